/*
 * memory_pools.c - memory hooks for stream-ordered allocations (cuMemAllocAsync,
 * cuMemAllocFromPoolAsync, cuMemFreeAsync and their _ptsz variants) and virtual memory
 * management (cuMemCreate / cuMemRelease). Rules in memory.c: bytes asked are reserved before
 * the driver call and given back at the matching free; what a pool keeps cached after a free
 * is not counted (the NVML guard is the backstop), a VMM handle counts from create to release.
 * Neither is given back when a context is destroyed: the driver keeps both (cuda.h,
 * cuCtxDestroy). On a stream being captured, an allocation or free is a node of the graph
 * being made, not memory: it passes through uncounted and the graph's memory nodes are
 * reserved when the graph is instantiated (memory_graphs.c).
 */
#include "fgpu.h"

/* Whether s is being captured into a graph (ptsz: a NULL stream is the per-thread one). An
 * error (the legacy stream during another stream's global capture) counts as not captured:
 * the driver refuses that allocation itself. */
static int capturing(CUstream s, int ptsz)
{
    __typeof__(&cuStreamIsCapturing) is = ptsz ? fgpu_real.cuStreamIsCapturing_ptsz
                                               : fgpu_real.cuStreamIsCapturing;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    return is != NULL && is(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* ------------------------------------------------------------------ stream-ordered */

static CUresult alloc_async(__typeof__(&cuMemAllocAsync) real, CUdeviceptr *dptr, size_t n,
                            CUstream s, int ptsz)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (!fgpu_g.active || capturing(s, ptsz))
        return real(dptr, n, s);
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, n);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(dptr, n, s);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, n);
    else
        fgpu_mem_track_unbound(K_PTR, *dptr, g, n);
    return r;
}

FGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    FGPU_REAL_OR(cuMemAllocAsync, CUDA_ERROR_NOT_INITIALIZED);
    return alloc_async(fgpu_real.cuMemAllocAsync, dptr, bytesize, hStream, 0);
}

FGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    FGPU_REAL_OR(cuMemAllocAsync_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    return alloc_async(fgpu_real.cuMemAllocAsync_ptsz, dptr, bytesize, hStream, 1);
}

static CUresult alloc_pool(__typeof__(&cuMemAllocFromPoolAsync) real, CUdeviceptr *dptr,
                           size_t n, CUmemoryPool pool, CUstream s, int ptsz)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (!fgpu_g.active || capturing(s, ptsz))
        return real(dptr, n, pool, s);
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, n);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(dptr, n, pool, s);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, n);
    else
        fgpu_mem_track_unbound(K_PTR, *dptr, g, n);
    return r;
}

FGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream hStream)
{
    FGPU_REAL_OR(cuMemAllocFromPoolAsync, CUDA_ERROR_NOT_INITIALIZED);
    return alloc_pool(fgpu_real.cuMemAllocFromPoolAsync, dptr, bytesize, pool, hStream, 0);
}

FGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                  CUmemoryPool pool, CUstream hStream)
{
    FGPU_REAL_OR(cuMemAllocFromPoolAsync_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    return alloc_pool(fgpu_real.cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, hStream, 1);
}

static CUresult free_async(__typeof__(&cuMemFreeAsync) real, CUdeviceptr dptr, CUstream s,
                           int ptsz)
{
    if (capturing(s, ptsz))
        return real(dptr, s); /* a free node: the memory goes at the graph's launch */
    CUresult r = real(dptr, s);
    if (r == CUDA_SUCCESS)
        fgpu_mem_release(K_PTR, dptr);
    return r;
}

FGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    PASS_IF_INACTIVE(cuMemFreeAsync, dptr, hStream);
    return free_async(fgpu_real.cuMemFreeAsync, dptr, hStream, 0);
}

FGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    PASS_IF_INACTIVE(cuMemFreeAsync_ptsz, dptr, hStream);
    return free_async(fgpu_real.cuMemFreeAsync_ptsz, dptr, hStream, 1);
}

/* ------------------------------------------------------------------ virtual memory */

FGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    PASS_IF_INACTIVE(cuMemCreate, handle, size, prop, flags);
    int g = (prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
                ? fgpu_gpu_of_device(prop->location.id)
                : -1;
    CUresult r = fgpu_mem_take(&g, size);
    if (r != CUDA_SUCCESS)
        return r;
    r = fgpu_real.cuMemCreate(handle, size, prop, flags);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, size);
    else
        fgpu_mem_track_unbound(K_HANDLE, *handle, g, size);
    return r;
}

FGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    PASS_IF_INACTIVE(cuMemRelease, handle);
    CUresult r = fgpu_real.cuMemRelease(handle);
    if (r == CUDA_SUCCESS)
        fgpu_mem_release(K_HANDLE, handle);
    return r;
}
