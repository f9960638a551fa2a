/*
 * limits.c - fake driver (a STAND-IN for tests, see fake.h): context limits (cuCtxSetLimit,
 * cuCtxGetLimit) of the current context. The malloc heap takes device memory (released with
 * the context, context.c).
 */
#include <string.h>

#include "fake.h"

/* cuCtxGetLimit before any cuCtxSetLimit (the real driver's defaults on current GPUs):
 * stack 1 KiB, printf FIFO 1 MiB, malloc heap 8 MiB, sync depth 2, pending launches 2048,
 * L2 fetch granularity 32, persisting L2 0. */
static const size_t limit_defaults[7] = {1024, 1u << 20, 8u << 20, 2, 2048, 32, 0};

void fk_ctx_limits_init(struct fk_ctx *c)
{
    memcpy(c->limits, limit_defaults, sizeof c->limits);
}

/* Limits of the current context. CU_LIMIT_MALLOC_HEAP_SIZE takes device memory: setting it
 * takes the new size (or gives back the difference) at once; the default heap is not taken
 * (the real driver takes it unasked, at the first launch that needs it). */
CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    struct fk_ctx *c;
    CUresult rc = fk_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((unsigned)limit >= sizeof c->limits / sizeof c->limits[0])
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    if (limit != CU_LIMIT_MALLOC_HEAP_SIZE) {
        c->limits[limit] = value;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&fk_g.lock);
    if (value > c->heap_reserved)
        rc = fk_reserve(c->gpu, value - c->heap_reserved);
    else
        fk_release(c->gpu, c->heap_reserved - value);
    if (rc == CUDA_SUCCESS) {
        c->heap_reserved = value;
        c->limits[limit] = value;
    }
    pthread_mutex_unlock(&fk_g.lock);
    return rc;
}

CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    struct fk_ctx *c;
    if (pvalue == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((unsigned)limit >= sizeof c->limits / sizeof c->limits[0])
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    *pvalue = c->limits[limit];
    return CUDA_SUCCESS;
}
