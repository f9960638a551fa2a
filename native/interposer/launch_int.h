/*
 * launch_int.h - what launch.c, launch_ring.c and launch_sync.c share (private to them): the
 * ring of in-flight entries, the lanes and their tails, the calling thread's lock-free joins
 * (defined in launch_ring.c; see its header comment), and the small helpers the launch path
 * calls. Those are static inline here, as they were static in one file before the split, so
 * the hot path (fgpu_launch_before's lock-free join) makes no call across files.
 */
#ifndef FGPU_LAUNCH_INT_H
#define FGPU_LAUNCH_INT_H

#include <pthread.h>
#include <time.h>

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

/* One (context, stream), not a per-thread default stream; see launch_ring.c's header comment.
 * The first four fields are read without ring_lock by a call joining a tail; they change only
 * under it. */
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

/* ------------------------------------------------------------------ state (launch_ring.c) */
FGPU_HIDDEN extern pthread_mutex_t ring_lock;
FGPU_HIDDEN extern struct entry ring[RING];
FGPU_HIDDEN extern unsigned ring_head; /* index of the oldest entry */
FGPU_HIDDEN extern unsigned ring_count;
FGPU_HIDDEN extern uint64_t ring_seq;
FGPU_HIDDEN extern unsigned open_tails; /* lanes with an open tail */
FGPU_HIDDEN extern struct fgpu_lane lanes[LANES];
FGPU_HIDDEN extern _Thread_local struct fgpu_pool *tl_pool;
FGPU_HIDDEN extern _Thread_local CUcontext tl_ctx;
FGPU_HIDDEN extern _Thread_local struct tl_joins tj;

/* ------------------------------------------------------------------ helpers (inline) */
/* pool_*, ring_at, find_seq, push_entry and lane_tail: ring_lock held. lane_is and
 * stamp_ns: also the lock-free join's. */

static inline CUevent pool_get(struct fgpu_pool *pl)
{
    if (pl->n > 0)
        return pl->ev[--pl->n];
    CUevent e = NULL;
    if (fgpu_real.cuEventCreate == NULL || fgpu_real.cuEventCreate(&e, CU_EVENT_DEFAULT) != 0)
        return NULL;
    return e;
}

static inline void pool_put(struct fgpu_pool *pl, CUevent e)
{
    if (e == NULL || pl == NULL || pl->ctx == NULL)
        return; /* its context was destroyed, and its events with it */
    if (pl->n < POOL_CAP)
        pl->ev[pl->n++] = e;
    else if (fgpu_real.cuEventDestroy_v2 != NULL)
        fgpu_real.cuEventDestroy_v2(e);
}

static inline struct entry *ring_at(unsigned i) { return &ring[(ring_head + i) % RING]; }

/* The entry of sequence number seq while it is in the ring, else NULL (O(1): consecutive). */
static inline struct entry *find_seq(uint64_t seq)
{
    if (ring_count == 0 || seq == 0)
        return NULL;
    uint64_t first = ring_at(0)->seq;
    if (seq < first || seq - first >= ring_count)
        return NULL;
    return ring_at((unsigned)(seq - first));
}

static inline struct entry *push_entry(void)
{
    struct entry *e = &ring[(ring_head + ring_count) % RING];
    ring_count++;
    *e = (struct entry){.seq = ++ring_seq, .launches = 1};
    return e;
}

static inline int lane_is(struct fgpu_lane *l, CUcontext ctx, CUstream stream)
{
    /* relaxed: identity only; a caller that acts on it confirms with the word
     * (tail_join_fast in launch.c) */
    return atomic_load_explicit(&l->ctx, memory_order_relaxed) == ctx &&
           atomic_load_explicit(&l->stream, memory_order_relaxed) == stream;
}

static inline uint32_t lane_tail(struct fgpu_lane *l)
{
    /* relaxed: written only under ring_lock, which the caller holds */
    return (uint32_t)atomic_load_explicit(&l->word, memory_order_relaxed);
}

/* CLOCK_MONOTONIC_COARSE in ns (vDSO, about 5 ns): the last tick (1-4 ms), never ahead of
 * CLOCK_MONOTONIC. */
static inline uint64_t stamp_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline CUcontext current_ctx(void)
{
    CUcontext ctx = NULL;
    if (fgpu_real.cuCtxGetCurrent == NULL || fgpu_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
        return NULL;
    return ctx;
}

/* ------------------------------------------------------------------ launch_ring.c */
/* Each takes ring_lock held; see its definition. */
FGPU_HIDDEN struct fgpu_pool *pool_of(CUcontext ctx);
FGPU_HIDDEN struct fgpu_lane *lane_get(CUcontext ctx, CUstream stream, struct fgpu_pool *pl);
FGPU_HIDDEN void joins_flush(void);
FGPU_HIDDEN void retire_ready(int p);
FGPU_HIDDEN void retire_wait(int p);
FGPU_HIDDEN void tail_close(struct fgpu_lane *l, int p);
FGPU_HIDDEN void tails_close(CUcontext ctx, int all, CUstream stream, int p);
FGPU_HIDDEN void tails_close_all(CUcontext cur, int p);
FGPU_HIDDEN int tail_join(struct fgpu_lane *l, uint32_t max, int p);

#endif /* FGPU_LAUNCH_INT_H */
