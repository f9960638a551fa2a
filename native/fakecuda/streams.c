/*
 * streams.c - fake driver (a STAND-IN for tests, see fake.h): streams and the work on them
 * (launch.c turns launches, copies and memsets into operations).
 * Each stream has a worker thread, started on its first operation, that runs the stream's
 * operations in order: kernels ("spin": kernelParams[0] points to a uint64_t duration in ns)
 * and copies/memsets (bytes at 10 GB/s) hold the device lock for their duration and count as
 * device time; events take the time the stream reaches them; stream-ordered frees give
 * memory back when reached. The NULL / CU_STREAM_LEGACY handle is the context's default
 * stream; CU_STREAM_PER_THREAD and NULL in the _ptsz entry points the calling thread's own
 * stream. Not modelled: implicit synchronisation between the legacy stream and others.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph.h"

#define FK_SLICE_NS 5000000ull /* busy time is published in slices of at most 5 ms */

struct fk_stream {
    uint32_t magic;
    int per_thread;
    struct fk_ctx *ctx;
    uint64_t ctx_id;
    int pins; /* context synchronisations waiting on it (streams_mu) */
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    struct fk_op *head, *tail;
    uint64_t submitted, completed;
    int started, stop;
    pthread_t thread;
    struct fk_stream *list_next; /* every stream of the process */
    struct fk_graph *capture;    /* being captured into this graph (capture.c); NULL: not */
};

struct fk_event {
    uint32_t magic;
    unsigned int flags;
    uint64_t gen_recorded; /* records asked */
    uint64_t gen_done;     /* the last record the stream reached */
    uint64_t t_ns;
    int refs; /* the handle + records in flight */
};

static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t streams_cv = PTHREAD_COND_INITIALIZER;
static struct fk_stream *streams;
static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;

#define FK_PT_STREAMS 8
static __thread struct {
    uint64_t ctx_id;
    struct fk_stream *s;
} per_thread[FK_PT_STREAMS];

void fk_streams_after_fork(void)
{
    pthread_mutex_init(&streams_mu, NULL);
    pthread_cond_init(&streams_cv, NULL);
    pthread_mutex_init(&ev_mu, NULL);
    pthread_cond_init(&ev_cv, NULL);
    streams = NULL; /* the parent's streams have no workers here: dropped */
    memset(per_thread, 0, sizeof per_thread);
}

struct fk_ctx *fk_stream_ctx(struct fk_stream *s)
{
    return s->ctx;
}

/* ------------------------------------------------------------------ the worker */

static void sleep_until(uint64_t t_ns)
{
    struct timespec ts = {(time_t)(t_ns / 1000000000ull), (long)(t_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

static void event_release_locked(struct fk_event *e)
{
    if (--e->refs == 0)
        free(e);
}

static void run_op(struct fk_stream *s, struct fk_op *op)
{
    switch (op->kind) {
    case FK_OP_KERNEL:
    case FK_OP_COPY: {
        int gpu = s->ctx->gpu, slot = fk_my_slot(), waiter;
        fk_dev_lock(gpu, &waiter);
        uint64_t start = fk_now_ns(), last = start, end = start + op->ns;
        while (last < end) {
            uint64_t next = end - last > FK_SLICE_NS ? last + FK_SLICE_NS : end;
            sleep_until(next);
            if (!fk_dev_held(gpu, waiter))
                break; /* stopped past its turn: the device went on without it */
            uint64_t now = fk_now_ns();
            fk_dev_busy(gpu, slot, now - last);
            last = now;
        }
        fk_dev_unlock(gpu, waiter);
        break;
    }
    case FK_OP_EVENT:
        pthread_mutex_lock(&ev_mu);
        if (op->event->gen_recorded == op->event_gen) {
            op->event->t_ns = fk_now_ns();
            op->event->gen_done = op->event_gen;
        }
        event_release_locked(op->event);
        pthread_cond_broadcast(&ev_cv);
        pthread_mutex_unlock(&ev_mu);
        break;
    case FK_OP_FREE:
        fk_alloc_release(op->free_alloc);
        break;
    }
    free(op);
}

static void *worker(void *arg)
{
    struct fk_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->work_cv, &s->mu);
        struct fk_op *op = s->head;
        if (op == NULL)
            break;
        s->head = op->next;
        if (s->head == NULL)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        run_op(s, op);
        pthread_mutex_lock(&s->mu);
        s->completed++;
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

struct fk_graph *fk_stream_capture(struct fk_stream *s)
{
    pthread_mutex_lock(&s->mu);
    struct fk_graph *g = s->capture;
    pthread_mutex_unlock(&s->mu);
    return g;
}

void fk_stream_set_capture(struct fk_stream *s, struct fk_graph *g)
{
    pthread_mutex_lock(&s->mu);
    s->capture = g;
    pthread_mutex_unlock(&s->mu);
}

/* On a stream being captured, work becomes a node of the graph: kernels and copies a node of
 * their duration. An event recorded during the capture completes at once (the real driver
 * makes it part of the capture; nothing here waits on it). */
static CUresult capture_op(struct fk_graph *g, struct fk_op *op)
{
    CUresult rc = CUDA_SUCCESS;
    if (op->kind == FK_OP_KERNEL || op->kind == FK_OP_COPY) {
        struct fk_node proto = {.kind = FK_N_KERNEL, .ns = op->ns};
        CUgraphNode node;
        rc = fk_graph_add(&node, (CUgraph)g, NULL, 0, &proto);
    } else if (op->kind == FK_OP_EVENT) { /* complete at once: nothing waits on it */
        pthread_mutex_lock(&ev_mu);
        if (op->event->gen_done < op->event_gen) {
            op->event->gen_done = op->event_gen;
            op->event->t_ns = fk_now_ns();
        }
        event_release_locked(op->event);
        pthread_cond_broadcast(&ev_cv);
        pthread_mutex_unlock(&ev_mu);
    } else if (op->kind == FK_OP_FREE) {
        fk_alloc_release(op->free_alloc);
    }
    free(op);
    return rc;
}

CUresult fk_enqueue(struct fk_stream *s, struct fk_op *op)
{
    op->next = NULL;
    struct fk_graph *g = fk_stream_capture(s);
    if (g != NULL)
        return capture_op(g, op);
    pthread_mutex_lock(&s->mu);
    if (!s->started) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old); /* signals stay with the program's threads */
        int rc = pthread_create(&s->thread, NULL, worker, s);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc != 0) {
            pthread_mutex_unlock(&s->mu);
            fk_debug("cannot start a stream worker thread");
            if (op->kind == FK_OP_EVENT) {
                pthread_mutex_lock(&ev_mu);
                event_release_locked(op->event);
                pthread_mutex_unlock(&ev_mu);
            } else if (op->kind == FK_OP_FREE) {
                fk_alloc_release(op->free_alloc);
            }
            free(op);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        s->started = 1;
    }
    if (s->tail != NULL)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    s->submitted++;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ streams */

static uint64_t ctx_id_of(struct fk_ctx *c)
{
    return c->serial;
}

struct fk_stream *fk_stream_new(struct fk_ctx *c, unsigned int flags)
{
    (void)flags;
    struct fk_stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->magic = FK_STREAM_MAGIC;
    s->ctx = c;
    s->ctx_id = ctx_id_of(c);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    pthread_mutex_lock(&streams_mu);
    s->list_next = streams;
    streams = s;
    pthread_mutex_unlock(&streams_mu);
    return s;
}

CUresult fk_stream_sync(struct fk_stream *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->submitted;
    while (s->completed < target)
        pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return CUDA_SUCCESS;
}

/* Pins the context's streams (so none is freed meanwhile), then waits for each without
 * holding the list lock. */
void fk_ctx_sync(struct fk_ctx *c)
{
    size_t n = 0, i = 0;
    pthread_mutex_lock(&streams_mu);
    for (struct fk_stream *s = streams; s != NULL; s = s->list_next)
        n += s->ctx == c;
    struct fk_stream **pinned = calloc(n ? n : 1, sizeof *pinned);
    for (struct fk_stream *s = streams; s != NULL && pinned != NULL; s = s->list_next) {
        if (s->ctx == c) {
            s->pins++;
            pinned[i++] = s;
        }
    }
    pthread_mutex_unlock(&streams_mu);
    if (pinned == NULL)
        return;
    for (size_t k = 0; k < i; k++)
        fk_stream_sync(pinned[k]);
    pthread_mutex_lock(&streams_mu);
    for (size_t k = 0; k < i; k++)
        pinned[k]->pins--;
    pthread_cond_broadcast(&streams_cv);
    pthread_mutex_unlock(&streams_mu);
    free(pinned);
}

/* Checkpoint lock (checkpoint.c): whether every stream of the process has run all it was
 * given. Stream locks are taken one at a time under the list lock (never the other way). */
int fk_streams_idle(void)
{
    int idle = 1;
    pthread_mutex_lock(&streams_mu);
    for (struct fk_stream *s = streams; s != NULL && idle; s = s->list_next) {
        pthread_mutex_lock(&s->mu);
        idle = s->completed == s->submitted;
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&streams_mu);
    return idle;
}

void fk_stream_free(struct fk_stream *s)
{
    pthread_mutex_lock(&streams_mu);
    for (struct fk_stream **pp = &streams; *pp != NULL; pp = &(*pp)->list_next) {
        if (*pp == s) {
            *pp = s->list_next;
            break;
        }
    }
    while (s->pins > 0)
        pthread_cond_wait(&streams_cv, &streams_mu);
    pthread_mutex_unlock(&streams_mu);
    pthread_mutex_lock(&s->mu);
    s->stop = 1; /* the worker finishes what is queued, then ends */
    pthread_cond_signal(&s->work_cv);
    int started = s->started;
    pthread_mutex_unlock(&s->mu);
    if (started)
        pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    s->magic = 0;
    free(s);
}

/* Every stream of a context that is going away (its per-thread streams included). */
void fk_ctx_streams_free(struct fk_ctx *c)
{
    for (;;) {
        struct fk_stream *found = NULL;
        pthread_mutex_lock(&streams_mu);
        for (struct fk_stream *s = streams; s != NULL && found == NULL; s = s->list_next)
            if (s->ctx == c)
                found = s;
        pthread_mutex_unlock(&streams_mu);
        if (found == NULL)
            return;
        fk_stream_free(found);
    }
}

static struct fk_stream *thread_stream(struct fk_ctx *c)
{
    uint64_t id = ctx_id_of(c);
    int empty = -1;
    for (int i = 0; i < FK_PT_STREAMS; i++) {
        if (per_thread[i].s != NULL && per_thread[i].ctx_id == id)
            return per_thread[i].s; /* serials are never reused: the stream is alive */
        if (empty < 0 && per_thread[i].s == NULL)
            empty = i;
    }
    struct fk_stream *s = fk_stream_new(c, CU_STREAM_DEFAULT);
    if (s == NULL)
        return NULL;
    s->per_thread = 1;
    if (empty < 0)
        empty = 0; /* more contexts than entries: the old stream stays with its context */
    per_thread[empty].ctx_id = id;
    per_thread[empty].s = s;
    return s;
}

CUresult fk_resolve_stream(CUstream h, int ptsz, struct fk_stream **out)
{
    struct fk_ctx *c;
    CUresult rc;
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        if ((rc = fk_current(&c)) != CUDA_SUCCESS)
            return rc;
        int pt = h == CU_STREAM_PER_THREAD || (h == NULL && ptsz);
        *out = pt ? thread_stream(c) : c->null_stream;
        return *out != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    if ((rc = fk_check_init()) != CUDA_SUCCESS)
        return rc;
    struct fk_stream *s = (struct fk_stream *)h;
    if (s->magic != FK_STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int flags)
{
    struct fk_ctx *c;
    if (phStream == NULL || (flags & ~CU_STREAM_NON_BLOCKING) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_stream *s = fk_stream_new(c, flags);
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phStream = (CUstream)s;
    return CUDA_SUCCESS;
}

/* Waits for the stream's work (the real driver returns at once and frees it later). */
CUresult cuStreamDestroy_v2(CUstream hStream)
{
    struct fk_stream *s;
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = fk_resolve_stream(hStream, 0, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (s->per_thread)
        return CUDA_ERROR_INVALID_HANDLE;
    fk_stream_free(s);
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream h, int ptsz)
{
    struct fk_stream *s;
    CUresult rc = fk_resolve_stream(h, ptsz, &s);
    return rc != CUDA_SUCCESS ? rc : fk_stream_sync(s);
}

static CUresult stream_query(CUstream h, int ptsz)
{
    struct fk_stream *s;
    CUresult rc = fk_resolve_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&s->mu);
    int idle = s->completed == s->submitted;
    pthread_mutex_unlock(&s->mu);
    return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamSynchronize(CUstream hStream) { return stream_sync(hStream, 0); }
CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return stream_sync(hStream, 1); }
CUresult cuStreamQuery(CUstream hStream) { return stream_query(hStream, 0); }
CUresult cuStreamQuery_ptsz(CUstream hStream) { return stream_query(hStream, 1); }

/* ------------------------------------------------------------------ events */

CUresult cuEventCreate(CUevent *phEvent, unsigned int flags)
{
    unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (phEvent == NULL || (flags & ~known) != 0 ||
        ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_ctx *c;
    CUresult rc = fk_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_event *e = calloc(1, sizeof *e);
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = FK_EVENT_MAGIC;
    e->flags = flags;
    e->refs = 1;
    *phEvent = (CUevent)e;
    return CUDA_SUCCESS;
}

static struct fk_event *event_of(CUevent h)
{
    struct fk_event *e = (struct fk_event *)h;
    return e != NULL && e->magic == FK_EVENT_MAGIC ? e : NULL;
}

static CUresult event_record(CUevent h, CUstream hs, int ptsz)
{
    struct fk_stream *s;
    CUresult rc = fk_resolve_stream(hs, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_op *op = calloc(1, sizeof *op);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&ev_mu);
    struct fk_event *e = event_of(h);
    if (e == NULL) {
        pthread_mutex_unlock(&ev_mu);
        free(op);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    op->kind = FK_OP_EVENT;
    op->event = e;
    op->event_gen = ++e->gen_recorded;
    e->refs++;
    pthread_mutex_unlock(&ev_mu);
    return fk_enqueue(s, op);
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) { return event_record(hEvent, hStream, 0); }
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    return event_record(hEvent, hStream, 1);
}

CUresult cuEventQuery(CUevent hEvent)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&ev_mu);
    struct fk_event *e = event_of(hEvent);
    rc = e == NULL ? CUDA_ERROR_INVALID_HANDLE
                   : (e->gen_done == e->gen_recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
    pthread_mutex_unlock(&ev_mu);
    return rc;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&ev_mu);
    struct fk_event *e = event_of(hEvent);
    if (e == NULL) {
        pthread_mutex_unlock(&ev_mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    uint64_t target = e->gen_recorded;
    e->refs++;
    while (e->gen_done < target)
        pthread_cond_wait(&ev_cv, &ev_mu);
    event_release_locked(e);
    pthread_mutex_unlock(&ev_mu);
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    if (pMilliseconds == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&ev_mu);
    struct fk_event *a = event_of(hStart), *b = event_of(hEnd);
    if (a == NULL || b == NULL || a->gen_recorded == 0 || b->gen_recorded == 0 ||
        ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if (a->gen_done != a->gen_recorded || b->gen_done != b->gen_recorded)
        rc = CUDA_ERROR_NOT_READY;
    else
        *pMilliseconds = (float)(((double)b->t_ns - (double)a->t_ns) / 1e6);
    pthread_mutex_unlock(&ev_mu);
    return rc;
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&ev_mu);
    struct fk_event *e = event_of(hEvent);
    if (e != NULL) {
        e->magic = 0; /* records in flight keep it until they are reached */
        event_release_locked(e);
    }
    pthread_mutex_unlock(&ev_mu);
    return e != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
