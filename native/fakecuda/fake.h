/*
 * fake.h - internals of the fake CUDA driver and fake NVML: a STAND-IN written for fgpu's
 * tests, not NVIDIA's driver. It models GPUs shared by every process of the machine; the
 * state lives in one shared file (FGPU_FAKE_GPU_STATE) mapped by every process.
 *
 * Files and what each owns:
 *   state.c       the shared file (layout below, creation, configuration), process slots,
 *                 liveness (pid + start time), the sweep of dead processes, memory counters,
 *                 clocks, debug log.
 *   devlock.c     the cross-process device lock, busy-time counters and samples.
 *   context.c     cuInit, devices, contexts, fork and exit.
 *   limits.c      context limits (cuCtxSetLimit: the malloc heap takes device memory).
 *   modules.c     modules and the spin kernel, error strings, fgpuFakeDeviceTime.
 *   memory.c      the per-process allocation table, cuMemAlloc*, cuMemGetInfo, pools.
 *   objects.c     CUDA arrays, mipmapped arrays, IPC handles.
 *   vmm.c         virtual memory management (cuMemCreate, reserve, map, unmap, release).
 *   streams.c     streams and their worker threads, events.
 *   launch.c      launches, copies, memsets.
 *   graphs.c      graphs: kernel and memory nodes, instantiate, launch, graph memory trim.
 *   graph_nodes.c cuGraphAddNode / _v2, the other instantiate entry points, upload, queries.
 *   capture.c     stream capture (graph.h: the graph objects these three share).
 *   procaddress.c cuGetProcAddress and _v2.
 *   contents.c    what device memory holds: host backing of cuMemAlloc-family allocations,
 *                 written and read by the synchronous copies and memsets; saved to and loaded
 *                 from a checkpoint file.
 *   checkpoint.c  cuCheckpointProcess* (lock, checkpoint, restore, unlock, state) by pid from
 *                 another process, and the per-process restore thread that carries them out.
 *   nvml.c        the fake NVML (its own library, libnvidia-ml.so.1, with state.c and devlock.c).
 */
#ifndef FGPU_FAKE_H
#define FGPU_FAKE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "cuda_api.h"

#define FK_MAGIC 0x4b415046u /* "FPAK" */
#define FK_VERSION 4u /* 2: checkpoint fields in struct fk_proc; 3: ck_map; 4: accounting */
#define FK_MAX_GPUS 16
#define FK_MAX_PROCS 256
#define FK_MAX_WAITERS 512
#define FK_MAX_EXPORTS 1024
#define FK_RING 16
#define FK_RING_STEP_NS 100000000ull /* a busy-time sample at most every 100 ms */
#define FK_NAME_LEN 96
#define FK_CHUNK (2ull << 20)    /* pool growth, VMM granularity, graph pool: 2 MiB */
#define FK_PITCH_ALIGN 512ull    /* cuMemAllocPitch rounds the pitch up to this */
#define FK_COPY_BYTES_PER_US 10000ull /* modelled copy and memset speed: 10 GB/s */

/* ------------------------------------------------------------------ shared layout */
struct fk_sample {
    _Atomic uint64_t t_ns;    /* CLOCK_MONOTONIC */
    _Atomic uint64_t busy_ns; /* cumulative busy time at t_ns */
};

/* Busy-time history, written only by the holder of the device lock (one writer). */
struct fk_ring {
    _Atomic uint32_t count; /* samples written so far (index = count % FK_RING) */
    uint32_t pad;
    struct fk_sample s[FK_RING];
};

/* A waiter's seq at or above this is parked (its process was seen stopped): behind all
 * others until it runs again (devlock.c). Arrival numbers never get near it. */
#define FK_PARKED (1ull << 62)

struct fk_waiter {
    _Atomic int32_t pid;  /* 0 = free slot; set first, to claim */
    uint32_t pad;
    _Atomic uint64_t start; /* the process's start time (/proc/<pid>/stat field 22) */
    _Atomic uint64_t seq;   /* arrival number; 0 = not (yet) waiting */
};

struct fk_gpu {
    char uuid[FK_NAME_LEN];
    char name[FK_NAME_LEN];
    uint64_t total; /* bytes */
    _Atomic uint64_t used;    /* bytes held by all processes */
    _Atomic uint64_t busy_ns; /* device time: kernels, copies, memsets */
    /* the device lock: one operation at a time across processes, in arrival order */
    _Atomic uint32_t holder; /* 0 = free, else waiter index + 1 */
    _Atomic uint32_t wake;   /* futex word, bumped on every release */
    _Atomic uint64_t arrivals;
    struct fk_waiter waiters[FK_MAX_WAITERS];
    struct fk_ring ring;
    /* NVML accounting mode (nvml_accounting.c): off until root turns it on, as after a
     * driver load; kept in the state file as the real driver keeps it until unload */
    _Atomic uint32_t accounting;
    uint32_t pad_acct;
    _Atomic uint64_t accounting_since_us; /* CLOCK_REALTIME us it was last turned on */
};

enum { FK_SLOT_FREE = 0, FK_SLOT_CLAIM, FK_SLOT_LIVE, FK_SLOT_RECLAIM, FK_SLOT_DEAD };

struct fk_proc {
    _Atomic uint32_t state;
    _Atomic int32_t pid;
    _Atomic uint64_t start;
    _Atomic uint64_t dead_order; /* larger = died later; DEAD slots are reused oldest first */
    _Atomic uint64_t used[FK_MAX_GPUS];
    _Atomic uint64_t busy_ns[FK_MAX_GPUS];
    _Atomic uint64_t last_active_ns[FK_MAX_GPUS];
    _Atomic uint32_t contexts[FK_MAX_GPUS];
    _Atomic uint64_t peak[FK_MAX_GPUS]; /* highest used[g] since the slot was claimed */
    _Atomic uint64_t start_us;          /* CLOCK_REALTIME us the slot was claimed */
    _Atomic uint64_t end_us;            /* CLOCK_REALTIME us it was reclaimed (dead) */
    struct fk_ring ring[FK_MAX_GPUS];
    /* checkpointing (checkpoint.c): a controller posts a request (ck_op, ck_arg), bumps
     * ck_req; the process's restore thread carries it out, sets ck_result, bumps ck_done */
    _Atomic uint32_t ck_state;  /* CUprocessState; the futex word blocked API calls wait on */
    _Atomic uint32_t ck_req;    /* futex word: requests posted */
    _Atomic uint32_t ck_done;   /* futex word: requests answered */
    _Atomic uint32_t ck_op;     /* FK_CK_LOCK, ... */
    _Atomic uint32_t ck_arg;    /* lock: timeout in ms (0 = none); restore: 1 = gpuPairs */
    _Atomic uint32_t ck_busy;   /* a controller holds the request channel (pid) */
    _Atomic int32_t ck_result;  /* CUresult of the last answered request */
    _Atomic int32_t ck_tid;     /* the restore thread's tid; 0 = none (no cuInit yet) */
    _Atomic uint64_t ck_saved[FK_MAX_GPUS]; /* bytes given back at checkpoint, per GPU */
    /* restore with gpuPairs: per checkpointed GPU (global index), the GPU to restore onto
     * plus 1; 0 = not named (the same GPU). Written by the controller that holds ck_busy. */
    _Atomic uint32_t ck_map[FK_MAX_GPUS];
};

enum { FK_CK_LOCK = 1, FK_CK_CHECKPOINT, FK_CK_RESTORE, FK_CK_UNLOCK };
#define FK_CK_REMAP_VERSION 13000 /* driver version from which a restore takes gpuPairs */

enum { FK_EXPORT_FREE = 0, FK_EXPORT_CLAIM, FK_EXPORT_LIVE };

struct fk_export {
    _Atomic uint32_t state;
    uint32_t gpu;
    _Atomic uint64_t seq;
    uint64_t dptr;
    uint64_t size;
    int32_t pid;
    uint32_t pad;
    uint64_t start;
};

struct fk_shared {
    uint32_t magic;
    uint32_t version;
    uint64_t size; /* sizeof(struct fk_shared) */
    uint32_t ngpus;
    uint32_t pad;
    _Atomic uint64_t next_va;
    _Atomic uint64_t dead_seq;
    _Atomic uint64_t export_seq;
    struct fk_gpu gpus[FK_MAX_GPUS];
    struct fk_proc procs[FK_MAX_PROCS];
    struct fk_export exports[FK_MAX_EXPORTS];
};

/* ------------------------------------------------------------------ state.c, devlock.c */
extern struct fk_shared *fk_sh; /* NULL until fk_state_open succeeded */

void fk_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t fk_now_ns(void);      /* CLOCK_MONOTONIC */
uint64_t fk_realtime_us(void); /* CLOCK_REALTIME, microseconds */
int fk_state_open(void);       /* 0 or -1 (reason logged with FGPU_FAKE_DEBUG=1): missing,
                                  unmakeable, or corrupt state file */
uint64_t fk_proc_start(pid_t pid);       /* start time in clock ticks; 0 if no such process */
int fk_alive(int32_t pid, uint64_t start); /* 1 alive (not a zombie, same start time) */
/* 1: stopped by a signal (SIGSTOP), or (with cgroup) in a frozen cgroup v2 */
int fk_stopped(int32_t pid, int cgroup);
uint64_t fk_self_start(void);
int fk_my_slot(void);          /* this process's slot, claimed on first use; -1 if full */
void fk_slot_release_self(void);
void fk_state_after_fork(void); /* in a forked child: locks usable again */
void fk_sweep(void);           /* give back memory of dead processes */
int fk_gpu_by_uuid(const char *uuid); /* global index or -1 */
uint64_t fk_new_va(uint64_t size);    /* unique device address range across processes */
/* GPU indices held by this process's objects (contexts, allocations, pools, modules, ...)
 * are the global indices its devices had at cuInit: "logical". A restore with gpuPairs
 * moves a process onto other GPUs without rewriting those objects: fk_phys gives the
 * physical (global) index behind a logical one, identity until such a restore, and every
 * function below that takes `gpu` translates it. fk_phys_remap (the restore thread, the
 * process checkpointed) makes every logical index behind physical g refer to to[g] (to[g] <
 * 0: unchanged), for all g at once.
 * The fake NVML is a separate library and never translates (identity). */
int fk_phys(int gpu);
void fk_phys_remap(const int *to); /* to: FK_MAX_GPUS entries */
CUresult fk_reserve(int gpu, uint64_t bytes); /* CUDA_ERROR_ILLEGAL_STATE: corrupt counter */
void fk_release(int gpu, uint64_t bytes);      /* never below zero (clamped, logged) */
int fk_device_used(int gpu, uint64_t *used);   /* 0, or -1 when above the total (corrupt) */
CUresult fk_reserve_phys(int gpu, uint64_t bytes); /* the same, by physical index */
void fk_release_phys(int gpu, uint64_t bytes);
void fk_dev_lock(int gpu, int *waiter_out);
void fk_dev_unlock(int gpu, int waiter);
int fk_dev_held(int gpu, int waiter); /* 1 while waiter still holds the device lock */
void fk_dev_busy(int gpu, int slot, uint64_t ns); /* add busy time; caller holds the lock */
uint64_t fk_ring_since(const struct fk_ring *ring, uint64_t busy_now, uint64_t now_ns,
                       uint64_t from_ns, uint64_t *window_start_ns);

/* ------------------------------------------------------------------ process-local state */
#define FK_CTX_MAGIC 0x43545846u
#define FK_STREAM_MAGIC 0x53545246u
#define FK_EVENT_MAGIC 0x45564e46u
#define FK_POOL_MAGIC 0x504f4f46u
#define FK_ARRAY_MAGIC 0x41525246u
#define FK_MODULE_MAGIC 0x4d4f4446u
#define FK_FUNC_MAGIC 0x46554e46u
#define FK_GRAPH_MAGIC 0x47525046u
#define FK_NODE_MAGIC 0x4e4f4446u
#define FK_EXEC_MAGIC 0x45584546u

struct fk_stream;

struct fk_ctx {
    uint32_t magic;
    uint32_t gen; /* fk_local.gen when made: stale after fork */
    int dev;      /* visible ordinal */
    int gpu;      /* index in the shared state */
    int primary;
    int refs;
    uint64_t serial; /* unique in the process, never reused */
    struct fk_stream *null_stream;
    size_t limits[7];      /* cuCtxSetLimit values, by CUlimit */
    uint64_t heap_reserved; /* device memory taken for CU_LIMIT_MALLOC_HEAP_SIZE */
};

struct fk_func {
    uint32_t magic;
    int kind; /* FK_FUNC_SPIN */
};
#define FK_FUNC_SPIN 1

struct fk_module {
    uint32_t magic;
    int gpu;
    uint64_t bytes; /* device memory the image takes ("FGPUFAKE bytes=N" images) */
    struct fk_func spin;
};

struct fk_pool {
    uint32_t magic;
    int gpu;
    int is_default; /* default pools give memory back at once; created ones keep it */
    int destroyed;  /* destroyed with allocations outstanding: freed with the last one */
    uint64_t max_size; /* 0 = no limit */
    uint64_t reserved; /* device memory the pool holds (created pools: whole chunks) */
    uint64_t used;     /* bytes its allocations hold */
    uint64_t allocs;   /* outstanding allocations */
};

struct fk_local {
    pthread_mutex_t lock; /* guards everything below and the allocation table */
    uint32_t gen;
    _Atomic int initialised; /* set (seq_cst) after init_result, under lock; read lock-free */
    CUresult init_result;
    int nvis;
    int vis[FK_MAX_GPUS]; /* visible ordinal -> global gpu index */
    struct fk_ctx *primary[FK_MAX_GPUS];
    struct fk_pool *default_pool[FK_MAX_GPUS];
    uint64_t graph_reserved[FK_MAX_GPUS]; /* graph memory pool, per global gpu */
    uint64_t graph_used[FK_MAX_GPUS];
};
extern struct fk_local fk_g;

/* context.c */
CUresult fk_check_init(void);
CUresult fk_current(struct fk_ctx **out); /* the calling thread's context */
int fk_ctx_valid(const struct fk_ctx *c);
CUresult fk_dev_gpu(CUdevice dev, int *gpu); /* visible ordinal -> global (logical) index */
void fk_uuid_bytes(const char *text, CUuuid *out); /* a uuid string -> cuDeviceGetUuid's bytes */
void fk_ctx_limits_init(struct fk_ctx *c);   /* limits.c: the defaults of a new context */

/* memory.c: the per-process allocation table */
enum { FK_A_MEM = 1, FK_A_PITCH, FK_A_MANAGED, FK_A_ASYNC, FK_A_POOL, FK_A_GRAPH, FK_A_IPC };
struct fk_alloc {
    struct fk_alloc *next;
    uint64_t dptr;
    uint64_t bytes; /* device memory behind it (0 for IPC imports) */
    int gpu;
    int kind;
    struct fk_pool *pool;
    int export_idx; /* -1 when not exported */
    int opens;      /* IPC imports: open count */
    uint64_t ctx_serial; /* cuMemAlloc / Pitch / Managed: the owning context (0: none) */
    unsigned char *data; /* contents.c: host backing (NULL: never written, reads as zeros) */
};
struct fk_alloc *fk_alloc_take(uint64_t dptr); /* remove from the table (caller: fk_g.lock) */
struct fk_alloc *fk_alloc_find(uint64_t dptr); /* caller: fk_g.lock */
struct fk_alloc *fk_alloc_containing(uint64_t dptr); /* any address inside; caller: fk_g.lock */
void fk_alloc_each(void (*fn)(struct fk_alloc *a, void *arg), void *arg); /* caller: fk_g.lock */
void fk_alloc_put(struct fk_alloc *a);         /* caller: fk_g.lock */
struct fk_alloc *fk_alloc_new(uint64_t dptr, uint64_t bytes, int gpu, int kind); /* NULL: no memory */
void fk_alloc_release(struct fk_alloc *a);     /* give the memory back; frees a */
void fk_alloc_forget_all(void);                /* after fork: drop without giving back */
void fk_alloc_release_ctx(uint64_t ctx_serial); /* what a destroyed context owned */
CUresult fk_pool_alloc(struct fk_pool *p, uint64_t bytes, CUdeviceptr *dptr);

/* contents.c (callers hold no lock) */
CUresult fk_contents_write(uint64_t dptr, const void *src, uint64_t n); /* host -> device */
CUresult fk_contents_read(void *dst, uint64_t dptr, uint64_t n);        /* device -> host */
CUresult fk_contents_set(uint64_t dptr, unsigned char value, uint64_t n);
void fk_contents_free(struct fk_alloc *a);
int fk_contents_save(const char *path);  /* caller: fk_g.lock; 0, or -1 (errno) */
int fk_contents_load(const char *path);  /* caller: fk_g.lock; 0, or -1 (errno) */

/* checkpoint.c */
void fk_ck_start(void);  /* after a successful cuInit: the restore thread of this process */
void fk_ck_after_fork(void); /* in a forked child */
void fk_ck_gate(void);   /* blocks while this process is locked or checkpointed */
int fk_ck_path(int32_t pid, uint64_t start, char *buf, size_t len); /* checkpoint file */

/* streams.c */
enum { FK_OP_KERNEL = 1, FK_OP_COPY, FK_OP_EVENT, FK_OP_FREE };
struct fk_event;
struct fk_op {
    struct fk_op *next;
    int kind;
    uint64_t ns;
    struct fk_event *event;
    uint64_t event_gen;
    struct fk_alloc *free_alloc;
};
struct fk_stream *fk_stream_new(struct fk_ctx *c, unsigned int flags);
CUresult fk_resolve_stream(CUstream h, int ptsz, struct fk_stream **out);
struct fk_ctx *fk_stream_ctx(struct fk_stream *s);
CUresult fk_enqueue(struct fk_stream *s, struct fk_op *op); /* takes op */
CUresult fk_stream_sync(struct fk_stream *s);
void fk_ctx_sync(struct fk_ctx *c);
int fk_streams_idle(void); /* 1 when no stream of the process has work queued or running */
void fk_stream_free(struct fk_stream *s); /* drains, stops the worker, frees */
void fk_ctx_streams_free(struct fk_ctx *c); /* every stream of the context */
void fk_streams_after_fork(void);
uint64_t fk_kernel_ns(struct fk_func *f, void **params, CUresult *err);

#endif /* FGPU_FAKE_H */
