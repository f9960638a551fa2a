/*
 * cudemo_bench.c - fgpu-cudemo's timing commands for bench/interposer.py.
 *
 *   bench-launch COUNT         COUNT zero-length kernel launches on the default stream, each
 *                              timed with CLOCK_MONOTONIC around the call: median and p99 ns
 *   bench-alloc COUNT BYTES    COUNT cuMemAlloc_v2 + cuMemFree_v2 pairs, each pair timed
 *
 * One JSON line each. The figures are what the program sees per call, with or without the
 * interposer preloaded (the benchmark runs both).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cudemo.h"

static int by_value(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, uint64_t *samples, long count)
{
    qsort(samples, (size_t)count, sizeof *samples, by_value);
    uint64_t total = 0;
    for (long i = 0; i < count; i++)
        total += samples[i];
    long p99 = (long)((double)count * 0.99);
    if (p99 >= count)
        p99 = count - 1;
    printf("{\"bench\":\"%s\",\"count\":%ld,\"median_ns\":%llu,\"p99_ns\":%llu,"
           "\"mean_ns\":%.1f}\n",
           what, count, (unsigned long long)samples[count / 2],
           (unsigned long long)samples[p99], (double)total / (double)count);
}

int cmd_bench_launch(long count)
{
    static const char image[] = "FGPUFAKE spin module";
    CUmodule m;
    CUfunction f;
    uint64_t ns = 0;
    void *params[] = {&ns};
    uint64_t *samples = calloc((size_t)count, sizeof *samples);
    if (samples == NULL || count <= 0) {
        fprintf(stderr, "fgpu-cudemo: bench-launch: COUNT must be positive\n");
        free(samples);
        return 64;
    }
    CHECK(api.cuModuleLoadData(&m, image));
    CHECK(api.cuModuleGetFunction(&f, m, "spin"));
    for (long i = 0; i < count; i++) {
        uint64_t t = now_ns();
        CUresult rc = api.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
        samples[i] = now_ns() - t;
        if (rc != CUDA_SUCCESS)
            fail("cuLaunchKernel", rc);
    }
    CHECK(api.cuCtxSynchronize());
    report("launch", samples, count);
    free(samples);
    CHECK(api.cuModuleUnload(m));
    return 0;
}

int cmd_bench_alloc(long count, size_t bytes)
{
    uint64_t *samples = calloc((size_t)count, sizeof *samples);
    if (samples == NULL || count <= 0) {
        fprintf(stderr, "fgpu-cudemo: bench-alloc: COUNT must be positive\n");
        free(samples);
        return 64;
    }
    for (long i = 0; i < count; i++) {
        CUdeviceptr p;
        uint64_t t = now_ns();
        CUresult rc = api.cuMemAlloc_v2(&p, bytes);
        if (rc == CUDA_SUCCESS)
            rc = api.cuMemFree_v2(p);
        samples[i] = now_ns() - t;
        if (rc != CUDA_SUCCESS)
            fail("cuMemAlloc_v2/cuMemFree_v2", rc);
    }
    report("alloc", samples, count);
    free(samples);
    return 0;
}
