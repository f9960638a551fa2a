/*
 * launch_cost.c - fgpu-launch-cost: the time one cuLaunchKernel call takes in the caller,
 * for the interposer benchmark (run it with and without LD_PRELOAD=libfgpu.so and compare).
 *
 *   fgpu-launch-cost [KERNEL_NS [BATCHES [BATCH]]]   (defaults 1000 30 100)
 *
 * On the fake driver (a stand-in for libcuda.so.1 written for the tests): loads its "spin"
 * module, then runs BATCHES batches of BATCH launches of a KERNEL_NS-long kernel on one
 * stream, timing each call with CLOCK_MONOTONIC, with a cuStreamSynchronize between batches
 * (so the in-flight bound of the interposer is not what is measured); the first two batches
 * are warm-up. Prints one JSON line: median, p90, p99 and the count, in ns. Exit 1 with a
 * JSON error naming the call when the driver refuses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_api.h"

CUresult cuModuleLoadData(CUmodule *module, const void *image);

static unsigned long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

#define CHECK(call)                                                                          \
    do {                                                                                     \
        CUresult rc_ = (call);                                                               \
        if (rc_ != CUDA_SUCCESS) {                                                           \
            printf("{\"call\":\"%s\",\"result\":%d}\n", #call, rc_);                         \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

static long arg(int argc, char **argv, int i, long dflt, const char *name)
{
    if (argc <= i)
        return dflt;
    char *end;
    long v = strtol(argv[i], &end, 10);
    if (*end != '\0' || v <= 0 || v > 100000000) {
        fprintf(stderr, "fgpu-launch-cost: %s=%s is not a number in 1..100000000\n", name,
                argv[i]);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    long kernel_ns = arg(argc, argv, 1, 1000, "KERNEL_NS");
    long batches = arg(argc, argv, 2, 30, "BATCHES");
    long batch = arg(argc, argv, 3, 100, "BATCH");
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream stream;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "FGPUFAKE"));
    CHECK(cuModuleGetFunction(&fn, mod, "spin"));
    CHECK(cuStreamCreate(&stream, CU_STREAM_DEFAULT));
    unsigned long long ns = (unsigned long long)kernel_ns;
    void *params[] = {&ns};
    size_t n = (size_t)batches * (size_t)batch, k = 0;
    unsigned long long *t = malloc(n * sizeof *t);
    if (t == NULL) {
        printf("{\"call\":\"malloc\",\"result\":-1}\n");
        return 1;
    }
    for (long b = 0; b < batches + 2; b++) {
        for (long i = 0; i < batch; i++) {
            unsigned long long t0 = now_ns();
            CUresult rc = cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
            unsigned long long t1 = now_ns();
            if (rc != CUDA_SUCCESS) {
                printf("{\"call\":\"cuLaunchKernel\",\"result\":%d}\n", rc);
                return 1;
            }
            if (b >= 2)
                t[k++] = t1 - t0;
        }
        CHECK(cuStreamSynchronize(stream));
    }
    qsort(t, k, sizeof *t, cmp);
    printf("{\"launches\":%zu,\"kernel_ns\":%ld,\"median_ns\":%llu,\"p90_ns\":%llu,"
           "\"p99_ns\":%llu}\n",
           k, kernel_ns, t[k / 2], t[k * 9 / 10], t[k * 99 / 100]);
    free(t);
    return 0;
}
