/*
 * procaddress.c - fake driver (a STAND-IN for tests, see fake.h): cuGetProcAddress (CUDA 11
 * form) and cuGetProcAddress_v2 (CUDA 12 form). A base name (no _v2 suffix) and the caller's
 * CUDA version choose the newest exported version whose minimum version the caller reaches;
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM chooses the _ptsz entry where there is one.
 * The pointers are this library's own definitions (it is linked with -Bsymbolic), the same
 * that dlsym on its handle returns, whatever an interposer loaded first exports.
 */
#include <string.h>

#include "fake.h"

typedef void (*fk_fn)(void);

struct fk_entry {
    const char *name; /* what callers ask for */
    int min_version;  /* the CUDA version that introduced this symbol */
    fk_fn fn;
    fk_fn fn_ptsz; /* per-thread default stream variant, or NULL */
};

#define E(name, ver, sym) {name, ver, (fk_fn)sym, NULL}
#define P(name, ver, sym, ptsz) {name, ver, (fk_fn)sym, (fk_fn)ptsz}

static const struct fk_entry entries[] = {
    E("cuInit", 2000, cuInit),
    E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    E("cuGetErrorString", 6000, cuGetErrorString),
    E("cuGetErrorName", 6000, cuGetErrorName),
    E("cuGetProcAddress", 11030, cuGetProcAddress),
    E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    E("cuDeviceGet", 2000, cuDeviceGet),
    E("cuDeviceGetCount", 2000, cuDeviceGetCount),
    E("cuDeviceGetName", 2000, cuDeviceGetName),
    E("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    E("cuCtxCreate", 3020, cuCtxCreate_v2),
    E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    E("cuCtxGetDevice", 2000, cuCtxGetDevice),
    E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    E("cuModuleLoadData", 2000, cuModuleLoadData),
    E("cuModuleGetFunction", 2000, cuModuleGetFunction),
    E("cuModuleUnload", 2000, cuModuleUnload),
    E("cuStreamCreate", 2000, cuStreamCreate),
    E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    P("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
    P("cuStreamQuery", 2000, cuStreamQuery, cuStreamQuery_ptsz),
    E("cuEventCreate", 2000, cuEventCreate),
    P("cuEventRecord", 2000, cuEventRecord, cuEventRecord_ptsz),
    E("cuEventQuery", 2000, cuEventQuery),
    E("cuEventSynchronize", 2000, cuEventSynchronize),
    E("cuEventElapsedTime", 2000, cuEventElapsedTime),
    E("cuEventDestroy", 4000, cuEventDestroy_v2),
    E("cuMemAlloc", 3020, cuMemAlloc_v2),
    E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    E("cuMemAllocManaged", 6000, cuMemAllocManaged),
    E("cuMemFree", 3020, cuMemFree_v2),
    E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
    E("cuMemPoolCreate", 11020, cuMemPoolCreate),
    E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    E("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    E("cuMemCreate", 10020, cuMemCreate),
    E("cuMemRelease", 10020, cuMemRelease),
    E("cuMemAddressReserve", 10020, cuMemAddressReserve),
    E("cuMemAddressFree", 10020, cuMemAddressFree),
    E("cuMemMap", 10020, cuMemMap),
    E("cuMemUnmap", 10020, cuMemUnmap),
    E("cuMemSetAccess", 10020, cuMemSetAccess),
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    E("cuArrayCreate", 3020, cuArrayCreate_v2),
    E("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    E("cuArrayDestroy", 2000, cuArrayDestroy),
    E("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    E("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    E("cuGraphCreate", 10000, cuGraphCreate),
    E("cuGraphAddKernelNode", 10000, cuGraphAddKernelNode),
    E("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
    E("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode),
    E("cuGraphAddMemFreeNode", 11040, cuGraphAddMemFreeNode),
    E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    P("cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz),
    E("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    E("cuGraphDestroy", 10000, cuGraphDestroy),
    E("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
    E("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    E("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    E("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    P("cuLaunchKernel", 4000, cuLaunchKernel, cuLaunchKernel_ptsz),
    P("cuLaunchKernelEx", 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz),
    P("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel,
      cuLaunchCooperativeKernel_ptsz),
    E("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
    E("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    P("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
    P("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
    P("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz),
    E("cuMemsetD8", 3020, cuMemsetD8_v2),
    P("cuMemsetD8Async", 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz),
    P("cuMemsetD32Async", 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz),
};

static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (symbol == NULL || pfn == NULL ||
        flags > (CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    const struct fk_entry *best = NULL;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        const struct fk_entry *e = &entries[i];
        if (strcmp(e->name, symbol) != 0)
            continue;
        if (e->min_version > cudaVersion) {
            if (best == NULL)
                st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
            continue;
        }
        if (best == NULL || e->min_version > best->min_version)
            best = e;
    }
    *pfn = NULL;
    if (status != NULL)
        *status = best != NULL ? CU_GET_PROC_ADDRESS_SUCCESS : st;
    if (best == NULL)
        return CUDA_ERROR_NOT_FOUND;
    fk_fn fn = best->fn;
    if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->fn_ptsz != NULL)
        fn = best->fn_ptsz;
    *pfn = (void *)fn;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}
