/*
 * launch_sync.c - the synchronize hooks: cuStreamSynchronize(_ptsz), cuCtxSynchronize and
 * cuCtxSynchronize_v2. They are not gated; they close the open tails (launch_ring.c) of what
 * they wait for before the driver call and retire completed work right after it, so a
 * program that ends with a synchronize has all of its GPU time counted.
 */
#include <pthread.h>

#include "launch_int.h"

/* Before a synchronize: close the tails it waits for (all of a context's, or a stream's).
 * sync_ctx: the context a cuCtxSynchronize_v2 names (NULL: the current one); another
 * context's tails are closed as a closed gate closes them (made current for the record). */
static void close_before_sync_ctx(int all, CUstream stream, CUcontext sync_ctx)
{
    if (!fgpu_g.active || fgpu_real.cuEventQuery == NULL || fgpu_real.cuEventRecord == NULL)
        return;
    pthread_mutex_lock(&ring_lock);
    joins_flush();
    int any = open_tails > 0;
    pthread_mutex_unlock(&ring_lock);
    if (!any)
        return;
    CUcontext ctx = current_ctx();
    pthread_mutex_lock(&ring_lock);
    if (sync_ctx == NULL || sync_ctx == ctx) {
        tails_close(ctx, all, stream, fgpu_proc());
    } else {
        int p = fgpu_proc();
        for (int i = 0; i < LANES && open_tails > 0; i++) {
            struct fgpu_lane *l = &lanes[i];
            if (lane_tail(l) == 0 ||
                atomic_load_explicit(&l->ctx, memory_order_relaxed) != sync_ctx)
                continue;
            if (fgpu_real.cuCtxSetCurrent != NULL &&
                fgpu_real.cuCtxSetCurrent(sync_ctx) == CUDA_SUCCESS) {
                tail_close(l, p);
                fgpu_real.cuCtxSetCurrent(ctx);
            }
        }
    }
    pthread_mutex_unlock(&ring_lock);
}

static void close_before_sync(int all, CUstream stream) { close_before_sync_ctx(all, stream, NULL); }

static void retire_now(void)
{
    if (!fgpu_g.active || fgpu_real.cuEventQuery == NULL)
        return;
    pthread_mutex_lock(&ring_lock);
    retire_ready(fgpu_proc());
    pthread_mutex_unlock(&ring_lock);
}

FGPU_EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
    FGPU_REAL_OR(cuStreamSynchronize, CUDA_ERROR_NOT_INITIALIZED);
    if (hStream != CU_STREAM_PER_THREAD)
        close_before_sync(0, hStream);
    CUresult r = fgpu_real.cuStreamSynchronize(hStream);
    retire_now();
    return r;
}

FGPU_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    FGPU_REAL_OR(cuStreamSynchronize_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    if (hStream != NULL && hStream != CU_STREAM_PER_THREAD)
        close_before_sync(0, hStream);
    CUresult r = fgpu_real.cuStreamSynchronize_ptsz(hStream);
    retire_now();
    return r;
}

FGPU_EXPORT CUresult cuCtxSynchronize(void)
{
    FGPU_REAL_OR(cuCtxSynchronize, CUDA_ERROR_NOT_INITIALIZED);
    close_before_sync(1, NULL);
    CUresult r = fgpu_real.cuCtxSynchronize();
    retire_now();
    return r;
}

/* CUDA 13's form (what cuGetProcAddress answers for cuCtxSynchronize at 13000) */
FGPU_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    FGPU_REAL_OR(cuCtxSynchronize_v2, CUDA_ERROR_NOT_INITIALIZED);
    close_before_sync_ctx(1, NULL, ctx);
    CUresult r = fgpu_real.cuCtxSynchronize_v2(ctx);
    retire_now();
    return r;
}
