/*
 * agent.c - libfgpu-agent.so: the agent's side of a workload's segment, for Python ctypes.
 *
 * Owns: creating a segment's two files (each written to a temporary name, then renamed):
 * the workload part (mode 0600, chown to the workload's user) and the control part
 * (<path>.ctl, mode 0644, owned by the agent's user: the workload can only read it),
 * mapping and unmapping both (one handle, struct fgpu_agent_seg), the agent's writes (gate and
 * heartbeat, max_inflight, a GPU's memory limit), the sweep of dead processes (seg.c, the same
 * code the interposer runs, plus the host's view of other pid namespaces below), a
 * consistent-enough snapshot of the counters in a plain struct and the list of the processes
 * that hold an entry (fgpu_agent_procs).
 *
 * Errors: functions return 0 or a negative errno value; fgpu_agent_open returns NULL and
 * writes the reason into the caller's buffer.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "seg.h"

#define FGPU_API __attribute__((visibility("default")))

/* The agent's handle of one segment: both parts, mapped read-write; or the control part
 * read-only when this process may not write it (not the agent's user: a sweep or a look as
 * the workload's user), and then the agent's writes answer -EPERM. */
struct fgpu_agent_seg {
    struct fgpu_seg *s;
    struct fgpu_seg_ctl *c;
    int ctl_readonly;
};

struct fgpu_agent_gpu {
    char uuid[FGPU_SEG_UUID_LEN];
    uint64_t memory_limit;   /* bytes, 0 = no cap */
    uint64_t memory_reserved;
    uint64_t memory_peak;
    uint64_t gpu_time_ns;
    uint64_t oom_count;
    uint64_t oom_last_bytes;
};

struct fgpu_agent_snapshot {
    uint32_t ngpus;
    uint32_t flags;
    uint32_t gate;
    uint32_t max_inflight;
    uint64_t launches;
    uint64_t gate_waits;
    uint64_t last_launch_ns;   /* CLOCK_MONOTONIC */
    uint64_t processes;        /* entries ever claimed */
    uint32_t live_processes;   /* entries held now (pid > 0) */
    uint32_t inflight;         /* sum over held entries */
    uint32_t waiting;          /* sum over held entries */
    uint32_t pad0;
    struct fgpu_agent_gpu gpus[FGPU_SEG_MAX_GPUS];
};

/* One held procs[] entry: a process that claimed it through the interposer (its own word:
 * the entries are in the workload's part). */
struct fgpu_agent_proc {
    int32_t pid;          /* in the owner's pid namespace */
    uint32_t pad0;
    uint64_t start_ticks; /* field 22 of /proc/<pid>/stat */
    uint64_t pidns_dev;   /* the owner's /proc/self/ns/pid (both 0: unknown) */
    uint64_t pidns_ino;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

FGPU_API uint32_t fgpu_agent_segment_size(void) { return (uint32_t)sizeof(struct fgpu_seg); }

FGPU_API uint32_t fgpu_agent_snapshot_size(void)
{
    return (uint32_t)sizeof(struct fgpu_agent_snapshot);
}

/* Write size bytes made by fill(m, arg) to path atomically: a temporary file (mode, chown
 * to uid/gid unless both are -1) renamed into place. 0 or -errno. */
static int write_file(const char *path, size_t size, mode_t mode, int32_t uid, int32_t gid,
                      void (*fill)(void *m, const void *arg), const void *arg)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    int rc = 0;
    if (ftruncate(fd, (off_t)size) != 0) {
        rc = -errno;
        goto fail;
    }
    if ((uid >= 0 || gid >= 0) && fchown(fd, (uid_t)uid, (gid_t)gid) != 0) {
        rc = -errno;
        goto fail;
    }
    if (fchmod(fd, mode) != 0) {
        rc = -errno;
        goto fail;
    }
    /* the file is zero-filled by ftruncate: fill it through a shared mapping */
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        rc = -errno;
        goto fail;
    }
    fill(m, arg);
    munmap(m, size);
    if (fsync(fd) != 0 || close(fd) != 0) {
        rc = -errno;
        unlink(tmp);
        return rc;
    }
    if (rename(tmp, path) != 0) {
        rc = -errno;
        unlink(tmp);
        return rc;
    }
    return 0;
fail:
    close(fd);
    unlink(tmp);
    return rc;
}

struct create_args {
    const char *workload_id;
    uint32_t ngpus;
    const char *const *uuids;
    const uint64_t *limits;
    uint32_t flags;
    uint32_t max_inflight;
};

static void fill_ctl(void *m, const void *arg)
{
    const struct create_args *a = arg;
    struct fgpu_seg_ctl *c = m;
    c->magic = FGPU_SEG_CTL_MAGIC;
    c->version = FGPU_SEG_VERSION;
    c->size = (uint32_t)sizeof(struct fgpu_seg_ctl);
    c->ngpus = a->ngpus;
    c->flags = a->flags;
    snprintf(c->workload_id, sizeof c->workload_id, "%s", a->workload_id);
    atomic_store(&c->gate, FGPU_GATE_OPEN);
    atomic_store(&c->max_inflight, a->max_inflight);
    atomic_store(&c->agent_beat_ns, now_ns());
    for (uint32_t g = 0; g < a->ngpus; g++) {
        snprintf(c->gpus[g].uuid, sizeof c->gpus[g].uuid, "%s", a->uuids[g]);
        atomic_store(&c->gpus[g].memory_limit, a->limits[g]);
    }
}

static void fill_seg(void *m, const void *arg)
{
    const struct create_args *a = arg;
    struct fgpu_seg *s = m;
    s->magic = FGPU_SEG_MAGIC;
    s->version = FGPU_SEG_VERSION;
    s->size = (uint32_t)sizeof(struct fgpu_seg);
    s->ngpus = a->ngpus;
}

FGPU_API int fgpu_agent_create(const char *path, const char *workload_id, uint32_t ngpus,
                               const char *const *uuids, const uint64_t *limits, uint32_t flags,
                               uint32_t max_inflight, int32_t uid, int32_t gid)
{
    if (path == NULL || workload_id == NULL || ngpus > FGPU_SEG_MAX_GPUS ||
        (ngpus > 0 && (uuids == NULL || limits == NULL)))
        return -EINVAL;
    if (strlen(workload_id) >= FGPU_SEG_ID_LEN)
        return -ENAMETOOLONG;
    for (uint32_t g = 0; g < ngpus; g++) {
        if (uuids[g] == NULL || uuids[g][0] == '\0')
            return -EINVAL;
        if (strlen(uuids[g]) >= FGPU_SEG_UUID_LEN)
            return -ENAMETOOLONG;
    }
    char ctl[PATH_MAX];
    if (fgpu_seg_ctl_path(path, ctl, sizeof ctl) != 0)
        return -ENAMETOOLONG;
    struct create_args a = {workload_id, ngpus, uuids, limits, flags, max_inflight};
    /* the control part first: an interposer that finds the workload part finds it too. Its
     * owner is the agent's user (no chown), readable by all: the workload's user cannot write
     * it, whatever it does to its own mapping */
    int rc = write_file(ctl, sizeof(struct fgpu_seg_ctl), 0644, -1, -1, fill_ctl, &a);
    if (rc != 0)
        return rc;
    rc = write_file(path, sizeof(struct fgpu_seg), 0600, uid, gid, fill_seg, &a);
    if (rc != 0)
        unlink(ctl);
    return rc;
}

FGPU_API struct fgpu_agent_seg *fgpu_agent_open(const char *path, char *why, size_t why_len)
{
    char dummy[8];
    if (why == NULL || why_len == 0) {
        why = dummy;
        why_len = sizeof dummy;
    }
    if (path == NULL) {
        snprintf(why, why_len, "path is NULL");
        return NULL;
    }
    struct fgpu_seg *s = fgpu_seg_map(path, why, why_len);
    if (s == NULL)
        return NULL;
    int readonly = 0;
    char ctl[PATH_MAX];
    if (fgpu_seg_ctl_path(path, ctl, sizeof ctl) == 0 && faccessat(AT_FDCWD, ctl, W_OK, AT_EACCESS) != 0 &&
        (errno == EACCES || errno == EPERM || errno == EROFS))
        readonly = 1; /* not ours to write: look, sweep, but decide nothing */
    struct fgpu_seg_ctl *c = fgpu_seg_ctl_map(path, !readonly, why, why_len);
    if (c == NULL) {
        fgpu_seg_unmap(s);
        return NULL;
    }
    struct fgpu_agent_seg *h = malloc(sizeof *h);
    if (h == NULL) {
        snprintf(why, why_len, "out of memory");
        fgpu_seg_unmap(s);
        fgpu_seg_ctl_unmap(c);
        return NULL;
    }
    h->s = s;
    h->c = c;
    h->ctl_readonly = readonly;
    return h;
}

FGPU_API int fgpu_agent_close(struct fgpu_agent_seg *h)
{
    if (h == NULL)
        return -EINVAL;
    fgpu_seg_unmap(h->s);
    fgpu_seg_ctl_unmap(h->c);
    free(h);
    return 0;
}

FGPU_API int fgpu_agent_set_gate(struct fgpu_agent_seg *h, uint32_t gate)
{
    if (h == NULL || (gate != FGPU_GATE_OPEN && gate != FGPU_GATE_CLOSED))
        return -EINVAL;
    if (h->ctl_readonly)
        return -EPERM;
    struct fgpu_seg_ctl *c = h->c;
    atomic_store_explicit(&c->agent_beat_ns, now_ns(), memory_order_relaxed);
    /* release: whatever the agent wrote before (limits) is visible to a launcher that sees
     * the new gate value with its acquire load */
    atomic_store_explicit(&c->gate, gate, memory_order_release);
    if (gate == FGPU_GATE_OPEN) {
        /* shared futex (not PRIVATE): the waiters are in other processes, on their read-only
         * mappings of the same file (the futex is keyed by the file's page, not the map) */
        if (syscall(SYS_futex, (uint32_t *)&c->gate, FUTEX_WAKE, INT_MAX, NULL, NULL, 0) < 0)
            return -errno;
    }
    return 0;
}

/* The agent's heartbeat (CLOCK_MONOTONIC now): a closed gate whose agent stayed silent for
 * more than FGPU_SEG_STALE_NS counts as open in the interposer. */
FGPU_API int fgpu_agent_beat(struct fgpu_agent_seg *h)
{
    if (h == NULL)
        return -EINVAL;
    if (h->ctl_readonly)
        return -EPERM;
    atomic_store_explicit(&h->c->agent_beat_ns, now_ns(), memory_order_relaxed);
    return 0;
}

FGPU_API int fgpu_agent_set_max_inflight(struct fgpu_agent_seg *h, uint32_t max_inflight)
{
    if (h == NULL)
        return -EINVAL;
    if (h->ctl_readonly)
        return -EPERM;
    atomic_store_explicit(&h->c->max_inflight, max_inflight, memory_order_relaxed);
    return 0;
}

/* Renames GPU `gpu` of the segment (a workload restored onto another GPU: its processes
 * keep their device ordinals, now standing for `uuid`). The caller does it while the
 * workload's processes are stopped: the interposer reads the name without a lock. */
FGPU_API int fgpu_agent_set_uuid(struct fgpu_agent_seg *h, uint32_t gpu, const char *uuid)
{
    if (h == NULL || gpu >= h->c->ngpus || uuid == NULL)
        return -EINVAL;
    if (h->ctl_readonly)
        return -EPERM;
    size_t n = strlen(uuid);
    if (n == 0 || n >= FGPU_SEG_UUID_LEN)
        return -EINVAL;
    char buf[FGPU_SEG_UUID_LEN] = {0};
    memcpy(buf, uuid, n);
    memcpy(h->c->gpus[gpu].uuid, buf, sizeof buf);
    return 0;
}

FGPU_API int fgpu_agent_set_memory_limit(struct fgpu_agent_seg *h, uint32_t gpu, uint64_t bytes)
{
    if (h == NULL || gpu >= h->c->ngpus)
        return -EINVAL;
    if (h->ctl_readonly)
        return -EPERM;
    atomic_store_explicit(&h->c->gpus[gpu].memory_limit, bytes, memory_order_relaxed);
    return 0;
}

/* The innermost pid of /proc/<host>/status's NSpid line (the pid in the process's own pid
 * namespace) and how many namespaces the line lists; -1 when unreadable (it exited). */
static int ns_pid_of(int host, int32_t *pid, int *levels)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", host);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return -1;
    char line[512];
    int rc = -1;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "NSpid:", 6) != 0)
            continue;
        *levels = 0;
        char *p = line + 6, *end;
        for (;;) {
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            *pid = (int32_t)v;
            (*levels)++;
            p = end;
        }
        rc = *levels > 0 ? 0 : -1;
        break;
    }
    fclose(f);
    return rc;
}

/* Whether process host reads boot-relative times as we do (same time namespace, or a
 * kernel without time namespaces). */
static int same_time_ns(int host)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/time", host);
    struct stat a, b;
    int ra = stat("/proc/self/ns/time", &a), rb = stat(path, &b);
    if (ra != 0 && rb != 0)
        return 1;
    return ra == 0 && rb == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* The entries of other pid namespaces, judged from the host's: every process of every
 * namespace is under /proc there, with its namespace (/proc/<pid>/ns/pid) and its pid in
 * that namespace (NSpid). An entry is alive when a process of its namespace has its pid and
 * start time (or is of another time namespace, whose start times are read with another
 * boot-time offset: kept); dead otherwise, its namespace gone included (a restarted
 * container). Nothing
 * is judged when a process that may belong to another namespace cannot be examined
 * (EACCES: not root, or no CAP_SYS_PTRACE), since it might be the owner. */
static uint64_t sweep_other_namespaces(struct fgpu_seg *s, struct fgpu_pidns me)
{
    int32_t pid[FGPU_SEG_MAX_PROCS];
    uint64_t ticks[FGPU_SEG_MAX_PROCS];
    struct fgpu_pidns ns[FGPU_SEG_MAX_PROCS];
    unsigned char alive[FGPU_SEG_MAX_PROCS];
    int n = 0;
    for (int p = 0; p < FGPU_SEG_MAX_PROCS; p++) {
        struct fgpu_seg_proc *e = &s->procs[p];
        pid[p] = atomic_load_explicit(&e->pid, memory_order_acquire);
        ticks[p] = atomic_load_explicit(&e->start_ticks, memory_order_relaxed);
        ns[p].dev = atomic_load_explicit(&e->pidns_dev, memory_order_relaxed);
        ns[p].ino = atomic_load_explicit(&e->pidns_ino, memory_order_relaxed);
        alive[p] = 0;
        if (pid[p] <= 0 || (ns[p].dev == me.dev && ns[p].ino == me.ino))
            pid[p] = 0; /* free, busy, or ours (fgpu_seg_sweep judged it) */
        else
            n++;
    }
    if (n == 0)
        return 0;
    DIR *d = opendir("/proc");
    if (d == NULL)
        return 0;
    int blind = 0;
    struct dirent *de;
    while (!blind && (de = readdir(d)) != NULL) {
        char *end;
        long host = strtol(de->d_name, &end, 10);
        if (*end != '\0' || host <= 0 || host > INT_MAX)
            continue; /* not a process */
        int32_t inner = 0;
        int levels = 0;
        if (ns_pid_of((int)host, &inner, &levels) != 0 || levels < 2)
            continue; /* gone, or a process of the host's namespace */
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/ns/pid", (int)host);
        struct stat st;
        if (stat(path, &st) != 0) {
            if (errno != ENOENT && errno != ESRCH)
                blind = 1;
            continue;
        }
        uint64_t now = 0;
        for (int p = 0; p < FGPU_SEG_MAX_PROCS; p++) {
            if (pid[p] != inner || ns[p].dev != (uint64_t)st.st_dev ||
                ns[p].ino != (uint64_t)st.st_ino)
                continue;
            if (now == 0)
                now = fgpu_proc_start_ticks((pid_t)host);
            /* a start time read through another time namespace carries its boot-time
             * offset: not comparable, so the entry is kept */
            if ((now != 0 && now == ticks[p]) || !same_time_ns((int)host))
                alive[p] = 1;
        }
    }
    closedir(d);
    if (blind)
        return 0;
    uint64_t total = 0;
    for (int p = 0; p < FGPU_SEG_MAX_PROCS; p++) {
        if (pid[p] > 0 && !alive[p])
            total += fgpu_seg_reclaim_dead(s, p, pid[p], ticks[p], ns[p]);
    }
    return total;
}

/* The agent's sweep: the entries of its own pid namespace (fgpu_seg_sweep, as in every
 * interposer), and, only from the host's pid namespace with the host's /proc (the one place
 * that sees every namespace whole), the entries of the others. */
FGPU_API uint64_t fgpu_agent_sweep(struct fgpu_agent_seg *h)
{
    if (h == NULL)
        return 0;
    struct fgpu_seg *s = h->s;
    uint64_t total = fgpu_seg_sweep(s);
    struct fgpu_pidns me = fgpu_pidns_self();
    if (me.ino == FGPU_PIDNS_INIT_INO && fgpu_procfs_is_own())
        total += sweep_other_namespaces(s, me);
    return total;
}

FGPU_API int fgpu_agent_snapshot(struct fgpu_agent_seg *h, struct fgpu_agent_snapshot *out)
{
    if (h == NULL || out == NULL)
        return -EINVAL;
    struct fgpu_seg *s = h->s;
    const struct fgpu_seg_ctl *c = h->c;
    memset(out, 0, sizeof *out);
    /* the shape and the decisions from the control part (the agent's); the counters from
     * the workload part (the workload's own account) */
    out->ngpus = c->ngpus;
    out->flags = c->flags;
    /* relaxed loads: each counter is read once; the snapshot is not one atomic instant */
    out->gate = atomic_load_explicit(&c->gate, memory_order_relaxed);
    out->max_inflight = atomic_load_explicit(&c->max_inflight, memory_order_relaxed);
    out->launches = atomic_load_explicit(&s->launches, memory_order_relaxed);
    out->gate_waits = atomic_load_explicit(&s->gate_waits, memory_order_relaxed);
    out->last_launch_ns = atomic_load_explicit(&s->last_launch_ns, memory_order_relaxed);
    out->processes = atomic_load_explicit(&s->processes, memory_order_relaxed);
    for (uint32_t g = 0; g < c->ngpus && g < FGPU_SEG_MAX_GPUS; g++) {
        struct fgpu_seg_gpu *src = &s->gpus[g];
        struct fgpu_agent_gpu *dst = &out->gpus[g];
        memcpy(dst->uuid, c->gpus[g].uuid, sizeof dst->uuid);
        dst->uuid[sizeof dst->uuid - 1] = '\0';
        dst->memory_limit = atomic_load_explicit(&c->gpus[g].memory_limit, memory_order_relaxed);
        dst->memory_reserved = atomic_load_explicit(&src->memory_reserved, memory_order_relaxed);
        dst->memory_peak = atomic_load_explicit(&src->memory_peak, memory_order_relaxed);
        dst->gpu_time_ns = atomic_load_explicit(&src->gpu_time_ns, memory_order_relaxed);
        dst->oom_count = atomic_load_explicit(&src->oom_count, memory_order_relaxed);
        dst->oom_last_bytes = atomic_load_explicit(&src->oom_last_bytes, memory_order_relaxed);
    }
    for (int p = 0; p < FGPU_SEG_MAX_PROCS; p++) {
        struct fgpu_seg_proc *e = &s->procs[p];
        if (atomic_load_explicit(&e->pid, memory_order_acquire) <= 0)
            continue;
        out->live_processes++;
        out->inflight += atomic_load_explicit(&e->inflight, memory_order_relaxed);
        out->waiting += atomic_load_explicit(&e->waiting, memory_order_relaxed);
    }
    return 0;
}

/* The held entries, up to max of them, into out; returns how many there are (may be more than
 * max) or -EINVAL. */
FGPU_API int fgpu_agent_procs(struct fgpu_agent_seg *h, struct fgpu_agent_proc *out, uint32_t max)
{
    if (h == NULL || (out == NULL && max > 0))
        return -EINVAL;
    struct fgpu_seg *s = h->s;
    int n = 0;
    for (int p = 0; p < FGPU_SEG_MAX_PROCS; p++) {
        struct fgpu_seg_proc *e = &s->procs[p];
        /* acquire: pairs with the claimer's release store of pid (the rest is filled) */
        int32_t pid = atomic_load_explicit(&e->pid, memory_order_acquire);
        if (pid <= 0)
            continue;
        if ((uint32_t)n < max) {
            struct fgpu_agent_proc *o = &out[n];
            memset(o, 0, sizeof *o);
            o->pid = pid;
            o->start_ticks = atomic_load_explicit(&e->start_ticks, memory_order_relaxed);
            o->pidns_dev = atomic_load_explicit(&e->pidns_dev, memory_order_relaxed);
            o->pidns_ino = atomic_load_explicit(&e->pidns_ino, memory_order_relaxed);
        }
        n++;
    }
    return n;
}
