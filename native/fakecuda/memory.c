/*
 * memory.c - fake driver (a STAND-IN for tests, see fake.h): device memory. The process's
 * allocation table (device address -> size, GPU, kind), cuMemAlloc/Pitch/Managed/Free,
 * cuMemGetInfo, stream-ordered allocation (default pools give memory back at once, created
 * pools grow in 2 MiB chunks and keep freed memory until trimmed or destroyed). What the
 * memory holds: contents.c.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph.h"

#define FK_BUCKETS 4096
static struct fk_alloc *table[FK_BUCKETS];

static unsigned bucket(uint64_t dptr)
{
    return (unsigned)((dptr >> 21) ^ (dptr >> 9) ^ dptr) % FK_BUCKETS;
}

struct fk_alloc *fk_alloc_find(uint64_t dptr)
{
    for (struct fk_alloc *a = table[bucket(dptr)]; a != NULL; a = a->next)
        if (a->dptr == dptr)
            return a;
    return NULL;
}

struct fk_alloc *fk_alloc_take(uint64_t dptr)
{
    for (struct fk_alloc **pp = &table[bucket(dptr)]; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->dptr == dptr) {
            struct fk_alloc *a = *pp;
            *pp = a->next;
            a->next = NULL;
            return a;
        }
    }
    return NULL;
}

struct fk_alloc *fk_alloc_containing(uint64_t dptr)
{
    for (unsigned b = 0; b < FK_BUCKETS; b++)
        for (struct fk_alloc *a = table[b]; a != NULL; a = a->next)
            if (dptr >= a->dptr && dptr - a->dptr < a->bytes)
                return a;
    return NULL;
}

void fk_alloc_each(void (*fn)(struct fk_alloc *a, void *arg), void *arg)
{
    for (unsigned b = 0; b < FK_BUCKETS; b++)
        for (struct fk_alloc *a = table[b]; a != NULL; a = a->next)
            fn(a, arg);
}

void fk_alloc_put(struct fk_alloc *a)
{
    unsigned b = bucket(a->dptr);
    a->next = table[b];
    table[b] = a;
}

void fk_alloc_forget_all(void)
{
    for (unsigned b = 0; b < FK_BUCKETS; b++) {
        while (table[b] != NULL) {
            struct fk_alloc *a = table[b];
            table[b] = a->next;
            fk_contents_free(a);
            free(a);
        }
    }
}

/* Gives back every cuMemAlloc / Pitch / Managed allocation of a context being destroyed (the
 * driver frees them with it; pool, VMM and graph memory outlive contexts). */
void fk_alloc_release_ctx(uint64_t ctx_serial)
{
    struct fk_alloc *doomed = NULL;
    pthread_mutex_lock(&fk_g.lock);
    for (unsigned b = 0; b < FK_BUCKETS; b++) {
        for (struct fk_alloc **pp = &table[b]; *pp != NULL;) {
            struct fk_alloc *a = *pp;
            if (a->ctx_serial == ctx_serial && a->kind != FK_A_IPC) {
                *pp = a->next;
                a->next = doomed;
                doomed = a;
            } else {
                pp = &a->next;
            }
        }
    }
    pthread_mutex_unlock(&fk_g.lock);
    while (doomed != NULL) {
        struct fk_alloc *next = doomed->next;
        fk_alloc_release(doomed);
        doomed = next;
    }
}

struct fk_alloc *fk_alloc_new(uint64_t dptr, uint64_t bytes, int gpu, int kind)
{
    struct fk_alloc *a = calloc(1, sizeof *a);
    if (a == NULL)
        return NULL;
    a->dptr = dptr;
    a->bytes = bytes;
    a->gpu = gpu;
    a->kind = kind;
    a->export_idx = -1;
    return a;
}

static void unexport(struct fk_alloc *a)
{
    if (a->export_idx < 0)
        return;
    struct fk_export *e = &fk_sh->exports[a->export_idx];
    uint32_t live = FK_EXPORT_LIVE;
    if (e->dptr == a->dptr)
        atomic_compare_exchange_strong(&e->state, &live, FK_EXPORT_FREE);
    a->export_idx = -1;
}

static void pool_free_locked(struct fk_pool *p)
{
    if (p->reserved != 0)
        fk_release(p->gpu, p->reserved);
    p->magic = 0;
    free(p);
}

/* Gives the memory behind `a` back (to the device, its pool or the graph pool); frees a.
 * The caller holds no lock. */
void fk_alloc_release(struct fk_alloc *a)
{
    pthread_mutex_lock(&fk_g.lock);
    unexport(a);
    switch (a->kind) {
    case FK_A_POOL: {
        struct fk_pool *p = a->pool;
        p->used -= a->bytes;
        p->allocs--;
        if (p->destroyed) { /* a destroyed pool gives memory back as its allocations go */
            uint64_t give = a->bytes < p->reserved ? a->bytes : p->reserved;
            fk_release(p->gpu, give);
            p->reserved -= give;
            if (p->allocs == 0)
                pool_free_locked(p);
        }
        break;
    }
    case FK_A_GRAPH:
        fk_g.graph_used[a->gpu] -= a->bytes; /* back to the graph pool, not the device */
        break;
    case FK_A_IPC:
        break;
    default:
        fk_release(a->gpu, a->bytes);
        break;
    }
    pthread_mutex_unlock(&fk_g.lock);
    fk_contents_free(a);
    free(a);
}

/* ------------------------------------------------------------------ plain allocations */

static CUresult alloc_plain(CUdeviceptr *dptr, uint64_t bytes, int kind)
{
    struct fk_ctx *c;
    if (dptr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = fk_reserve(c->gpu, bytes)) != CUDA_SUCCESS)
        return rc;
    struct fk_alloc *a = fk_alloc_new(fk_new_va(bytes), bytes, c->gpu, kind);
    if (a == NULL) {
        fk_release(c->gpu, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->ctx_serial = c->serial;
    pthread_mutex_lock(&fk_g.lock);
    fk_alloc_put(a);
    pthread_mutex_unlock(&fk_g.lock);
    *dptr = a->dptr;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return alloc_plain(dptr, bytesize, FK_A_MEM);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_plain(dptr, bytesize, FK_A_MANAGED);
}

/* The pitch is the row width rounded up to FK_PITCH_ALIGN bytes; the allocation is
 * pitch * height. elementSizeBytes must be 4, 8 or 16 (the documented values). */
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t widthInBytes, size_t height,
                            unsigned int elementSizeBytes)
{
    if (pPitch == NULL || widthInBytes == 0 || height == 0 ||
        (elementSizeBytes != 4 && elementSizeBytes != 8 && elementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t pitch = (widthInBytes + FK_PITCH_ALIGN - 1) / FK_PITCH_ALIGN * FK_PITCH_ALIGN;
    uint64_t bytes;
    if (pitch < widthInBytes || __builtin_mul_overflow(pitch, (uint64_t)height, &bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = alloc_plain(dptr, bytes, FK_A_PITCH);
    if (rc == CUDA_SUCCESS)
        *pPitch = pitch;
    return rc;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (dptr == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&fk_g.lock);
    struct fk_alloc *a = fk_alloc_find(dptr);
    if (a != NULL && a->kind != FK_A_IPC)
        a = fk_alloc_take(dptr);
    else
        a = NULL;
    pthread_mutex_unlock(&fk_g.lock);
    if (a == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fk_alloc_release(a);
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    struct fk_ctx *c;
    if (free_bytes == NULL || total == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_current(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_gpu *d = &fk_sh->gpus[fk_phys(c->gpu)];
    uint64_t used;
    if (fk_device_used(c->gpu, &used) != 0)
        return CUDA_ERROR_ILLEGAL_STATE; /* a corrupt counter is an error, not a figure */
    *total = d->total;
    *free_bytes = d->total - used;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ pools */

static struct fk_pool *pool_new(int gpu, int is_default, uint64_t max_size)
{
    struct fk_pool *p = calloc(1, sizeof *p);
    if (p != NULL) {
        p->magic = FK_POOL_MAGIC;
        p->gpu = gpu;
        p->is_default = is_default;
        p->max_size = max_size;
    }
    return p;
}

static struct fk_pool *default_pool(int dev, int gpu)
{
    pthread_mutex_lock(&fk_g.lock);
    if (fk_g.default_pool[dev] == NULL)
        fk_g.default_pool[dev] = pool_new(gpu, 1, 0);
    struct fk_pool *p = fk_g.default_pool[dev];
    pthread_mutex_unlock(&fk_g.lock);
    return p;
}

CUresult fk_pool_alloc(struct fk_pool *p, uint64_t bytes, CUdeviceptr *dptr)
{
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.lock);
    CUresult rc = CUDA_SUCCESS;
    if (p->magic != FK_POOL_MAGIC || p->destroyed) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else if (p->is_default) {
        rc = fk_reserve(p->gpu, bytes);
    } else if (p->used + bytes > p->reserved) {
        uint64_t grow = (p->used + bytes - p->reserved + FK_CHUNK - 1) / FK_CHUNK * FK_CHUNK;
        if (p->max_size != 0 && p->reserved + grow > p->max_size)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else if ((rc = fk_reserve(p->gpu, grow)) == CUDA_SUCCESS)
            p->reserved += grow;
    }
    struct fk_alloc *a = NULL;
    if (rc == CUDA_SUCCESS) {
        a = fk_alloc_new(fk_new_va(bytes), bytes, p->gpu, p->is_default ? FK_A_ASYNC : FK_A_POOL);
        if (a == NULL) {
            if (p->is_default)
                fk_release(p->gpu, bytes);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (a != NULL) {
        if (!p->is_default) {
            p->used += bytes;
            p->allocs++;
            a->pool = p;
        }
        fk_alloc_put(a);
        *dptr = a->dptr;
    }
    pthread_mutex_unlock(&fk_g.lock);
    return rc;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream h,
                            int ptsz)
{
    struct fk_stream *s;
    if (dptr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_resolve_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_pool *p = (struct fk_pool *)pool;
    struct fk_graph *g = fk_stream_capture(s);
    if (g != NULL) { /* captured: an alloc node of the graph, memory only at its launch */
        struct fk_ctx *c = fk_stream_ctx(s);
        if (p != NULL && (p->magic != FK_POOL_MAGIC || p->destroyed))
            return CUDA_ERROR_INVALID_VALUE;
        CUDA_MEM_ALLOC_NODE_PARAMS np = {0};
        np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        np.poolProps.location.id = c->dev;
        np.bytesize = bytes;
        CUgraphNode node;
        rc = cuGraphAddMemAllocNode(&node, (CUgraph)g, NULL, 0, &np);
        if (rc == CUDA_SUCCESS)
            *dptr = np.dptr;
        return rc;
    }
    if (p == NULL) {
        struct fk_ctx *c = fk_stream_ctx(s);
        p = default_pool(c->dev, c->gpu);
        if (p == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return fk_pool_alloc(p, bytes, dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, NULL, hStream, 0);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, NULL, hStream, 1);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream)
{
    if (pool == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, pool, hStream, 0);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream)
{
    if (pool == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(dptr, bytesize, pool, hStream, 1);
}

/* The memory goes back when the stream reaches the free. */
static CUresult free_async(CUdeviceptr dptr, CUstream h, int ptsz)
{
    struct fk_stream *s;
    CUresult rc = fk_resolve_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_graph *g = fk_stream_capture(s);
    if (g != NULL) { /* captured: a free node of the graph */
        CUgraphNode node;
        return cuGraphAddMemFreeNode(&node, (CUgraph)g, NULL, 0, dptr);
    }
    pthread_mutex_lock(&fk_g.lock);
    struct fk_alloc *a = fk_alloc_find(dptr);
    if (a != NULL && (a->kind == FK_A_ASYNC || a->kind == FK_A_POOL || a->kind == FK_A_GRAPH))
        a = fk_alloc_take(dptr);
    else
        a = NULL;
    pthread_mutex_unlock(&fk_g.lock);
    if (a == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_op *op = calloc(1, sizeof *op);
    if (op == NULL) {
        fk_alloc_release(a);
        return CUDA_SUCCESS;
    }
    op->kind = FK_OP_FREE;
    op->free_alloc = a;
    return fk_enqueue(s, op);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, 0);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, 1);
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    int gpu;
    if (pool == NULL || props == NULL || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(props->location.id, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc == CUDA_ERROR_INVALID_DEVICE ? CUDA_ERROR_INVALID_VALUE : rc;
    struct fk_pool *p = pool_new(gpu, 0, props->maxSize);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

static int pool_ok(const struct fk_pool *p)
{
    return p != NULL && p->magic == FK_POOL_MAGIC && !p->destroyed;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    struct fk_pool *p = (struct fk_pool *)pool;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    if (!pool_ok(p) || p->is_default) {
        pthread_mutex_unlock(&fk_g.lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    p->destroyed = 1;
    fk_release(p->gpu, p->reserved - p->used); /* what no allocation holds goes now */
    p->reserved = p->used;
    if (p->allocs == 0)
        pool_free_locked(p);
    pthread_mutex_unlock(&fk_g.lock);
    return CUDA_SUCCESS;
}

/* Keeps at least minBytesToKeep reserved (rounded up to chunks), and all that allocations
 * hold; gives the rest back to the device. */
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    struct fk_pool *p = (struct fk_pool *)pool;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    if (!pool_ok(p)) {
        pthread_mutex_unlock(&fk_g.lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t keep = p->used > minBytesToKeep ? p->used : minBytesToKeep;
    keep = (keep + FK_CHUNK - 1) / FK_CHUNK * FK_CHUNK;
    if (p->reserved > keep) {
        fk_release(p->gpu, p->reserved - keep);
        p->reserved = keep;
    }
    pthread_mutex_unlock(&fk_g.lock);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    int gpu;
    if (pool_out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(dev, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_pool *p = default_pool(dev, gpu);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool_out = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}
