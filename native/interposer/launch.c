/*
 * launch.c - the governor's decisions carried out at launch; bounded in-flight work; GPU time.
 *
 * Gated calls (hooks.h): kernel launches (plain, Ex, cooperative), graph launches, async
 * copies and memsets, and their _ptsz variants. cuStreamSynchronize(_ptsz) and
 * cuCtxSynchronize are not gated; they close the open tails (below) of what they wait for
 * before the driver call and retire completed work right after it, so a program that ends
 * with a synchronize has all of its GPU time counted.
 *
 * Closed gate (segment flag FGPU_SEG_GATING): procs[me].waiting and gate_waits go up, the
 * thread closes the open tails (of every context), then sleeps on the gate word (FUTEX_WAIT, shared:
 * the agent's FUTEX_WAKE comes from another process), waking every 1 ms while this process
 * has work in flight to retire it, so the agent sees inflight drop; then waiting goes down.
 *
 * In flight: entries of a ring, each a start and an end event (from a per-context pool,
 * default flags so they time) on one stream, covering one or more gated calls; and the open
 * tails below. procs[me].inflight counts operations: an entry or an open tail is one.
 * Completed entries are retired (cuEventQuery == CUDA_SUCCESS) by calls that take the lock,
 * at synchronizes and at a closed gate, adding end - start to gpu_time_ns.
 *
 * An entry made by a call: its start is the end event of the stream's latest entry when that
 * one is still outstanding (the stream never went idle between them), else an event recorded
 * just before the call; its end is recorded right after. What is counted: from the stream
 * reaching the call to its completion, so time queued behind other processes' kernels on the
 * device is included, and overlapping streams of one process each count their own time (the
 * agent caps a workload's charge at wall time). Per-thread default streams always get their
 * own start and never form tails.
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
 * 1 ms of short ones. A pause takes
 * effect within about max_inflight kernels as before, or max_inflight ms for kernels shorter
 * than 1 ms - which no longer wait for an event per launch.
 *
 * Threads: joins only read the lane (its ctx, stream, word, est_ns: atomics written under
 * ring_lock) and write thread-local counts; everything else runs under ring_lock. A lane
 * changes hands only without an open tail, with a new generation, so a join that raced a
 * close or a change fails its generation check or counts against the old tail's generation
 * (then only the launches counter gets it). A join whose tail another thread ended while the
 * driver call ran sees the generation moved after the call and makes sure an end event
 * follows it (cover_late).
 *
 * Hot path, gate open, joining a tail: one acquire load of seg->gate, the current context
 * (cuCtxGetCurrent: the stream NULL means the current context's), loads of the lane, the
 * driver call, one load after it. No system call, no allocation, no logging, no lock, no
 * event. A call that takes ring_lock (process-local, uncontended: no system call) stamps
 * last_launch_ns (the coarse clock, at most a tick behind), retires, and records at most two
 * events; the lock is never held across the launch itself, only across cuEventRecord when
 * closing a tail and across the cuEventSynchronize that enforces max_inflight.
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
#define LANES 16
#define TAIL_MAX 128             /* calls in one tail at most (then it closes) */
#define TICK_EVERY 8             /* a lock-free join reads the clock every 8th time */
#define TAIL_SPAN_NS 1000000ull  /* a tail holds at most about 1 ms of (estimated) work */
#define EST_UNKNOWN UINT64_MAX
#define GEN_MASK 0xffffffff00000000ull

struct entry {
    uint64_t seq;   /* consecutive: the ring holds seq ring_at(0)->seq .. + ring_count - 1 */
    CUevent start;  /* owned by this entry (its own, or a predecessor's shared end) */
    CUevent end;
    CUstream stream;
    CUcontext ctx;
    int gpu;
    int ptd;        /* per-thread default stream: never shares its end */
    int end_shared; /* a successor or a tail took our end as its start and will release it */
    int dead;       /* context destroyed: nothing to query */
    int capped;     /* a tail closed after its start completed: charge at most cap_ns */
    uint32_t launches; /* gated calls it covers */
    uint64_t cap_ns;
};

struct fgpu_pool {
    CUcontext ctx;
    int gpu;
    int n;
    CUevent ev[POOL_CAP];
};

/* One (context, stream), not a per-thread default stream; see the header comment. The first
 * four fields are read without ring_lock by a call joining a tail; they change only under it. */
struct fgpu_lane {
    _Atomic(CUcontext) ctx; /* NULL: free */
    _Atomic(CUstream) stream;
    /* generation << 32 | calls counted in the open tail (0: none open). Written only under
     * ring_lock; the generation moves whenever the lane changes hands or a tail ends, so a
     * thread that saw one tail never counts itself into the next by mistake */
    _Atomic uint64_t word;
    _Atomic uint64_t est_ns; /* ns per call of the latest exact entry, EST_UNKNOWN before one */
    uint32_t failed;    /* calls of the open tail the driver refused */
    uint32_t extra;     /* calls of the open tail that lock-free joiners reported (flushed) */
    struct fgpu_pool *pool;
    uint64_t last_seq;  /* the lane's latest entry (0: none) */
    CUevent tail_start; /* the open tail's start (an entry's end, owned by the tail) */
    uint64_t tail_pred; /* seq of the entry whose end tail_start is */
};

static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry ring[RING];
static unsigned ring_head; /* index of the oldest entry */
static unsigned ring_count;
static uint64_t ring_seq;
static unsigned open_tails; /* lanes with an open tail */
static unsigned lane_evict; /* round robin over lanes without a tail */
static struct fgpu_pool pools[POOLS];
static struct fgpu_lane lanes[LANES];
static _Thread_local struct fgpu_pool *tl_pool;
static _Thread_local CUcontext tl_ctx;
/* The calling thread's lock-free joins: the lane and tail generation it joins, the clock tick
 * of its last call under ring_lock (a join in a later tick takes the lock and asks the driver
 * about the tail's start), and joins not yet reported to the lane and the segment's launches
 * counter (flushed under ring_lock). The default TLS model: libfgpu.so may be dlopened (the
 * tests' ctypes) where no static TLS is left, so no initial-exec. */
struct tl_joins {
    struct fgpu_lane *lane;
    uint64_t tick; /* CLOCK_MONOTONIC_COARSE at the thread's last call under ring_lock */
    uint32_t gen;
    uint32_t unflushed;
};
static _Thread_local struct tl_joins tj;

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

/* The entry of sequence number seq while it is in the ring, else NULL (O(1): consecutive). */
static struct entry *find_seq(uint64_t seq)
{
    if (ring_count == 0 || seq == 0)
        return NULL;
    uint64_t first = ring_at(0)->seq;
    if (seq < first || seq - first >= ring_count)
        return NULL;
    return ring_at((unsigned)(seq - first));
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

static int lane_is(struct fgpu_lane *l, CUcontext ctx, CUstream stream)
{
    /* relaxed: identity only; a caller that acts on it confirms with the word (see below) */
    return atomic_load_explicit(&l->ctx, memory_order_relaxed) == ctx &&
           atomic_load_explicit(&l->stream, memory_order_relaxed) == stream;
}

static uint32_t lane_tail(struct fgpu_lane *l)
{
    /* relaxed: written only under ring_lock, which the caller holds */
    return (uint32_t)atomic_load_explicit(&l->word, memory_order_relaxed);
}

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
static struct fgpu_lane *lane_get(CUcontext ctx, CUstream stream, struct fgpu_pool *pl)
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
static void joins_flush(void)
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

/* CLOCK_MONOTONIC_COARSE in ns (vDSO, about 5 ns): the last tick (1-4 ms), never ahead of
 * CLOCK_MONOTONIC. */
static uint64_t stamp_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

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

/* --------------------------------------------------------------- entries (ring_lock held) */

static struct entry *push_entry(void)
{
    struct entry *e = &ring[(ring_head + ring_count) % RING];
    ring_count++;
    *e = (struct entry){.seq = ++ring_seq, .launches = 1};
    return e;
}

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

static void retire_ready(int p)
{
    while (ring_count > 0) {
        struct entry *e = ring_at(0);
        if (!e->dead && fgpu_real.cuEventQuery(e->end) == CUDA_ERROR_NOT_READY)
            return;
        retire_oldest(p);
    }
}

/* Wait for and retire the oldest entry (the ring is full, or over max_inflight). */
static void retire_wait(int p)
{
    struct entry *e = ring_at(0);
    if (!e->dead)
        fgpu_real.cuEventSynchronize(e->end);
    retire_oldest(p);
}

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
static void tail_close(struct fgpu_lane *l, int p)
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
static void tails_close(CUcontext ctx, int all, CUstream stream, int p)
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
static void tails_close_all(CUcontext cur, int p)
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

static CUcontext current_ctx(void)
{
    CUcontext ctx = NULL;
    if (fgpu_real.cuCtxGetCurrent == NULL || fgpu_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
        return NULL;
    return ctx;
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

static __attribute__((noinline, cold)) void gate_wait(int p)
{
    struct fgpu_seg *s = fgpu_g.seg;
    atomic_fetch_add_explicit(&s->gate_waits, 1, memory_order_relaxed);
    if (p >= 0)
        atomic_fetch_add_explicit(&s->procs[p].waiting, 1, memory_order_relaxed);
    CUcontext ctx = current_ctx();
    int closed = 0;
    while (gate_closed(s)) {
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

/* Join lane l's tail, or open one, when the header's rules allow (ring_lock held, the
 * thread's joins flushed): 0 not, 1 joined, 2 joined as the tail's last call (it is full:
 * TAIL_MAX calls, or TAIL_SPAN_NS of estimated work), so it closes right after the call. */
static int tail_join(struct fgpu_lane *l, uint32_t max, int p)
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
    if (fgpu_g.gating && gate_closed(s))
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
    uint32_t max = atomic_load_explicit(&s->max_inflight, memory_order_relaxed);
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

/* --------------------------------------------------------------- retire points */

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
