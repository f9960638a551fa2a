/*
 * procaddr.c - cuGetProcAddress / cuGetProcAddress_v2, and the hook table (from hooks.h).
 *
 * The CUDA runtime (and any program that follows it) takes driver entry points from
 * cuGetProcAddress(_v2) with a base name ("cuMemAlloc"), a CUDA version and flags (per-thread
 * default stream or legacy). Which versioned symbol that means (cuMemAlloc_v2, ..._ptsz) is
 * the driver's own rule; we do not guess it. We ask the real driver first and then swap the
 * pointer it returned: if it is the real pointer of a hooked symbol (same address dlsym gave
 * for that exact name), the caller gets our hook for that exact symbol; any other pointer is
 * handed back untouched. So versions and _ptsz variants map one to one by construction.
 * Asked for "cuGetProcAddress" itself, the driver's pointer is swapped for our hook as well.
 */
#include <string.h>

#include "fgpu.h"

struct hook_entry {
    const char *name;
    void *hook;
    void **real;
};

static const struct hook_entry cuda_hooks[] = {
#define FGPU_HOOK(name) {#name, (void *)&name, (void **)&fgpu_real.name},
#include "hooks.h"
};

static const char *const hook_names[] = {
#define FGPU_HOOK(name) #name,
#define FGPU_NVML_HOOK(name) #name,
#include "hooks.h"
    NULL};

/* The hooked symbols, NULL-terminated (the tests' coverage check reads it with ctypes). */
FGPU_EXPORT const char *const *fgpu_interposer_hook_names(void);
const char *const *fgpu_interposer_hook_names(void) { return hook_names; }

void *fgpu_hook_for(void *p)
{
    if (p == NULL)
        return p;
    fgpu_init();
    if (!fgpu_g.active)
        return p;
    for (size_t i = 0; i < sizeof cuda_hooks / sizeof cuda_hooks[0]; i++) {
        if (*cuda_hooks[i].real == p)
            return cuda_hooks[i].hook;
    }
    return p;
}

FGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                      cuuint64_t flags)
{
    FGPU_REAL_OR(cuGetProcAddress, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = fgpu_real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn != NULL)
        *pfn = fgpu_hook_for(*pfn);
    return r;
}

FGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus)
{
    FGPU_REAL_OR(cuGetProcAddress_v2, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = fgpu_real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn != NULL)
        *pfn = fgpu_hook_for(*pfn);
    return r;
}
