/*
 * cudart_probe.c - a CUDA runtime program for the tests: built by the test (not by build.py)
 * with the installed toolkit's headers and linked to its libcudart.so (NVIDIA's CUDA runtime),
 * then run against the fake driver (or the tracing stand-in, trace/libcuda.so.1). It walks the
 * runtime's common start-up and memory paths and prints one JSON object: the result code of
 * each call (cudaSuccess = 0) and the figures it read.
 *
 *     fgpu-cudart-probe [BYTES]     (BYTES: the cudaMalloc size, default 64 MiB)
 */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#define STEP(name, call)                                                                 \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        printf("%s\"%s\":%d", first ? "" : ",", name, (int)e_);                           \
        first = 0;                                                                       \
    } while (0)

int main(int argc, char **argv)
{
    size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : (64u << 20);
    int first = 1, runtime = 0, driver = 0, count = 0;
    size_t free_b = 0, total_b = 0;
    void *p = NULL, *q = NULL;
    struct cudaDeviceProp prop;
    cudaStream_t stream = NULL;
    printf("{\"results\":{");
    STEP("cudaRuntimeGetVersion", cudaRuntimeGetVersion(&runtime));
    STEP("cudaDriverGetVersion", cudaDriverGetVersion(&driver));
    STEP("cudaGetDeviceCount", cudaGetDeviceCount(&count));
    STEP("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, 0));
    STEP("cudaSetDevice", cudaSetDevice(0));
    STEP("cudaFree0", cudaFree(NULL));
    STEP("cudaMemGetInfo", cudaMemGetInfo(&free_b, &total_b));
    STEP("cudaMalloc", cudaMalloc(&p, bytes));
    STEP("cudaMemset", cudaMemset(p, 0, 4096));
    STEP("cudaDeviceSynchronize", cudaDeviceSynchronize());
    STEP("cudaStreamCreate", cudaStreamCreate(&stream));
    STEP("cudaMallocAsync", cudaMallocAsync(&q, 1u << 20, stream));
    STEP("cudaFreeAsync", cudaFreeAsync(q, stream));
    STEP("cudaStreamSynchronize", cudaStreamSynchronize(stream));
    STEP("cudaStreamDestroy", cudaStreamDestroy(stream));
    STEP("cudaFree", cudaFree(p));
    STEP("cudaDeviceReset", cudaDeviceReset());
    printf("},\"runtime_version\":%d,\"driver_version\":%d,\"device_count\":%d,"
           "\"total_global_mem\":%zu,\"free\":%zu,\"total\":%zu}\n",
           runtime, driver, count, count > 0 ? prop.totalGlobalMem : 0, free_b, total_b);
    return 0;
}
