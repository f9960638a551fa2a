/*
 * checkpoint.c - fake driver (a STAND-IN for tests, see fake.h): the checkpoint API of the
 * CUDA driver (cuda.h since 12.8, "CUDA Checkpointing"): cuCheckpointProcessLock,
 * cuCheckpointProcessCheckpoint, cuCheckpointProcessRestore, cuCheckpointProcessUnlock,
 * cuCheckpointProcessGetState and cuCheckpointProcessGetRestoreThreadId, called by pid from
 * another process.
 *
 * Every process that called cuInit has a restore thread (its tid is what
 * cuCheckpointProcessGetRestoreThreadId gives). A controller posts a request in the target's
 * slot of the shared state file and waits on a futex; the restore thread carries it out in
 * the target process, where the allocations and their contents are:
 *   lock        RUNNING -> LOCKED: the process's CUDA calls block from then on (fk_ck_gate),
 *               then the work already queued on its streams runs to the end. With timeoutMs
 *               and work still running when it passes: back to RUNNING, CUDA_ERROR_NOT_READY.
 *   checkpoint  LOCKED -> CHECKPOINTED: the contents of its memory (contents.c) go to a file
 *               next to the state file (<state>.ckpt.<pid>.<start>), and all the device memory
 *               it held is given back to its GPUs (cuMemGetInfo and NVML of every process see
 *               it free) after the modelled copy time (all it held at 10 GB/s, as cuMemcpy).
 *   restore     CHECKPOINTED -> LOCKED: the same amounts are taken again on the same GPUs and
 *               the contents read back (the same modelled copy time). A GPU without room:
 *               CUDA_ERROR_OUT_OF_MEMORY, nothing taken, the process stays CHECKPOINTED
 *               (restore can be tried again). With args->gpuPairs (CUDA 13, driver version
 *               >= 13000; older: CUDA_ERROR_NOT_SUPPORTED) each checkpointed GPU's amount is
 *               taken on the GPU paired with it instead, and afterwards the process's device
 *               ordinals stand for the new GPUs (fk_phys: its contexts, allocations and
 *               pointers stay as they were; cuDeviceGetUuid, cuMemGetInfo and NVML's
 *               per-process figures show the new GPU). As cuda.h says: the new GPU must be of
 *               the same model ("chip type") and have room, and the pairs must name every
 *               checkpointed GPU. CUDA_ERROR_INVALID_VALUE: an unknown UUID, a different
 *               model, a GPU named twice or a checkpointed GPU left out. A pair for a GPU the
 *               process did not use is ignored (one set of pairs serves every process of a
 *               workload; cuda.h does not say how the driver takes it).
 *   unlock      LOCKED -> RUNNING: blocked calls go on.
 * Any other transition: CUDA_ERROR_ILLEGAL_STATE. A pid that is not a live process that
 * called cuInit on the fake, or the caller's own pid: CUDA_ERROR_INVALID_VALUE. Reserved
 * argument fields not zero: CUDA_ERROR_INVALID_VALUE. The caller must have called cuInit
 * (CUDA_ERROR_NOT_INITIALIZED otherwise).
 * Not modelled: customStorageInfo_out (later CUDA 13 headers); IPC handles exported before
 * a remap still name the old GPU;
 * calls already inside the driver when the lock comes finish (only new calls block); a
 * process stopped (SIGSTOP, cgroup freezer) does not answer until thawed, so a controller
 * freezes it after checkpoint and thaws it before restore.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"
#include "fgpu_procaddr_table.h"

static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t thread_pid; /* the process the restore thread was started in */
/* This process's slot once its restore thread runs (NULL before, and in a forked child until
 * its cuInit): every driver call reads it in fk_ck_gate, so it is one load, no getpid(). A
 * process without a restore thread cannot be locked, so NULL means "never blocked". */
static struct fk_proc *_Atomic gate_proc;

/* The state file is MAP_SHARED: process-shared futexes (no FUTEX_PRIVATE_FLAG). */
static void futex_wait(_Atomic uint32_t *word, uint32_t val, uint64_t timeout_ns)
{
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, timeout_ns ? &ts : NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The modelled time of copying `bytes` between device and host memory (FK_COPY_BYTES_PER_US,
 * as for cuMemcpy). */
static uint64_t copy_ns(uint64_t bytes)
{
    return bytes / FK_COPY_BYTES_PER_US * 1000u;
}

static void set_state(struct fk_proc *p, uint32_t state)
{
    atomic_store_explicit(&p->ck_state, state, memory_order_release);
    futex_wake(&p->ck_state);
}

/* ------------------------------------------------------------------ the target process */

void fk_ck_gate(void)
{
    struct fk_proc *p = atomic_load_explicit(&gate_proc, memory_order_acquire);
    if (p == NULL)
        return;
    for (;;) {
        uint32_t st = atomic_load_explicit(&p->ck_state, memory_order_acquire);
        if (st != CU_PROCESS_STATE_LOCKED && st != CU_PROCESS_STATE_CHECKPOINTED)
            return;
        futex_wait(&p->ck_state, st, 0);
    }
}

static CUresult do_lock(struct fk_proc *p, uint32_t timeout_ms)
{
    if (atomic_load(&p->ck_state) != CU_PROCESS_STATE_RUNNING)
        return CUDA_ERROR_ILLEGAL_STATE;
    set_state(p, CU_PROCESS_STATE_LOCKED);
    uint64_t deadline = fk_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (!fk_streams_idle()) { /* queued work runs to the end */
        if (timeout_ms != 0 && fk_now_ns() >= deadline) {
            set_state(p, CU_PROCESS_STATE_RUNNING);
            return CUDA_ERROR_NOT_READY;
        }
        sleep_ns(1000000);
    }
    return CUDA_SUCCESS;
}

static CUresult do_checkpoint(struct fk_proc *p)
{
    if (atomic_load(&p->ck_state) != CU_PROCESS_STATE_LOCKED)
        return CUDA_ERROR_ILLEGAL_STATE;
    char path[4096];
    if (fk_ck_path(atomic_load(&p->pid), atomic_load(&p->start), path, sizeof path) != 0)
        return CUDA_ERROR_UNKNOWN;
    pthread_mutex_lock(&fk_g.lock);
    if (fk_contents_save(path) != 0) {
        int err = errno;
        pthread_mutex_unlock(&fk_g.lock);
        fk_debug("checkpoint: cannot write %s: %s", path, strerror(err));
        return err == ENOSPC || err == ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
    }
    uint64_t total = 0;
    for (uint32_t g = 0; g < fk_sh->ngpus; g++) {
        uint64_t held = atomic_load(&p->used[g]);
        atomic_store(&p->ck_saved[g], held);
        total += held;
    }
    sleep_ns(copy_ns(total)); /* the copy to host memory, before the GPU memory is free */
    for (uint32_t g = 0; g < fk_sh->ngpus; g++)
        fk_release_phys((int)g, atomic_load(&p->ck_saved[g]));
    set_state(p, CU_PROCESS_STATE_CHECKPOINTED);
    pthread_mutex_unlock(&fk_g.lock);
    return CUDA_SUCCESS;
}

/* The GPU checkpointed GPU g is restored onto: ck_map (a restore with gpuPairs), else g. */
static int restore_target(struct fk_proc *p, uint32_t g)
{
    uint32_t m = atomic_load(&p->ck_map[g]);
    return m == 0 ? (int)g : (int)m - 1;
}

static CUresult do_restore(struct fk_proc *p, int paired)
{
    if (atomic_load(&p->ck_state) != CU_PROCESS_STATE_CHECKPOINTED)
        return CUDA_ERROR_ILLEGAL_STATE;
    uint32_t n = fk_sh->ngpus, g;
    int remap = 0;
    for (g = 0; g < n; g++) {
        int used = atomic_load(&p->ck_saved[g]) != 0 || atomic_load(&p->contexts[g]) != 0;
        if (!used)
            atomic_store(&p->ck_map[g], 0); /* a pair for a GPU it did not use: no move */
        else if (paired && atomic_load(&p->ck_map[g]) == 0)
            return CUDA_ERROR_INVALID_VALUE; /* the pairs must name every checkpointed GPU */
        else if (restore_target(p, g) != (int)g)
            remap = 1;
    }
    CUresult rc = CUDA_SUCCESS;
    for (g = 0; g < n && rc == CUDA_SUCCESS; g++) {
        uint64_t want = atomic_load(&p->ck_saved[g]);
        if (want != 0)
            rc = fk_reserve_phys(restore_target(p, g), want);
    }
    if (rc != CUDA_SUCCESS) { /* give back what was taken before the GPU that lacked room */
        for (uint32_t k = 0; k + 1 < g; k++)
            fk_release_phys(restore_target(p, k), atomic_load(&p->ck_saved[k]));
        return rc;
    }
    uint64_t total = 0;
    for (g = 0; g < n; g++)
        total += atomic_load(&p->ck_saved[g]);
    sleep_ns(copy_ns(total)); /* the copy back to the GPU */
    char path[4096];
    if (fk_ck_path(atomic_load(&p->pid), atomic_load(&p->start), path, sizeof path) != 0)
        return CUDA_ERROR_UNKNOWN;
    pthread_mutex_lock(&fk_g.lock);
    int loaded = fk_contents_load(path);
    pthread_mutex_unlock(&fk_g.lock);
    if (loaded != 0) {
        fk_debug("restore: cannot read %s: %s", path, strerror(errno));
        set_state(p, CU_PROCESS_STATE_FAILED);
        return CUDA_ERROR_UNKNOWN;
    }
    unlink(path);
    if (remap) { /* the process's devices now stand for the new GPUs (same ordinals) */
        int to[FK_MAX_GPUS];
        uint32_t ctxs[FK_MAX_GPUS] = {0};
        for (g = 0; g < FK_MAX_GPUS; g++)
            to[g] = g < n && restore_target(p, g) != (int)g ? restore_target(p, g) : -1;
        for (g = 0; g < n; g++)
            if (to[g] >= 0)
                ctxs[g] = atomic_exchange(&p->contexts[g], 0);
        for (g = 0; g < n; g++)
            if (to[g] >= 0)
                atomic_fetch_add(&p->contexts[to[g]], ctxs[g]);
        fk_phys_remap(to);
    }
    for (g = 0; g < n; g++) {
        atomic_store(&p->ck_saved[g], 0);
        atomic_store(&p->ck_map[g], 0);
    }
    set_state(p, CU_PROCESS_STATE_LOCKED);
    return CUDA_SUCCESS;
}

static CUresult do_unlock(struct fk_proc *p)
{
    if (atomic_load(&p->ck_state) != CU_PROCESS_STATE_LOCKED)
        return CUDA_ERROR_ILLEGAL_STATE;
    set_state(p, CU_PROCESS_STATE_RUNNING);
    return CUDA_SUCCESS;
}

static void *restore_thread(void *arg)
{
    struct fk_proc *p = &fk_sh->procs[(intptr_t)arg];
    atomic_store(&p->ck_tid, (int32_t)syscall(SYS_gettid));
    for (;;) {
        uint32_t req = atomic_load_explicit(&p->ck_req, memory_order_acquire);
        if (req == atomic_load(&p->ck_done)) {
            futex_wait(&p->ck_req, req, 0);
            continue;
        }
        CUresult rc;
        switch (atomic_load(&p->ck_op)) {
        case FK_CK_LOCK:
            rc = do_lock(p, atomic_load(&p->ck_arg));
            break;
        case FK_CK_CHECKPOINT:
            rc = do_checkpoint(p);
            break;
        case FK_CK_RESTORE:
            rc = do_restore(p, atomic_load(&p->ck_arg) != 0);
            break;
        case FK_CK_UNLOCK:
            rc = do_unlock(p);
            break;
        default:
            rc = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        atomic_store(&p->ck_result, (int32_t)rc);
        atomic_store_explicit(&p->ck_done, req, memory_order_release);
        futex_wake(&p->ck_done);
    }
    return NULL;
}

void fk_ck_after_fork(void)
{
    pthread_mutex_init(&start_lock, NULL); /* the child has no restore thread until cuInit */
    atomic_store_explicit(&gate_proc, NULL, memory_order_relaxed);
}

void fk_ck_start(void)
{
    pthread_mutex_lock(&start_lock);
    pid_t me = getpid();
    int slot = fk_my_slot();
    if (thread_pid != me && slot >= 0) {
        pthread_t t;
        pthread_attr_t attr;
        sigset_t all, old;
        sigfillset(&all);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_sigmask(SIG_SETMASK, &all, &old); /* signals stay with the program's threads */
        if (pthread_create(&t, &attr, restore_thread, (void *)(intptr_t)slot) == 0) {
            thread_pid = me;
            atomic_store_explicit(&gate_proc, &fk_sh->procs[slot], memory_order_release);
        } else
            fk_debug("cannot start the restore thread: the process cannot be checkpointed");
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
    }
    pthread_mutex_unlock(&start_lock);
}

/* ------------------------------------------------------------------ the controller */

static int all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0)
            return 0;
    return 1;
}

/* The slot of live CUDA process `pid` (one that called cuInit: its restore thread runs). */
static CUresult target(int pid, struct fk_proc **out)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (pid <= 0 || pid == getpid())
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < FK_MAX_PROCS; i++) {
        struct fk_proc *p = &fk_sh->procs[i];
        if (atomic_load(&p->state) == FK_SLOT_LIVE && atomic_load(&p->pid) == pid &&
            atomic_load(&p->ck_tid) != 0 && fk_alive(pid, atomic_load(&p->start))) {
            *out = p;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* Posts one request to the target's restore thread and waits for its answer. Controllers
 * take turns on a slot (ck_busy holds the pid of the one posting; a dead one's turn is
 * taken over). A target that dies meanwhile: CUDA_ERROR_INVALID_VALUE. */
static CUresult request(int pid, uint32_t op, uint32_t arg, const uint32_t *map)
{
    struct fk_proc *p;
    CUresult rc = target(pid, &p);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t start = atomic_load(&p->start);
    uint32_t me = (uint32_t)getpid();
    for (;;) {
        uint32_t holder = 0;
        if (atomic_compare_exchange_strong(&p->ck_busy, &holder, me))
            break;
        if (!fk_alive((int32_t)holder, 0))
            atomic_compare_exchange_strong(&p->ck_busy, &holder, 0);
        else
            sleep_ns(1000000);
    }
    for (int g = 0; g < FK_MAX_GPUS; g++)
        atomic_store(&p->ck_map[g], map != NULL ? map[g] : 0);
    atomic_store(&p->ck_op, op);
    atomic_store(&p->ck_arg, arg);
    uint32_t req = atomic_fetch_add(&p->ck_req, 1) + 1;
    futex_wake(&p->ck_req);
    for (;;) {
        uint32_t done = atomic_load_explicit(&p->ck_done, memory_order_acquire);
        if (done == req) {
            rc = (CUresult)atomic_load(&p->ck_result);
            break;
        }
        futex_wait(&p->ck_done, done, 100000000ull); /* re-checks the target every 100 ms */
        if (!fk_alive(pid, start) || atomic_load(&p->pid) != pid) {
            rc = CUDA_ERROR_INVALID_VALUE;
            break;
        }
    }
    atomic_store(&p->ck_busy, 0);
    return rc;
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    if (args != NULL && (args->reserved0 != 0 || !all_zero(args->reserved1, sizeof args->reserved1)))
        return CUDA_ERROR_INVALID_VALUE;
    return request(pid, FK_CK_LOCK, args != NULL ? args->timeoutMs : 0, NULL);
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
    if (args != NULL && !all_zero(args->reserved, sizeof args->reserved))
        return CUDA_ERROR_INVALID_VALUE;
    return request(pid, FK_CK_CHECKPOINT, 0, NULL);
}

/* The global index of the GPU whose UUID is `u` (the 16 bytes cuDeviceGetUuid gives), or -1. */
static int gpu_by_uuid_bytes(const CUuuid *u)
{
    for (uint32_t i = 0; i < fk_sh->ngpus; i++) {
        CUuuid mine;
        fk_uuid_bytes(fk_sh->gpus[i].uuid, &mine);
        if (memcmp(mine.bytes, u->bytes, sizeof mine.bytes) == 0)
            return (int)i;
    }
    return -1;
}

/* gpuPairs -> map (per old GPU: the new one + 1). CUDA_ERROR_INVALID_VALUE: pairs NULL with
 * a count, an unknown UUID, a GPU named twice as old or as new, or an old and a new GPU of
 * different models (cuda.h: "the same chip type"). Room on the new GPUs and "every
 * checkpointed GPU named" are checked by the restore itself. */
static CUresult pairs_map(const CUcheckpointRestoreArgs *args, uint32_t *map)
{
    uint32_t taken[FK_MAX_GPUS] = {0};
    if (args->gpuPairs == NULL || args->gpuPairsCount > fk_sh->ngpus)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned int i = 0; i < args->gpuPairsCount; i++) {
        int old = gpu_by_uuid_bytes(&args->gpuPairs[i].oldUuid);
        int neu = gpu_by_uuid_bytes(&args->gpuPairs[i].newUuid);
        if (old < 0 || neu < 0 || map[old] != 0 || taken[neu] != 0 ||
            strcmp(fk_sh->gpus[old].name, fk_sh->gpus[neu].name) != 0)
            return CUDA_ERROR_INVALID_VALUE;
        map[old] = (uint32_t)neu + 1;
        taken[neu] = 1;
    }
    return CUDA_SUCCESS;
}

/* FGPU_FAKE_REMAP_REFUSED=1 in the caller's environment: refuse every restore that moves a
 * GPU with CUDA_ERROR_INVALID_VALUE, as r580 drivers are reported to do when the target sees
 * only some GPUs through CUDA_VISIBLE_DEVICES (a test's knob for the caller's fallback). */
static int remap_refused(const uint32_t *map)
{
    const char *knob = getenv("FGPU_FAKE_REMAP_REFUSED");
    if (knob == NULL || strcmp(knob, "1") != 0)
        return 0;
    for (uint32_t g = 0; g < fk_sh->ngpus; g++)
        if (map[g] != 0 && map[g] != g + 1)
            return 1;
    return 0;
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    uint32_t map[FK_MAX_GPUS] = {0};
    uint32_t paired = 0;
    if (args != NULL) {
        if (!all_zero(args->reserved, sizeof args->reserved) || args->reserved1 != 0)
            return CUDA_ERROR_INVALID_VALUE;
        if (args->gpuPairsCount != 0 || args->gpuPairs != NULL) {
            if (FGPU_PROCADDR_CUDA_VERSION < FK_CK_REMAP_VERSION)
                return CUDA_ERROR_NOT_SUPPORTED; /* an older driver: no remapping */
            CUresult rc = fk_check_init();
            if (rc != CUDA_SUCCESS)
                return rc;
            if ((rc = pairs_map(args, map)) != CUDA_SUCCESS)
                return rc;
            if (remap_refused(map))
                return CUDA_ERROR_INVALID_VALUE;
            paired = 1;
        }
    }
    return request(pid, FK_CK_RESTORE, paired, map);
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    if (args != NULL && !all_zero(args->reserved, sizeof args->reserved))
        return CUDA_ERROR_INVALID_VALUE;
    return request(pid, FK_CK_UNLOCK, 0, NULL);
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
    if (state == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_proc *p;
    CUresult rc = target(pid, &p);
    if (rc == CUDA_SUCCESS)
        *state = (CUprocessState)atomic_load(&p->ck_state);
    return rc;
}

CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
    if (tid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_proc *p;
    CUresult rc = target(pid, &p);
    if (rc == CUDA_SUCCESS)
        *tid = atomic_load(&p->ck_tid);
    return rc;
}
