/*
 * procaddr.c - cuGetProcAddress / cuGetProcAddress_v2, and the hook table (from hooks.h).
 *
 * The CUDA runtime (and any program that follows it) takes driver entry points from
 * cuGetProcAddress(_v2) with a base name ("cuMemAlloc"), a CUDA version and flags (per-thread
 * default stream or legacy). We ask the real driver first (so a name the driver does not
 * have, or not at that version, fails exactly as it would), then swap the pointer it returned:
 *  1. by identity: if it is the real pointer of a hooked symbol (the address dlsym gave for
 *     that exact versioned name), the caller gets our hook for that exact symbol. The driver
 *     decided which versioned symbol the request means; versions and _ptsz map one to one.
 *  2. by name, when the pointer is not one dlsym gave (a driver whose cuGetProcAddress
 *     answers with internal addresses): the first hooked name among base + "_v2_ptsz",
 *     base + "_ptsz" (per-thread flag only), base + "_v2", base. Every hooked "_v2" exists
 *     since CUDA 4.0, so this rule is used only for cudaVersion >= 4000; cuGetProcAddress
 *     itself is "_v2" from 12000 on.
 * FGPU_PROCADDR=names forces rule 2 (the tests run the fake driver's version table through
 * it); FGPU_PROCADDR=pointers disables it; default: 1, then 2.
 * Any other pointer is handed back untouched.
 */
#include <stdio.h>
#include <stdlib.h>
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

enum { BY_BOTH = 0, BY_POINTERS, BY_NAMES };
static int procaddr_mode = -1; /* read once; a benign race (same value written) */

static int mode(void)
{
    if (procaddr_mode < 0) {
        const char *v = getenv("FGPU_PROCADDR");
        int m = BY_BOTH;
        if (v != NULL && strcmp(v, "names") == 0)
            m = BY_NAMES;
        else if (v != NULL && strcmp(v, "pointers") == 0)
            m = BY_POINTERS;
        else if (v != NULL && v[0] != '\0' && strcmp(v, "auto") != 0)
            fgpu_log(FGPU_LOG_WARN, "FGPU_PROCADDR=%.40s is not auto, names or pointers; "
                                    "using auto", v);
        procaddr_mode = m;
    }
    return procaddr_mode;
}

static void *hook_named(const char *name)
{
    for (size_t i = 0; i < sizeof cuda_hooks / sizeof cuda_hooks[0]; i++) {
        if (strcmp(cuda_hooks[i].name, name) == 0)
            return cuda_hooks[i].hook;
    }
    return NULL;
}

static void *hook_by_name(const char *symbol, int version, cuuint64_t flags)
{
    if (symbol == NULL || strlen(symbol) > 96)
        return NULL;
    if (strcmp(symbol, "cuGetProcAddress") == 0)
        return hook_named(version >= 12000 ? "cuGetProcAddress_v2" : "cuGetProcAddress");
    if (version < 4000)
        return NULL;
    int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    static const char *const per_thread[] = {"_v2_ptsz", "_ptsz", "_v2", ""};
    static const char *const legacy[] = {"_v2", ""};
    const char *const *suffix = ptds ? per_thread : legacy;
    size_t n = ptds ? 4 : 2;
    for (size_t i = 0; i < n; i++) {
        char name[128];
        snprintf(name, sizeof name, "%s%s", symbol, suffix[i]);
        void *h = hook_named(name);
        if (h != NULL)
            return h;
    }
    return NULL;
}

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

/* The pointer to hand out for a successful lookup of symbol that returned p. */
static void *swap(void *p, const char *symbol, int version, cuuint64_t flags)
{
    fgpu_init();
    if (p == NULL || !fgpu_g.active)
        return p;
    int m = mode();
    if (m != BY_NAMES) {
        void *h = fgpu_hook_for(p);
        if (h != p || m == BY_POINTERS)
            return h;
    }
    void *h = hook_by_name(symbol, version, flags);
    if (h == NULL)
        return p;
    fgpu_log(FGPU_LOG_DEBUG, "cuGetProcAddress(%.96s, %d, %llu): hooked by name", symbol,
             version, (unsigned long long)flags);
    return h;
}

FGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                      cuuint64_t flags)
{
    FGPU_REAL_OR(cuGetProcAddress, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = fgpu_real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn != NULL)
        *pfn = swap(*pfn, symbol, cudaVersion, flags);
    return r;
}

FGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus)
{
    FGPU_REAL_OR(cuGetProcAddress_v2, CUDA_ERROR_NOT_INITIALIZED);
    CUresult r = fgpu_real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn != NULL)
        *pfn = swap(*pfn, symbol, cudaVersion, flags);
    return r;
}
