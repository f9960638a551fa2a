/*
 * fgpu.h - what the files of libfgpu.so share (internal; nothing here is exported).
 *
 * Files by concern:
 *   config.c    environment, log level, lazy initialisation (pthread_once), fork and exit
 *   resolve.c   the real driver and NVML (handles and pointers), the real dlopen and the
 *               decision of the dlopen interposer (dlopen_x86_64.S / dlopen_aarch64.S jump)
 *   procaddr.c  cuGetProcAddress / _v2 and the hook table built from hooks.h
 *   memory.c    memory accounting: reserve before allocate, give back on free; linear
 *               allocations, cuMemGetInfo
 *   memory_pools.c    stream-ordered allocations (async, pools) and VMM (cuMemCreate)
 *   memory_objects.c  arrays, mipmapped arrays; contexts (destroy, primary release and
 *               reset, the malloc heap limit), cuDeviceTotalMem
 *   memory_graphs.c   graph memory nodes, reserved at every instantiate entry point
 *   launch.c    launch gating: the gate, the launch path before and after a gated call
 *   launch_ring.c   bounded in-flight work, GPU time from events: the ring of entries,
 *               event pools, lanes and their tails (shared with launch*.c in launch_int.h)
 *   launch_sync.c   the synchronize hooks (close tails before, retire after)
 *   launch_hooks.c  the gated entry points (kernels, graphs, async copies and memsets)
 *   nvml.c      NVML memory queries
 *   seg.c       the segment shared with the agent (also in libfgpu-agent.so)
 */
#ifndef FGPU_INTERNAL_H
#define FGPU_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "cuda_api.h"
#include "nvml_api.h"
#include "seg.h"

#define FGPU_EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------ config.c */
enum fgpu_log_level { FGPU_LOG_ERROR = 0, FGPU_LOG_WARN = 1, FGPU_LOG_INFO = 2, FGPU_LOG_DEBUG = 3 };

struct fgpu_state {
    int disabled;          /* FGPU_INTERPOSER=off */
    int active;            /* a valid segment is mapped: hooks do their work */
    int log_level;         /* FGPU_LOG */
    struct fgpu_seg *seg;  /* the workload part (read-write); NULL when not active */
    const struct fgpu_seg_ctl *ctl; /* the agent's part, mapped read-only; NULL when not active */
    int gating;            /* ctl->flags & FGPU_SEG_GATING */
    int capping;           /* ctl->flags & FGPU_SEG_MEMORY_CAP */
    char real_libcuda[512];  /* FGPU_REAL_LIBCUDA or "libcuda.so.1" */
    char real_libnvml[512];  /* FGPU_REAL_LIBNVML or "libnvidia-ml.so.1" */
    char self_dir[512];      /* the folder libfgpu.so was loaded from (for the shims) */
};

FGPU_HIDDEN extern struct fgpu_state fgpu_g;

/* Read the environment and map the segment, once per process image. Cheap after the first
 * call (an acquire load inside pthread_once). */
FGPU_HIDDEN void fgpu_init(void);

/* Only FGPU_INTERPOSER and FGPU_LOG (what the dlopen decision needs; no segment). */
FGPU_HIDDEN void fgpu_init_env(void);

/* This process's procs[] entry, claimed at first use; -1 when none could be claimed. */
FGPU_HIDDEN int fgpu_proc(void);

/* Write one line on stderr when level <= FGPU_LOG. Not for hot paths. */
FGPU_HIDDEN void fgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* CLOCK_MONOTONIC in ns (vDSO, no system call). */
FGPU_HIDDEN uint64_t fgpu_now_ns(void);

/* ------------------------------------------------------------------ resolve.c */
struct fgpu_real {
#define FGPU_HOOK(name) __typeof__(&name) name;
#define FGPU_HELPER(name) __typeof__(&name) name;
#define FGPU_NVML_HOOK(name) __typeof__(&name) name;
#define FGPU_NVML_HELPER(name) __typeof__(&name) name;
#include "hooks.h"
};

FGPU_HIDDEN extern struct fgpu_real fgpu_real;

/* Load the real driver and fill the CUDA pointers of fgpu_real, once. Returns 0, or -1 when
 * the driver cannot be loaded (hooks then answer CUDA_ERROR_NOT_INITIALIZED). */
FGPU_HIDDEN int fgpu_resolve_cuda(void);
/* The same for NVML (hooks then answer NVML_ERROR_LIBRARY_NOT_FOUND). */
FGPU_HIDDEN int fgpu_resolve_nvml(void);

/* The real dlopen (the next definition after ours), resolved once. */
FGPU_HIDDEN extern void *(*fgpu_real_dlopen)(const char *, int);
FGPU_HIDDEN void *fgpu_call_real_dlopen(const char *file, int mode);

/* ------------------------------------------------------------------ procaddr.c */
/* The hook that replaces real pointer p, or p itself when p is not hooked / not active. */
FGPU_HIDDEN void *fgpu_hook_for(void *p);

/* ------------------------------------------------------------------ memory.c */
/* Segment GPU index of a CUDA device (by uuid, cached); FGPU_GPU_NOT_GRANTED when the device
 * is not in the segment (the workload was not given it: with the memory cap on, every
 * allocation there is refused); -1 when the interposer is not active or the device's uuid
 * cannot be read. */
#define FGPU_GPU_NOT_GRANTED (-2)
FGPU_HIDDEN int fgpu_gpu_of_device(CUdevice dev);
/* ... of the current context's device; -1 as above. */
FGPU_HIDDEN int fgpu_gpu_of_current(void);
/* Forget process-local state after fork (child). */
FGPU_HIDDEN void fgpu_memory_atfork_child(void);

/* The accounting primitives shared by memory.c, memory_pools.c, memory_objects.c and
 * memory_graphs.c. Kinds of records (K_HEAP: a context's malloc heap, keyed by the context): */
enum fgpu_rec_kind { K_PTR = 1, K_ARRAY, K_MIPMAP, K_HANDLE, K_GEXEC, K_HEAP };
struct fgpu_gnode { /* a graph's alloc node (memory_graphs.c) */
    int gpu;
    int freed; /* the graph also frees it */
    uint64_t bytes;
    uint64_t dptr;
};
/* Reserve bytes on *gpu before a driver call: CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY past
 * the cap (after one sweep). *gpu < 0 means "not counted" (and is set to -1 when the
 * process has no entry in an uncapped segment). */
FGPU_HIDDEN CUresult fgpu_mem_take(int *gpu, uint64_t bytes);
FGPU_HIDDEN void fgpu_mem_give(int gpu, uint64_t bytes);
/* Remember (kind, key) -> (gpu, bytes, owning context); give back with fgpu_mem_release.
 * fgpu_mem_track: memory of the current context (given back when that context is destroyed
 * or reset); fgpu_mem_track_unbound: memory that outlives its context (VMM handles, pool and
 * graph memory: cuda.h, cuCtxDestroy). */
FGPU_HIDDEN void fgpu_mem_track(int kind, uint64_t key, int gpu, uint64_t bytes);
FGPU_HIDDEN void fgpu_mem_track_unbound(int kind, uint64_t key, int gpu, uint64_t bytes);
FGPU_HIDDEN int fgpu_mem_release(int kind, uint64_t key);
/* Give back and forget every record owned by ctx (it was destroyed); ctx NULL: nothing. */
FGPU_HIDDEN void fgpu_mem_release_ctx(CUcontext ctx);
/* Set the bytes of record (kind, key) owned by ctx (made when missing, dropped at 0) and
 * return what it held before; nothing is reserved or given back here. */
FGPU_HIDDEN uint64_t fgpu_mem_replace(int kind, uint64_t key, CUcontext ctx, int gpu,
                                      uint64_t bytes);
FGPU_HIDDEN uint64_t fgpu_mul_sat(uint64_t a, uint64_t b);
FGPU_HIDDEN uint64_t fgpu_add_sat(uint64_t a, uint64_t b);

/* ------------------------------------------------------------------ launch.c, launch_ring.c */
/* What fgpu_launch_before hands to fgpu_launch_after for one gated call. */
#define FGPU_TOK_JOINED 4
struct fgpu_tok {
    int go; /* 0: not tracked, 1: own entry (start event taken), 2: joined a lane's tail
             * under the lock, 3: the same as its last call (closes it after the driver call),
             * FGPU_TOK_JOINED: joined lock-free (after a successful call, fgpu_launch_after
             * only when *tail_word no longer equals word_seen: the tail ended meanwhile) */
    int ptsz;
    CUstream stream;
    struct fgpu_pool *pool;
    struct fgpu_lane *lane; /* the (context, stream) it was counted on; NULL for none */
    CUcontext ctx;
    _Atomic uint64_t *tail_word; /* FGPU_TOK_JOINED: the lane's tail word, as it was seen */
    uint64_t word_seen;
    CUevent start;
    uint64_t pred_seq; /* 0: start is our own event */
};

/* Before a gated call: wait at a closed gate, retire completed work, keep within
 * max_inflight, take a start event. After it: record the end event (if r is CUDA_SUCCESS). */
FGPU_HIDDEN void fgpu_launch_before(struct fgpu_tok *t, CUstream stream, int ptsz);
FGPU_HIDDEN void fgpu_launch_after(struct fgpu_tok *t, CUresult r);
FGPU_HIDDEN void fgpu_launch_atfork_child(void);
/* Drop the in-flight records and events of a context about to be destroyed. */
FGPU_HIDDEN void fgpu_launch_forget_context(CUcontext ctx);

/* The guard every hook starts with: initialise once, pass through when not active. */
#define FGPU_REAL_OR(name, fail)                                                             \
    do {                                                                                     \
        if (fgpu_resolve_cuda() != 0 || fgpu_real.name == NULL)                              \
            return (fail);                                                                   \
    } while (0)

/* The start of a memory hook: the real function, or straight through when not active. */
#define PASS_IF_INACTIVE(name, ...)                                                          \
    FGPU_REAL_OR(name, CUDA_ERROR_NOT_INITIALIZED);                                          \
    if (!fgpu_g.active)                                                                      \
    return fgpu_real.name(__VA_ARGS__)

#endif /* FGPU_INTERNAL_H */
