/*
 * versions.c - fake driver (a STAND-IN for tests, see fake.h): the newer versioned forms a
 * real CUDA 13.0 driver answers from cuGetProcAddress (cuCtxCreate_v3/_v4, cuCtxGetDevice_v2,
 * cuCtxSynchronize_v2, cuEventElapsedTime_v2), the synchronous copies and memsets on the
 * per-thread default stream (_ptds), and cuGetExportTable. Each is the older form's behaviour
 * with the newer prototype.
 */
#include <stdlib.h>

#include "fake.h"

#ifdef FK_TRACE
void fk_trace_export_table(const CUuuid *id, CUresult r); /* native/tests/cutrace.c */
#endif

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev)
{
    /* a real driver limits the context's SMs; the fake models no SMs, but checks the list */
    if (numParams < 0 || (numParams > 0 && paramsArray == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < numParams; i++) {
        if (paramsArray[i].type != CU_EXEC_AFFINITY_TYPE_SM_COUNT)
            return CUDA_ERROR_INVALID_VALUE;
    }
    return cuCtxCreate_v2(pctx, flags, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                        CUdevice dev)
{
    if (ctxCreateParams == NULL)
        return cuCtxCreate_v2(pctx, flags, dev);
    if (ctxCreateParams->cigParams != NULL)
        return CUDA_ERROR_NOT_SUPPORTED; /* CUDA in graphics: no graphics on the fake */
    return cuCtxCreate_v3(pctx, ctxCreateParams->execAffinityParams,
                          ctxCreateParams->numExecAffinityParams, flags, dev);
}

/* ctx, or the calling thread's context when ctx is NULL; CUDA_ERROR_INVALID_CONTEXT when
 * ctx is not a live context */
static CUresult ctx_or_current(CUcontext ctx, struct fk_ctx **out)
{
    if (ctx == NULL)
        return fk_current(out);
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_ctx *c = (struct fk_ctx *)ctx;
    pthread_mutex_lock(&fk_g.lock);
    int ok = fk_ctx_valid(c);
    pthread_mutex_unlock(&fk_g.lock);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    struct fk_ctx *c;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = ctx_or_current(ctx, &c);
    if (rc == CUDA_SUCCESS)
        *device = c->dev;
    return rc;
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    struct fk_ctx *c;
    CUresult rc = ctx_or_current(ctx, &c);
    if (rc == CUDA_SUCCESS)
        fk_ctx_sync(c);
    return rc;
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime(pMilliseconds, hStart, hEnd);
}

/* a synchronous copy on the per-thread default stream: enqueue there, wait for it */
static CUresult sync_ptds(CUresult rc)
{
    struct fk_stream *s;
    if (rc == CUDA_SUCCESS && (rc = fk_resolve_stream(CU_STREAM_PER_THREAD, 1, &s)) ==
                                  CUDA_SUCCESS)
        rc = fk_stream_sync(s);
    return rc;
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
    return sync_ptds(cuMemcpyHtoDAsync_v2_ptsz(dst, src, n, CU_STREAM_PER_THREAD));
}

CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
    return sync_ptds(cuMemcpyDtoHAsync_v2_ptsz(dst, src, n, CU_STREAM_PER_THREAD));
}

CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char uc, size_t n)
{
    return sync_ptds(cuMemsetD8Async_ptsz(dst, uc, n, CU_STREAM_PER_THREAD));
}

/* Private tables of NVIDIA's own libraries (the CUDA runtime asks for several by UUID). The
 * fake has none: CUDA_ERROR_NOT_FOUND, as a driver answers for an id it does not know. */
CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    CUresult rc = CUDA_ERROR_NOT_FOUND;
    if (ppExportTable == NULL || pExportTableId == NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    else
        *ppExportTable = NULL;
#ifdef FK_TRACE
    /* the tracing stand-in can answer another code, to find out what a caller tolerates */
    const char *v = getenv("FGPU_TRACE_EXPORT_TABLE_RESULT");
    if (rc != CUDA_ERROR_INVALID_VALUE && v != NULL && v[0] != '\0')
        rc = (CUresult)atoi(v);
    fk_trace_export_table(pExportTableId, rc);
#endif
    return rc;
}
