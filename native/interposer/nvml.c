/*
 * nvml.c - NVML memory queries for a capped GPU (libfgpu.so).
 *
 * Owns: nvmlDeviceGetMemoryInfo and _v2. For a device whose uuid is in the segment and
 * capped: total = the cap (never above the real total), free = cap - reserved (never above
 * the real free), used = total - free. Any other device, or no segment: the real answer.
 */
#include <string.h>

#include "fgpu.h"

/* The segment GPU of an NVML device, -1 when not capped. */
static int capped_gpu(nvmlDevice_t dev, uint64_t *limit, uint64_t *reserved)
{
    fgpu_init();
    if (!fgpu_g.active || !fgpu_g.capping || fgpu_real.nvmlDeviceGetUUID == NULL)
        return -1;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (fgpu_real.nvmlDeviceGetUUID(dev, uuid, sizeof uuid) != NVML_SUCCESS)
        return -1;
    int g = fgpu_seg_find_gpu(fgpu_g.ctl, uuid);
    if (g < 0)
        return -1;
    *limit = atomic_load_explicit(&fgpu_g.ctl->gpus[g].memory_limit, memory_order_relaxed);
    *reserved = atomic_load_explicit(&fgpu_g.seg->gpus[g].memory_reserved, memory_order_relaxed);
    return *limit == 0 ? -1 : g;
}

static void clamp(unsigned long long *total, unsigned long long *free_b,
                  unsigned long long *used, uint64_t limit, uint64_t reserved)
{
    uint64_t left = reserved >= limit ? 0 : limit - reserved;
    if (limit < *total)
        *total = limit;
    if (left < *free_b)
        *free_b = left;
    *used = *total - *free_b;
}

FGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    if (fgpu_resolve_nvml() != 0 || fgpu_real.nvmlDeviceGetMemoryInfo == NULL)
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    nvmlReturn_t r = fgpu_real.nvmlDeviceGetMemoryInfo(device, memory);
    uint64_t limit, reserved;
    if (r == NVML_SUCCESS && memory != NULL && capped_gpu(device, &limit, &reserved) >= 0)
        clamp(&memory->total, &memory->free, &memory->used, limit, reserved);
    return r;
}

FGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device,
                                                    nvmlMemory_v2_t *memory)
{
    if (fgpu_resolve_nvml() != 0 || fgpu_real.nvmlDeviceGetMemoryInfo_v2 == NULL)
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    nvmlReturn_t r = fgpu_real.nvmlDeviceGetMemoryInfo_v2(device, memory);
    uint64_t limit, reserved;
    if (r == NVML_SUCCESS && memory != NULL && capped_gpu(device, &limit, &reserved) >= 0) {
        clamp(&memory->total, &memory->free, &memory->used, limit, reserved);
        memory->reserved = 0;
    }
    return r;
}
