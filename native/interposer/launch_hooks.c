/*
 * launch_hooks.c - the gated entry points of hooks.h: cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch, cuMemcpy{HtoD,DtoH,DtoD}Async_v2,
 * cuMemsetD8Async, cuMemsetD32Async and their _ptsz variants. Each one is the same three
 * steps: fgpu_launch_before (gate, in-flight bound, start event or a place in a lane's tail;
 * launch.c), the driver call, fgpu_launch_after (end event; not called after a successful call
 * that joined a tail lock-free, which has nothing to do after). A _ptsz variant passes ptsz = 1 so a NULL stream means the
 * calling thread's per-thread default stream when the end event is recorded.
 */
#include <stdatomic.h>

#include "fgpu.h"

/* --------------------------------------------------------------- the gated hooks */

/* 1 once fgpu_resolve_cuda() succeeded: the hooks below then skip its pthread_once. Set with
 * release after pthread_once returned; read with acquire, so the driver pointers it filled are
 * visible to every thread that sees 1 (the same guarantee pthread_once gives). */
static atomic_int resolved;

/* A lock-free join whose tail's generation moved by the end of the driver call (another
 * thread closed the tail meanwhile): fgpu_launch_after makes sure an end event follows the
 * call. Relaxed is enough: a close whose end event the driver queued before this call
 * happened before the call (the driver orders one stream's work under its own lock), so this
 * load sees its generation; one queued after the call covers the call anyway. */
static inline int fgpu_tail_moved(const struct fgpu_tok *t)
{
    uint64_t now = atomic_load_explicit(t->tail_word, memory_order_relaxed);
    return (now >> 32) != (t->word_seen >> 32);
}

#define GATED(name, ptsz, stream, ...)                                                       \
    if (!atomic_load_explicit(&resolved, memory_order_acquire)) {                            \
        if (fgpu_resolve_cuda() != 0)                                                        \
            return CUDA_ERROR_NOT_INITIALIZED;                                               \
        atomic_store_explicit(&resolved, 1, memory_order_release);                           \
    }                                                                                        \
    if (fgpu_real.name == NULL)                                                              \
        return CUDA_ERROR_NOT_INITIALIZED;                                                   \
    struct fgpu_tok t;                                                                       \
    fgpu_launch_before(&t, (stream), (ptsz));                                                \
    CUresult r = fgpu_real.name(__VA_ARGS__);                                                \
    if (t.go != FGPU_TOK_JOINED || r != CUDA_SUCCESS || fgpu_tail_moved(&t))                 \
        fgpu_launch_after(&t, r);                                                            \
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

