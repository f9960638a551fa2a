/*
 * vmm.c - fake driver (a STAND-IN for tests, see fake.h): virtual memory management.
 * cuMemCreate takes device memory (sizes in whole 2 MiB granules); the memory goes back when
 * the handle is released and no mapping uses it any more, as with the real driver. Address
 * ranges (cuMemAddressReserve) take no device memory. The process's handles, ranges and
 * mappings are guarded by fk_g.lock.
 */
#include <stdlib.h>

#include "fake.h"

struct fk_phys {
    struct fk_phys *next;
    uint64_t id;
    int gpu;
    uint64_t size;
    int refs; /* the handle (until cuMemRelease) + mappings */
    int released;
};

struct fk_range {
    struct fk_range *next;
    uint64_t base, size;
};

struct fk_map {
    struct fk_map *next;
    uint64_t ptr, size;
    struct fk_phys *phys;
};

static struct fk_phys *phys_list;
static struct fk_range *ranges;
static struct fk_map *maps;
static uint64_t next_id = 1;

static CUresult prop_gpu(const CUmemAllocationProp *prop, int *gpu)
{
    if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_dev_gpu(prop->location.id, gpu);
    return rc == CUDA_ERROR_INVALID_DEVICE ? CUDA_ERROR_INVALID_VALUE : rc;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    int gpu;
    if (granularity == NULL || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = prop_gpu(prop, &gpu);
    if (rc == CUDA_SUCCESS)
        *granularity = FK_CHUNK;
    return rc;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags)
{
    int gpu;
    if (handle == NULL || flags != 0 || size == 0 || size % FK_CHUNK != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = prop_gpu(prop, &gpu);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_phys *p = calloc(1, sizeof *p);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((rc = fk_reserve(gpu, size)) != CUDA_SUCCESS) {
        free(p);
        return rc;
    }
    pthread_mutex_lock(&fk_g.lock);
    p->id = next_id++;
    p->gpu = gpu;
    p->size = size;
    p->refs = 1;
    p->next = phys_list;
    phys_list = p;
    *handle = p->id;
    pthread_mutex_unlock(&fk_g.lock);
    return CUDA_SUCCESS;
}

/* caller: fk_g.lock */
static void phys_unref(struct fk_phys *p)
{
    if (--p->refs > 0)
        return;
    for (struct fk_phys **pp = &phys_list; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    fk_release(p->gpu, p->size);
    free(p);
}

static struct fk_phys *phys_find(uint64_t id)
{
    for (struct fk_phys *p = phys_list; p != NULL; p = p->next)
        if (p->id == id && !p->released)
            return p;
    return NULL;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&fk_g.lock);
    struct fk_phys *p = phys_find(handle);
    if (p != NULL) {
        p->released = 1;
        phys_unref(p);
    }
    pthread_mutex_unlock(&fk_g.lock);
    return p != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    (void)addr; /* a hint only */
    if (ptr == NULL || size == 0 || size % FK_CHUNK != 0 || flags != 0 ||
        (alignment & (alignment - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t align = alignment > FK_CHUNK ? alignment : FK_CHUNK;
    struct fk_range *r = calloc(1, sizeof *r);
    if (r == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t raw = fk_new_va(size + align);
    r->base = (raw + align - 1) / align * align;
    r->size = size;
    pthread_mutex_lock(&fk_g.lock);
    r->next = ranges;
    ranges = r;
    pthread_mutex_unlock(&fk_g.lock);
    *ptr = r->base;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.lock);
    for (struct fk_range **pp = &ranges; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->base == ptr && (*pp)->size == size) {
            struct fk_range *r = *pp;
            *pp = r->next;
            free(r);
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&fk_g.lock);
    return rc;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (flags != 0 || size == 0 || size % FK_CHUNK != 0 || offset % FK_CHUNK != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    struct fk_map *m = calloc(1, sizeof *m);
    if (m == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fk_g.lock);
    struct fk_phys *p = phys_find(handle);
    int in_range = 0;
    for (struct fk_range *r = ranges; r != NULL; r = r->next)
        in_range |= ptr >= r->base && ptr + size <= r->base + r->size;
    for (struct fk_map *x = maps; x != NULL; x = x->next)
        if (ptr < x->ptr + x->size && x->ptr < ptr + size)
            rc = CUDA_ERROR_ALREADY_MAPPED;
    if (p == NULL || !in_range || offset + size > p->size)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        m->ptr = ptr;
        m->size = size;
        m->phys = p;
        m->next = maps;
        maps = m;
        p->refs++;
    }
    pthread_mutex_unlock(&fk_g.lock);
    if (rc != CUDA_SUCCESS)
        free(m);
    return rc;
}

/* Unmaps every mapping inside [ptr, ptr + size). */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.lock);
    for (struct fk_map **pp = &maps; *pp != NULL;) {
        struct fk_map *m = *pp;
        if (m->ptr >= ptr && m->ptr + m->size <= ptr + size) {
            *pp = m->next;
            phys_unref(m->phys);
            free(m);
            rc = CUDA_SUCCESS;
        } else {
            pp = &m->next;
        }
    }
    pthread_mutex_unlock(&fk_g.lock);
    return rc;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    if (desc == NULL || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fk_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_g.lock);
    for (struct fk_map *m = maps; m != NULL; m = m->next)
        if (m->ptr >= ptr && m->ptr + m->size <= ptr + size)
            rc = CUDA_SUCCESS;
    pthread_mutex_unlock(&fk_g.lock);
    return rc;
}
