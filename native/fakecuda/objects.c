/*
 * objects.c - fake driver (a STAND-IN for tests, see fake.h): CUDA arrays and mipmapped
 * arrays (device memory sized from their descriptors) and IPC handles (opening one maps
 * memory another process holds, through the shared export table: no new device memory).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake.h"

/* ------------------------------------------------------------------ arrays */

struct fk_array {
    uint32_t magic;
    int gpu;
    uint64_t bytes;
};

/* width * height * depth * channels * element size, summed over mipmap levels (each level
 * halves every extent, at least 1). Height 0 means 1D, depth 0 means 2D. Returns 0 for a
 * bad descriptor. */
static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch,
                            unsigned levels)
{
    unsigned eb = fgpu_cu_array_format_bytes(f);
    if (w == 0 || eb == 0 || (ch != 1 && ch != 2 && ch != 4) || (d != 0 && h == 0) || levels == 0)
        return 0;
    size_t largest = w > h ? w : h;
    largest = largest > d ? largest : d;
    unsigned max_levels = 1;
    while (largest >> max_levels)
        max_levels++;
    if (levels > max_levels)
        return 0;
    uint64_t total = 0;
    for (unsigned l = 0; l < levels; l++) {
        uint64_t lw = w >> l ? w >> l : 1;
        uint64_t lh = h == 0 ? 1 : (h >> l ? h >> l : 1);
        uint64_t ld = d == 0 ? 1 : (d >> l ? d >> l : 1);
        uint64_t level;
        if (__builtin_mul_overflow(lw, lh, &level) || __builtin_mul_overflow(level, ld, &level) ||
            __builtin_mul_overflow(level, (uint64_t)ch * eb, &level) ||
            __builtin_add_overflow(total, level, &total))
            return UINT64_MAX;
    }
    return total;
}

static CUresult array_new(void **handle, uint64_t bytes)
{
    struct fk_ctx *c;
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytes == UINT64_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fk_array *a = calloc(1, sizeof *a);
    if (a == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((rc = fk_reserve(c->gpu, bytes)) != CUDA_SUCCESS) {
        free(a);
        return rc;
    }
    a->magic = FK_ARRAY_MAGIC;
    a->gpu = c->gpu;
    a->bytes = bytes;
    *handle = a;
    return CUDA_SUCCESS;
}

static CUresult array_free(void *handle)
{
    struct fk_array *a = handle;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (a == NULL || a->magic != FK_ARRAY_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    fk_release(a->gpu, a->bytes);
    a->magic = 0;
    free(a);
    return CUDA_SUCCESS;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (d == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = array_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels, 1);
    return array_new((void **)pHandle, bytes);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    if (d == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1);
    return array_new((void **)pHandle, bytes);
}

CUresult cuArrayDestroy(CUarray hArray)
{
    return array_free(hArray);
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                unsigned int numMipmapLevels)
{
    if (d == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes =
        array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, numMipmapLevels);
    return array_new((void **)pHandle, bytes);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    return array_free(hMipmappedArray);
}

/* ------------------------------------------------------------------ IPC */

#define FK_IPC_MAGIC 0x43504946u
struct fk_ipc {
    uint32_t magic;
    uint32_t idx; /* export slot in the shared state */
    uint64_t seq;
    uint64_t dptr;
    uint64_t size;
};
_Static_assert(sizeof(struct fk_ipc) <= CU_IPC_HANDLE_SIZE, "IPC handle fits");

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    if (pHandle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    struct fk_alloc *a = fk_alloc_find(dptr);
    if (a == NULL || (a->kind != FK_A_MEM && a->kind != FK_A_PITCH)) {
        pthread_mutex_unlock(&fk_g.lock);
        return CUDA_ERROR_INVALID_VALUE; /* only cuMemAlloc memory can be exported */
    }
    if (a->export_idx < 0) {
        for (int i = 0; i < FK_MAX_EXPORTS && a->export_idx < 0; i++) {
            struct fk_export *e = &fk_sh->exports[i];
            uint32_t expect = FK_EXPORT_FREE;
            if (!atomic_compare_exchange_strong(&e->state, &expect, FK_EXPORT_CLAIM))
                continue;
            e->gpu = (uint32_t)a->gpu;
            e->dptr = a->dptr;
            e->size = a->bytes;
            e->pid = (int32_t)getpid();
            e->start = fk_self_start();
            atomic_store(&e->seq, atomic_fetch_add(&fk_sh->export_seq, 1) + 1);
            atomic_store_explicit(&e->state, FK_EXPORT_LIVE, memory_order_release);
            a->export_idx = i;
        }
    }
    int idx = a->export_idx;
    struct fk_ipc h = {FK_IPC_MAGIC, (uint32_t)idx, 0, a->dptr, a->bytes};
    pthread_mutex_unlock(&fk_g.lock);
    if (idx < 0)
        return CUDA_ERROR_OUT_OF_MEMORY; /* the machine-wide export table is full */
    h.seq = atomic_load(&fk_sh->exports[idx].seq);
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, &h, sizeof h);
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
    struct fk_ctx *c;
    struct fk_ipc h;
    if (pdptr == NULL || (flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    memcpy(&h, handle.reserved, sizeof h);
    if (h.magic != FK_IPC_MAGIC || h.idx >= FK_MAX_EXPORTS)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_export *e = &fk_sh->exports[h.idx];
    if (atomic_load_explicit(&e->state, memory_order_acquire) != FK_EXPORT_LIVE ||
        atomic_load(&e->seq) != h.seq || e->dptr != h.dptr)
        return CUDA_ERROR_INVALID_VALUE; /* freed since, or not a handle */
    if (e->pid == (int32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* a process cannot open its own handle */
    if (!fk_alive(e->pid, e->start))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.lock);
    struct fk_alloc *a = fk_alloc_find(h.dptr);
    if (a != NULL && a->kind == FK_A_IPC) {
        a->opens++;
    } else if (a == NULL && (a = fk_alloc_new(h.dptr, 0, (int)e->gpu, FK_A_IPC)) != NULL) {
        a->opens = 1;
        fk_alloc_put(a);
    } else {
        rc = a == NULL ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&fk_g.lock);
    if (rc == CUDA_SUCCESS)
        *pdptr = h.dptr;
    return rc;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    struct fk_alloc *a = fk_alloc_find(dptr);
    if (a == NULL || a->kind != FK_A_IPC) {
        pthread_mutex_unlock(&fk_g.lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (--a->opens == 0)
        free(fk_alloc_take(dptr));
    pthread_mutex_unlock(&fk_g.lock);
    return CUDA_SUCCESS;
}
