/*
 * config.c - configuration, logging and the life of the process (libfgpu.so).
 *
 * Owns: reading FGPU_INTERPOSER, FGPU_LOG, FGPU_SEG, FGPU_REAL_LIBCUDA, FGPU_REAL_LIBNVML;
 * mapping the segment (once, lazily, from the first hook that needs it: pthread_once);
 * claiming this process's procs[] entry at cuInit (or its first use); fork (the child forgets the parent's
 * CUDA state and claims its own entry) and exit (the entry is given back).
 *
 * Nothing is printed before a CUDA or NVML hook (or a dlopen of the driver) runs, so a
 * program that never touches CUDA sees no difference. The one thing done at load, only where
 * FGPU_SEG is set: give back what this pid's previous image (before exec) held.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fgpu.h"

struct fgpu_state fgpu_g = {.log_level = FGPU_LOG_WARN};

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static pthread_once_t seg_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t proc_lock = PTHREAD_MUTEX_INITIALIZER;
/* -2: not claimed yet; -1: could not claim; >= 0: index. relaxed/acquire noted at uses. */
static _Atomic int proc_index = -2;

void fgpu_log(int level, const char *fmt, ...)
{
    if (level > fgpu_g.log_level)
        return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    char line[768];
    int n = snprintf(line, sizeof line, "fgpu[%d] %s: ", (int)getpid(), names[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    /* one write: lines of concurrent processes do not interleave */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

uint64_t fgpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* vDSO: no system call */
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void copy_path(char *dst, size_t n, const char *env, const char *dflt)
{
    const char *v = getenv(env);
    snprintf(dst, n, "%s", (v != NULL && v[0] != '\0') ? v : dflt);
}

static void read_env(void)
{
    const char *lvl = getenv("FGPU_LOG");
    if (lvl != NULL && lvl[0] != '\0') {
        if (strcmp(lvl, "debug") == 0)
            fgpu_g.log_level = FGPU_LOG_DEBUG;
        else if (strcmp(lvl, "info") == 0)
            fgpu_g.log_level = FGPU_LOG_INFO;
        else if (strcmp(lvl, "warn") == 0)
            fgpu_g.log_level = FGPU_LOG_WARN;
        else if (strcmp(lvl, "error") == 0)
            fgpu_g.log_level = FGPU_LOG_ERROR;
        else
            fgpu_log(FGPU_LOG_WARN, "FGPU_LOG=%.40s is not one of debug, info, warn, error; "
                                    "using warn", lvl);
    }
    const char *off = getenv("FGPU_INTERPOSER");
    if (off != NULL && (strcmp(off, "off") == 0 || strcmp(off, "0") == 0))
        fgpu_g.disabled = 1;
    else if (off != NULL && off[0] != '\0' && strcmp(off, "on") != 0 && strcmp(off, "1") != 0)
        fgpu_log(FGPU_LOG_WARN, "FGPU_INTERPOSER=%.40s is not on or off; staying on", off);
    copy_path(fgpu_g.real_libcuda, sizeof fgpu_g.real_libcuda, "FGPU_REAL_LIBCUDA",
              "libcuda.so.1");
    copy_path(fgpu_g.real_libnvml, sizeof fgpu_g.real_libnvml, "FGPU_REAL_LIBNVML",
              "libnvidia-ml.so.1");
    Dl_info info;
    if (dladdr((void *)&read_env, &info) != 0 && info.dli_fname != NULL) {
        snprintf(fgpu_g.self_dir, sizeof fgpu_g.self_dir, "%s", info.dli_fname);
        char *slash = strrchr(fgpu_g.self_dir, '/');
        if (slash != NULL)
            *slash = '\0';
        else
            snprintf(fgpu_g.self_dir, sizeof fgpu_g.self_dir, ".");
    }
}

void fgpu_init_env(void) { pthread_once(&env_once, read_env); }

static void atfork_child(void)
{
    /* the child has no CUDA state and a new pid: it claims its own entry when it needs one */
    atomic_store_explicit(&proc_index, -2, memory_order_relaxed);
    pthread_mutex_init(&proc_lock, NULL);
    fgpu_memory_atfork_child();
    fgpu_launch_atfork_child();
}

static void map_segment(void)
{
    fgpu_init_env();
    pthread_atfork(NULL, NULL, atfork_child);
    if (fgpu_g.disabled) {
        fgpu_log(FGPU_LOG_INFO, "FGPU_INTERPOSER=off: every call passes through");
        return;
    }
    const char *path = getenv("FGPU_SEG");
    if (path == NULL || path[0] == '\0') {
        fgpu_log(FGPU_LOG_WARN, "FGPU_SEG is not set: no memory cap and no gating in this "
                                "process (every call passes through)");
        return;
    }
    char why[512];
    struct fgpu_seg *s = fgpu_seg_map(path, why, sizeof why);
    if (s == NULL) {
        fgpu_log(FGPU_LOG_WARN, "FGPU_SEG: %s; every call passes through", why);
        return;
    }
    /* the agent's part: read-only (its file is not the workload's, so neither open for
     * writing nor mprotect can make this mapping writable) */
    const struct fgpu_seg_ctl *c = fgpu_seg_ctl_map(path, 0, why, sizeof why);
    if (c == NULL) {
        fgpu_seg_unmap(s);
        fgpu_log(FGPU_LOG_WARN, "FGPU_SEG: %s; every call passes through", why);
        return;
    }
    fgpu_g.seg = s;
    fgpu_g.ctl = c;
    fgpu_g.gating = (c->flags & FGPU_SEG_GATING) != 0;
    fgpu_g.capping = (c->flags & FGPU_SEG_MEMORY_CAP) != 0;
    fgpu_g.active = 1;
    fgpu_log(FGPU_LOG_DEBUG, "segment %s mapped: workload %.64s, %u GPUs, flags 0x%x", path,
             c->workload_id, c->ngpus, c->flags);
}

void fgpu_init(void) { pthread_once(&seg_once, map_segment); }

int fgpu_proc(void)
{
    /* acquire: pairs with the release store below; the entry was claimed before */
    int p = atomic_load_explicit(&proc_index, memory_order_acquire);
    if (p != -2)
        return p;
    pthread_mutex_lock(&proc_lock);
    p = atomic_load_explicit(&proc_index, memory_order_relaxed);
    if (p == -2) {
        pid_t pid = getpid();
        p = fgpu_seg_claim(fgpu_g.seg, pid, fgpu_proc_self_start_ticks(), fgpu_pidns_self());
        if (p < 0)
            fgpu_log(FGPU_LOG_WARN, "segment has no free process entry (%d held by live "
                                    "processes): allocations on capped GPUs are refused",
                     FGPU_SEG_MAX_PROCS);
        atomic_store_explicit(&proc_index, p, memory_order_release);
    }
    pthread_mutex_unlock(&proc_lock);
    return p;
}

/* cuInit: the entry is claimed before the real driver knows the process, so no process of
 * the workload is ever listed by NVML without one, not even one that only opens a context:
 * the agent compares the two and takes a process on the GPU without an entry, past a grace
 * time, for one that goes around the interposer (issue 27). */
FGPU_EXPORT CUresult cuInit(unsigned int flags)
{
    FGPU_REAL_OR(cuInit, CUDA_ERROR_NOT_INITIALIZED);
    if (fgpu_g.active)
        (void)fgpu_proc();
    return fgpu_real.cuInit(flags);
}

/* exec keeps the pid and the start time, and the driver freed the old image's memory: give
 * back what the old image held as soon as the new one is loaded, even if it never touches
 * CUDA again. Silent (a program that does not use CUDA must not notice) and only in processes
 * that carry FGPU_SEG; the entry stays with the process (fgpu_proc finds it again). */
__attribute__((constructor)) static void fgpu_reclaim_previous_image(void)
{
    const char *off = getenv("FGPU_INTERPOSER");
    const char *path = getenv("FGPU_SEG");
    if (path == NULL || path[0] == '\0' ||
        (off != NULL && (strcmp(off, "off") == 0 || strcmp(off, "0") == 0)))
        return;
    char why[256];
    struct fgpu_seg *s = fgpu_seg_map(path, why, sizeof why);
    if (s == NULL)
        return; /* said (once) when a CUDA call needs the segment */
    pid_t pid = getpid();
    fgpu_seg_reclaim_own(s, pid, fgpu_proc_self_start_ticks(), fgpu_pidns_self());
    fgpu_seg_unmap(s);
}

__attribute__((destructor)) static void fgpu_exit(void)
{
    int p = atomic_load_explicit(&proc_index, memory_order_acquire);
    if (fgpu_g.active && p >= 0 && atomic_load(&fgpu_g.seg->procs[p].pid) == (int32_t)getpid())
        fgpu_seg_release(fgpu_g.seg, p); /* the driver frees this process's memory at exit */
}
