/*
 * launch_hooks.c - the gated entry points of hooks.h: cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch, cuMemcpy{HtoD,DtoH,DtoD}Async_v2,
 * cuMemsetD8Async, cuMemsetD32Async and their _ptsz variants. Each one is the same three
 * steps: fgpu_launch_before (gate, in-flight bound, start event; launch.c), the driver call,
 * fgpu_launch_after (end event). A _ptsz variant passes ptsz = 1 so a NULL stream means the
 * calling thread's per-thread default stream when the end event is recorded.
 */
#include "fgpu.h"

/* --------------------------------------------------------------- the gated hooks */

#define GATED(name, ptsz, stream, ...)                                                       \
    FGPU_REAL_OR(name, CUDA_ERROR_NOT_INITIALIZED);                                          \
    struct fgpu_tok t;                                                                       \
    fgpu_launch_before(&t, (stream), (ptsz));                                                \
    CUresult r = fgpu_real.name(__VA_ARGS__);                                                \
    fgpu_launch_after(&t, r);                                                                \
    return r

#define KERNEL_ARGS                                                                          \
    CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,       \
        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,              \
        unsigned int sharedMemBytes, CUstream hStream
#define KERNEL_PASS                                                                          \
    f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream

FGPU_EXPORT CUresult cuLaunchKernel(KERNEL_ARGS, void **kernelParams, void **extra)
{
    GATED(cuLaunchKernel, 0, hStream, KERNEL_PASS, kernelParams, extra);
}

FGPU_EXPORT CUresult cuLaunchKernel_ptsz(KERNEL_ARGS, void **kernelParams, void **extra)
{
    GATED(cuLaunchKernel_ptsz, 1, hStream, KERNEL_PASS, kernelParams, extra);
}

FGPU_EXPORT CUresult cuLaunchCooperativeKernel(KERNEL_ARGS, void **kernelParams)
{
    GATED(cuLaunchCooperativeKernel, 0, hStream, KERNEL_PASS, kernelParams);
}

FGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(KERNEL_ARGS, void **kernelParams)
{
    GATED(cuLaunchCooperativeKernel_ptsz, 1, hStream, KERNEL_PASS, kernelParams);
}

FGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                      void **kernelParams, void **extra)
{
    GATED(cuLaunchKernelEx, 0, config != NULL ? config->hStream : NULL, config, f, kernelParams,
          extra);
}

FGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                           void **kernelParams, void **extra)
{
    GATED(cuLaunchKernelEx_ptsz, 1, config != NULL ? config->hStream : NULL, config, f,
          kernelParams, extra);
}

FGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    GATED(cuGraphLaunch, 0, hStream, hGraphExec, hStream);
}

FGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    GATED(cuGraphLaunch_ptsz, 1, hStream, hGraphExec, hStream);
}

FGPU_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost,
                                          size_t byteCount, CUstream hStream)
{
    GATED(cuMemcpyHtoDAsync_v2, 0, hStream, dstDevice, srcHost, byteCount, hStream);
}

FGPU_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost,
                                               size_t byteCount, CUstream hStream)
{
    GATED(cuMemcpyHtoDAsync_v2_ptsz, 1, hStream, dstDevice, srcHost, byteCount, hStream);
}

FGPU_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice,
                                          size_t byteCount, CUstream hStream)
{
    GATED(cuMemcpyDtoHAsync_v2, 0, hStream, dstHost, srcDevice, byteCount, hStream);
}

FGPU_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice,
                                               size_t byteCount, CUstream hStream)
{
    GATED(cuMemcpyDtoHAsync_v2_ptsz, 1, hStream, dstHost, srcDevice, byteCount, hStream);
}

FGPU_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                          size_t byteCount, CUstream hStream)
{
    GATED(cuMemcpyDtoDAsync_v2, 0, hStream, dstDevice, srcDevice, byteCount, hStream);
}

FGPU_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                               size_t byteCount, CUstream hStream)
{
    GATED(cuMemcpyDtoDAsync_v2_ptsz, 1, hStream, dstDevice, srcDevice, byteCount, hStream);
}

FGPU_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t n,
                                     CUstream hStream)
{
    GATED(cuMemsetD8Async, 0, hStream, dstDevice, uc, n, hStream);
}

FGPU_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t n,
                                          CUstream hStream)
{
    GATED(cuMemsetD8Async_ptsz, 1, hStream, dstDevice, uc, n, hStream);
}

FGPU_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t n,
                                      CUstream hStream)
{
    GATED(cuMemsetD32Async, 0, hStream, dstDevice, ui, n, hStream);
}

FGPU_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t n,
                                           CUstream hStream)
{
    GATED(cuMemsetD32Async_ptsz, 1, hStream, dstDevice, ui, n, hStream);
}

