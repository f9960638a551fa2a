/*
 * launch_ring.c - in-flight work and GPU time: the ring of entries, the per-context event
 * pools, the lanes and their tails (all under ring_lock, but for the lane fields a lock-free
 * join reads), retiring completed entries into gpu_time_ns, and forgetting a destroyed
 * context's work and a forked child's. The launch path that calls into it: launch.c.
 *
 * In flight: entries of a ring, each a start and an end event (from a per-context pool,
 * default flags so they time) on one stream, covering one or more gated calls; and the open
 * tails below. procs[me].inflight counts operations: an entry or an open tail is one.
 * Completed entries are retired (cuEventQuery == CUDA_SUCCESS) by calls that take the lock,
 * at synchronizes and at a closed gate, adding end - start to gpu_time_ns.
 *
 * Lanes and tails: an event per call would cost about a second launch, so consecutive calls
 * on one stream share events. A lane is one (context, stream) that is not a per-thread
 * default stream. A call opens a tail on its lane when the lane's latest entry is still
 * NOT_READY (asked of the driver) and its calls were measured short (est_ns, the lane's latest
 * exact time per call, under TAIL_SPAN_NS): that entry's end becomes the tail's start. Calls
 * join the open tail with no driver call but the launch, lock-free (tail_join_fast): one
 * acquire load of the lane's word (generation << 32 | calls), thread-local counts reported at
 * the thread's next locked call, and every TICK_EVERY-th join a look at the coarse clock:
 * in a new tick (1-4 ms) the call takes the lock and asks the driver whether the start is
 * still NOT_READY before it joins. A tail ends - an end event recorded on its stream, making
 * an entry from its start to that event - when its start completed (the next call sees it),
 * after TAIL_MAX calls or TAIL_SPAN_NS of estimated work (then the last call records the end
 * right after itself), at a synchronize of its stream or context, at a closed gate, and before
 * a bounded call counts what is in flight.
 *
 * Why GPU time stays exact: if the tail's start is still NOT_READY when the tail ends, it was
 * NOT_READY when each call joined (events complete in order), so every call was queued while
 * the stream was busy, the stream ran from the start through the tail without a gap, and the
 * end event, queued behind the tail while the stream is still busy, makes end - start the
 * tail's time - what an event per call would have summed (ungated work queued between the
 * calls on that stream is counted, as between an entry and a successor sharing its end).
 * Only when the start had completed (the program waited by a means the interposer does not
 * see, e.g. cuEventSynchronize or a synchronous copy, then went on, or paused within a tick)
 * may the stream have idled inside or after the tail: then end - start is an upper bound, and
 * the entry is charged at most its calls times the lane's latest exact time per call
 * ("capped"). That is the one estimate: the last tail before such a wait, at most about
 * TAIL_SPAN_NS (1 ms) of work, which is why tails are kept that short; idle time of the
 * program is never counted as GPU time. Short tails also bring GPU time to the agent about
 * as soon as an event per call did.
 *
 * Why the in-flight bound holds: with max_inflight 0 nothing is bounded but the ring's RING
 * entries. With a bound, an open tail is one operation, like an entry: a call that would open
 * one waits as a new entry would, and joining adds none. Tails form only from calls measured
 * short and hold at most about TAIL_SPAN_NS: one operation in flight is one kernel, or about
 * 1 ms of short ones. A pause takes effect within about max_inflight kernels as before, or
 * max_inflight ms for kernels shorter than 1 ms - which no longer wait for an event per launch.
 *
 * Threads: joins only read the lane (its ctx, stream, word, est_ns: atomics written under
 * ring_lock) and write thread-local counts; everything else runs under ring_lock. A lane
 * changes hands only without an open tail, with a new generation, so a join that raced a
 * close or a change fails its generation check or counts against the old tail's generation
 * (then only the launches counter gets it). A join whose tail another thread ended while the
 * driver call ran sees the generation moved after the call and makes sure an end event
 * follows it (cover_late).
 */
#include <pthread.h>

#include "launch_int.h"

/* The state launch_int.h declares: under ring_lock, but for the lane fields a lock-free join
 * reads and the calling thread's own (_Thread_local). */
pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
struct entry ring[RING];
unsigned ring_head; /* index of the oldest entry */
unsigned ring_count;
uint64_t ring_seq;
unsigned open_tails; /* lanes with an open tail */
static unsigned lane_evict; /* round robin over lanes without a tail */
static struct fgpu_pool pools[POOLS];
struct fgpu_lane lanes[LANES];
_Thread_local struct fgpu_pool *tl_pool;
_Thread_local CUcontext tl_ctx;
_Thread_local struct tl_joins tj;

/* --------------------------------------------------------------- events (ring_lock held) */

struct fgpu_pool *pool_of(CUcontext ctx)
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

static struct fgpu_pool *pool_find(CUcontext ctx)
{
    for (int i = 0; i < POOLS; i++) {
        if (pools[i].ctx == ctx && ctx != NULL)
            return &pools[i];
    }
    return NULL;
}

/* --------------------------------------------------------------- lanes */

static struct fgpu_lane *lane_find(CUcontext ctx, CUstream stream)
{
    if (ctx == NULL)
        return NULL;
    struct fgpu_lane *l = tj.lane;
    if (l != NULL && lane_is(l, ctx, stream))
        return l;
    for (int i = 0; i < LANES; i++) {
        if (lane_is(&lanes[i], ctx, stream))
            return &lanes[i];
    }
    return NULL;
}

/* The lane of (ctx, stream), made when missing (ring_lock held); NULL when every lane holds
 * an open tail. A lane changes hands only without an open tail, and with a new generation. */
struct fgpu_lane *lane_get(CUcontext ctx, CUstream stream, struct fgpu_pool *pl)
{
    struct fgpu_lane *l = lane_find(ctx, stream);
    if (l == NULL) {
        for (int i = 0; i < LANES && l == NULL; i++)
            l = atomic_load_explicit(&lanes[i].ctx, memory_order_relaxed) == NULL ? &lanes[i]
                                                                                 : NULL;
        for (int i = 0; i < LANES && l == NULL; i++) {
            struct fgpu_lane *c = &lanes[lane_evict++ % LANES];
            l = lane_tail(c) == 0 ? c : NULL;
        }
        if (l == NULL)
            return NULL;
        uint64_t w = atomic_load_explicit(&l->word, memory_order_relaxed);
        atomic_store_explicit(&l->ctx, ctx, memory_order_relaxed);
        atomic_store_explicit(&l->stream, stream, memory_order_relaxed);
        atomic_store_explicit(&l->est_ns, EST_UNKNOWN, memory_order_relaxed);
        /* release: the identity above is visible with the new generation (tail 0: no joiner
         * acts on it until a tail is opened with another release store) */
        atomic_store_explicit(&l->word, (w & GEN_MASK) + (1ull << 32), memory_order_release);
        l->failed = 0;
        l->extra = 0;
        l->pool = pl;
        l->last_seq = 0;
        l->tail_start = NULL;
        l->tail_pred = 0;
    }
    if (tj.lane != l && tj.unflushed == 0) {
        tj.lane = l;
        tj.gen = 0;
    }
    return l;
}

/* Take the open tail's count (counted and reported calls), leaving none open and the lane at
 * a new generation (ring_lock held). */
static uint32_t lane_take(struct fgpu_lane *l)
{
    uint64_t w = atomic_load_explicit(&l->word, memory_order_relaxed);
    /* release: lock-free joiners that see the new generation see the tail closed */
    atomic_store_explicit(&l->word, (w & GEN_MASK) + (1ull << 32), memory_order_release);
    uint32_t n = (uint32_t)w + l->extra;
    l->extra = 0;
    return n;
}

/* Report the calling thread's lock-free joins (ring_lock held): to the segment's launches
 * counter, and to its lane's tail while that tail is still open. */
void joins_flush(void)
{
    if (tj.unflushed == 0)
        return;
    /* relaxed: a counter */
    atomic_fetch_add_explicit(&fgpu_g.seg->launches, tj.unflushed, memory_order_relaxed);
    struct fgpu_lane *l = tj.lane;
    uint64_t w = l != NULL ? atomic_load_explicit(&l->word, memory_order_relaxed) : 0;
    if ((uint32_t)w != 0 && (uint32_t)(w >> 32) == tj.gen)
        l->extra += tj.unflushed; /* for the cap of a capped tail */
    tj.unflushed = 0;
}

/* --------------------------------------------------------------- entries (ring_lock held) */

/* Account and drop the oldest entry; its events go back to the pool. */
static void retire_oldest(int p)
{
    struct entry *e = ring_at(0);
    struct fgpu_seg *s = fgpu_g.seg;
    if (!e->dead) {
        float ms = 0.0f;
        if (e->start != NULL && e->gpu >= 0 &&
            fgpu_real.cuEventElapsedTime(&ms, e->start, e->end) == CUDA_SUCCESS && ms >= 0.0f) {
            uint64_t ns = (uint64_t)((double)ms * 1e6 + 0.5);
            if (e->capped && ns > e->cap_ns)
                ns = e->cap_ns;
            if (!e->capped && !e->ptd && e->launches > 0) {
                struct fgpu_lane *l = lane_find(e->ctx, e->stream);
                if (l != NULL) /* relaxed: an estimate for later tails */
                    atomic_store_explicit(&l->est_ns, ns / e->launches, memory_order_relaxed);
            }
            if (ns > 0)
                atomic_fetch_add_explicit(&s->gpus[e->gpu].gpu_time_ns, ns,
                                          memory_order_relaxed);
        }
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

void retire_ready(int p)
{
    while (ring_count > 0) {
        struct entry *e = ring_at(0);
        if (!e->dead && fgpu_real.cuEventQuery(e->end) == CUDA_ERROR_NOT_READY)
            return;
        retire_oldest(p);
    }
}

/* Wait for and retire the oldest entry (the ring is full, or over max_inflight). */
void retire_wait(int p)
{
    struct entry *e = ring_at(0);
    if (!e->dead)
        fgpu_real.cuEventSynchronize(e->end);
    retire_oldest(p);
}

/* --------------------------------------------------------------- tails (ring_lock held) */

/* Count a tail's n calls counted under ring_lock in the segment's launches, less those the
 * driver refused (lock-free joins are counted when flushed). */
static void tail_count(struct fgpu_lane *l, uint32_t n)
{
    uint32_t bad = l->failed;
    l->failed = 0;
    if (n > bad) /* relaxed: a counter */
        atomic_fetch_add_explicit(&fgpu_g.seg->launches, n - bad, memory_order_relaxed);
}

/* Release an open tail's start and its place in flight (ring_lock held, count taken). */
static void tail_forget(struct fgpu_lane *l, int p)
{
    struct entry *pred = find_seq(l->tail_pred);
    if (pred != NULL)
        pred->end_shared = 0; /* the entry releases its own end again */
    else
        pool_put(l->pool, l->tail_start);
    l->tail_start = NULL;
    open_tails--;
    if (p >= 0)
        atomic_fetch_sub_explicit(&fgpu_g.seg->procs[p].inflight, 1, memory_order_relaxed);
}

/* Close lane l's open tail: record an end event on its stream (the calling thread's current
 * context is the lane's) and make the entry from the tail's start to it; see the header. */
void tail_close(struct fgpu_lane *l, int p)
{
    if (lane_tail(l) == 0)
        return;
    while (ring_count >= RING)
        retire_wait(p);
    int exact = fgpu_real.cuEventQuery(l->tail_start) == CUDA_ERROR_NOT_READY;
    CUstream stream = atomic_load_explicit(&l->stream, memory_order_relaxed);
    tail_count(l, lane_tail(l));
    uint32_t n = lane_take(l);
    CUevent end = pool_get(l->pool);
    if (end == NULL || fgpu_real.cuEventRecord(end, stream) != CUDA_SUCCESS) {
        pool_put(l->pool, end);
        tail_forget(l, p); /* not timed; its calls are no longer counted in flight */
        return;
    }
    struct entry *e = push_entry(); /* takes over the tail's place in inflight */
    e->start = l->tail_start;
    e->end = end;
    e->stream = stream;
    e->ctx = atomic_load_explicit(&l->ctx, memory_order_relaxed);
    e->gpu = l->pool->gpu;
    e->launches = n;
    if (!exact) {
        uint64_t est = atomic_load_explicit(&l->est_ns, memory_order_relaxed);
        e->capped = 1;
        e->cap_ns = est == EST_UNKNOWN ? 0 : est * n;
    }
    l->last_seq = e->seq;
    l->tail_start = NULL;
    open_tails--;
}

/* Close the open tails of context ctx (the current one): every lane's, or stream's only. */
void tails_close(CUcontext ctx, int all, CUstream stream, int p)
{
    if (open_tails == 0 || ctx == NULL)
        return;
    for (int i = 0; i < LANES; i++) {
        struct fgpu_lane *l = &lanes[i];
        if (lane_tail(l) > 0 && atomic_load_explicit(&l->ctx, memory_order_relaxed) == ctx &&
            (all || atomic_load_explicit(&l->stream, memory_order_relaxed) == stream))
            tail_close(l, p);
    }
}

/* Close every open tail, at a closed gate, so the agent sees what is in flight drain: the
 * current context's directly, another context's with it made current for the record (its
 * NULL stream is that context's), then cur again. */
void tails_close_all(CUcontext cur, int p)
{
    for (int i = 0; i < LANES && open_tails > 0; i++) {
        struct fgpu_lane *l = &lanes[i];
        CUcontext c = atomic_load_explicit(&l->ctx, memory_order_relaxed);
        if (lane_tail(l) == 0 || c == NULL)
            continue;
        if (c == cur) {
            tail_close(l, p);
        } else if (fgpu_real.cuCtxSetCurrent != NULL &&
                   fgpu_real.cuCtxSetCurrent(c) == CUDA_SUCCESS) {
            tail_close(l, p);
            fgpu_real.cuCtxSetCurrent(cur);
        }
    }
}

/* Join lane l's tail, or open one, when the header's rules allow (ring_lock held, the
 * thread's joins flushed): 0 not, 1 joined, 2 joined as the tail's last call (it is full:
 * TAIL_MAX calls, or TAIL_SPAN_NS of estimated work), so it closes right after the call. */
int tail_join(struct fgpu_lane *l, uint32_t max, int p)
{
    uint32_t n = lane_tail(l);
    uint32_t all = n + l->extra;
    uint64_t est = atomic_load_explicit(&l->est_ns, memory_order_relaxed);
    if (est == EST_UNKNOWN || (n == 0 && est >= TAIL_SPAN_NS))
        return 0; /* not measured yet, or one call is already long */
    int last = all + 1 >= TAIL_MAX || (uint64_t)(all + 2) * est >= TAIL_SPAN_NS;
    uint64_t w = atomic_load_explicit(&l->word, memory_order_relaxed);
    if (n > 0) {
        if (fgpu_real.cuEventQuery(l->tail_start) != CUDA_ERROR_NOT_READY)
            return 0; /* the stream may have gone idle: close, and start anew */
        /* relaxed: the count only (the tail and its start were published when it opened) */
        atomic_store_explicit(&l->word, w + 1, memory_order_relaxed);
        tj.gen = (uint32_t)(w >> 32);
        return 1 + last;
    }
    struct entry *pred = find_seq(l->last_seq);
    if (pred == NULL || pred->dead || pred->ptd || pred->end_shared)
        return 0;
    /* a new tail is one more operation in flight: within the bound, as an entry */
    while (max != 0 && ring_count > 0 && ring_count + open_tails >= max)
        retire_wait(p);
    pred = find_seq(l->last_seq);
    if (pred == NULL || fgpu_real.cuEventQuery(pred->end) != CUDA_ERROR_NOT_READY)
        return 0; /* completed: the stream may idle, so the call gets an entry of its own */
    pred->end_shared = 1; /* the tail owns it now; the entry that closes it releases it */
    l->tail_start = pred->end;
    l->tail_pred = pred->seq;
    l->failed = 0;
    l->extra = 0;
    open_tails++;
    if (p >= 0)
        atomic_fetch_add_explicit(&fgpu_g.seg->procs[p].inflight, 1, memory_order_relaxed);
    /* release: the start above is set before a lock-free joiner can see the tail open */
    atomic_store_explicit(&l->word, w + 1, memory_order_release);
    tj.gen = (uint32_t)(w >> 32);
    return 1 + last;
}

/* --------------------------------------------------------------- context destroy, fork */

void fgpu_launch_forget_context(CUcontext ctx)
{
    if (!fgpu_g.active)
        return;
    pthread_mutex_lock(&ring_lock);
    int p = fgpu_proc();
    for (int i = 0; i < LANES; i++) {
        struct fgpu_lane *l = &lanes[i];
        if (ctx == NULL || atomic_load_explicit(&l->ctx, memory_order_relaxed) != ctx)
            continue;
        joins_flush();
        tail_count(l, lane_tail(l));
        if (lane_take(l) > 0) { /* launched, but its events die with the context: not timed */
            open_tails--;
            if (p >= 0)
                atomic_fetch_sub_explicit(&fgpu_g.seg->procs[p].inflight, 1,
                                          memory_order_relaxed);
        }
        l->tail_start = NULL;
        l->last_seq = 0;
        atomic_store_explicit(&l->ctx, NULL, memory_order_relaxed); /* free */
    }
    for (unsigned i = 0; i < ring_count; i++) {
        struct entry *e = ring_at(i);
        if (e->ctx == ctx)
            e->dead = 1; /* retired (without time) at the next retire */
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
    open_tails = 0;
    for (int i = 0; i < POOLS; i++) {
        pools[i].ctx = NULL;
        pools[i].n = 0;
    }
    for (int i = 0; i < LANES; i++) { /* one thread here: no joiner races these stores */
        atomic_store_explicit(&lanes[i].ctx, NULL, memory_order_relaxed);
        atomic_store_explicit(&lanes[i].word, 0, memory_order_relaxed);
        lanes[i].tail_start = NULL;
        lanes[i].last_seq = 0;
    }
    tl_pool = NULL;
    tl_ctx = NULL;
    tj = (struct tl_joins){0};
}
