/*
 * fgpu_procaddr.h - the CUDA driver's cuGetProcAddress rule over the generated table
 * (fgpu_procaddr_table.h, from NVIDIA's cudaTypedefs.h by native/tools/gen_procaddr.py).
 * Shared by the interposer's name rule (native/interposer/procaddr.c) and the fake driver
 * (native/fakecuda/procaddress.c), so both answer what a real driver answers.
 *
 * The rule, for (name, cudaVersion, flags):
 *   1. among the legacy rows of name, the one with the highest version <= cudaVersion; none
 *      -> no symbol (SYMBOL_NOT_FOUND when name has no row, else VERSION_NOT_SUFFICIENT);
 *   2. with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM in flags, that row's per-thread
 *      variant (its symbol + "_ptds"/"_ptsz") when the table has it at a version
 *      <= cudaVersion; otherwise the legacy row.
 * The Python twin of this rule is native/tools/gen_procaddr.py:lookup (the tests compare them).
 */
#ifndef FGPU_PROCADDR_H
#define FGPU_PROCADDR_H

#include <string.h>

#include "cuda_api.h"
#include "fgpu_procaddr_table.h"

_Static_assert(FGPU_PROCADDR_CUDA_VERSION == FGPU_CUDA_API_VERSION,
               "the generated table and cuda_api.h must follow the same cuda.h");

/* index of the first row whose base is name, or -1 (binary search; the table is sorted) */
static inline int fgpu_procaddr_first(const char *name)
{
    int lo = 0, hi = FGPU_PROCADDR_ROWS;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(fgpu_procaddr_rows[mid].base, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < FGPU_PROCADDR_ROWS && strcmp(fgpu_procaddr_rows[lo].base, name) == 0 ? lo : -1;
}

/* 1 when symbol is base + "_ptds" or base + "_ptsz" */
static inline int fgpu_procaddr_variant_of(const char *symbol, const char *base)
{
    size_t n = strlen(base);
    return strncmp(symbol, base, n) == 0 &&
           (strcmp(symbol + n, "_ptds") == 0 || strcmp(symbol + n, "_ptsz") == 0);
}

/* The symbol a real driver answers for (name, cudaVersion, flags), or NULL; *status (when
 * not NULL) is what cuGetProcAddress_v2 reports in symbolStatus. */
static inline const char *fgpu_procaddr_symbol(const char *name, int cudaVersion,
                                               cuuint64_t flags,
                                               CUdriverProcAddressQueryResult *status)
{
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const struct fgpu_procaddr_row *best = NULL, *threaded = NULL;
    int i = name != NULL ? fgpu_procaddr_first(name) : -1;
    if (i >= 0) {
        st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        for (; i < FGPU_PROCADDR_ROWS && strcmp(fgpu_procaddr_rows[i].base, name) == 0; i++) {
            const struct fgpu_procaddr_row *r = &fgpu_procaddr_rows[i];
            if (r->version > cudaVersion)
                continue;
            if (!r->per_thread) {
                best = r; /* rows of a kind come in rising version order */
            } else if (best != NULL && fgpu_procaddr_variant_of(r->symbol, best->symbol)) {
                threaded = r;
            }
        }
    }
    if (best != NULL)
        st = CU_GET_PROC_ADDRESS_SUCCESS;
    if (status != NULL)
        *status = st;
    if (best == NULL)
        return NULL;
    if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && threaded != NULL)
        return threaded->symbol;
    return best->symbol;
}

#endif
