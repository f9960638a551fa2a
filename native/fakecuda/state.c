/*
 * state.c - the fake driver's machine-wide state (a STAND-IN for tests, see fake.h): the
 * shared file, its creation from FGPU_FAKE_GPUS, process slots and their liveness, the sweep
 * that gives back a dead process's memory, and the device memory counters. Compiled into
 * both fake libraries.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"

struct fk_shared *fk_sh;
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t slot_pid;  /* the pid fk_slot was claimed for (a forked child claims anew) */
static int slot_index = -1;
static uint64_t self_start;
static pid_t self_start_pid;

void fk_debug(const char *fmt, ...)
{
    const char *on = getenv("FGPU_FAKE_DEBUG");
    if (on == NULL || on[0] == '\0' || strcmp(on, "0") == 0)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fgpu-fakecuda[%d]: %s\n", (int)getpid(), line);
}

uint64_t fk_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t fk_realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000u;
}

/* ------------------------------------------------------------------ liveness */

/* Reads /proc/<pid>/stat: the state letter (field 3) and start time (field 22). */
static int read_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL || p[1] != ' ')
        return -1;
    p += 2;
    *state = *p;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (p == NULL)
            return -1;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return 0;
}

uint64_t fk_proc_start(pid_t pid)
{
    char state;
    uint64_t start;
    return read_stat(pid, &state, &start) == 0 ? start : 0;
}

uint64_t fk_self_start(void)
{
    pid_t me = getpid();
    if (self_start_pid != me) {
        self_start = fk_proc_start(me);
        self_start_pid = me;
    }
    return self_start;
}

int fk_alive(int32_t pid, uint64_t start)
{
    if (pid <= 0)
        return 0;
    if (pid == getpid())
        return start == 0 || start == fk_self_start();
    char state;
    uint64_t now_start;
    if (read_stat(pid, &state, &now_start) != 0)
        return kill(pid, 0) == 0 || errno == EPERM ? 1 : 0; /* no /proc: existence only */
    if (state == 'Z' || state == 'X')
        return 0;
    return start == 0 || start == now_start;
}

/* Whether the process is held off the CPU by fgpu's freezers: stopped by a signal (state T
 * or t) or in a frozen cgroup v2 (its cgroup.events says "frozen 1"). */
int fk_stopped(int32_t pid, int cgroup)
{
    char state;
    uint64_t start;
    if (pid <= 0 || read_stat(pid, &state, &start) != 0)
        return 0;
    if (state == 'T' || state == 't')
        return 1;
    if (!cgroup)
        return 0;
    char path[96], line[512];
    snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return 0;
    int found = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "0::", 3) == 0) { /* the v2 hierarchy */
            line[strcspn(line, "\n")] = '\0';
            found = 1;
            break;
        }
    }
    fclose(f);
    if (!found)
        return 0;
    char events[640];
    snprintf(events, sizeof events, "/sys/fs/cgroup%s/cgroup.events", line + 3);
    f = fopen(events, "re");
    if (f == NULL)
        return 0;
    int frozen = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strcmp(line, "frozen 1\n") == 0)
            frozen = 1;
    }
    fclose(f);
    return frozen;
}

/* ------------------------------------------------------------------ creation */

static int parse_gpus(const char *spec, struct fk_shared *sh)
{
    char *copy = strdup(spec);
    if (copy == NULL)
        return -1;
    int n = 0, rc = 0;
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item != NULL;
         item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        char *colon = eq ? strrchr(eq, ':') : NULL;
        if (eq == NULL || colon == NULL || eq == item || colon == eq + 1) {
            fk_debug("FGPU_FAKE_GPUS: entry '%s' is not UUID=MODEL:MIB", item);
            rc = -1;
            break;
        }
        *eq = '\0';
        *colon = '\0';
        char *end = NULL;
        errno = 0;
        unsigned long long mib = strtoull(colon + 1, &end, 10);
        if (errno != 0 || end == colon + 1 || *end != '\0' || mib == 0 || mib > (1ull << 30)) {
            fk_debug("FGPU_FAKE_GPUS: memory '%s' of %s is not a MiB count in 1..2^30",
                     colon + 1, item);
            rc = -1;
            break;
        }
        if (strlen(item) >= FK_NAME_LEN || strlen(eq + 1) >= FK_NAME_LEN) {
            fk_debug("FGPU_FAKE_GPUS: uuid or model of '%s' longer than %d", item,
                     FK_NAME_LEN - 1);
            rc = -1;
            break;
        }
        if (n == FK_MAX_GPUS) {
            fk_debug("FGPU_FAKE_GPUS: more than %d GPUs", FK_MAX_GPUS);
            rc = -1;
            break;
        }
        for (int i = 0; i < n; i++) {
            if (strcmp(sh->gpus[i].uuid, item) == 0) {
                fk_debug("FGPU_FAKE_GPUS: uuid %s given twice", item);
                rc = -1;
            }
        }
        if (rc != 0)
            break;
        strcpy(sh->gpus[n].uuid, item);
        strcpy(sh->gpus[n].name, eq + 1);
        sh->gpus[n].total = mib << 20;
        n++;
    }
    free(copy);
    if (rc == 0 && n == 0) {
        fk_debug("FGPU_FAKE_GPUS: no GPUs in '%s'", spec);
        rc = -1;
    }
    sh->ngpus = (uint32_t)n;
    return rc;
}

/* Whether the mapped header describes GPUs this code can index safely: 1..FK_MAX_GPUS of
 * them, each named by terminated strings, with a total in 1 MiB..2^30 MiB (what
 * FGPU_FAKE_GPUS allows). A used counter out of range is found where it is read
 * (fk_device_used), so that processes already running see it too. */
static int check_header(const struct fk_shared *sh, const char *path)
{
    if (sh->ngpus == 0 || sh->ngpus > FK_MAX_GPUS) {
        fk_debug("state file %s is corrupt: %u GPUs (1..%d)", path, sh->ngpus, FK_MAX_GPUS);
        return -1;
    }
    for (uint32_t i = 0; i < sh->ngpus; i++) {
        const struct fk_gpu *d = &sh->gpus[i];
        if (memchr(d->uuid, '\0', FK_NAME_LEN) == NULL ||
            memchr(d->name, '\0', FK_NAME_LEN) == NULL) {
            fk_debug("state file %s is corrupt: GPU %u's uuid or name is not terminated", path,
                     i);
            return -1;
        }
        if (d->total < (1ull << 20) || d->total > (1ull << 50)) {
            fk_debug("state file %s is corrupt: GPU %u total %llu bytes (1 MiB..2^30 MiB)",
                     path, i, (unsigned long long)d->total);
            return -1;
        }
    }
    return 0;
}

static int map_file(int fd, const char *path)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != sizeof(struct fk_shared)) {
        fk_debug("state file %s: size %lld, expected %zu (another version?)", path,
                 (long long)st.st_size, sizeof(struct fk_shared));
        return -1;
    }
    void *m = mmap(NULL, sizeof(struct fk_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        fk_debug("state file %s: mmap: %s", path, strerror(errno));
        return -1;
    }
    struct fk_shared *sh = m;
    if (sh->magic != FK_MAGIC || sh->version != FK_VERSION || sh->size != sizeof *sh) {
        fk_debug("state file %s: not a fake-GPU state of version %u", path, FK_VERSION);
        munmap(m, sizeof *sh);
        return -1;
    }
    if (check_header(sh, path) != 0) {
        munmap(m, sizeof *sh);
        return -1;
    }
    fk_sh = sh;
    return 0;
}

/* Makes the file under a temporary name, then links it into place: racing first users
 * agree on whichever link landed first. Mode 0600: only the creating user's processes may
 * use the pretend GPUs; a service whose workloads run as other users widens it itself
 * (fgpu.agent.fakegpu.state_file_mode, docs/governor.md). */
static int create_file(const char *path)
{
    const char *spec = getenv("FGPU_FAKE_GPUS");
    if (spec == NULL || spec[0] == '\0') {
        fk_debug("state file %s does not exist and FGPU_FAKE_GPUS is not set", path);
        return -1;
    }
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d.%llu", path, (int)getpid(),
                 (unsigned long long)fk_now_ns()) >= (int)sizeof tmp)
        return -1;
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        fk_debug("state file %s: cannot create %s: %s", path, tmp, strerror(errno));
        return -1;
    }
    int rc = -1;
    struct fk_shared *sh = MAP_FAILED;
    if (ftruncate(fd, sizeof *sh) != 0)
        goto out;
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED)
        goto out;
    if (parse_gpus(spec, sh) != 0)
        goto out;
    sh->size = sizeof *sh;
    sh->version = FK_VERSION;
    atomic_store(&sh->next_va, 0x100000000000ull); /* 16 TiB: looks like a device address */
    sh->magic = FK_MAGIC;
    if (msync(sh, sizeof *sh, MS_SYNC) != 0)
        goto out;
    if (link(tmp, path) != 0 && errno != EEXIST) {
        fk_debug("state file %s: link: %s", path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (sh != MAP_FAILED)
        munmap(sh, sizeof *sh);
    close(fd);
    unlink(tmp);
    return rc;
}

int fk_state_open(void)
{
    pthread_mutex_lock(&open_lock);
    int rc = 0;
    if (fk_sh == NULL) {
        const char *path = getenv("FGPU_FAKE_GPU_STATE");
        if (path == NULL || path[0] == '\0') {
            fk_debug("FGPU_FAKE_GPU_STATE is not set: no fake GPUs");
            rc = -1;
        } else {
            int fd = open(path, O_RDWR | O_CLOEXEC);
            if (fd < 0 && errno == ENOENT) {
                if (create_file(path) == 0)
                    fd = open(path, O_RDWR | O_CLOEXEC);
            } else if (fd < 0) {
                fk_debug("state file %s: %s", path, strerror(errno));
            }
            rc = fd < 0 ? -1 : map_file(fd, path);
            if (fd >= 0)
                close(fd);
        }
    }
    pthread_mutex_unlock(&open_lock);
    return rc;
}

int fk_gpu_by_uuid(const char *uuid)
{
    for (uint32_t i = 0; fk_sh != NULL && i < fk_sh->ngpus; i++)
        if (strcmp(fk_sh->gpus[i].uuid, uuid) == 0)
            return (int)i;
    return -1;
}

uint64_t fk_new_va(uint64_t size)
{
    uint64_t span = (size + FK_CHUNK - 1) / FK_CHUNK * FK_CHUNK + FK_CHUNK; /* + a guard gap */
    return atomic_fetch_add_explicit(&fk_sh->next_va, span, memory_order_relaxed);
}

/* ------------------------------------------------------------------ memory counters */

/* Lowers GPU `gpu`'s used counter by `bytes`, never below zero: a counter that holds less
 * than is given back (the file was edited by hand) ends at zero, said in the debug log,
 * instead of wrapping to an enormous figure. */
static void device_sub(int gpu, uint64_t bytes)
{
    struct fk_gpu *d = &fk_sh->gpus[gpu];
    uint64_t cur = atomic_load_explicit(&d->used, memory_order_relaxed), take;
    do {
        take = cur < bytes ? cur : bytes;
    } while (!atomic_compare_exchange_weak_explicit(&d->used, &cur, cur - take,
                                                    memory_order_acq_rel, memory_order_relaxed));
    if (take != bytes)
        fk_debug("state of %s: %llu bytes given back but only %llu counted as used; "
                 "the counter stops at 0 (the state file was changed by hand?)",
                 d->uuid, (unsigned long long)bytes, (unsigned long long)take);
}

/* logical -> physical GPU index + 1 (0 = identity); see fake.h. Read lock-free by every
 * call that takes a GPU; written only while the process is checkpointed (no calls run). */
static _Atomic int phys_map[FK_MAX_GPUS];

int fk_phys(int gpu)
{
    if (gpu < 0 || gpu >= FK_MAX_GPUS)
        return gpu;
    int m = atomic_load_explicit(&phys_map[gpu], memory_order_relaxed);
    return m == 0 ? gpu : m - 1;
}

void fk_phys_remap(const int *to)
{
    int next[FK_MAX_GPUS];
    for (int g = 0; g < FK_MAX_GPUS; g++) { /* all at once: a swap of two GPUs is a remap */
        int ph = fk_phys(g);
        next[g] = to[ph] >= 0 ? to[ph] : ph;
    }
    for (int g = 0; g < FK_MAX_GPUS; g++)
        atomic_store_explicit(&phys_map[g], next[g] == g ? 0 : next[g] + 1, memory_order_relaxed);
}

static int device_used_phys(int gpu, uint64_t *used)
{
    const struct fk_gpu *d = &fk_sh->gpus[gpu];
    uint64_t u = atomic_load_explicit(&d->used, memory_order_acquire);
    if (u > d->total) {
        fk_debug("state of %s is corrupt: %llu bytes used of %llu", d->uuid,
                 (unsigned long long)u, (unsigned long long)d->total);
        return -1;
    }
    *used = u;
    return 0;
}

int fk_device_used(int gpu, uint64_t *used)
{
    return device_used_phys(fk_phys(gpu), used);
}

/* ------------------------------------------------------------------ process slots */

int fk_ck_path(int32_t pid, uint64_t start, char *buf, size_t len)
{
    const char *state = getenv("FGPU_FAKE_GPU_STATE");
    if (state == NULL || state[0] == '\0')
        return -1;
    int n = snprintf(buf, len, "%s.ckpt.%d.%llu", state, (int)pid, (unsigned long long)start);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

static void reclaim_slot(struct fk_proc *p)
{
    if (atomic_load(&p->ck_state) == CU_PROCESS_STATE_CHECKPOINTED) {
        char path[PATH_MAX + 64]; /* a checkpointed process that died: its contents go */
        if (fk_ck_path(atomic_load(&p->pid), atomic_load(&p->start), path, sizeof path) == 0)
            unlink(path);
    }
    atomic_store(&p->ck_state, CU_PROCESS_STATE_RUNNING);
    for (int g = 0; g < FK_MAX_GPUS; g++) {
        uint64_t u = atomic_exchange(&p->used[g], 0);
        if (u != 0 && (uint32_t)g < fk_sh->ngpus)
            device_sub(g, u);
        atomic_store(&p->contexts[g], 0);
    }
    int32_t pid = atomic_load(&p->pid);
    uint64_t start = atomic_load(&p->start);
    for (int i = 0; i < FK_MAX_EXPORTS; i++) {
        struct fk_export *e = &fk_sh->exports[i];
        if (atomic_load(&e->state) == FK_EXPORT_LIVE && e->pid == pid && e->start == start)
            atomic_store(&e->state, FK_EXPORT_FREE);
    }
    atomic_store(&p->end_us, fk_realtime_us());
    atomic_store(&p->dead_order, atomic_fetch_add(&fk_sh->dead_seq, 1) + 1);
    atomic_store_explicit(&p->state, FK_SLOT_DEAD, memory_order_release);
}

void fk_sweep(void)
{
    if (fk_sh == NULL)
        return;
    for (int i = 0; i < FK_MAX_PROCS; i++) {
        struct fk_proc *p = &fk_sh->procs[i];
        if (atomic_load_explicit(&p->state, memory_order_acquire) != FK_SLOT_LIVE)
            continue;
        if (fk_alive(atomic_load(&p->pid), atomic_load(&p->start)))
            continue;
        uint32_t expect = FK_SLOT_LIVE;
        if (atomic_compare_exchange_strong(&p->state, &expect, FK_SLOT_RECLAIM)) {
            fk_debug("gave back the memory of dead process %d", (int)atomic_load(&p->pid));
            reclaim_slot(p);
        }
    }
    /* waiters of dead processes that never got to wait (pid set, no seq) */
    for (uint32_t g = 0; g < fk_sh->ngpus; g++) {
        for (int w = 0; w < FK_MAX_WAITERS; w++) {
            struct fk_waiter *x = &fk_sh->gpus[g].waiters[w];
            int32_t pid = atomic_load(&x->pid);
            if (pid != 0 && atomic_load(&x->seq) == 0 && !fk_alive(pid, atomic_load(&x->start)))
                atomic_compare_exchange_strong(&x->pid, &pid, 0);
        }
    }
}

static int claim_slot(void)
{
    pid_t me = getpid();
    uint64_t start = fk_self_start();
    /* a slot left by this pid before an exec: give its memory back, as exec would */
    for (int i = 0; i < FK_MAX_PROCS; i++) {
        struct fk_proc *p = &fk_sh->procs[i];
        uint32_t expect = FK_SLOT_LIVE;
        if (atomic_load(&p->pid) == me && atomic_load(&p->start) == start &&
            atomic_compare_exchange_strong(&p->state, &expect, FK_SLOT_RECLAIM))
            reclaim_slot(p);
    }
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < FK_MAX_PROCS; i++) {
            uint32_t expect = FK_SLOT_FREE;
            if (atomic_compare_exchange_strong(&fk_sh->procs[i].state, &expect, FK_SLOT_CLAIM))
                return i;
        }
        for (;;) { /* the slot of the process that died first */
            int best = -1;
            uint64_t best_order = UINT64_MAX;
            for (int i = 0; i < FK_MAX_PROCS; i++) {
                struct fk_proc *p = &fk_sh->procs[i];
                if (atomic_load(&p->state) == FK_SLOT_DEAD &&
                    atomic_load(&p->dead_order) < best_order) {
                    best = i;
                    best_order = atomic_load(&p->dead_order);
                }
            }
            if (best < 0)
                break;
            uint32_t expect = FK_SLOT_DEAD;
            if (atomic_compare_exchange_strong(&fk_sh->procs[best].state, &expect,
                                               FK_SLOT_CLAIM))
                return best;
        }
        fk_sweep();
    }
    return -1;
}

int fk_my_slot(void)
{
    pid_t me = getpid();
    if (slot_pid == me)
        return slot_index;
    pthread_mutex_lock(&open_lock);
    if (slot_pid != me) {
        int i = claim_slot();
        if (i >= 0) {
            struct fk_proc *p = &fk_sh->procs[i];
            atomic_store(&p->pid, me);
            atomic_store(&p->start, fk_self_start());
            atomic_store(&p->start_us, fk_realtime_us());
            atomic_store(&p->end_us, 0);
            for (int g = 0; g < FK_MAX_GPUS; g++) {
                atomic_store(&p->used[g], 0);
                atomic_store(&p->busy_ns[g], 0);
                atomic_store(&p->last_active_ns[g], 0);
                atomic_store(&p->contexts[g], 0);
                atomic_store(&p->peak[g], 0);
                atomic_store(&p->ring[g].count, 0);
                atomic_store(&p->ck_saved[g], 0);
            }
            atomic_store(&p->ck_state, CU_PROCESS_STATE_RUNNING);
            atomic_store(&p->ck_done, atomic_load(&p->ck_req)); /* nothing pending */
            atomic_store(&p->ck_busy, 0);
            atomic_store(&p->ck_tid, 0);
            atomic_store_explicit(&p->state, FK_SLOT_LIVE, memory_order_release);
        } else {
            fk_debug("all %d process slots of the state file are taken", FK_MAX_PROCS);
        }
        slot_index = i;
        slot_pid = me;
    }
    int i = slot_index;
    pthread_mutex_unlock(&open_lock);
    return i;
}

/* At exit: the memory of this process goes back, like the real driver at teardown. */
void fk_slot_release_self(void)
{
    if (fk_sh == NULL || slot_pid != getpid() || slot_index < 0)
        return;
    struct fk_proc *p = &fk_sh->procs[slot_index];
    uint32_t expect = FK_SLOT_LIVE;
    if (atomic_compare_exchange_strong(&p->state, &expect, FK_SLOT_RECLAIM))
        reclaim_slot(p);
}

/* The device counter is raised before the process's own, and lowered after it: a process
 * killed between the two steps leaks the amount until the state file is replaced, but the
 * sweep can never give back more than was taken. */
CUresult fk_reserve(int gpu, uint64_t bytes)
{
    return fk_reserve_phys(fk_phys(gpu), bytes);
}

CUresult fk_reserve_phys(int gpu, uint64_t bytes)
{
    int slot = fk_my_slot();
    if (slot < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fk_gpu *d = &fk_sh->gpus[gpu];
    uint64_t seen;
    if (device_used_phys(gpu, &seen) != 0)
        return CUDA_ERROR_ILLEGAL_STATE;
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t cur = atomic_load_explicit(&d->used, memory_order_relaxed);
        while (bytes <= d->total && cur <= d->total - bytes) {
            if (atomic_compare_exchange_weak_explicit(&d->used, &cur, cur + bytes,
                                                      memory_order_acq_rel,
                                                      memory_order_relaxed)) {
                struct fk_proc *p = &fk_sh->procs[slot];
                uint64_t held = atomic_fetch_add(&p->used[gpu], bytes) + bytes;
                uint64_t peak = atomic_load(&p->peak[gpu]);
                while (held > peak && !atomic_compare_exchange_weak(&p->peak[gpu], &peak, held))
                    ; /* the high-water mark NVML accounting reports (maxMemoryUsage) */
                return CUDA_SUCCESS;
            }
        }
        if (attempt == 0)
            fk_sweep();
    }
    fk_debug("out of memory on %s: %llu bytes asked, %llu of %llu used", d->uuid,
             (unsigned long long)bytes, (unsigned long long)atomic_load(&d->used),
             (unsigned long long)d->total);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Lowers the process's counter first, by at most what it holds (a concurrent exit-time
 * reclaim may have taken it all), then the device's by the same amount, clamped at zero
 * (device_sub). */
void fk_release(int gpu, uint64_t bytes)
{
    fk_release_phys(fk_phys(gpu), bytes);
}

void fk_release_phys(int gpu, uint64_t bytes)
{
    int slot = fk_my_slot();
    if (slot < 0 || bytes == 0)
        return;
    _Atomic uint64_t *mine = &fk_sh->procs[slot].used[gpu];
    uint64_t cur = atomic_load(mine), take;
    do {
        take = cur < bytes ? cur : bytes;
    } while (!atomic_compare_exchange_weak(mine, &cur, cur - take));
    if (take != 0)
        device_sub(gpu, take);
}

void fk_state_after_fork(void)
{
    pthread_mutex_init(&open_lock, NULL);
}
