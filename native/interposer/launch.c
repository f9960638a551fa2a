/*
 * launch.c - the governor's decisions carried out at launch: the gate, and the launch path
 * (fgpu_launch_before / fgpu_launch_after around each gated call).
 *
 * Gated calls (hooks.h, launch_hooks.c): kernel launches (plain, Ex, cooperative), graph
 * launches, async copies and memsets, and their _ptsz variants. The synchronize calls are not
 * gated (launch_sync.c).
 *
 * Files, one concern each (launch_int.h holds what they share, and the small helpers the
 * launch path calls as static inline functions, so the split adds no call to the hot path):
 *   launch.c       the gate, and the launch path before and after a gated call
 *   launch_ring.c  in flight: the ring of entries, event pools, lanes and their tails;
 *                  retiring (GPU time), context destroy, fork
 *   launch_sync.c  the synchronize hooks: close tails before, retire after
 *
 * Closed gate (segment flag FGPU_SEG_GATING): procs[me].waiting and gate_waits go up, the
 * thread closes the open tails (of every context), then sleeps on the gate word (FUTEX_WAIT, shared:
 * the agent's FUTEX_WAKE comes from another process), waking every 1 ms while this process
 * has work in flight to retire it, so the agent sees inflight drop; then waiting goes down.
 *
 * An entry made by a call: its start is the end event of the stream's latest entry when that
 * one is still outstanding (the stream never went idle between them), else an event recorded
 * just before the call; its end is recorded right after. What is counted: from the stream
 * reaching the call to its completion, so time queued behind other processes' kernels on the
 * device is included, and overlapping streams of one process each count their own time (the
 * agent caps a workload's charge at wall time). Per-thread default streams always get their
 * own start and never form tails.
 * (Entries, lanes and tails, and why GPU time and the in-flight bound stay exact: launch_ring.c.)
 *
 * Hot path, gate open, joining a tail: one acquire load of seg->gate, the current context
 * (cuCtxGetCurrent: the stream NULL means the current context's), loads of the lane, the
 * driver call, one load after it. No system call, no allocation, no logging, no lock, no
 * event. A call that takes ring_lock (process-local, uncontended: no system call) stamps
 * last_launch_ns (the coarse clock, at most a tick behind), retires, and records at most two
 * events; the lock is never held across the launch itself, only across cuEventRecord when
 * closing a tail and across the cuEventSynchronize that enforces max_inflight.
 */
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "launch_int.h"

/* --------------------------------------------------------------- gate */

/* Closed and its agent alive. Where the segment carries the agent's heartbeat
 * (FGPU_SEG_STALE_NS), a gate whose agent has been silent longer than that counts as open:
 * a dead agent must not hold its workloads forever. */
static int gate_closed(const struct fgpu_seg_ctl *c)
{
    /* acquire: pairs with the agent's release store when it opens the gate */
    if (atomic_load_explicit(&c->gate, memory_order_acquire) == FGPU_GATE_OPEN)
        return 0;
#ifdef FGPU_SEG_STALE_NS
    uint64_t beat = atomic_load_explicit(&c->agent_beat_ns, memory_order_relaxed);
    uint64_t now = fgpu_now_ns();
    if (now > beat && now - beat > FGPU_SEG_STALE_NS)
        return 0;
#endif
    return 1;
}

static __attribute__((noinline, cold)) void gate_wait(int p)
{
    struct fgpu_seg *s = fgpu_g.seg;
    atomic_fetch_add_explicit(&s->gate_waits, 1, memory_order_relaxed);
    if (p >= 0)
        atomic_fetch_add_explicit(&s->procs[p].waiting, 1, memory_order_relaxed);
    CUcontext ctx = current_ctx();
    int closed = 0;
    while (gate_closed(fgpu_g.ctl)) {
        pthread_mutex_lock(&ring_lock);
        joins_flush();
        if (!closed) /* so the agent sees the tails drain like any entry */
            tails_close_all(ctx, p);
        closed = 1;
        retire_ready(p);
        int busy = ring_count > 0 || open_tails > 0;
        pthread_mutex_unlock(&ring_lock);
        struct timespec ts = {0, busy ? 1000000L : 100000000L};
        /* shared futex (no FUTEX_PRIVATE_FLAG): the waker is the agent, another process */
        /* on the read-only control page: FUTEX_WAIT only reads the word */
        syscall(SYS_futex, (const uint32_t *)&fgpu_g.ctl->gate, FUTEX_WAIT, FGPU_GATE_CLOSED,
                &ts, NULL, 0);
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

/* The lock-free join (the hot path): count the call in the open tail of (ctx, stream) when
 * one is open, the thread asked the driver about the tail's start within this clock tick, and
 * the tail stays within TAIL_SPAN_NS of estimated work. Only loads and thread-local stores: the
 * count is reported at the thread's next call under ring_lock (joins_flush). */
static struct fgpu_lane *tail_join_fast(CUcontext ctx, CUstream stream, struct fgpu_tok *t)
{
    struct fgpu_lane *l = tj.lane;
    if (l == NULL)
        return NULL;
    /* acquire: pairs with the release store that opened the tail (identity, start); the
     * identity is read after it, so a lane that changed hands shows a new generation */
    uint64_t w = atomic_load_explicit(&l->word, memory_order_acquire);
    uint32_t n = (uint32_t)w;
    if (n == 0 || !lane_is(l, ctx, stream))
        return NULL;
    if ((uint32_t)(w >> 32) != tj.gen) {
        if (tj.unflushed != 0)
            return NULL; /* joins of an earlier tail to report first */
        tj.gen = (uint32_t)(w >> 32);
    }
    if ((tj.unflushed & (TICK_EVERY - 1)) == 0 && stamp_ns() != tj.tick)
        return NULL; /* a new tick: the program may have paused, ask about the start */
    /* relaxed: an estimate, written at retire */
    uint64_t est = atomic_load_explicit(&l->est_ns, memory_order_relaxed);
    if (est == EST_UNKNOWN || (uint64_t)(n + tj.unflushed + 1) * est >= TAIL_SPAN_NS)
        return NULL;
    tj.unflushed++;
    t->tail_word = &l->word;
    t->word_seen = w;
    return l;
}

/* last_launch_ns, which the agent reads as "busy lately" against an idle window of 50 ms
 * (fgpu.agent.governor.gate.DEFAULT_IDLE_NS): the coarse clock, at most one tick behind.
 * Relaxed: a time stamp, no ordering. Stored when it moved, so launches do not keep the
 * agent's line dirty. Returns the time stamp. */
static uint64_t stamp_launch(struct fgpu_seg *s)
{
    uint64_t now = stamp_ns();
    if (atomic_load_explicit(&s->last_launch_ns, memory_order_relaxed) != now)
        atomic_store_explicit(&s->last_launch_ns, now, memory_order_relaxed);
    return now;
}

static void launch_before_locked(struct fgpu_tok *t, CUstream stream, int ptsz, CUcontext ctx,
                                 int ptd, uint32_t max);

void fgpu_launch_before(struct fgpu_tok *t, CUstream stream, int ptsz)
{
    t->go = 0;
    if (!fgpu_g.active)
        return;
    struct fgpu_seg *s = fgpu_g.seg;
    if (fgpu_g.gating && gate_closed(fgpu_g.ctl))
        gate_wait(fgpu_proc());
    if (fgpu_real.cuEventRecord == NULL || fgpu_real.cuEventQuery == NULL ||
        fgpu_real.cuEventElapsedTime == NULL || fgpu_real.cuCtxGetCurrent == NULL) {
        stamp_launch(s);
        return;
    }
    CUcontext ctx = NULL;
    if (fgpu_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL) {
        stamp_launch(s);
        return;
    }
    int ptd = (ptsz && stream == NULL) || stream == CU_STREAM_PER_THREAD;
    /* relaxed: one value the agent sets; a call that reads the old one is as if it came
     * just before the change */
    uint32_t max = atomic_load_explicit(&fgpu_g.ctl->max_inflight, memory_order_relaxed);
    if (!ptd && (t->lane = tail_join_fast(ctx, stream, t)) != NULL) {
        t->go = FGPU_TOK_JOINED;
        t->ctx = ctx;
        t->stream = stream;
        return; /* last_launch_ns was stamped in this tick; the open tail keeps inflight up */
    }
    launch_before_locked(t, stream, ptsz, ctx, ptd, max);
}

/* The rest of fgpu_launch_before, under ring_lock: not inlined, so the lock-free join above
 * stays a small function. */
static __attribute__((noinline)) void launch_before_locked(struct fgpu_tok *t, CUstream stream,
                                                           int ptsz, CUcontext ctx, int ptd,
                                                           uint32_t max)
{
    struct fgpu_seg *s = fgpu_g.seg;
    uint64_t now = stamp_launch(s);
    int p = fgpu_proc();
    pthread_mutex_lock(&ring_lock);
    joins_flush();
    tj.tick = now;
    struct fgpu_pool *pl = (tl_ctx == ctx && tl_pool != NULL && tl_pool->ctx == ctx) ? tl_pool
                                                                              : pool_of(ctx);
    if (pl == NULL) {
        pthread_mutex_unlock(&ring_lock);
        t->go = 0;
        return;
    }
    tl_ctx = ctx;
    tl_pool = pl;
    struct fgpu_lane *lane = ptd ? NULL : lane_get(ctx, stream, pl);
    t->lane = lane;
    t->ctx = ctx;
    t->stream = stream;
    int joined = lane != NULL ? tail_join(lane, max, p) : 0;
    if (joined) {
        t->go = joined == 2 ? 3 : 2; /* 3: the tail is full, it closes right after the call */
        pthread_mutex_unlock(&ring_lock);
        return;
    }
    if (lane != NULL)
        tail_close(lane, p);
    retire_ready(p);
    if (max != 0) /* every tail of this context counts as one operation, then the bound */
        tails_close(ctx, 1, NULL, p);
    while (ring_count >= RING || (max != 0 && ring_count > 0 && ring_count + open_tails >= max))
        retire_wait(p);
    t->pool = pl;
    t->stream = stream;
    t->ptsz = ptsz;
    t->lane = lane;
    t->ctx = ctx;
    t->start = NULL;
    t->pred_seq = 0;
    struct entry *pred = lane != NULL ? find_seq(lane->last_seq) : NULL;
    if (pred != NULL && !pred->dead && !pred->end_shared &&
        fgpu_real.cuEventQuery(pred->end) == CUDA_ERROR_NOT_READY) {
        pred->end_shared = 1; /* still running: the stream is busy up to our call */
        t->start = pred->end;
        t->pred_seq = pred->seq;
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

/* The lane t counted on, if it still is that (context, stream) (ring_lock held). */
static struct fgpu_lane *tok_lane(struct fgpu_tok *t)
{
    struct fgpu_lane *l = t->lane;
    return l != NULL && lane_is(l, t->ctx, t->stream) ? l : NULL;
}

/* A lock-free join whose tail another thread closed while the driver call ran (ring_lock
 * held): if the close's end event went before the call, the call needs an end event of its
 * own. A tail open again now closes after the call; else an entry from the lane's latest end
 * event (the close's: exact when still pending, capped otherwise), or, when that one is gone,
 * an entry without a start (not timed, but in flight until the call completes). */
static void cover_late(struct fgpu_tok *t, int p)
{
    struct fgpu_lane *l = tok_lane(t);
    if (l == NULL || lane_tail(l) > 0)
        return; /* lane gone with its context, or a tail open that ends after the call */
    struct entry *pred = find_seq(l->last_seq);
    CUevent start = NULL;
    int exact = 0;
    if (pred != NULL && !pred->dead && !pred->ptd && !pred->end_shared) {
        exact = fgpu_real.cuEventQuery(pred->end) == CUDA_ERROR_NOT_READY;
        start = pred->end;
    }
    while (ring_count >= RING)
        retire_wait(p);
    pred = find_seq(l->last_seq); /* (retire_wait may have retired it: then it completed) */
    if (pred == NULL || pred->end_shared || pred->end != start)
        start = NULL;
    CUevent end = pool_get(l->pool);
    CUstream stream = atomic_load_explicit(&l->stream, memory_order_relaxed);
    if (end == NULL || fgpu_real.cuEventRecord(end, stream) != CUDA_SUCCESS) {
        pool_put(l->pool, end);
        return;
    }
    if (start != NULL)
        pred->end_shared = 1;
    struct entry *e = push_entry();
    e->start = start;
    e->end = end;
    e->stream = stream;
    e->ctx = t->ctx;
    e->gpu = l->pool->gpu;
    if (start != NULL && !exact) {
        uint64_t est = atomic_load_explicit(&l->est_ns, memory_order_relaxed);
        e->capped = 1;
        e->cap_ns = est == EST_UNKNOWN ? 0 : est;
    }
    l->last_seq = e->seq;
    if (p >= 0)
        atomic_fetch_add_explicit(&fgpu_g.seg->procs[p].inflight, 1, memory_order_relaxed);
}

void fgpu_launch_after(struct fgpu_tok *t, CUresult r)
{
    if (!t->go)
        return;
    struct fgpu_seg *s = fgpu_g.seg;
    if (t->go == FGPU_TOK_JOINED) { /* joined lock-free: reported at the next locked call */
        if (r != CUDA_SUCCESS) {
            if (tj.unflushed > 0)
                tj.unflushed--;
            return;
        }
        pthread_mutex_lock(&ring_lock); /* the tail ended while the call ran */
        cover_late(t, fgpu_proc());
        pthread_mutex_unlock(&ring_lock);
        return;
    }
    if (t->go >= 2) {
        /* joined a tail under ring_lock: nothing to record; counted when the tail closes. A
         * call the driver refused stays among the tail's calls (which only scale the cap of
         * a capped tail) and is taken off the launches then. */
        if (r == CUDA_SUCCESS && t->go == 2)
            return;
        pthread_mutex_lock(&ring_lock);
        struct fgpu_lane *l = tok_lane(t);
        int p = fgpu_proc();
        if (l != NULL && r != CUDA_SUCCESS && lane_tail(l) > 0)
            l->failed++;
        if (t->go == 3) { /* the full tail's end event goes right after its last call */
            joins_flush();
            if (l != NULL)
                tail_close(l, p);
            retire_ready(p);
        }
        pthread_mutex_unlock(&ring_lock);
        return;
    }
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
    struct entry *e = push_entry();
    e->start = t->start;
    e->end = end;
    e->stream = t->stream;
    e->ctx = t->pool->ctx;
    e->gpu = t->pool->gpu;
    e->ptd = (t->ptsz && t->stream == NULL) || t->stream == CU_STREAM_PER_THREAD;
    struct fgpu_lane *l = tok_lane(t);
    if (l != NULL && lane_tail(l) == 0)
        l->last_seq = e->seq; /* (a tail opened meanwhile keeps its own start) */
    int p = fgpu_proc();
    if (p >= 0)
        atomic_fetch_add_explicit(&s->procs[p].inflight, 1, memory_order_relaxed);
    pthread_mutex_unlock(&ring_lock);
}
