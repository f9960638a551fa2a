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
 *     answers with internal addresses): the symbol a real driver answers for (name,
 *     cudaVersion, flags) by the driver's own rule over the table generated from NVIDIA's
 *     cudaTypedefs.h (fgpu_procaddr.h), and our hook for exactly that symbol, if we hook it;
 *     otherwise the driver's pointer (never the hook of another version). A request above
 *     the table's CUDA version may mean a symbol newer than the table knows: the name rule
 *     then holds only if the driver answers the same pointer at the table's version.
 * FGPU_PROCADDR=names forces rule 2 (the tests run the real runtime's requests through it);
 * FGPU_PROCADDR=pointers disables it; default: 1, then 2.
 * Any other pointer is handed back untouched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fgpu.h"
#include "fgpu_procaddr.h"

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

/* The hook for the symbol a real driver answers for (symbol, version, flags), or NULL. */
static void *hook_by_name(const char *symbol, int version, cuuint64_t flags)
{
    const char *answer = fgpu_procaddr_symbol(symbol, version, flags, NULL);
    return answer != NULL ? hook_named(answer) : NULL;
}

/* 1 when the driver answers p for symbol at the table's CUDA version too (so no symbol newer
 * than the table's is meant by a request at a later version). */
static int same_at_table_version(void *p, const char *symbol, cuuint64_t flags)
{
    void *q = NULL;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    if (fgpu_real.cuGetProcAddress_v2 != NULL) {
        CUdriverProcAddressQueryResult st;
        r = fgpu_real.cuGetProcAddress_v2(symbol, &q, FGPU_PROCADDR_CUDA_VERSION, flags, &st);
    } else if (fgpu_real.cuGetProcAddress != NULL) {
        r = fgpu_real.cuGetProcAddress(symbol, &q, FGPU_PROCADDR_CUDA_VERSION, flags);
    }
    return r == CUDA_SUCCESS && q == p;
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
    if (version > FGPU_PROCADDR_CUDA_VERSION && !same_at_table_version(p, symbol, flags)) {
        fgpu_log(FGPU_LOG_WARN, "cuGetProcAddress(%.96s, %d): the driver answers a function "
                                "newer than CUDA %d's; not hooked", symbol, version,
                 FGPU_PROCADDR_CUDA_VERSION);
        return p;
    }
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
