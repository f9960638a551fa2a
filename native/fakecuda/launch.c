/*
 * launch.c - fake driver (a STAND-IN for tests, see fake.h): kernel launches (cuLaunchKernel,
 * cuLaunchKernelEx, cuLaunchCooperativeKernel and their _ptsz forms), copies and memsets:
 * each becomes a timed operation on its stream (copies and memsets: bytes at 10 GB/s). The
 * synchronous host<->device copies and cuMemsetD8 also move contents (contents.c).
 */
#include <stdlib.h>
#include <string.h>

#include "fake.h"

/* ------------------------------------------------------------------ launches */

uint64_t fk_kernel_ns(struct fk_func *f, void **params, CUresult *err)
{
    *err = CUDA_SUCCESS;
    if (f == NULL || f->magic != FK_FUNC_MAGIC) {
        *err = CUDA_ERROR_INVALID_HANDLE;
        return 0;
    }
    if (params == NULL || params[0] == NULL) {
        *err = CUDA_ERROR_INVALID_VALUE; /* spin needs its duration parameter */
        return 0;
    }
    uint64_t ns;
    memcpy(&ns, params[0], sizeof ns);
    return ns;
}

static CUresult enqueue_timed(struct fk_stream *s, int kind, uint64_t ns)
{
    struct fk_op *op = calloc(1, sizeof *op);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = kind;
    op->ns = ns;
    return fk_enqueue(s, op);
}

static CUresult launch(CUfunction f, const unsigned dims[6], CUstream h, void **params,
                       void **extra, int ptsz)
{
    struct fk_stream *s;
    for (int i = 0; i < 6; i++)
        if (dims[i] == 0)
            return CUDA_ERROR_INVALID_VALUE;
    if (extra != NULL && params == NULL)
        return CUDA_ERROR_INVALID_VALUE; /* parameters packed in `extra`: not modelled */
    CUresult rc = fk_resolve_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t ns = fk_kernel_ns((struct fk_func *)f, params, &rc);
    return rc != CUDA_SUCCESS ? rc : enqueue_timed(s, FK_OP_KERNEL, ns);
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                        void **extra)
{
    (void)sharedMemBytes;
    const unsigned dims[6] = {gx, gy, gz, bx, by, bz};
    return launch(f, dims, hStream, kernelParams, extra, 0);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz,
                             unsigned int sharedMemBytes, CUstream hStream,
                             void **kernelParams, void **extra)
{
    (void)sharedMemBytes;
    const unsigned dims[6] = {gx, gy, gz, bx, by, bz};
    return launch(f, dims, hStream, kernelParams, extra, 1);
}

static CUresult launch_ex(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra,
                          int ptsz)
{
    if (cfg == NULL || (cfg->numAttrs > 0 && cfg->attrs == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    const unsigned dims[6] = {cfg->gridDimX,  cfg->gridDimY,  cfg->gridDimZ,
                              cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ};
    return launch(f, dims, cfg->hStream, params, extra, ptsz);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra)
{
    return launch_ex(config, f, kernelParams, extra, 0);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra)
{
    return launch_ex(config, f, kernelParams, extra, 1);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                   unsigned int gz, unsigned int bx, unsigned int by,
                                   unsigned int bz, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams)
{
    (void)sharedMemBytes;
    const unsigned dims[6] = {gx, gy, gz, bx, by, bz};
    return launch(f, dims, hStream, kernelParams, NULL, 0);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                        unsigned int gz, unsigned int bx, unsigned int by,
                                        unsigned int bz, unsigned int sharedMemBytes,
                                        CUstream hStream, void **kernelParams)
{
    (void)sharedMemBytes;
    const unsigned dims[6] = {gx, gy, gz, bx, by, bz};
    return launch(f, dims, hStream, kernelParams, NULL, 1);
}

/* ------------------------------------------------------------------ copies and memsets */

static CUresult copy_async(int ok, uint64_t bytes, CUstream h, int ptsz)
{
    struct fk_stream *s;
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_resolve_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    return enqueue_timed(s, FK_OP_COPY, bytes * 1000u / FK_COPY_BYTES_PER_US);
}

static CUresult copy_sync(int ok, uint64_t bytes)
{
    struct fk_stream *s;
    CUresult rc = copy_async(ok, bytes, CU_STREAM_LEGACY, 0);
    if (rc == CUDA_SUCCESS && (rc = fk_resolve_stream(CU_STREAM_LEGACY, 0, &s)) == CUDA_SUCCESS)
        rc = fk_stream_sync(s);
    return rc;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    CUresult rc = copy_sync(dst != 0 && src != NULL, n);
    return rc == CUDA_SUCCESS ? fk_contents_write(dst, src, n) : rc;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    CUresult rc = copy_sync(dst != NULL && src != 0, n);
    return rc == CUDA_SUCCESS ? fk_contents_read(dst, src, n) : rc;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t n)
{
    CUresult rc = copy_sync(dst != 0, n);
    return rc == CUDA_SUCCESS ? fk_contents_set(dst, uc, n) : rc;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream h)
{
    return copy_async(dst != 0 && src != NULL, n, h, 0);
}

CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream h)
{
    return copy_async(dst != 0 && src != NULL, n, h, 1);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream h)
{
    return copy_async(dst != NULL && src != 0, n, h, 0);
}

CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream h)
{
    return copy_async(dst != NULL && src != 0, n, h, 1);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h)
{
    return copy_async(dst != 0 && src != 0, n, h, 0);
}

CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h)
{
    return copy_async(dst != 0 && src != 0, n, h, 1);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream h)
{
    (void)uc;
    return copy_async(dst != 0, n, h, 0);
}

CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char uc, size_t n, CUstream h)
{
    (void)uc;
    return copy_async(dst != 0, n, h, 1);
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t n, CUstream h)
{
    (void)ui;
    return copy_async(dst != 0 && n <= SIZE_MAX / 4, (uint64_t)n * 4u, h, 0);
}

CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int ui, size_t n, CUstream h)
{
    (void)ui;
    return copy_async(dst != 0 && n <= SIZE_MAX / 4, (uint64_t)n * 4u, h, 1);
}
