/*
 * nvml.c - the fake NVML (libnvidia-ml.so.1), a STAND-IN for tests (see fake.h): it reads
 * the fake driver's machine-wide state. Every GPU of the state file is listed
 * (CUDA_VISIBLE_DEVICES does not apply to NVML). Memory and process queries first give back
 * the memory of dead processes. Utilization comes from the device time the fake driver
 * counted: over the last second for nvmlDeviceGetUtilizationRates, and since
 * lastSeenTimeStamp (at most 10 s back) for nvmlDeviceGetProcessUtilization. Accounting (per
 * process high-water mark of device memory and lifetime figures) is kept for every process
 * slot and answered while root has turned accounting mode on, as the driver does.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fake.h"
#include "nvml_api.h"

#define FK_NVML_DEV_MAGIC 0x4c4d564eu

struct nvmlDevice_st {
    uint32_t magic;
    int index;
};

static struct nvmlDevice_st devices[FK_MAX_GPUS];
static pthread_mutex_t nvml_lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;

static nvmlReturn_t init(void)
{
    if (fk_state_open() != 0)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    pthread_mutex_lock(&nvml_lock);
    for (int i = 0; i < FK_MAX_GPUS; i++) {
        devices[i].magic = FK_NVML_DEV_MAGIC;
        devices[i].index = i;
    }
    init_count++;
    pthread_mutex_unlock(&nvml_lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return init(); }

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init();
}

nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&nvml_lock);
    nvmlReturn_t rc = init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count > 0)
        init_count--;
    pthread_mutex_unlock(&nvml_lock);
    return rc;
}

static nvmlReturn_t ready(void)
{
    pthread_mutex_lock(&nvml_lock);
    int n = init_count;
    pthread_mutex_unlock(&nvml_lock);
    return n > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

/* The device behind a handle, or an error. */
static nvmlReturn_t dev_index(nvmlDevice_t d, int *index)
{
    nvmlReturn_t rc = ready();
    if (rc != NVML_SUCCESS)
        return rc;
    if (d == NULL || d->magic != FK_NVML_DEV_MAGIC || d->index < 0 ||
        d->index >= (int)fk_sh->ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->index;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_text(char *out, unsigned int length, const char *text)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = ready();
    return rc != NVML_SUCCESS ? rc : copy_text(version, length, "550.54.15");
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t rc = ready();
    if (rc != NVML_SUCCESS)
        return rc;
    if (deviceCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = fk_sh->ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t rc = ready();
    if (rc != NVML_SUCCESS)
        return rc;
    if (device == NULL || index >= fk_sh->ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t rc = ready();
    if (rc != NVML_SUCCESS)
        return rc;
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    int i = fk_gpu_by_uuid(uuid);
    if (i < 0)
        return NVML_ERROR_NOT_FOUND;
    *device = &devices[i];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    int i;
    nvmlReturn_t rc = dev_index(device, &i);
    return rc != NVML_SUCCESS ? rc : copy_text(uuid, length, fk_sh->gpus[i].uuid);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    int i;
    nvmlReturn_t rc = dev_index(device, &i);
    return rc != NVML_SUCCESS ? rc : copy_text(name, length, fk_sh->gpus[i].name);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    int i;
    nvmlReturn_t rc = dev_index(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (index == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)i;
    return NVML_SUCCESS;
}

/* NVML_ERROR_UNKNOWN ("an internal driver error") when the state's counter is corrupt. */
static nvmlReturn_t memory_of(int i, unsigned long long *total, unsigned long long *used)
{
    fk_sweep();
    uint64_t u;
    if (fk_device_used(i, &u) != 0)
        return NVML_ERROR_UNKNOWN;
    *total = fk_sh->gpus[i].total;
    *used = u;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    int i;
    nvmlReturn_t rc = dev_index(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = memory_of(i, &memory->total, &memory->used)) != NVML_SUCCESS)
        return rc;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    int i;
    nvmlReturn_t rc = dev_index(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if ((rc = memory_of(i, &memory->total, &memory->used)) != NVML_SUCCESS)
        return rc;
    memory->reserved = 0;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

/* Processes with a context or memory on the device. */
static nvmlReturn_t running(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    int g;
    nvmlReturn_t rc = dev_index(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    fk_sweep();
    unsigned int n = 0;
    for (int i = 0; i < FK_MAX_PROCS; i++) {
        struct fk_proc *p = &fk_sh->procs[i];
        if (atomic_load(&p->state) != FK_SLOT_LIVE)
            continue;
        uint64_t used = atomic_load(&p->used[g]);
        if (used == 0 && atomic_load(&p->contexts[g]) == 0)
            continue;
        if (infos != NULL && n < *count) {
            infos[n].pid = (unsigned int)atomic_load(&p->pid);
            infos[n].usedGpuMemory = used;
            infos[n].gpuInstanceId = (unsigned int)NVML_VALUE_NOT_AVAILABLE;
            infos[n].computeInstanceId = (unsigned int)NVML_VALUE_NOT_AVAILABLE;
        }
        n++;
    }
    rc = n > *count || (infos == NULL && n > 0) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = n;
    return rc;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return running(device, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return running(device, infoCount, infos);
}

static unsigned int percent(uint64_t busy, uint64_t window)
{
    if (window == 0)
        return 0;
    uint64_t p = (busy * 100u + window / 2) / window;
    return p > 100 ? 100u : (unsigned int)p;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    int g;
    nvmlReturn_t rc = dev_index(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (processSamplesCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = fk_now_ns(), now_us = fk_realtime_us();
    uint64_t back_ns = 1000000000ull; /* lastSeenTimeStamp 0: the last second */
    if (lastSeenTimeStamp != 0)
        back_ns = lastSeenTimeStamp < now_us ? (now_us - lastSeenTimeStamp) * 1000u : 0;
    if (back_ns > 10000000000ull)
        back_ns = 10000000000ull;
    uint64_t from = now > back_ns ? now - back_ns : 0;
    unsigned int n = 0;
    for (int i = 0; i < FK_MAX_PROCS; i++) {
        struct fk_proc *p = &fk_sh->procs[i];
        uint32_t st = atomic_load(&p->state);
        if ((st != FK_SLOT_LIVE && st != FK_SLOT_DEAD) ||
            atomic_load(&p->last_active_ns[g]) <= from)
            continue;
        uint64_t start;
        uint64_t busy = fk_ring_since(&p->ring[g], atomic_load(&p->busy_ns[g]), now, from, &start);
        if (utilization != NULL && n < *processSamplesCount) {
            nvmlProcessUtilizationSample_t *s = &utilization[n];
            memset(s, 0, sizeof *s);
            s->pid = (unsigned int)atomic_load(&p->pid);
            s->timeStamp = now_us;
            s->smUtil = percent(busy, now - start);
        }
        n++;
    }
    if (n == 0)
        return NVML_ERROR_NOT_FOUND; /* no samples newer than lastSeenTimeStamp */
    rc = utilization == NULL || n > *processSamplesCount ? NVML_ERROR_INSUFFICIENT_SIZE
                                                         : NVML_SUCCESS;
    *processSamplesCount = n;
    return rc;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    int g;
    nvmlReturn_t rc = dev_index(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (utilization == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = fk_now_ns(), from = now > 1000000000ull ? now - 1000000000ull : 0, start;
    struct fk_gpu *d = &fk_sh->gpus[g];
    uint64_t busy = fk_ring_since(&d->ring, atomic_load(&d->busy_ns), now, from, &start);
    utilization->gpu = percent(busy, now - start);
    utilization->memory = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode)
{
    int g;
    (void)currentMode;
    (void)pendingMode;
    nvmlReturn_t rc = dev_index(device, &g);
    return rc != NVML_SUCCESS ? rc : NVML_ERROR_NOT_SUPPORTED; /* no MIG in the fake */
}

/* ------------------------------------------------------------------ accounting
 * As the NVML reference's "Accounting Statistics": the mode is per device, off after a
 * driver load, changed only by root (NVML_ERROR_NO_PERMISSION otherwise); while it is off,
 * nvmlDeviceGetAccountingStats answers NVML_ERROR_NOT_SUPPORTED. Stats are kept for running
 * and terminated processes (the slots of dead processes, reused oldest first, are the
 * driver's circular buffer); for a pid seen more than once, the running process, else the
 * one that terminated last. A process that began before the mode was turned on is not
 * accounted (NVML_ERROR_NOT_FOUND): the fake records only what began under accounting. */

nvmlReturn_t nvmlDeviceGetAccountingMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    int g;
    nvmlReturn_t rc = dev_index(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (mode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = atomic_load(&fk_sh->gpus[g].accounting) ? NVML_FEATURE_ENABLED
                                                    : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceSetAccountingMode(nvmlDevice_t device, nvmlEnableState_t mode)
{
    int g;
    nvmlReturn_t rc = dev_index(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (mode != NVML_FEATURE_DISABLED && mode != NVML_FEATURE_ENABLED)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (geteuid() != 0)
        return NVML_ERROR_NO_PERMISSION;
    struct fk_gpu *d = &fk_sh->gpus[g];
    uint32_t was = atomic_exchange(&d->accounting, mode == NVML_FEATURE_ENABLED ? 1u : 0u);
    if (mode == NVML_FEATURE_ENABLED && was == 0)
        atomic_store(&d->accounting_since_us, fk_realtime_us());
    return NVML_SUCCESS;
}

/* Whether slot p is a process of this pid that used GPU g and began under accounting. */
static int accounted(struct fk_proc *p, unsigned int pid, int g, uint64_t since_us)
{
    if ((unsigned int)atomic_load(&p->pid) != pid || atomic_load(&p->start_us) < since_us)
        return 0;
    return atomic_load(&p->peak[g]) != 0 || atomic_load(&p->contexts[g]) != 0 ||
           atomic_load(&p->busy_ns[g]) != 0;
}

nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t device, unsigned int pid,
                                          nvmlAccountingStats_t *stats)
{
    int g;
    nvmlReturn_t rc = dev_index(device, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (stats == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct fk_gpu *d = &fk_sh->gpus[g];
    if (!atomic_load(&d->accounting))
        return NVML_ERROR_NOT_SUPPORTED;
    /* no sweep here (the guard asks for every process every 0.1 s): a process that died is
     * reported terminated from the next process or memory query, which sweeps */
    uint64_t since = atomic_load(&d->accounting_since_us);
    struct fk_proc *found = NULL;
    uint64_t found_order = 0;
    for (int i = 0; i < FK_MAX_PROCS; i++) {
        struct fk_proc *p = &fk_sh->procs[i];
        uint32_t st = atomic_load(&p->state);
        if ((st != FK_SLOT_LIVE && st != FK_SLOT_DEAD) || !accounted(p, pid, g, since))
            continue;
        if (st == FK_SLOT_LIVE) {
            found = p;
            break;
        }
        uint64_t order = atomic_load(&p->dead_order);
        if (found == NULL || order > found_order) {
            found = p;
            found_order = order;
        }
    }
    if (found == NULL)
        return NVML_ERROR_NOT_FOUND;
    int running = atomic_load(&found->state) == FK_SLOT_LIVE;
    uint64_t start = atomic_load(&found->start_us);
    uint64_t end = running ? fk_realtime_us() : atomic_load(&found->end_us);
    uint64_t life_ns = end > start ? (end - start) * 1000u : 0;
    memset(stats, 0, sizeof *stats);
    stats->gpuUtilization = percent(atomic_load(&found->busy_ns[g]), life_ns);
    stats->memoryUtilization = 0; /* the fake models no memory traffic */
    stats->maxMemoryUsage = atomic_load(&found->peak[g]);
    stats->time = running ? 0 : life_ns / 1000000u;
    stats->startTime = start;
    stats->isRunning = running ? 1u : 0u;
    return NVML_SUCCESS;
}
