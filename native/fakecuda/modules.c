/*
 * modules.c - fake driver (a STAND-IN for tests, see fake.h): modules and their "spin"
 * kernel, error names and strings, and the test hook fgpuFakeDeviceTime.
 */
#include <stdlib.h>
#include <string.h>

#include "fake.h"
#include "fakecuda.h"

/* ------------------------------------------------------------------ modules */

/* Any image loads. An image that is the text "FGPUFAKE bytes=N" also takes N bytes of device
 * memory until unloaded: a module's code and data, which no allocation call shows. */
CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    struct fk_ctx *c;
    if (module == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t bytes = 0;
    if (strncmp((const char *)image, "FGPUFAKE", 8) == 0) {
        const char *b = strstr((const char *)image, "bytes=");
        if (b != NULL)
            bytes = strtoull(b + 6, NULL, 10);
    }
    struct fk_module *m = calloc(1, sizeof *m);
    if (m == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (bytes != 0 && (rc = fk_reserve(c->gpu, bytes)) != CUDA_SUCCESS) {
        free(m);
        return rc;
    }
    m->magic = FK_MODULE_MAGIC;
    m->gpu = c->gpu;
    m->bytes = bytes;
    m->spin.magic = FK_FUNC_MAGIC;
    m->spin.kind = FK_FUNC_SPIN;
    *module = (CUmodule)m;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    struct fk_module *m = (struct fk_module *)hmod;
    if (hfunc == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (m == NULL || m->magic != FK_MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (strcmp(name, "spin") != 0)
        return CUDA_ERROR_NOT_FOUND;
    *hfunc = (CUfunction)&m->spin;
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hmod)
{
    struct fk_module *m = (struct fk_module *)hmod;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (m == NULL || m->magic != FK_MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    fk_release(m->gpu, m->bytes);
    m->magic = 0;
    m->spin.magic = 0;
    free(m);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ errors */

struct fk_errtext {
    CUresult code;
    const char *name;
    const char *text;
};

static const struct fk_errtext errtexts[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
     "context already current"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {CUDA_ERROR_UNMAP_FAILED, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
     "too many blocks in cooperative launch"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const struct fk_errtext *errtext(CUresult e)
{
    for (size_t i = 0; i < sizeof errtexts / sizeof errtexts[0]; i++)
        if (errtexts[i].code == e)
            return &errtexts[i];
    return NULL;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    const struct fk_errtext *t = errtext(error);
    if (pStr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (t == NULL) {
        *pStr = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pStr = t->text;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    const struct fk_errtext *t = errtext(error);
    if (pStr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (t == NULL) {
        *pStr = NULL;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pStr = t->name;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ test hook */

CUresult fgpuFakeDeviceTime(const char *uuid, int pid, unsigned long long *ns)
{
    if (uuid == NULL || ns == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (fk_state_open() != 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    int gpu = fk_gpu_by_uuid(uuid);
    if (gpu < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (pid == 0) {
        *ns = atomic_load(&fk_sh->gpus[gpu].busy_ns);
        return CUDA_SUCCESS;
    }
    int best = -1;
    uint64_t best_rank = 0;
    for (int i = 0; i < FK_MAX_PROCS; i++) {
        struct fk_proc *p = &fk_sh->procs[i];
        uint32_t st = atomic_load(&p->state);
        if ((st != FK_SLOT_LIVE && st != FK_SLOT_DEAD) || atomic_load(&p->pid) != pid)
            continue;
        /* a live process first, then the one that died last */
        uint64_t rank = st == FK_SLOT_LIVE ? UINT64_MAX : atomic_load(&p->dead_order);
        if (best < 0 || rank > best_rank) {
            best = i;
            best_rank = rank;
        }
    }
    if (best < 0)
        return CUDA_ERROR_NOT_FOUND;
    *ns = atomic_load(&fk_sh->procs[best].busy_ns[gpu]);
    return CUDA_SUCCESS;
}
