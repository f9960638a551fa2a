/*
 * context.c - fake driver (a STAND-IN for tests, see fake.h): cuInit and the visible devices
 * (CUDA_VISIBLE_DEVICES), device queries, contexts (primary and created, a per-thread
 * current-context stack), fork and exit handling.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake.h"
#include "fgpu_procaddr_table.h"

struct fk_local fk_g = {.lock = PTHREAD_MUTEX_INITIALIZER, .gen = 1};

#define FK_CTX_STACK 16
static __thread struct fk_ctx *ctx_stack[FK_CTX_STACK];
static __thread int ctx_depth;

/* ------------------------------------------------------------------ process life */

static void before_fork(void)
{
    pthread_mutex_lock(&fk_g.lock);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&fk_g.lock);
}

/* A forked child starts without CUDA (like the real driver, it must not use the parent's
 * contexts): it has to call cuInit again, and the parent's memory is not its own. */
static void after_fork_child(void)
{
    pthread_mutex_init(&fk_g.lock, NULL);
    fk_state_after_fork();
    fk_streams_after_fork();
    fk_ck_after_fork();
    fk_g.gen++;
    fk_g.initialised = 0;
    fk_g.nvis = 0;
    for (int i = 0; i < FK_MAX_GPUS; i++) {
        fk_g.primary[i] = NULL;
        fk_g.default_pool[i] = NULL;
        fk_g.graph_reserved[i] = 0;
        fk_g.graph_used[i] = 0;
    }
    fk_alloc_forget_all();
}

__attribute__((constructor)) static void fk_load(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

__attribute__((destructor)) static void fk_unload(void)
{
    fk_slot_release_self();
}

/* ------------------------------------------------------------------ init and devices */

/* CUDA_VISIBLE_DEVICES: indices or uuids (a unique prefix is enough), in the order given;
 * parsing stops at the first entry that names no device, as the real driver does. */
static void parse_visible(void)
{
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    fk_g.nvis = 0;
    if (env == NULL) {
        for (uint32_t i = 0; i < fk_sh->ngpus; i++)
            fk_g.vis[fk_g.nvis++] = (int)i;
        return;
    }
    char *copy = strdup(env);
    if (copy == NULL)
        return;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok))
            tok++;
        int found = -1;
        if (isdigit((unsigned char)tok[0])) {
            char *end = NULL;
            long idx = strtol(tok, &end, 10);
            if (*end == '\0' && idx >= 0 && idx < (long)fk_sh->ngpus)
                found = (int)idx;
        } else if (tok[0] != '\0') {
            size_t len = strlen(tok);
            for (uint32_t i = 0; i < fk_sh->ngpus; i++) {
                if (strncmp(fk_sh->gpus[i].uuid, tok, len) == 0) {
                    if (found >= 0) { /* ambiguous prefix */
                        found = -1;
                        break;
                    }
                    found = (int)i;
                }
            }
        }
        int dup = 0;
        for (int j = 0; j < fk_g.nvis; j++)
            dup |= fk_g.vis[j] == found;
        if (found < 0 || dup) {
            fk_debug("CUDA_VISIBLE_DEVICES: '%s' names no device (or again): list ends", tok);
            break;
        }
        fk_g.vis[fk_g.nvis++] = found;
    }
    free(copy);
}

CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.lock);
    if (!fk_g.initialised) {
        if (fk_state_open() != 0) {
            fk_g.init_result = CUDA_ERROR_NO_DEVICE;
        } else {
            parse_visible();
            fk_g.init_result = fk_g.nvis > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
            if (fk_g.nvis == 0)
                fk_debug("no visible device (CUDA_VISIBLE_DEVICES)");
        }
        fk_g.initialised = 1;
    }
    CUresult rc = fk_g.init_result;
    pthread_mutex_unlock(&fk_g.lock);
    if (rc == CUDA_SUCCESS)
        fk_ck_start();
    return rc;
}

/* Every entry point asks this, so it takes no lock (a real driver's check is a load, not a
 * process-wide mutex): cuInit writes init_result before it sets initialised, and initialised
 * is never cleared in a running process (only in a forked child, before any thread). The
 * acquire load pairs with that store, so a thread that sees 1 sees init_result. */
CUresult fk_check_init(void)
{
    if (!atomic_load_explicit(&fk_g.initialised, memory_order_acquire))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = fk_g.init_result;
    if (rc == CUDA_SUCCESS)
        fk_ck_gate(); /* locked or checkpointed (checkpoint.c): wait for the unlock */
    return rc;
}

CUresult fk_dev_gpu(CUdevice dev, int *gpu)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (dev < 0 || dev >= fk_g.nvis)
        return CUDA_ERROR_INVALID_DEVICE;
    *gpu = fk_g.vis[dev];
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = FGPU_PROCADDR_CUDA_VERSION; /* CUDA_VERSION of the generated table */
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    *count = fk_g.nvis;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    int gpu;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(ordinal, &gpu);
    if (rc == CUDA_SUCCESS)
        *device = ordinal;
    return rc;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    int gpu;
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(dev, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc;
    strncpy(name, fk_sh->gpus[fk_phys(gpu)].name, (size_t)len - 1);
    name[len - 1] = '\0';
    return CUDA_SUCCESS;
}

/* The 16 bytes of a "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" uuid; a uuid string in
 * another form (test names such as GPU-aaaa) is hashed (FNV-1a) into 16 bytes. */
void fk_uuid_bytes(const char *text, CUuuid *out)
{
    const char *p = strncmp(text, "GPU-", 4) == 0 ? text + 4 : text;
    int nibbles = 0, ok = 1;
    unsigned char bytes[16] = {0};
    for (; *p != '\0' && ok; p++) {
        if (*p == '-')
            continue;
        if (!isxdigit((unsigned char)*p) || nibbles == 32) {
            ok = 0;
            break;
        }
        int v = isdigit((unsigned char)*p) ? *p - '0' : tolower((unsigned char)*p) - 'a' + 10;
        bytes[nibbles / 2] = (unsigned char)(bytes[nibbles / 2] | (v << (nibbles % 2 ? 0 : 4)));
        nibbles++;
    }
    if (!ok || nibbles != 32) {
        uint64_t h1 = 0xcbf29ce484222325ull, h2 = 0x84222325cbf29ce4ull;
        for (const char *q = text; *q != '\0'; q++) {
            h1 = (h1 ^ (unsigned char)*q) * 0x100000001b3ull;
            h2 = (h2 ^ (unsigned char)*q) * 0x100000001b3ull + 1;
        }
        memcpy(bytes, &h1, 8);
        memcpy(bytes + 8, &h2, 8);
    }
    memcpy(out->bytes, bytes, 16);
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    int gpu;
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(dev, &gpu);
    if (rc == CUDA_SUCCESS)
        fk_uuid_bytes(fk_sh->gpus[fk_phys(gpu)].uuid, uuid);
    return rc;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid(uuid, dev);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    int gpu;
    if (bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(dev, &gpu);
    if (rc == CUDA_SUCCESS)
        *bytes = fk_sh->gpus[fk_phys(gpu)].total;
    return rc;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    int gpu;
    if (pi == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(dev, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc;
    const char *name = fk_sh->gpus[fk_phys(gpu)].name;
    int hopper = strstr(name, "H100") || strstr(name, "H200") || strstr(name, "H800");
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1410000; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = hopper ? 132 : 108; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 0x10 + gpu; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = hopper ? 9 : 8; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ contexts */

int fk_ctx_valid(const struct fk_ctx *c)
{
    return c != NULL && c->magic == FK_CTX_MAGIC && c->gen == fk_g.gen && c->refs > 0;
}

CUresult fk_current(struct fk_ctx **out)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_ctx *c = ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
    pthread_mutex_lock(&fk_g.lock);
    int ok = fk_ctx_valid(c);
    pthread_mutex_unlock(&fk_g.lock);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

static _Atomic uint64_t ctx_serial;


static struct fk_ctx *ctx_new(CUdevice dev, int gpu, int primary)
{
    struct fk_ctx *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->magic = FK_CTX_MAGIC;
    c->gen = fk_g.gen;
    c->dev = dev;
    c->gpu = gpu;
    c->primary = primary;
    c->refs = 1;
    c->serial = atomic_fetch_add(&ctx_serial, 1) + 1;
    fk_ctx_limits_init(c);
    c->null_stream = fk_stream_new(c, CU_STREAM_DEFAULT);
    if (c->null_stream == NULL) {
        free(c);
        return NULL;
    }
    int slot = fk_my_slot();
    if (slot >= 0)
        atomic_fetch_add(&fk_sh->procs[slot].contexts[fk_phys(gpu)], 1);
    return c;
}

/* Destroying a context frees what it owns: its cuMemAlloc / Pitch / Managed memory and its
 * malloc heap (arrays and module images are not followed here: they stay taken). */
static void ctx_free(struct fk_ctx *c)
{
    fk_ctx_sync(c);
    fk_ctx_streams_free(c);
    fk_alloc_release_ctx(c->serial);
    if (c->heap_reserved != 0)
        fk_release(c->gpu, c->heap_reserved);
    int slot = fk_my_slot();
    if (slot >= 0)
        atomic_fetch_sub(&fk_sh->procs[slot].contexts[fk_phys(c->gpu)], 1);
    c->magic = 0;
    free(c);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    int gpu;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(dev, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    struct fk_ctx *c = fk_g.primary[dev];
    if (c == NULL) {
        c = ctx_new(dev, gpu, 1);
        fk_g.primary[dev] = c;
    } else {
        c->refs++;
    }
    pthread_mutex_unlock(&fk_g.lock);
    if (c == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    int gpu;
    CUresult rc = fk_dev_gpu(dev, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    struct fk_ctx *c = fk_g.primary[dev];
    if (c == NULL) {
        pthread_mutex_unlock(&fk_g.lock);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    int last = --c->refs == 0;
    if (last)
        fk_g.primary[dev] = NULL;
    pthread_mutex_unlock(&fk_g.lock);
    if (last)
        ctx_free(c);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return cuDevicePrimaryCtxRelease_v2(dev);
}

/* Destroys the primary context whatever its count (the cudaDeviceReset path); the next
 * retain makes a new one. It leaves the calling thread's context stack. */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    int gpu;
    CUresult rc = fk_dev_gpu(dev, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    struct fk_ctx *c = fk_g.primary[dev];
    fk_g.primary[dev] = NULL;
    if (c != NULL)
        c->refs = 0;
    pthread_mutex_unlock(&fk_g.lock);
    if (c == NULL)
        return CUDA_SUCCESS;
    for (int i = 0; i < ctx_depth; i++) {
        if (ctx_stack[i] == c) {
            memmove(&ctx_stack[i], &ctx_stack[i + 1],
                    sizeof ctx_stack[0] * (size_t)(ctx_depth - i - 1));
            ctx_depth--;
            i--;
        }
    }
    ctx_free(c);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return cuDevicePrimaryCtxReset_v2(dev);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    int gpu;
    if (flags == NULL || active == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(dev, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    *active = fk_g.primary[dev] != NULL;
    pthread_mutex_unlock(&fk_g.lock);
    *flags = CU_CTX_SCHED_AUTO;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    int gpu;
    (void)flags;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(dev, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (ctx_depth == FK_CTX_STACK)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.lock);
    struct fk_ctx *c = ctx_new(dev, gpu, 0);
    pthread_mutex_unlock(&fk_g.lock);
    if (c == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    struct fk_ctx *c = (struct fk_ctx *)ctx;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    int ok = fk_ctx_valid(c) && !c->primary;
    if (ok)
        c->refs = 0;
    pthread_mutex_unlock(&fk_g.lock);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = 0; i < ctx_depth; i++) { /* off this thread's stack */
        if (ctx_stack[i] == c) {
            memmove(&ctx_stack[i], &ctx_stack[i + 1], sizeof ctx_stack[0] * (size_t)(ctx_depth - i - 1));
            ctx_depth--;
            i--;
        }
    }
    ctx_free(c);
    return CUDA_SUCCESS;
}

/* The current context is the top of the calling thread's stack (thread-local, as a real
 * driver keeps it), so cuCtxGetCurrent and cuCtxPopCurrent take no lock: fk_check_init is an
 * acquire load and the stack is only the calling thread's. The interposer asks for the
 * current context on every gated call, so a process-wide mutex here would serialise the
 * threads of a workload as no real driver does. cuCtxSetCurrent and cuCtxPushCurrent still
 * take fk_g.lock for one check of the handle they are given (fk_ctx_valid reads refs, which
 * destroy and release write under that lock); setting NULL checks nothing and locks nothing. */
CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    *pctx = ctx_depth > 0 ? (CUcontext)ctx_stack[ctx_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    struct fk_ctx *c = (struct fk_ctx *)ctx;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (c == NULL) {
        if (ctx_depth > 0)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&fk_g.lock);
    int ok = fk_ctx_valid(c);
    pthread_mutex_unlock(&fk_g.lock);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    struct fk_ctx *c = (struct fk_ctx *)ctx;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    int ok = fk_ctx_valid(c);
    pthread_mutex_unlock(&fk_g.lock);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == FK_CTX_STACK)
        return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fk_ctx *c = ctx_stack[--ctx_depth];
    if (pctx != NULL)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    struct fk_ctx *c;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_current(&c);
    if (rc == CUDA_SUCCESS)
        *device = c->dev;
    return rc;
}

CUresult cuCtxSynchronize(void)
{
    struct fk_ctx *c;
    CUresult rc = fk_current(&c);
    if (rc == CUDA_SUCCESS)
        fk_ctx_sync(c);
    return rc;
}
