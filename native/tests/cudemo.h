/*
 * cudemo.h - shared parts of fgpu-cudemo (cudemo.c: entry points, allocations; cudemo_main.c:
 * kernels, events, procaddr, the command line). See cudemo.c for the commands.
 */
#ifndef FGPU_CUDEMO_H
#define FGPU_CUDEMO_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_api.h"

/* the cudaVersion the program asks cuGetProcAddress at: a program built with CUDA 12.4's
 * cuda.h (whose cuCtxSynchronize takes no context; 13.0 answers cuCtxSynchronize_v2) */
#define CUDEMO_CUDA_VERSION 12040

/* field, name asked from cuGetProcAddress, per-thread-stream symbol (or the same) */
#define CUDEMO_API(X)                                                                    \
    X(cuInit, "cuInit", cuInit)                                                          \
    X(cuDriverGetVersion, "cuDriverGetVersion", cuDriverGetVersion)                      \
    X(cuGetErrorName, "cuGetErrorName", cuGetErrorName)                                  \
    X(cuDeviceGet, "cuDeviceGet", cuDeviceGet)                                           \
    X(cuDeviceGetCount, "cuDeviceGetCount", cuDeviceGetCount)                            \
    X(cuDeviceGetName, "cuDeviceGetName", cuDeviceGetName)                               \
    X(cuDeviceGetUuid_v2, "cuDeviceGetUuid", cuDeviceGetUuid_v2)                         \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", cuDeviceTotalMem_v2)                      \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain)    \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", cuCtxSetCurrent)                               \
    X(cuCtxSynchronize, "cuCtxSynchronize", cuCtxSynchronize)                            \
    X(cuModuleLoadData, "cuModuleLoadData", cuModuleLoadData)                            \
    X(cuModuleGetFunction, "cuModuleGetFunction", cuModuleGetFunction)                   \
    X(cuModuleUnload, "cuModuleUnload", cuModuleUnload)                                  \
    X(cuStreamCreate, "cuStreamCreate", cuStreamCreate)                                  \
    X(cuStreamDestroy_v2, "cuStreamDestroy", cuStreamDestroy_v2)                         \
    X(cuStreamSynchronize, "cuStreamSynchronize", cuStreamSynchronize_ptsz)              \
    X(cuEventCreate, "cuEventCreate", cuEventCreate)                                     \
    X(cuEventRecord, "cuEventRecord", cuEventRecord_ptsz)                                \
    X(cuEventQuery, "cuEventQuery", cuEventQuery)                                        \
    X(cuEventSynchronize, "cuEventSynchronize", cuEventSynchronize)                      \
    X(cuEventElapsedTime, "cuEventElapsedTime", cuEventElapsedTime)                      \
    X(cuEventDestroy_v2, "cuEventDestroy", cuEventDestroy_v2)                            \
    X(cuMemAlloc_v2, "cuMemAlloc", cuMemAlloc_v2)                                        \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", cuMemAllocPitch_v2)                         \
    X(cuMemAllocManaged, "cuMemAllocManaged", cuMemAllocManaged)                         \
    X(cuMemFree_v2, "cuMemFree", cuMemFree_v2)                                           \
    X(cuMemGetInfo_v2, "cuMemGetInfo", cuMemGetInfo_v2)                                  \
    X(cuMemAllocAsync, "cuMemAllocAsync", cuMemAllocAsync_ptsz)                          \
    X(cuMemFreeAsync, "cuMemFreeAsync", cuMemFreeAsync_ptsz)                             \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync_ptsz)  \
    X(cuMemPoolCreate, "cuMemPoolCreate", cuMemPoolCreate)                               \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", cuMemPoolDestroy)                            \
    X(cuMemCreate, "cuMemCreate", cuMemCreate)                                           \
    X(cuMemRelease, "cuMemRelease", cuMemRelease)                                        \
    X(cuMemAddressReserve, "cuMemAddressReserve", cuMemAddressReserve)                   \
    X(cuMemAddressFree, "cuMemAddressFree", cuMemAddressFree)                            \
    X(cuMemMap, "cuMemMap", cuMemMap)                                                    \
    X(cuMemUnmap, "cuMemUnmap", cuMemUnmap)                                              \
    X(cuMemSetAccess, "cuMemSetAccess", cuMemSetAccess)                                  \
    X(cuArrayCreate_v2, "cuArrayCreate", cuArrayCreate_v2)                               \
    X(cuArray3DCreate_v2, "cuArray3DCreate", cuArray3DCreate_v2)                         \
    X(cuArrayDestroy, "cuArrayDestroy", cuArrayDestroy)                                  \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", cuMipmappedArrayCreate)          \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", cuMipmappedArrayDestroy)       \
    X(cuGraphCreate, "cuGraphCreate", cuGraphCreate)                                     \
    X(cuGraphAddKernelNode_v2, "cuGraphAddKernelNode", cuGraphAddKernelNode_v2)          \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", cuGraphAddMemAllocNode)          \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags",                        \
      cuGraphInstantiateWithFlags)                                                       \
    X(cuGraphLaunch, "cuGraphLaunch", cuGraphLaunch_ptsz)                                \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", cuGraphExecDestroy)                      \
    X(cuGraphDestroy, "cuGraphDestroy", cuGraphDestroy)                                  \
    X(cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", cuDeviceGraphMemTrim)                \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle", cuIpcGetMemHandle)                         \
    X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2)                \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", cuIpcCloseMemHandle)                   \
    X(cuLaunchKernel, "cuLaunchKernel", cuLaunchKernel_ptsz)                             \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", cuLaunchKernelEx_ptsz)                       \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel",                            \
      cuLaunchCooperativeKernel_ptsz)

#define CUDEMO_FIELD(f, name, ptsz) __typeof__(&f) f;
struct cudemo_api {
    CUDEMO_API(CUDEMO_FIELD)
};


extern struct cudemo_api api;
extern int ptsz_mode, dlopen_mode, device_ordinal;
extern CUdevice dev;
extern CUcontext ctx;
extern const char *self_path;

uint64_t now_ns(void);
const char *err_name(CUresult rc);
void fail(const char *call, CUresult rc) __attribute__((noreturn));
void setup(void);
void meminfo(size_t *free_b, size_t *total);
void hex(const void *data, size_t n, char *out);
int cmd_alloc(const char *kind, size_t bytes);
int cmd_ipc_open(const char *text);
int cmd_until_oom(const char *kind, size_t chunk);
int cmd_hold(size_t bytes, const char *kind);
int cmd_threads(int n, const char *kind, size_t bytes);
int cmd_bench_launch(long count);
int cmd_bench_alloc(long count, size_t bytes);

#define CHECK(call)                                                                      \
    do {                                                                                 \
        CUresult rc_ = (call);                                                           \
        if (rc_ != CUDA_SUCCESS)                                                         \
            fail(#call, rc_);                                                            \
    } while (0)

#endif /* FGPU_CUDEMO_H */
