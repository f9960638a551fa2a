/*
 * seg.c - the segment logic shared by the interposer and the agent (see seg.h).
 *
 * Memory orders: the per-GPU counters are plain counters whose only invariant is the cap,
 * kept by one CAS on memory_reserved (acq_rel), so two processes can never both pass the
 * check (no check-then-allocate window). procs[].pid is the publication word of an entry:
 * a claimer fills the entry and then stores its pid with release; readers load the pid
 * with acquire before trusting start_ticks and the pid namespace. A reclaimer owns an entry
 * once its CAS pid -> -1 succeeded, so an entry is given back exactly once.
 *
 * Pid namespaces: an entry's pid is a number in its owner's pid namespace (recorded at
 * claim). Containers of one pod that share a claim share this segment but not their pid
 * namespaces, so a sweeper judges only entries of its own namespace: a pid of another one
 * names some other process here (or none) and must not make a live entry look dead.
 *
 * The control part (the agent's decisions) is a second file, mapped read-only here in the
 * interposer (fgpu_seg.h says why); the workload part's header fields (ngpus) are the
 * workload's to write, so no index into gpus[] or procs[] is taken from them unchecked.
 *
 * Order of the two counters: reserve adds to gpus[g] first and to procs[p] second; give
 * back subtracts from procs[p] first and gpus[g] second. A process killed between the two
 * steps leaves gpus[g] too high by that one amount (stricter than the cap, never looser).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "seg.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int fgpu_seg_check(const struct fgpu_seg *s, size_t mapped_size, char *why, size_t why_len)
{
    if (mapped_size < sizeof(struct fgpu_seg)) {
        snprintf(why, why_len, "size %zu is smaller than the segment (%zu bytes)", mapped_size,
                 sizeof(struct fgpu_seg));
        return -1;
    }
    if (s->magic != FGPU_SEG_MAGIC) {
        snprintf(why, why_len, "magic 0x%08x is not 0x%08x", s->magic, FGPU_SEG_MAGIC);
        return -1;
    }
    if (s->version != FGPU_SEG_VERSION) {
        snprintf(why, why_len, "version %u, this library reads version %u", s->version,
                 FGPU_SEG_VERSION);
        return -1;
    }
    if (s->size != sizeof(struct fgpu_seg)) {
        snprintf(why, why_len, "size field %u, this library's segment is %zu bytes", s->size,
                 sizeof(struct fgpu_seg));
        return -1;
    }
    if (s->ngpus > FGPU_SEG_MAX_GPUS) {
        snprintf(why, why_len, "ngpus %u is over the maximum %d", s->ngpus, FGPU_SEG_MAX_GPUS);
        return -1;
    }
    return 0;
}

int fgpu_seg_ctl_check(const struct fgpu_seg_ctl *c, size_t mapped_size, char *why,
                       size_t why_len)
{
    if (mapped_size < sizeof(struct fgpu_seg_ctl)) {
        snprintf(why, why_len, "size %zu is smaller than the control part (%zu bytes)",
                 mapped_size, sizeof(struct fgpu_seg_ctl));
        return -1;
    }
    if (c->magic != FGPU_SEG_CTL_MAGIC) {
        snprintf(why, why_len, "magic 0x%08x is not 0x%08x", c->magic, FGPU_SEG_CTL_MAGIC);
        return -1;
    }
    if (c->version != FGPU_SEG_VERSION) {
        snprintf(why, why_len, "version %u, this library reads version %u", c->version,
                 FGPU_SEG_VERSION);
        return -1;
    }
    if (c->size != sizeof(struct fgpu_seg_ctl)) {
        snprintf(why, why_len, "size field %u, this library's control part is %zu bytes",
                 c->size, sizeof(struct fgpu_seg_ctl));
        return -1;
    }
    if (c->ngpus > FGPU_SEG_MAX_GPUS) {
        snprintf(why, why_len, "ngpus %u is over the maximum %d", c->ngpus, FGPU_SEG_MAX_GPUS);
        return -1;
    }
    return 0;
}

/* Map size bytes of path (read-write or read-only); NULL with the reason in why. */
static void *map_file(const char *path, size_t size, int writable, char *why, size_t why_len)
{
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_len, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_len, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if ((size_t)st.st_size < size) {
        snprintf(why, why_len, "%s: file size %lld is smaller than the segment (%zu bytes)",
                 path, (long long)st.st_size, size);
        close(fd);
        return NULL;
    }
    int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
    void *m = mmap(NULL, size, prot, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(why, why_len, "cannot map %s: %s", path, strerror(err));
        return NULL;
    }
    return m;
}

struct fgpu_seg *fgpu_seg_map(const char *path, char *why, size_t why_len)
{
    struct fgpu_seg *m = map_file(path, sizeof(struct fgpu_seg), 1, why, why_len);
    if (m == NULL)
        return NULL;
    char reason[160];
    if (fgpu_seg_check(m, sizeof(struct fgpu_seg), reason, sizeof reason) != 0) {
        snprintf(why, why_len, "%s: %s", path, reason);
        munmap(m, sizeof(struct fgpu_seg));
        return NULL;
    }
    return m;
}

int fgpu_seg_ctl_path(const char *path, char *out, size_t out_len)
{
    int n = snprintf(out, out_len, "%s%s", path, FGPU_SEG_CTL_SUFFIX);
    return n < 0 || (size_t)n >= out_len ? -1 : 0;
}

struct fgpu_seg_ctl *fgpu_seg_ctl_map(const char *path, int writable, char *why, size_t why_len)
{
    char ctl[4096];
    if (fgpu_seg_ctl_path(path, ctl, sizeof ctl) != 0) {
        snprintf(why, why_len, "segment path too long (%zu bytes)", strlen(path));
        return NULL;
    }
    struct fgpu_seg_ctl *m = map_file(ctl, sizeof(struct fgpu_seg_ctl), writable, why, why_len);
    if (m == NULL)
        return NULL;
    char reason[160];
    if (fgpu_seg_ctl_check(m, sizeof(struct fgpu_seg_ctl), reason, sizeof reason) != 0) {
        snprintf(why, why_len, "%s: %s", ctl, reason);
        munmap(m, sizeof(struct fgpu_seg_ctl));
        return NULL;
    }
    return m;
}

void fgpu_seg_unmap(struct fgpu_seg *s)
{
    if (s != NULL)
        munmap(s, sizeof(struct fgpu_seg));
}

void fgpu_seg_ctl_unmap(const struct fgpu_seg_ctl *c)
{
    if (c != NULL)
        munmap((void *)c, sizeof(struct fgpu_seg_ctl));
}

struct fgpu_pidns fgpu_pidns_self(void)
{
    struct fgpu_pidns ns = {0, 0};
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) == 0) {
        ns.dev = (uint64_t)st.st_dev;
        ns.ino = (uint64_t)st.st_ino;
    }
    return ns;
}

int fgpu_procfs_is_own(void)
{
    char link[32];
    ssize_t n = readlink("/proc/self", link, sizeof link - 1);
    if (n <= 0)
        return 0;
    link[n] = '\0';
    long v = 0;
    for (ssize_t i = 0; i < n; i++) {
        if (link[i] < '0' || link[i] > '9')
            return 0;
        v = v * 10 + (link[i] - '0');
    }
    return v == (long)getpid();
}

static uint64_t start_ticks_at(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char buf[1024];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* the command name (field 2) may hold spaces and ')': fields resume after the last ')' */
    char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ')
        return 0;
    p += 2; /* field 3: state */
    if (*p == 'Z' || *p == 'X' || *p == 'x')
        return 0; /* a zombie's driver state is already gone */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (p == NULL)
            return 0;
        p++;
    }
    uint64_t v = 0;
    while (*p >= '0' && *p <= '9')
        v = v * 10 + (uint64_t)(*p++ - '0');
    return v;
}

uint64_t fgpu_proc_start_ticks(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    return start_ticks_at(path);
}

uint64_t fgpu_proc_self_start_ticks(void) { return start_ticks_at("/proc/self/stat"); }

static int same_ns(const struct fgpu_seg_proc *e, struct fgpu_pidns ns)
{
    return atomic_load_explicit(&e->pidns_dev, memory_order_relaxed) == ns.dev &&
           atomic_load_explicit(&e->pidns_ino, memory_order_relaxed) == ns.ino;
}

/* Whether entry e (loaded with acquire) names the process (pid, start_ticks, ns). */
static int entry_is(const struct fgpu_seg_proc *e, int32_t pid, uint64_t start_ticks,
                    struct fgpu_pidns ns)
{
    return atomic_load_explicit(&e->pid, memory_order_acquire) == pid &&
           atomic_load_explicit(&e->start_ticks, memory_order_relaxed) == start_ticks &&
           same_ns(e, ns);
}

/* Subtract up to want from *a, never below zero; returns what was subtracted. */
static uint64_t sub_sat(_Atomic uint64_t *a, uint64_t want)
{
    uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
    uint64_t take;
    do {
        take = want < cur ? want : cur;
    } while (!atomic_compare_exchange_weak_explicit(a, &cur, cur - take, memory_order_acq_rel,
                                                    memory_order_relaxed));
    return take;
}

/* Give back everything entry p holds; the caller owns p (pid is -1 or its own). */
static uint64_t drain_entry(struct fgpu_seg *s, struct fgpu_seg_proc *e)
{
    uint64_t total = 0;
    for (uint32_t g = 0; g < FGPU_SEG_MAX_GPUS; g++) {
        /* exchange: relaxed is enough, the owner of the entry is the only writer now */
        uint64_t r = atomic_exchange_explicit(&e->reserved[g], 0, memory_order_relaxed);
        if (r != 0) /* every g < FGPU_SEG_MAX_GPUS is in gpus[]: s->ngpus is not trusted */
            total += sub_sat(&s->gpus[g].memory_reserved, r);
    }
    atomic_store_explicit(&e->inflight, 0, memory_order_relaxed);
    atomic_store_explicit(&e->waiting, 0, memory_order_relaxed);
    return total;
}

uint64_t fgpu_seg_release(struct fgpu_seg *s, int p)
{
    if (p < 0 || p >= FGPU_SEG_MAX_PROCS)
        return 0;
    struct fgpu_seg_proc *e = &s->procs[p];
    uint64_t total = drain_entry(s, e);
    atomic_store_explicit(&e->start_ticks, 0, memory_order_relaxed);
    atomic_store_explicit(&e->pidns_dev, 0, memory_order_relaxed);
    atomic_store_explicit(&e->pidns_ino, 0, memory_order_relaxed);
    /* release: the drained counters are visible before the entry reads as free */
    atomic_store_explicit(&e->pid, 0, memory_order_release);
    return total;
}

uint64_t fgpu_seg_reclaim_dead(struct fgpu_seg *s, int p, int32_t pid, uint64_t start_ticks,
                               struct fgpu_pidns ns)
{
    if (p < 0 || p >= FGPU_SEG_MAX_PROCS || pid <= 0)
        return 0;
    struct fgpu_seg_proc *e = &s->procs[p];
    int32_t expect = pid;
    /* acq_rel: we own the entry from here; no other sweeper can take it, and a claimer's
     * fields stored before its release store of pid are visible */
    if (!atomic_compare_exchange_strong_explicit(&e->pid, &expect, -1, memory_order_acq_rel,
                                                 memory_order_relaxed))
        return 0;
    /* the entry may have been freed and claimed again (same pid number) since it was judged */
    if (atomic_load_explicit(&e->start_ticks, memory_order_relaxed) != start_ticks ||
        !same_ns(e, ns)) {
        atomic_store_explicit(&e->pid, pid, memory_order_release);
        return 0;
    }
    return fgpu_seg_release(s, p);
}

uint64_t fgpu_seg_sweep(struct fgpu_seg *s)
{
    struct fgpu_pidns me = fgpu_pidns_self();
    /* a procfs of another pid namespace (unshare --pid without remounting /proc) shows other
     * processes under our pid numbers: then only "this pid exists here" (kill 0) is asked */
    int by_procfs = fgpu_procfs_is_own();
    uint64_t total = 0;
    for (int p = 0; p < FGPU_SEG_MAX_PROCS; p++) {
        struct fgpu_seg_proc *e = &s->procs[p];
        /* acquire: pairs with the claimer's release store of pid, the rest is filled */
        int32_t pid = atomic_load_explicit(&e->pid, memory_order_acquire);
        if (pid <= 0)
            continue;
        uint64_t st = atomic_load_explicit(&e->start_ticks, memory_order_relaxed);
        if (!same_ns(e, me))
            continue; /* another container's pid: not ours to judge */
        if (by_procfs) {
            uint64_t now = fgpu_proc_start_ticks(pid);
            if (now != 0 && now == st)
                continue; /* alive */
        } else if (kill(pid, 0) == 0 || errno == EPERM) {
            continue; /* no usable procfs here: fall back to "the pid exists" */
        }
        total += fgpu_seg_reclaim_dead(s, p, pid, st, me);
    }
    return total;
}

uint64_t fgpu_seg_reclaim_own(struct fgpu_seg *s, pid_t pid, uint64_t start_ticks,
                              struct fgpu_pidns ns)
{
    uint64_t total = 0;
    for (int p = 0; p < FGPU_SEG_MAX_PROCS; p++) {
        struct fgpu_seg_proc *e = &s->procs[p];
        if (entry_is(e, (int32_t)pid, start_ticks, ns))
            total += drain_entry(s, e);
    }
    return total;
}

int fgpu_seg_claim(struct fgpu_seg *s, pid_t pid, uint64_t start_ticks, struct fgpu_pidns ns)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int p = 0; p < FGPU_SEG_MAX_PROCS; p++) {
            struct fgpu_seg_proc *e = &s->procs[p];
            if (entry_is(e, (int32_t)pid, start_ticks, ns)) {
                /* our previous image (exec keeps pid and start time): its driver memory
                 * was freed by the exec, so give its reservations back and reuse it */
                drain_entry(s, e);
                return p;
            }
        }
        for (int p = 0; p < FGPU_SEG_MAX_PROCS; p++) {
            struct fgpu_seg_proc *e = &s->procs[p];
            int32_t expect = 0;
            if (!atomic_compare_exchange_strong_explicit(&e->pid, &expect, -1,
                                                         memory_order_acq_rel,
                                                         memory_order_relaxed))
                continue;
            drain_entry(s, e); /* a free entry holds nothing; stay safe if it did */
            atomic_store_explicit(&e->start_ticks, start_ticks, memory_order_relaxed);
            atomic_store_explicit(&e->pidns_dev, ns.dev, memory_order_relaxed);
            atomic_store_explicit(&e->pidns_ino, ns.ino, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->processes, 1, memory_order_relaxed);
            /* release: the identity and the zeroed counters are visible with the pid */
            atomic_store_explicit(&e->pid, (int32_t)pid, memory_order_release);
            return p;
        }
        if (pass == 0)
            fgpu_seg_sweep(s);
    }
    return -1;
}

int fgpu_seg_reserve(struct fgpu_seg *s, const struct fgpu_seg_ctl *c, int p, uint32_t g,
                     uint64_t bytes)
{
    if (p < 0 || p >= FGPU_SEG_MAX_PROCS || g >= c->ngpus)
        return -1;
    struct fgpu_seg_gpu *gpu = &s->gpus[g];
    int capped = (c->flags & FGPU_SEG_MEMORY_CAP) != 0;
    uint64_t cur = atomic_load_explicit(&gpu->memory_reserved, memory_order_relaxed);
    uint64_t next;
    do {
        /* the limit may move (agent); read it on every try, relaxed: it is one value */
        uint64_t limit = atomic_load_explicit(&c->gpus[g].memory_limit, memory_order_relaxed);
        if (capped && limit != 0 && (bytes > limit || cur > limit - bytes))
            return -1;
        next = cur + bytes;
        /* acq_rel: the decision and the new total are one step; no window between them */
    } while (!atomic_compare_exchange_weak_explicit(&gpu->memory_reserved, &cur, next,
                                                    memory_order_acq_rel,
                                                    memory_order_relaxed));
    atomic_fetch_add_explicit(&s->procs[p].reserved[g], bytes, memory_order_relaxed);
    uint64_t peak = atomic_load_explicit(&gpu->memory_peak, memory_order_relaxed);
    while (next > peak && !atomic_compare_exchange_weak_explicit(
                              &gpu->memory_peak, &peak, next, memory_order_relaxed,
                              memory_order_relaxed)) {
    }
    return 0;
}

void fgpu_seg_unreserve(struct fgpu_seg *s, int p, uint32_t g, uint64_t bytes)
{
    if (p < 0 || p >= FGPU_SEG_MAX_PROCS || g >= FGPU_SEG_MAX_GPUS)
        return;
    uint64_t took = sub_sat(&s->procs[p].reserved[g], bytes);
    sub_sat(&s->gpus[g].memory_reserved, took);
}

int fgpu_seg_find_gpu(const struct fgpu_seg_ctl *c, const char *uuid)
{
    for (uint32_t g = 0; g < c->ngpus && g < FGPU_SEG_MAX_GPUS; g++) {
        if (strncmp(c->gpus[g].uuid, uuid, FGPU_SEG_UUID_LEN) == 0)
            return (int)g;
    }
    return -1;
}
