/*
 * memory_objects.c - memory hooks for objects that are not plain pointers: CUDA arrays and
 * mipmapped arrays; contexts; the device's total memory (rules in memory.c).
 *
 * Arrays: width x height x depth x channels x bytes per channel (a 0 dimension counts as 1),
 * summed over mip levels (each level halves width, height and, unless layered, depth). The
 * driver's padding is not seen; the NVML guard is the backstop.
 * Contexts: what a context owns (cuMemAlloc / Pitch / Managed, arrays, its malloc heap; not
 * VMM handles, pool or graph memory, which outlive it) is given back when the driver destroys
 * it: cuCtxDestroy_v2, cuDevicePrimaryCtxReset / _v2 (cudaDeviceReset), and
 * cuDevicePrimaryCtxRelease / _v2 when that release leaves the primary context inactive
 * (refcount 0; cuDevicePrimaryCtxGetState says so after the call). The primary context's
 * handle is read before the call with a retain + release pair while it is active (a net
 * change of zero, never a creation).
 * The malloc heap: cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, n) reserves n for the current
 * context (raising: the difference before the call; lowering: the difference given back
 * after it); the driver's default heap (8 MiB, taken unasked) is left to the NVML guard.
 * cuDeviceTotalMem_v2 says the cap on a capped GPU (what cudaGetDeviceProperties'
 * totalGlobalMem and PyTorch's total_memory come from), as cuMemGetInfo_v2 does.
 */
#include "fgpu.h"

#define FGPU_ARRAY3D_LAYERED 0x01u /* cuda.h CUDA_ARRAY3D_LAYERED: Depth is a layer count */

static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch)
{
    unsigned per = fgpu_cu_array_format_bytes(f);
    if (per == 0)
        per = 4; /* a format the header does not list: counted as 4 bytes per channel */
    uint64_t e = (uint64_t)per * (ch == 0 ? 1 : ch);
    uint64_t wh = fgpu_mul_sat(w == 0 ? 1 : w, h == 0 ? 1 : h);
    return fgpu_mul_sat(fgpu_mul_sat(wh, d == 0 ? 1 : d), e);
}


FGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    PASS_IF_INACTIVE(cuArrayCreate_v2, pHandle, desc);
    if (desc == NULL)
        return fgpu_real.cuArrayCreate_v2(pHandle, desc);
    uint64_t n = array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, n);
    if (r != CUDA_SUCCESS)
        return r;
    r = fgpu_real.cuArrayCreate_v2(pHandle, desc);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, n);
    else
        fgpu_mem_track(K_ARRAY, (uint64_t)(uintptr_t)*pHandle, g, n);
    return r;
}

FGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    PASS_IF_INACTIVE(cuArray3DCreate_v2, pHandle, desc);
    if (desc == NULL)
        return fgpu_real.cuArray3DCreate_v2(pHandle, desc);
    uint64_t n =
        array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, n);
    if (r != CUDA_SUCCESS)
        return r;
    r = fgpu_real.cuArray3DCreate_v2(pHandle, desc);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, n);
    else
        fgpu_mem_track(K_ARRAY, (uint64_t)(uintptr_t)*pHandle, g, n);
    return r;
}

FGPU_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    PASS_IF_INACTIVE(cuArrayDestroy, hArray);
    CUresult r = fgpu_real.cuArrayDestroy(hArray);
    if (r == CUDA_SUCCESS)
        fgpu_mem_release(K_ARRAY, (uint64_t)(uintptr_t)hArray);
    return r;
}

FGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                            const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                            unsigned int numMipmapLevels)
{
    PASS_IF_INACTIVE(cuMipmappedArrayCreate, pHandle, desc, numMipmapLevels);
    if (desc == NULL)
        return fgpu_real.cuMipmappedArrayCreate(pHandle, desc, numMipmapLevels);
    uint64_t n = 0;
    size_t w = desc->Width, h = desc->Height, d = desc->Depth;
    int layered = (desc->Flags & FGPU_ARRAY3D_LAYERED) != 0;
    for (unsigned l = 0; l < numMipmapLevels && l < 64; l++) {
        n = fgpu_add_sat(n, array_bytes(w, h, d, desc->Format, desc->NumChannels));
        w = w > 1 ? w / 2 : w;
        h = h > 1 ? h / 2 : h;
        if (!layered)
            d = d > 1 ? d / 2 : d;
    }
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, n);
    if (r != CUDA_SUCCESS)
        return r;
    r = fgpu_real.cuMipmappedArrayCreate(pHandle, desc, numMipmapLevels);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, n);
    else
        fgpu_mem_track(K_MIPMAP, (uint64_t)(uintptr_t)*pHandle, g, n);
    return r;
}

FGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    PASS_IF_INACTIVE(cuMipmappedArrayDestroy, hMipmappedArray);
    CUresult r = fgpu_real.cuMipmappedArrayDestroy(hMipmappedArray);
    if (r == CUDA_SUCCESS)
        fgpu_mem_release(K_MIPMAP, (uint64_t)(uintptr_t)hMipmappedArray);
    return r;
}

FGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    PASS_IF_INACTIVE(cuCtxDestroy_v2, ctx);
    fgpu_launch_forget_context(ctx); /* its events die with it */
    CUresult r = fgpu_real.cuCtxDestroy_v2(ctx);
    if (r == CUDA_SUCCESS)
        fgpu_mem_release_ctx(ctx);
    return r;
}

/* The handle of dev's primary context while it is active, else NULL. */
static CUcontext primary_handle(CUdevice dev)
{
    unsigned int flags = 0;
    int active = 0;
    CUcontext h = NULL;
    if (fgpu_real.cuDevicePrimaryCtxGetState == NULL || fgpu_real.cuDevicePrimaryCtxRetain == NULL ||
        fgpu_real.cuDevicePrimaryCtxRelease_v2 == NULL ||
        fgpu_real.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || !active)
        return NULL;
    if (fgpu_real.cuDevicePrimaryCtxRetain(&h, dev) != CUDA_SUCCESS)
        return NULL;
    fgpu_real.cuDevicePrimaryCtxRelease_v2(dev);
    return h;
}

static int primary_active(CUdevice dev)
{
    unsigned int flags = 0;
    int active = 1;
    if (fgpu_real.cuDevicePrimaryCtxGetState == NULL ||
        fgpu_real.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS)
        return 1; /* unknown: keep the reservations (stricter) */
    return active;
}

static CUresult primary_release(__typeof__(&cuDevicePrimaryCtxRelease_v2) real, CUdevice dev)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (!fgpu_g.active)
        return real(dev);
    CUcontext h = primary_handle(dev);
    CUresult r = real(dev);
    if (r == CUDA_SUCCESS && h != NULL && !primary_active(dev)) {
        fgpu_launch_forget_context(h); /* its events died with it */
        fgpu_mem_release_ctx(h);
    }
    return r;
}

FGPU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    FGPU_REAL_OR(cuDevicePrimaryCtxRelease, CUDA_ERROR_NOT_INITIALIZED);
    return primary_release(fgpu_real.cuDevicePrimaryCtxRelease, dev);
}

FGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    FGPU_REAL_OR(cuDevicePrimaryCtxRelease_v2, CUDA_ERROR_NOT_INITIALIZED);
    return primary_release(fgpu_real.cuDevicePrimaryCtxRelease_v2, dev);
}

static CUresult primary_reset(__typeof__(&cuDevicePrimaryCtxReset_v2) real, CUdevice dev)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_FOUND;
    if (!fgpu_g.active)
        return real(dev);
    CUcontext h = primary_handle(dev);
    if (h != NULL)
        fgpu_launch_forget_context(h); /* its events die with it */
    CUresult r = real(dev);
    if (r == CUDA_SUCCESS && h != NULL)
        fgpu_mem_release_ctx(h);
    return r;
}

FGPU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    FGPU_REAL_OR(cuDevicePrimaryCtxReset, CUDA_ERROR_NOT_INITIALIZED);
    return primary_reset(fgpu_real.cuDevicePrimaryCtxReset, dev);
}

FGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    FGPU_REAL_OR(cuDevicePrimaryCtxReset_v2, CUDA_ERROR_NOT_INITIALIZED);
    return primary_reset(fgpu_real.cuDevicePrimaryCtxReset_v2, dev);
}

FGPU_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    PASS_IF_INACTIVE(cuCtxSetLimit, limit, value);
    CUcontext ctx = NULL;
    if (limit != CU_LIMIT_MALLOC_HEAP_SIZE || fgpu_real.cuCtxGetCurrent == NULL ||
        fgpu_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return fgpu_real.cuCtxSetLimit(limit, value);
    int g = fgpu_gpu_of_current();
    uint64_t key = (uint64_t)(uintptr_t)ctx;
    /* what the context's heap holds now (0 when never set), put back below */
    uint64_t old = fgpu_mem_replace(K_HEAP, key, ctx, g, 0);
    if (value > old) {
        int g2 = g;
        CUresult r = fgpu_mem_take(&g2, value - old);
        if (r != CUDA_SUCCESS) {
            fgpu_mem_replace(K_HEAP, key, ctx, g, old);
            return r;
        }
        r = fgpu_real.cuCtxSetLimit(limit, value);
        if (r != CUDA_SUCCESS) {
            fgpu_mem_give(g2, value - old);
            fgpu_mem_replace(K_HEAP, key, ctx, g, old);
            return r;
        }
        fgpu_mem_replace(K_HEAP, key, ctx, g, g2 >= 0 ? value : 0);
        return r;
    }
    CUresult r = fgpu_real.cuCtxSetLimit(limit, value);
    if (r != CUDA_SUCCESS) {
        fgpu_mem_replace(K_HEAP, key, ctx, g, old);
        return r;
    }
    fgpu_mem_give(g, old - value);
    fgpu_mem_replace(K_HEAP, key, ctx, g, value);
    return r;
}

FGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    PASS_IF_INACTIVE(cuDeviceTotalMem_v2, bytes, dev);
    CUresult r = fgpu_real.cuDeviceTotalMem_v2(bytes, dev);
    if (r != CUDA_SUCCESS || bytes == NULL || !fgpu_g.capping)
        return r;
    int g = fgpu_gpu_of_device(dev);
    if (g < 0)
        return r;
    uint64_t limit = atomic_load_explicit(&fgpu_g.ctl->gpus[g].memory_limit, memory_order_relaxed);
    if (limit != 0 && limit < *bytes)
        *bytes = (size_t)limit;
    return r;
}
