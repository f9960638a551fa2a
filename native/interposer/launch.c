/*
 * launch.c - the governor's decisions carried out at launch; bounded in-flight work; GPU time.
 *
 * Gated calls (hooks.h): kernel launches (plain, Ex, cooperative), graph launches, async
 * copies and memsets, and their _ptsz variants. cuStreamSynchronize(_ptsz) and
 * cuCtxSynchronize are not gated; they retire completed work right after the driver returns,
 * so a program that ends with a synchronize has all of its GPU time counted.
 *
 * Fast path, gate open: one acquire load of seg->gate, a relaxed store of last_launch_ns
 * (CLOCK_MONOTONIC through the vDSO), relaxed counter bumps, the driver call, and one event
 * recorded after it. No system call, no allocation once the event pool is warm, no logging,
 * no cross-process lock. The in-flight ring is guarded by a process-local mutex (uncontended:
 * two atomic operations, no system call) that is never held across a driver launch.
 *
 * Closed gate (segment flag FGPU_SEG_GATING): procs[me].waiting and gate_waits go up, the
 * thread sleeps on the gate word (FUTEX_WAIT, shared: the agent's FUTEX_WAKE comes from
 * another process), waking every 1 ms while this process has work in flight to retire it, so
 * the agent sees inflight drop; then waiting goes down.
 *
 * In flight: after each gated call an event (from a per-context pool, default flags so it
 * times) is recorded on the same stream and kept in a ring. Completed events are retired on
 * each gated call (cuEventQuery == CUDA_SUCCESS). Before a call, while max_inflight (0 = no
 * bound but the ring's 256) events are outstanding, the oldest is waited for with
 * cuEventSynchronize. procs[me].inflight mirrors the ring's length.
 *
 * GPU time: each call is measured from a start event to its end event. The start is the end
 * event of the previous call on the same stream when that one was still outstanding at the
 * last retire (the stream never went idle between them), else an event recorded just before
 * the call. What is counted: the time from the stream reaching the call to its completion,
 * so time spent queued behind other processes' kernels on the device is included, and work
 * on overlapping streams of one process is counted once per stream (the agent caps a
 * workload's charge at wall time). Per-thread default streams always get their own start.
 */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fgpu.h"

#define RING 256
#define POOLS 16
#define POOL_CAP 512

struct entry {
    uint64_t seq;
    CUevent start;  /* owned by this entry (its own, or a predecessor's shared end) */
    CUevent end;
    CUstream stream;
    CUcontext ctx;
    int gpu;
    int ptd;        /* per-thread default stream: never shares its end */
    int end_shared; /* a successor took our end as its start and will release it */
    int dead;       /* context destroyed: nothing to query */
};

struct fgpu_pool {
    CUcontext ctx;
    int gpu;
    int n;
    CUevent ev[POOL_CAP];
};

static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry ring[RING];
static unsigned ring_head; /* index of the oldest entry */
static unsigned ring_count;
static uint64_t ring_seq;
static struct fgpu_pool pools[POOLS];
static _Thread_local struct fgpu_pool *tl_pool;
static _Thread_local CUcontext tl_ctx;

/* --------------------------------------------------------------- events (ring_lock held) */

static CUevent pool_get(struct fgpu_pool *pl)
{
    if (pl->n > 0)
        return pl->ev[--pl->n];
    CUevent e = NULL;
    if (fgpu_real.cuEventCreate == NULL || fgpu_real.cuEventCreate(&e, CU_EVENT_DEFAULT) != 0)
        return NULL;
    return e;
}

static void pool_put(struct fgpu_pool *pl, CUevent e)
{
    if (e == NULL || pl == NULL || pl->ctx == NULL)
        return; /* its context was destroyed, and its events with it */
    if (pl->n < POOL_CAP)
        pl->ev[pl->n++] = e;
    else if (fgpu_real.cuEventDestroy_v2 != NULL)
        fgpu_real.cuEventDestroy_v2(e);
}

static struct fgpu_pool *pool_of(CUcontext ctx)
{
    struct fgpu_pool *free_slot = NULL;
    for (int i = 0; i < POOLS; i++) {
        if (pools[i].ctx == ctx)
            return &pools[i];
        if (pools[i].ctx == NULL && free_slot == NULL)
            free_slot = &pools[i];
    }
    if (free_slot == NULL)
        return NULL;
    free_slot->ctx = ctx;
    free_slot->n = 0;
    free_slot->gpu = fgpu_gpu_of_current();
    return free_slot;
}

static struct entry *ring_at(unsigned i) { return &ring[(ring_head + i) % RING]; }

static struct entry *find_seq(uint64_t seq)
{
    for (unsigned i = 0; i < ring_count; i++) {
        if (ring_at(i)->seq == seq)
            return ring_at(i);
    }
    return NULL;
}

static struct fgpu_pool *pool_find(CUcontext ctx)
{
    for (int i = 0; i < POOLS; i++) {
        if (pools[i].ctx == ctx && ctx != NULL)
            return &pools[i];
    }
    return NULL;
}

/* Account and drop the oldest entry; its events go back to the pool. */
static void retire_oldest(int p)
{
    struct entry *e = ring_at(0);
    struct fgpu_seg *s = fgpu_g.seg;
    if (!e->dead) {
        float ms = 0.0f;
        if (e->start != NULL && e->gpu >= 0 &&
            fgpu_real.cuEventElapsedTime(&ms, e->start, e->end) == CUDA_SUCCESS && ms > 0.0f)
            atomic_fetch_add_explicit(&s->gpus[e->gpu].gpu_time_ns,
                                      (uint64_t)((double)ms * 1e6 + 0.5), memory_order_relaxed);
        struct fgpu_pool *pl = pool_find(e->ctx);
        pool_put(pl, e->start);
        if (!e->end_shared)
            pool_put(pl, e->end);
    }
    ring_head = (ring_head + 1) % RING;
    ring_count--;
    if (p >= 0)
        atomic_fetch_sub_explicit(&s->procs[p].inflight, 1, memory_order_relaxed);
}

static void retire_ready(int p)
{
    while (ring_count > 0) {
        struct entry *e = ring_at(0);
        if (!e->dead && fgpu_real.cuEventQuery(e->end) == CUDA_ERROR_NOT_READY)
            return;
        retire_oldest(p);
    }
}

/* --------------------------------------------------------------- gate */

/* Closed and its agent alive. Where the segment carries the agent's heartbeat
 * (FGPU_SEG_STALE_NS), a gate whose agent has been silent longer than that counts as open:
 * a dead agent must not hold its workloads forever. */
static int gate_closed(struct fgpu_seg *s)
{
    /* acquire: pairs with the agent's release store when it opens the gate */
    if (atomic_load_explicit(&s->gate, memory_order_acquire) == FGPU_GATE_OPEN)
        return 0;
#ifdef FGPU_SEG_STALE_NS
    uint64_t beat = atomic_load_explicit(&s->agent_beat_ns, memory_order_relaxed);
    uint64_t now = fgpu_now_ns();
    if (now > beat && now - beat > FGPU_SEG_STALE_NS)
        return 0;
#endif
    return 1;
}

static void gate_wait(int p)
{
    struct fgpu_seg *s = fgpu_g.seg;
    atomic_fetch_add_explicit(&s->gate_waits, 1, memory_order_relaxed);
    if (p >= 0)
        atomic_fetch_add_explicit(&s->procs[p].waiting, 1, memory_order_relaxed);
    while (gate_closed(s)) {
        pthread_mutex_lock(&ring_lock);
        retire_ready(p);
        int busy = ring_count > 0;
        pthread_mutex_unlock(&ring_lock);
        struct timespec ts = {0, busy ? 1000000L : 100000000L};
        /* shared futex (no FUTEX_PRIVATE_FLAG): the waker is the agent, another process */
        syscall(SYS_futex, (uint32_t *)&s->gate, FUTEX_WAIT, FGPU_GATE_CLOSED, &ts, NULL, 0);
    }
    if (p >= 0)
        atomic_fetch_sub_explicit(&s->procs[p].waiting, 1, memory_order_relaxed);
}

static CUresult record(CUevent e, CUstream s, int ptsz)
{
    if (ptsz && s == NULL) {
        if (fgpu_real.cuEventRecord_ptsz != NULL)
            return fgpu_real.cuEventRecord_ptsz(e, s);
        s = CU_STREAM_PER_THREAD;
    }
    return fgpu_real.cuEventRecord(e, s);
}

/* --------------------------------------------------------------- before / after */

void fgpu_launch_before(struct fgpu_tok *t, CUstream stream, int ptsz)
{
    t->go = 0;
    if (!fgpu_g.active)
        return;
    struct fgpu_seg *s = fgpu_g.seg;
    int p = fgpu_proc();
    if (fgpu_g.gating && gate_closed(s))
        gate_wait(p);
    /* relaxed: a time stamp the agent reads as "busy lately"; no ordering needed */
    atomic_store_explicit(&s->last_launch_ns, fgpu_now_ns(), memory_order_relaxed);
    if (fgpu_real.cuEventRecord == NULL || fgpu_real.cuEventQuery == NULL ||
        fgpu_real.cuEventElapsedTime == NULL || fgpu_real.cuCtxGetCurrent == NULL)
        return;
    CUcontext ctx = NULL;
    if (fgpu_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return;
    int ptd = (ptsz && stream == NULL) || stream == CU_STREAM_PER_THREAD;
    pthread_mutex_lock(&ring_lock);
    struct fgpu_pool *pl = (tl_ctx == ctx && tl_pool != NULL && tl_pool->ctx == ctx) ? tl_pool
                                                                              : pool_of(ctx);
    if (pl == NULL) {
        pthread_mutex_unlock(&ring_lock);
        return;
    }
    tl_ctx = ctx;
    tl_pool = pl;
    retire_ready(p);
    uint32_t max = atomic_load_explicit(&s->max_inflight, memory_order_relaxed);
    while (ring_count >= RING || (max != 0 && ring_count >= max)) {
        struct entry *e = ring_at(0);
        if (!e->dead)
            fgpu_real.cuEventSynchronize(e->end);
        retire_oldest(p);
    }
    t->pool = pl;
    t->stream = stream;
    t->ptsz = ptsz;
    t->start = NULL;
    t->pred_seq = 0;
    if (!ptd) {
        for (unsigned i = ring_count; i-- > 0;) {
            struct entry *e = ring_at(i);
            if (e->dead || e->ptd || e->ctx != ctx || e->stream != stream)
                continue;
            /* still running? retire_ready stopped at the oldest entry that was not done, so
             * if everything older is on this same stream, this one is not done either;
             * otherwise ask (it may have finished behind another stream's work) */
            int mixed = 0;
            for (unsigned k = 0; k < i && !mixed; k++) {
                struct entry *o = ring_at(k);
                mixed = o->dead || o->ptd || o->ctx != ctx || o->stream != stream;
            }
            int busy = !mixed || fgpu_real.cuEventQuery(e->end) == CUDA_ERROR_NOT_READY;
            if (busy && !e->end_shared) {
                e->end_shared = 1;
                t->start = e->end;
                t->pred_seq = e->seq;
            }
            break;
        }
    }
    CUevent own = t->start == NULL ? pool_get(pl) : NULL;
    pthread_mutex_unlock(&ring_lock);
    if (own != NULL) {
        if (record(own, stream, ptsz) == CUDA_SUCCESS) {
            t->start = own;
        } else {
            pthread_mutex_lock(&ring_lock);
            pool_put(pl, own);
            pthread_mutex_unlock(&ring_lock);
        }
    }
    t->go = 1;
}

/* Give the start event back when the call failed (ring_lock held). */
static void drop_start(struct fgpu_tok *t)
{
    if (t->pred_seq != 0) {
        struct entry *pred = find_seq(t->pred_seq);
        if (pred != NULL)
            pred->end_shared = 0; /* the predecessor releases its own end again */
        else
            pool_put(t->pool, t->start);
    } else {
        pool_put(t->pool, t->start);
    }
}

void fgpu_launch_after(struct fgpu_tok *t, CUresult r)
{
    if (!t->go)
        return;
    struct fgpu_seg *s = fgpu_g.seg;
    pthread_mutex_lock(&ring_lock);
    if (r != CUDA_SUCCESS) {
        drop_start(t);
        pthread_mutex_unlock(&ring_lock);
        return;
    }
    atomic_fetch_add_explicit(&s->launches, 1, memory_order_relaxed);
    CUevent end = pool_get(t->pool);
    pthread_mutex_unlock(&ring_lock);
    CUresult rr = end != NULL ? record(end, t->stream, t->ptsz) : CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&ring_lock);
    if (rr != CUDA_SUCCESS || ring_count >= RING || t->pool->ctx == NULL) {
        pool_put(t->pool, end);
        drop_start(t);
        pthread_mutex_unlock(&ring_lock);
        return;
    }
    struct entry *e = &ring[(ring_head + ring_count) % RING];
    *e = (struct entry){.seq = ++ring_seq,
                        .start = t->start,
                        .end = end,
                        .stream = t->stream,
                        .ctx = t->pool->ctx,
                        .gpu = t->pool->gpu,
                        .ptd = (t->ptsz && t->stream == NULL) || t->stream == CU_STREAM_PER_THREAD};
    ring_count++;
    int p = fgpu_proc();
    if (p >= 0)
        atomic_fetch_add_explicit(&s->procs[p].inflight, 1, memory_order_relaxed);
    pthread_mutex_unlock(&ring_lock);
}

void fgpu_launch_forget_context(CUcontext ctx)
{
    if (!fgpu_g.active)
        return;
    pthread_mutex_lock(&ring_lock);
    for (unsigned i = 0; i < ring_count; i++) {
        struct entry *e = ring_at(i);
        if (e->ctx == ctx)
            e->dead = 1; /* retired (without time) at the next gated call */
    }
    for (int i = 0; i < POOLS; i++) {
        if (pools[i].ctx == ctx) {
            pools[i].ctx = NULL; /* its events die with the context */
            pools[i].n = 0;
        }
    }
    pthread_mutex_unlock(&ring_lock);
}

void fgpu_launch_atfork_child(void)
{
    pthread_mutex_init(&ring_lock, NULL);
    ring_head = 0;
    ring_count = 0;
    for (int i = 0; i < POOLS; i++) {
        pools[i].ctx = NULL;
        pools[i].n = 0;
    }
    tl_pool = NULL;
    tl_ctx = NULL;
}

/* --------------------------------------------------------------- retire points */

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
    CUresult r = fgpu_real.cuStreamSynchronize(hStream);
    retire_now();
    return r;
}

FGPU_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    FGPU_REAL_OR(cuStreamSynchronize_ptsz, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = fgpu_real.cuStreamSynchronize_ptsz(hStream);
    retire_now();
    return r;
}

FGPU_EXPORT CUresult cuCtxSynchronize(void)
{
    FGPU_REAL_OR(cuCtxSynchronize, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = fgpu_real.cuCtxSynchronize();
    retire_now();
    return r;
}

/* CUDA 13's form (what cuGetProcAddress answers for cuCtxSynchronize at 13000) */
FGPU_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    FGPU_REAL_OR(cuCtxSynchronize_v2, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = fgpu_real.cuCtxSynchronize_v2(ctx);
    retire_now();
    return r;
}
