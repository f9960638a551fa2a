/*
 * cudemo_bench.c - fgpu-cudemo's timing commands for bench/interposer.py.
 *
 *   bench-launch COUNT         COUNT zero-length kernel launches on the default stream, each
 *                              timed with CLOCK_MONOTONIC around the call: median and p99 ns
 *   bench-alloc COUNT BYTES    COUNT cuMemAlloc_v2 + cuMemFree_v2 pairs, each pair timed
 *   bench-batch COUNT SIZE     COUNT batches of SIZE zero-length kernel launches on the
 *                              default stream, each batch timed as a whole (the launch calls
 *                              only), then a cuCtxSynchronize timed on its own: median and
 *                              p99 ns per launch of the batches, median ns of the synchronize
 *
 *   bursts NS COUNT BURSTS IDLE_US
 *                              BURSTS times: COUNT NS-long kernels on the default stream,
 *                              waited for through an event of the program's own
 *                              (cuEventSynchronize, which the interposer does not see), then
 *                              IDLE_US of the CPU alone; a cuCtxSynchronize at the end
 *   ctx-bursts NS COUNT ROUNDS IDLE_US
 *                              ROUNDS times, on the primary context of device 0, then of
 *                              device 1: COUNT NS-long kernels on its default stream, waited
 *                              for through an event of the program's own, then IDLE_US of
 *                              the CPU alone; a cuCtxSynchronize in each context at the end
 *
 * One JSON line each. The figures are what the program sees per call, with or without the
 * interposer preloaded (the benchmark runs both).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "cudemo.h"

static int by_value(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* extra: more JSON members (",\"k\":v"), or "" */
static void report(const char *what, uint64_t *samples, long count, const char *extra)
{
    qsort(samples, (size_t)count, sizeof *samples, by_value);
    uint64_t total = 0;
    for (long i = 0; i < count; i++)
        total += samples[i];
    long p99 = (long)((double)count * 0.99);
    if (p99 >= count)
        p99 = count - 1;
    printf("{\"bench\":\"%s\",\"count\":%ld,\"median_ns\":%llu,\"p99_ns\":%llu,"
           "\"mean_ns\":%.1f%s}\n",
           what, count, (unsigned long long)samples[count / 2],
           (unsigned long long)samples[p99], (double)total / (double)count, extra);
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
    report("launch", samples, count, "");
    free(samples);
    CHECK(api.cuModuleUnload(m));
    return 0;
}

int cmd_bench_batch(long count, long size)
{
    static const char image[] = "FGPUFAKE spin module";
    CUmodule m;
    CUfunction f;
    uint64_t ns = 0;
    void *params[] = {&ns};
    uint64_t *samples = calloc(count > 0 ? (size_t)count : 1, sizeof *samples);
    uint64_t *syncs = calloc(count > 0 ? (size_t)count : 1, sizeof *syncs);
    if (samples == NULL || syncs == NULL || count <= 0 || size <= 0) {
        fprintf(stderr, "fgpu-cudemo: bench-batch: COUNT and SIZE must be positive\n");
        free(samples);
        free(syncs);
        return 64;
    }
    CHECK(api.cuModuleLoadData(&m, image));
    CHECK(api.cuModuleGetFunction(&f, m, "spin"));
    for (long i = 0; i < count; i++) {
        uint64_t t = now_ns();
        for (long k = 0; k < size; k++) {
            CUresult rc = api.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
            if (rc != CUDA_SUCCESS)
                fail("cuLaunchKernel", rc);
        }
        uint64_t t1 = now_ns();
        CHECK(api.cuCtxSynchronize());
        syncs[i] = now_ns() - t1;
        samples[i] = (t1 - t + (uint64_t)size / 2) / (uint64_t)size;
    }
    qsort(syncs, (size_t)count, sizeof *syncs, by_value);
    char extra[96];
    snprintf(extra, sizeof extra, ",\"size\":%ld,\"sync_median_ns\":%llu", size,
             (unsigned long long)syncs[count / 2]);
    report("batch", samples, count, extra);
    free(samples);
    free(syncs);
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
    report("alloc", samples, count, "");
    free(samples);
    return 0;
}

int cmd_bursts(uint64_t ns, long count, long bursts, long idle_us)
{
    static const char image[] = "FGPUFAKE spin module";
    CUmodule m;
    CUfunction f;
    CUevent done;
    void *params[] = {&ns};
    if (count <= 0 || bursts <= 0 || idle_us < 0) {
        fprintf(stderr, "fgpu-cudemo: bursts: COUNT and BURSTS must be positive\n");
        return 64;
    }
    CHECK(api.cuModuleLoadData(&m, image));
    CHECK(api.cuModuleGetFunction(&f, m, "spin"));
    CHECK(api.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
    uint64_t t0 = now_ns();
    for (long b = 0; b < bursts; b++) {
        for (long k = 0; k < count; k++) {
            CUresult rc = api.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
            if (rc != CUDA_SUCCESS)
                fail("cuLaunchKernel", rc);
        }
        CHECK(api.cuEventRecord(done, NULL));
        CHECK(api.cuEventSynchronize(done));
        struct timespec idle = {(time_t)(idle_us / 1000000), (long)(idle_us % 1000000) * 1000};
        while (nanosleep(&idle, &idle) != 0) {
        }
    }
    CHECK(api.cuCtxSynchronize());
    printf("{\"launches\":%ld,\"kernel_ns\":%llu,\"wall_ns\":%llu,\"pid\":%d}\n",
           count * bursts, (unsigned long long)ns, (unsigned long long)(now_ns() - t0),
           (int)getpid());
    CHECK(api.cuEventDestroy_v2(done));
    CHECK(api.cuModuleUnload(m));
    return 0;
}

int cmd_ctx_bursts(uint64_t ns, long count, long rounds, long idle_us)
{
    static const char image[] = "FGPUFAKE spin module";
    CUcontext ctx[2];
    CUfunction f[2];
    CUmodule m[2];
    CUevent done[2];
    void *params[] = {&ns};
    if (count <= 0 || rounds <= 0 || idle_us < 0) {
        fprintf(stderr, "fgpu-cudemo: ctx-bursts: COUNT and ROUNDS must be positive\n");
        return 64;
    }
    for (int d = 0; d < 2; d++) {
        CUdevice dev;
        CHECK(api.cuDeviceGet(&dev, d));
        CHECK(api.cuDevicePrimaryCtxRetain(&ctx[d], dev));
        CHECK(api.cuCtxSetCurrent(ctx[d]));
        CHECK(api.cuModuleLoadData(&m[d], image));
        CHECK(api.cuModuleGetFunction(&f[d], m[d], "spin"));
        CHECK(api.cuEventCreate(&done[d], CU_EVENT_DISABLE_TIMING));
    }
    for (long r = 0; r < rounds; r++) {
        for (int d = 0; d < 2; d++) {
            CHECK(api.cuCtxSetCurrent(ctx[d]));
            for (long k = 0; k < count; k++) {
                CUresult rc = api.cuLaunchKernel(f[d], 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
                if (rc != CUDA_SUCCESS)
                    fail("cuLaunchKernel", rc);
            }
            CHECK(api.cuEventRecord(done[d], NULL));
            CHECK(api.cuEventSynchronize(done[d]));
            struct timespec idle = {(time_t)(idle_us / 1000000), (long)(idle_us % 1000000) * 1000};
            while (nanosleep(&idle, &idle) != 0) {
            }
        }
    }
    for (int d = 0; d < 2; d++) {
        CHECK(api.cuCtxSetCurrent(ctx[d]));
        CHECK(api.cuCtxSynchronize());
        CHECK(api.cuEventDestroy_v2(done[d]));
        CHECK(api.cuModuleUnload(m[d]));
    }
    printf("{\"launches\":%ld,\"pid\":%d}\n", count * rounds * 2, (int)getpid());
    return 0;
}
