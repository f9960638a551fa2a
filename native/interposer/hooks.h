/*
 * hooks.h - the one list of symbols libfgpu hooks (an X-macro table).
 *
 * FGPU_HOOK(name)   a CUDA driver entry point: libfgpu.so defines and exports `name` (same
 *                   prototype as native/include/cuda_api.h), keeps the real driver's pointer in
 *                   fgpu_real.name, and cuGetProcAddress hands out the hook in place of the
 *                   driver's pointer. Listing a name here without writing its hook fails the
 *                   link (-z defs), so a hook cannot be half-registered.
 * FGPU_NVML_HOOK(name)  the same for NVML (libnvidia-ml.so.1).
 * FGPU_HELPER(name) a driver entry point the interposer calls itself (never hooked).
 * FGPU_NVML_HELPER(name)  the same for NVML.
 *
 * The tests read the list back from fgpu_interposer_hook_names() (coverage check).
 * No include guard on purpose: every inclusion expands the list with the caller's macros.
 */
#ifndef FGPU_HOOK
#define FGPU_HOOK(name)
#endif
#ifndef FGPU_NVML_HOOK
#define FGPU_NVML_HOOK(name)
#endif
#ifndef FGPU_HELPER
#define FGPU_HELPER(name)
#endif
#ifndef FGPU_NVML_HELPER
#define FGPU_NVML_HELPER(name)
#endif

/* entry-point lookup (procaddr.c) */
FGPU_HOOK(cuGetProcAddress)
FGPU_HOOK(cuGetProcAddress_v2)

/* the process's entry in the segment, claimed before the driver knows it (config.c) */
FGPU_HOOK(cuInit)

/* memory accounting (memory.c) */
FGPU_HOOK(cuMemAlloc_v2)
FGPU_HOOK(cuMemAllocPitch_v2)
FGPU_HOOK(cuMemAllocManaged)
FGPU_HOOK(cuMemFree_v2)
FGPU_HOOK(cuMemGetInfo_v2)
FGPU_HOOK(cuMemAllocAsync)
FGPU_HOOK(cuMemAllocAsync_ptsz)
FGPU_HOOK(cuMemAllocFromPoolAsync)
FGPU_HOOK(cuMemAllocFromPoolAsync_ptsz)
FGPU_HOOK(cuMemFreeAsync)
FGPU_HOOK(cuMemFreeAsync_ptsz)
FGPU_HOOK(cuMemCreate)
FGPU_HOOK(cuMemRelease)
FGPU_HOOK(cuArrayCreate_v2)
FGPU_HOOK(cuArray3DCreate_v2)
FGPU_HOOK(cuArrayDestroy)
FGPU_HOOK(cuMipmappedArrayCreate)
FGPU_HOOK(cuMipmappedArrayDestroy)
FGPU_HOOK(cuCtxDestroy_v2)
/* contexts, limits, device size (memory_objects.c) */
FGPU_HOOK(cuDevicePrimaryCtxRelease)
FGPU_HOOK(cuDevicePrimaryCtxRelease_v2)
FGPU_HOOK(cuDevicePrimaryCtxReset)
FGPU_HOOK(cuDevicePrimaryCtxReset_v2)
FGPU_HOOK(cuCtxSetLimit)
FGPU_HOOK(cuDeviceTotalMem_v2)
/* graph memory: every instantiate entry point (memory_graphs.c) */
FGPU_HOOK(cuGraphInstantiate)
FGPU_HOOK(cuGraphInstantiate_v2)
FGPU_HOOK(cuGraphInstantiateWithFlags)
FGPU_HOOK(cuGraphInstantiateWithParams)
FGPU_HOOK(cuGraphInstantiateWithParams_ptsz)
FGPU_HOOK(cuGraphExecDestroy)

/* launch gating (launch_hooks.c, launch.c) */
FGPU_HOOK(cuLaunchKernel)
FGPU_HOOK(cuLaunchKernel_ptsz)
FGPU_HOOK(cuLaunchKernelEx)
FGPU_HOOK(cuLaunchKernelEx_ptsz)
FGPU_HOOK(cuLaunchCooperativeKernel)
FGPU_HOOK(cuLaunchCooperativeKernel_ptsz)
FGPU_HOOK(cuGraphLaunch)
FGPU_HOOK(cuGraphLaunch_ptsz)
FGPU_HOOK(cuMemcpyHtoDAsync_v2)
FGPU_HOOK(cuMemcpyHtoDAsync_v2_ptsz)
FGPU_HOOK(cuMemcpyDtoHAsync_v2)
FGPU_HOOK(cuMemcpyDtoHAsync_v2_ptsz)
FGPU_HOOK(cuMemcpyDtoDAsync_v2)
FGPU_HOOK(cuMemcpyDtoDAsync_v2_ptsz)
FGPU_HOOK(cuMemsetD8Async)
FGPU_HOOK(cuMemsetD8Async_ptsz)
FGPU_HOOK(cuMemsetD32Async)
FGPU_HOOK(cuMemsetD32Async_ptsz)
/* retire points (launch_sync.c): completed work is accounted right after a synchronize */
FGPU_HOOK(cuStreamSynchronize)
FGPU_HOOK(cuStreamSynchronize_ptsz)
FGPU_HOOK(cuCtxSynchronize)
FGPU_HOOK(cuCtxSynchronize_v2)

/* NVML memory queries (nvml.c) */
FGPU_NVML_HOOK(nvmlDeviceGetMemoryInfo)
FGPU_NVML_HOOK(nvmlDeviceGetMemoryInfo_v2)
FGPU_NVML_HELPER(nvmlDeviceGetUUID)

/* what the interposer calls itself */
FGPU_HELPER(cuCtxGetCurrent)
FGPU_HELPER(cuCtxSetCurrent)
FGPU_HELPER(cuCtxGetDevice)
FGPU_HELPER(cuDeviceGetUuid)
FGPU_HELPER(cuDeviceGetUuid_v2)
FGPU_HELPER(cuEventCreate)
FGPU_HELPER(cuEventRecord)
FGPU_HELPER(cuEventRecord_ptsz)
FGPU_HELPER(cuEventQuery)
FGPU_HELPER(cuEventSynchronize)
FGPU_HELPER(cuEventElapsedTime)
FGPU_HELPER(cuEventDestroy_v2)
FGPU_HELPER(cuDevicePrimaryCtxGetState)
FGPU_HELPER(cuDevicePrimaryCtxRetain)
FGPU_HELPER(cuStreamIsCapturing)
FGPU_HELPER(cuStreamIsCapturing_ptsz)
FGPU_HELPER(cuGraphGetNodes)
FGPU_HELPER(cuGraphNodeGetType)
FGPU_HELPER(cuGraphMemAllocNodeGetParams)
FGPU_HELPER(cuGraphMemFreeNodeGetParams)
FGPU_HELPER(cuGraphChildGraphNodeGetGraph)

#undef FGPU_HOOK
#undef FGPU_NVML_HOOK
#undef FGPU_HELPER
#undef FGPU_NVML_HELPER
