/*
 * procaddress.c - fake driver (a STAND-IN for tests, see fake.h): cuGetProcAddress (CUDA 11
 * form) and cuGetProcAddress_v2 (CUDA 12 form), answered as a real driver answers: the
 * (name, cudaVersion, flags) -> versioned symbol rule of fgpu_procaddr.h over the table
 * generated from NVIDIA's cudaTypedefs.h (native/tools/gen_procaddr.py). The symbol is then
 * looked up in this library's own dynamic symbol table (dlsym on its own link map, whose
 * scope is this library and its dependencies, never an interposer preloaded first); a symbol
 * the real driver has but the fake does not implement is CUDA_ERROR_NOT_FOUND with
 * CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND. The pointers are this library's own definitions (it
 * is linked with -Bsymbolic), the same that dlsym on its handle returns.
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>

#include "fake.h"
#include "fgpu_procaddr.h"

#ifdef FK_TRACE
void fk_trace_procaddr(const char *symbol, int cudaVersion, cuuint64_t flags, CUresult r,
                       const char *answer); /* native/tests/cutrace.c */
#endif

static void *self_map; /* this library's struct link_map (glibc: also its dlopen handle) */
static void *self_base;
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

static void find_self(void)
{
    Dl_info info;
    struct link_map *map = NULL;
    if (dladdr1((void *)&cuGetProcAddress_v2, &info, (void **)&map, RTLD_DL_LINKMAP) != 0) {
        self_map = map;
        self_base = info.dli_fbase;
    }
}

/* the fake's own definition of symbol, or NULL when the fake does not implement it */
static void *own_symbol(const char *symbol)
{
    pthread_once(&self_once, find_self);
    if (self_map == NULL)
        return NULL;
    void *p = dlsym(self_map, symbol);
    Dl_info info;
    if (p == NULL || dladdr(p, &info) == 0 || info.dli_fbase != self_base)
        return NULL; /* found only in a dependency (libc, ...): not a driver function */
    return p;
}

static CUresult lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    if (symbol == NULL || pfn == NULL ||
        flags > (CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    CUdriverProcAddressQueryResult st;
    const char *answer = fgpu_procaddr_symbol(symbol, cudaVersion, flags, &st);
    void *fn = answer != NULL ? own_symbol(answer) : NULL;
    if (answer != NULL && fn == NULL)
        st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *pfn = fn;
    if (status != NULL)
        *status = st;
    CUresult r = fn != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
#ifdef FK_TRACE
    fk_trace_procaddr(symbol, cudaVersion, flags, r, answer);
#endif
    return r;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}
