/*
 * memory_pools.c - memory hooks for stream-ordered allocations (cuMemAllocAsync,
 * cuMemAllocFromPoolAsync, cuMemFreeAsync and their _ptsz variants) and virtual memory
 * management (cuMemCreate / cuMemRelease). Rules in memory.c: bytes asked are reserved before
 * the driver call and given back at the matching free; what a pool keeps cached after a free
 * is not counted (the NVML guard is the backstop), a VMM handle counts from create to release.
 */
#include "fgpu.h"

/* ------------------------------------------------------------------ stream-ordered */

static CUresult alloc_async(__typeof__(&cuMemAllocAsync) real, CUdeviceptr *dptr, size_t n,
                            CUstream s)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (!fgpu_g.active)
        return real(dptr, n, s);
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, n);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(dptr, n, s);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, n);
    else
        fgpu_mem_track(K_PTR, *dptr, g, n);
    return r;
}

FGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    FGPU_REAL_OR(cuMemAllocAsync, CUDA_ERROR_NOT_INITIALIZED);
    return alloc_async(fgpu_real.cuMemAllocAsync, dptr, bytesize, hStream);
}

FGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    FGPU_REAL_OR(cuMemAllocAsync_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    return alloc_async(fgpu_real.cuMemAllocAsync_ptsz, dptr, bytesize, hStream);
}

static CUresult alloc_pool(__typeof__(&cuMemAllocFromPoolAsync) real, CUdeviceptr *dptr,
                           size_t n, CUmemoryPool pool, CUstream s)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (!fgpu_g.active)
        return real(dptr, n, pool, s);
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, n);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(dptr, n, pool, s);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, n);
    else
        fgpu_mem_track(K_PTR, *dptr, g, n);
    return r;
}

FGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream hStream)
{
    FGPU_REAL_OR(cuMemAllocFromPoolAsync, CUDA_ERROR_NOT_INITIALIZED);
    return alloc_pool(fgpu_real.cuMemAllocFromPoolAsync, dptr, bytesize, pool, hStream);
}

FGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                  CUmemoryPool pool, CUstream hStream)
{
    FGPU_REAL_OR(cuMemAllocFromPoolAsync_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    return alloc_pool(fgpu_real.cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, hStream);
}

FGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    PASS_IF_INACTIVE(cuMemFreeAsync, dptr, hStream);
    CUresult r = fgpu_real.cuMemFreeAsync(dptr, hStream);
    if (r == CUDA_SUCCESS)
        fgpu_mem_release(K_PTR, dptr);
    return r;
}

FGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    PASS_IF_INACTIVE(cuMemFreeAsync_ptsz, dptr, hStream);
    CUresult r = fgpu_real.cuMemFreeAsync_ptsz(dptr, hStream);
    if (r == CUDA_SUCCESS)
        fgpu_mem_release(K_PTR, dptr);
    return r;
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
        fgpu_mem_track(K_HANDLE, *handle, g, size);
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
