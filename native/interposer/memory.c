/*
 * memory.c - memory accounting: a hard cap per workload and GPU, shared by its processes.
 *
 * Owns: the device -> segment GPU mapping (by uuid, cached per device), the process-local
 * table of what this process holds (pointer / handle -> GPU, bytes, context) and the memory
 * hooks of hooks.h. Rule for every counted allocation: reserve on the shared counter first
 * (seg.c: one CAS that fails past the cap, so no check-then-allocate window), then call the
 * driver, and give back if the driver fails. Over the cap: sweep dead processes once, try
 * again, else answer CUDA_ERROR_OUT_OF_MEMORY without calling the driver and bump oom_count.
 *
 * What is counted, in bytes asked (the driver may round up; the NVML guard is the backstop):
 *   cuMemAlloc_v2, cuMemAllocManaged (current device), cuMemAllocPitch_v2 (the bound
 *   round_up(width, 512) * height before, pitch * height after), cuMemAllocAsync and
 *   cuMemAllocFromPoolAsync (bytes asked, from the call to cuMemFreeAsync: a pool's cached
 *   growth after a free is not counted), cuMemCreate (device location; until cuMemRelease),
 *   cuArrayCreate_v2 / cuArray3DCreate_v2 / cuMipmappedArrayCreate (width x height x depth x
 *   channels x bytes per channel, summed over mip levels), a context's malloc heap
 *   (cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)), graph memory nodes (the sum of a graph's alloc
 *   nodes, however they got there, reserved at every instantiate entry point: memory_graphs.c).
 *   What a context owns (linear and managed memory, arrays, its heap) is given back when the
 *   driver destroys the context (cuCtxDestroy, primary release to 0, primary reset); VMM
 *   handles, pool and graph memory outlive contexts, as the driver says.
 *   IPC imports (cuIpcOpenMemHandle_v2) are not counted: the memory is charged to the
 *   workload whose process allocated it, so an import from the same workload is not counted
 *   twice and an import from another workload stays on that workload's quota.
 * The table lock is a process-local mutex: allocation is not the hot path.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fgpu.h"

#define MAX_DEVICES 64
#define NBUCKETS 1024


struct rec {
    uint64_t key;
    int kind;
    int gpu;
    uint64_t bytes;
    CUcontext ctx; /* the owning context; NULL: outlives contexts */
    struct rec *next;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rec *buckets[NBUCKETS];
/* device ordinal -> 0 unknown, -1 not in the segment, g + 1 (relaxed: a cache of a fact) */
static _Atomic int device_gpu[MAX_DEVICES];

static size_t bucket_of(uint64_t key) { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 54); }

uint64_t fgpu_mul_sat(uint64_t a, uint64_t b)
{
    uint64_t out;
    return __builtin_mul_overflow(a, b, &out) ? UINT64_MAX : out;
}

uint64_t fgpu_add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

static void format_uuid(char *out, size_t n, const char *prefix, const CUuuid *u)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, n,
             "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix,
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

int fgpu_gpu_of_device(CUdevice dev)
{
    if (!fgpu_g.active || fgpu_resolve_cuda() != 0)
        return -1;
    int cached = (dev >= 0 && dev < MAX_DEVICES)
                     ? atomic_load_explicit(&device_gpu[dev], memory_order_relaxed)
                     : 0;
    if (cached != 0)
        return cached > 0 ? cached - 1 : FGPU_GPU_NOT_GRANTED;
    CUuuid u;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    if (fgpu_real.cuDeviceGetUuid_v2 != NULL)
        r = fgpu_real.cuDeviceGetUuid_v2(&u, dev);
    if (r != CUDA_SUCCESS && fgpu_real.cuDeviceGetUuid != NULL)
        r = fgpu_real.cuDeviceGetUuid(&u, dev);
    if (r != CUDA_SUCCESS)
        return -1; /* not cached: the device may not be valid yet */
    char text[FGPU_SEG_UUID_LEN];
    format_uuid(text, sizeof text, "GPU", &u);
    int g = fgpu_seg_find_gpu(fgpu_g.ctl, text);
    if (g < 0) {
        format_uuid(text, sizeof text, "MIG", &u);
        g = fgpu_seg_find_gpu(fgpu_g.ctl, text);
    }
    if (g < 0)
        fgpu_log(FGPU_LOG_DEBUG, "device %d (%s) was not granted to this workload", dev, text);
    if (dev >= 0 && dev < MAX_DEVICES)
        atomic_store_explicit(&device_gpu[dev], g >= 0 ? g + 1 : -1, memory_order_relaxed);
    return g >= 0 ? g : FGPU_GPU_NOT_GRANTED;
}

int fgpu_gpu_of_current(void)
{
    if (!fgpu_g.active || fgpu_resolve_cuda() != 0 || fgpu_real.cuCtxGetDevice == NULL)
        return -1;
    CUdevice dev;
    if (fgpu_real.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return -1;
    return fgpu_gpu_of_device(dev);
}

static void count_oom(int gpu, uint64_t bytes)
{
    struct fgpu_seg_gpu *g = &fgpu_g.seg->gpus[gpu];
    atomic_fetch_add_explicit(&g->oom_count, 1, memory_order_relaxed);
    atomic_store_explicit(&g->oom_last_bytes, bytes, memory_order_relaxed);
    fgpu_log(FGPU_LOG_INFO, "refused %llu bytes on %.96s: %llu reserved of the %llu-byte cap",
             (unsigned long long)bytes, fgpu_g.ctl->gpus[gpu].uuid,
             (unsigned long long)atomic_load_explicit(&g->memory_reserved, memory_order_relaxed),
             (unsigned long long)atomic_load_explicit(&fgpu_g.ctl->gpus[gpu].memory_limit,
                                                      memory_order_relaxed));
}

/* Reserve bytes on *gpu before the driver call. *gpu < 0: nothing to count (set to -1 too
 * when this process has no entry and the segment does not cap). */
CUresult fgpu_mem_take(int *gpu, uint64_t bytes)
{
    if (*gpu == FGPU_GPU_NOT_GRANTED && bytes != 0 && fgpu_g.capping) {
        /* a GPU the workload was not given (it unset CUDA_VISIBLE_DEVICES, say): its cap
         * there is zero */
        fgpu_log(FGPU_LOG_INFO, "refused %llu bytes on a GPU not granted to this workload",
                 (unsigned long long)bytes);
        *gpu = -1;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (*gpu < 0 || bytes == 0) {
        *gpu = -1;
        return CUDA_SUCCESS;
    }
    int p = fgpu_proc();
    if (p < 0) {
        if (!fgpu_g.capping) {
            *gpu = -1;
            return CUDA_SUCCESS;
        }
        count_oom(*gpu, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (fgpu_seg_reserve(fgpu_g.seg, fgpu_g.ctl, p, (uint32_t)*gpu, bytes) == 0)
        return CUDA_SUCCESS;
    fgpu_seg_sweep(fgpu_g.seg); /* a dead process may still hold part of the cap */
    if (fgpu_seg_reserve(fgpu_g.seg, fgpu_g.ctl, p, (uint32_t)*gpu, bytes) == 0)
        return CUDA_SUCCESS;
    count_oom(*gpu, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

void fgpu_mem_give(int gpu, uint64_t bytes)
{
    if (gpu >= 0 && bytes != 0)
        fgpu_seg_unreserve(fgpu_g.seg, fgpu_proc(), (uint32_t)gpu, bytes);
}

static CUcontext current_ctx(void)
{
    CUcontext c = NULL;
    if (fgpu_real.cuCtxGetCurrent != NULL && fgpu_real.cuCtxGetCurrent(&c) != CUDA_SUCCESS)
        c = NULL;
    return c;
}

static void track(int kind, uint64_t key, int gpu, uint64_t bytes, CUcontext ctx)
{
    if (gpu < 0)
        return;
    struct rec *r = malloc(sizeof *r);
    if (r == NULL) {
        /* cannot remember it: give it back now rather than hold it forever */
        fgpu_mem_give(gpu, bytes);
        return;
    }
    *r = (struct rec){.key = key, .kind = kind, .gpu = gpu, .bytes = bytes, .ctx = ctx};
    pthread_mutex_lock(&table_lock);
    size_t b = bucket_of(key);
    r->next = buckets[b];
    buckets[b] = r;
    pthread_mutex_unlock(&table_lock);
}

void fgpu_mem_track(int kind, uint64_t key, int gpu, uint64_t bytes)
{
    track(kind, key, gpu, bytes, current_ctx());
}

void fgpu_mem_track_unbound(int kind, uint64_t key, int gpu, uint64_t bytes)
{
    track(kind, key, gpu, bytes, NULL);
}

uint64_t fgpu_mem_replace(int kind, uint64_t key, CUcontext ctx, int gpu, uint64_t bytes)
{
    uint64_t old = 0;
    struct rec *fresh = bytes != 0 ? malloc(sizeof *fresh) : NULL;
    pthread_mutex_lock(&table_lock);
    struct rec **pp = &buckets[bucket_of(key)];
    while (*pp != NULL && !((*pp)->kind == kind && (*pp)->key == key && (*pp)->ctx == ctx))
        pp = &(*pp)->next;
    struct rec *r = *pp;
    if (r != NULL) {
        old = r->bytes;
        if (bytes != 0) {
            r->bytes = bytes;
            r->gpu = gpu;
        } else {
            *pp = r->next;
        }
    } else if (fresh != NULL && gpu >= 0) {
        *fresh = (struct rec){.key = key, .kind = kind, .gpu = gpu, .bytes = bytes, .ctx = ctx};
        fresh->next = buckets[bucket_of(key)];
        buckets[bucket_of(key)] = fresh;
        fresh = NULL;
    }
    pthread_mutex_unlock(&table_lock);
    free(fresh);
    if (r != NULL && bytes == 0)
        free(r);
    return old;
}

/* Remove one record (kind, key) and give its bytes back. Returns 1 if there was one. */
int fgpu_mem_release(int kind, uint64_t key)
{
    pthread_mutex_lock(&table_lock);
    struct rec **pp = &buckets[bucket_of(key)];
    while (*pp != NULL && !((*pp)->kind == kind && (*pp)->key == key))
        pp = &(*pp)->next;
    struct rec *r = *pp;
    if (r != NULL)
        *pp = r->next;
    pthread_mutex_unlock(&table_lock);
    if (r == NULL)
        return 0;
    fgpu_mem_give(r->gpu, r->bytes);
    free(r);
    return 1;
}

/* Give back and forget every record of a context (before it is destroyed). */
void fgpu_mem_release_ctx(CUcontext ctx)
{
    if (ctx == NULL)
        return;
    for (;;) {
        struct rec *found = NULL;
        pthread_mutex_lock(&table_lock);
        for (size_t b = 0; b < NBUCKETS && found == NULL; b++) {
            for (struct rec **pp = &buckets[b]; *pp != NULL; pp = &(*pp)->next) {
                if ((*pp)->ctx == ctx) {
                    found = *pp;
                    *pp = found->next;
                    break;
                }
            }
        }
        pthread_mutex_unlock(&table_lock);
        if (found == NULL)
            return;
        fgpu_mem_give(found->gpu, found->bytes);
        free(found);
    }
}

void fgpu_memory_atfork_child(void)
{
    pthread_mutex_init(&table_lock, NULL);
    for (size_t b = 0; b < NBUCKETS; b++) {
        struct rec *r = buckets[b];
        while (r != NULL) {
            struct rec *next = r->next;
            free(r);
            r = next;
        }
        buckets[b] = NULL;
    }
}


/* ------------------------------------------------------------------ linear allocations */


FGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    PASS_IF_INACTIVE(cuMemAlloc_v2, dptr, bytesize);
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = fgpu_real.cuMemAlloc_v2(dptr, bytesize);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, bytesize);
    else
        fgpu_mem_track(K_PTR, *dptr, g, bytesize);
    return r;
}

FGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    PASS_IF_INACTIVE(cuMemAllocManaged, dptr, bytesize, flags);
    int g = fgpu_gpu_of_current();
    CUresult r = fgpu_mem_take(&g, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = fgpu_real.cuMemAllocManaged(dptr, bytesize, flags);
    if (r != CUDA_SUCCESS)
        fgpu_mem_give(g, bytesize);
    else
        fgpu_mem_track(K_PTR, *dptr, g, bytesize);
    return r;
}

FGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t widthInBytes,
                                        size_t height, unsigned int elementSizeBytes)
{
    PASS_IF_INACTIVE(cuMemAllocPitch_v2, dptr, pPitch, widthInBytes, height, elementSizeBytes);
    int g = fgpu_gpu_of_current();
    uint64_t w = widthInBytes > UINT64_MAX - 511 ? UINT64_MAX : (widthInBytes + 511) & ~511ull;
    uint64_t bound = fgpu_mul_sat(w, height);
    CUresult r = fgpu_mem_take(&g, bound);
    if (r != CUDA_SUCCESS)
        return r;
    r = fgpu_real.cuMemAllocPitch_v2(dptr, pPitch, widthInBytes, height, elementSizeBytes);
    if (r != CUDA_SUCCESS) {
        fgpu_mem_give(g, bound);
        return r;
    }
    uint64_t actual = fgpu_mul_sat(*pPitch, height);
    if (actual < bound) {
        fgpu_mem_give(g, bound - actual);
    } else if (actual > bound) {
        int g2 = g;
        if (fgpu_mem_take(&g2, actual - bound) != CUDA_SUCCESS) {
            fgpu_real.cuMemFree_v2(*dptr);
            fgpu_mem_give(g, bound);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    fgpu_mem_track(K_PTR, *dptr, g, actual);
    return r;
}

FGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    PASS_IF_INACTIVE(cuMemFree_v2, dptr);
    CUresult r = fgpu_real.cuMemFree_v2(dptr);
    if (r == CUDA_SUCCESS)
        fgpu_mem_release(K_PTR, dptr);
    return r;
}

FGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    PASS_IF_INACTIVE(cuMemGetInfo_v2, free_bytes, total_bytes);
    CUresult r = fgpu_real.cuMemGetInfo_v2(free_bytes, total_bytes);
    if (r != CUDA_SUCCESS || free_bytes == NULL || total_bytes == NULL)
        return r;
    int g = fgpu_gpu_of_current();
    if (g == FGPU_GPU_NOT_GRANTED && fgpu_g.capping)
        *free_bytes = 0; /* nothing of it may be allocated */
    if (g < 0)
        return r;
    struct fgpu_seg_gpu *gpu = &fgpu_g.seg->gpus[g];
    uint64_t limit = atomic_load_explicit(&fgpu_g.ctl->gpus[g].memory_limit, memory_order_relaxed);
    if (!fgpu_g.capping || limit == 0)
        return r;
    uint64_t used = atomic_load_explicit(&gpu->memory_reserved, memory_order_relaxed);
    uint64_t left = used >= limit ? 0 : limit - used;
    if (limit < *total_bytes)
        *total_bytes = (size_t)limit;
    if (left < *free_bytes)
        *free_bytes = (size_t)left;
    return r;
}
