// runtime_paths.cu - the CUDA runtime's roads to device memory, for bench/gpu_check.py on a
// real GPU under libfgpu.so (never run on the fake driver: the runtime needs a real driver).
//
//   runtime_paths CAP_BYTES
//
// With a cap of CAP_BYTES on the process's GPU it reports, as one JSON line on stdout:
//   props:    cudaGetDeviceProperties().totalGlobalMem and cudaMemGetInfo (expected: the cap)
//   malloc:   cudaMalloc of 256 MiB chunks until refused (expected: about CAP / 256 MiB of
//             them, then cudaErrorMemoryAllocation)
//   graph:    a graph with a memory-allocation node (cudaGraphAddMemAllocNode) past the cap,
//             instantiated (expected: refused), then one of half the cap with its free node:
//             instantiated, launched, destroyed (expected: all succeed)
//   capture:  cudaMallocAsync + cudaFreeAsync captured on a stream, past the cap (expected:
//             the instantiation refused)
//   heap:     cudaDeviceSetLimit(cudaLimitMallocHeapSize) past the cap (expected: refused)
//   reset:    cudaMalloc of 60 % of the cap, cudaDeviceReset, cudaMalloc of 60 % again
//             (expected: the second allocation succeeds: the reset gave the first back)
// Each step records the runtime's error names; nothing is asserted here.
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t CHUNK = 256ull << 20;

static const char *name(cudaError_t e) { return cudaGetErrorName(e); }

static void props(void)
{
    cudaDeviceProp p;
    memset(&p, 0, sizeof p);
    cudaError_t e = cudaGetDeviceProperties(&p, 0);
    size_t free_b = 0, total_b = 0;
    cudaError_t m = cudaMemGetInfo(&free_b, &total_b);
    printf("\"props\": {\"error\": \"%s\", \"total_global_mem\": %zu, \"meminfo_error\": \"%s\", "
           "\"meminfo_free\": %zu, \"meminfo_total\": %zu}",
           name(e), p.totalGlobalMem, name(m), free_b, total_b);
}

static void malloc_until_refused(void)
{
    void *held[4096];
    int n = 0;
    cudaError_t e = cudaSuccess;
    while (n < 4096 && (e = cudaMalloc(&held[n], CHUNK)) == cudaSuccess)
        n++;
    cudaGetLastError(); /* clear the sticky-free error state of the refusal */
    for (int i = 0; i < n; i++)
        cudaFree(held[i]);
    printf("\"malloc\": {\"chunk\": %zu, \"count\": %d, \"allocated\": %zu, \"error\": \"%s\"}",
           CHUNK, n, (size_t)n * CHUNK, name(e));
}

static cudaError_t graph_with_alloc(size_t bytes, int launch)
{
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    cudaError_t e = cudaGraphCreate(&g, 0);
    if (e != cudaSuccess)
        return e;
    cudaMemAllocNodeParams p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = cudaMemAllocationTypePinned;
    p.poolProps.location.type = cudaMemLocationTypeDevice;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    cudaGraphNode_t a = NULL, f = NULL;
    e = cudaGraphAddMemAllocNode(&a, g, NULL, 0, &p);
    if (e == cudaSuccess)
        e = cudaGraphAddMemFreeNode(&f, g, &a, 1, p.dptr);
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&x, g, 0);
    if (e == cudaSuccess && launch) {
        e = cudaGraphLaunch(x, 0);
        if (e == cudaSuccess)
            e = cudaDeviceSynchronize();
    }
    if (x != NULL)
        cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    cudaGetLastError();
    return e;
}

static void graph(size_t cap)
{
    cudaError_t over = graph_with_alloc(cap + (1ull << 30), 0);
    cudaError_t fits = graph_with_alloc(cap / 2, 1);
    printf("\"graph\": {\"over_error\": \"%s\", \"half_error\": \"%s\"}", name(over), name(fits));
}

static void capture(size_t cap)
{
    cudaStream_t s = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    void *d = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaError_t alloc = cudaErrorUnknown, inst = cudaErrorUnknown;
    if (e == cudaSuccess)
        e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    if (e == cudaSuccess) {
        alloc = cudaMallocAsync(&d, cap + (1ull << 30), s);
        if (alloc == cudaSuccess)
            cudaFreeAsync(d, s);
        e = cudaStreamEndCapture(s, &g);
    }
    if (e == cudaSuccess && alloc == cudaSuccess) {
        inst = cudaGraphInstantiate(&x, g, 0);
        if (x != NULL)
            cudaGraphExecDestroy(x);
    }
    if (g != NULL)
        cudaGraphDestroy(g);
    if (s != NULL)
        cudaStreamDestroy(s);
    cudaGetLastError();
    printf("\"capture\": {\"capture_error\": \"%s\", \"alloc_error\": \"%s\", "
           "\"instantiate_error\": \"%s\"}",
           name(e), name(alloc), name(inst));
}

static void heap(size_t cap)
{
    cudaError_t e = cudaDeviceSetLimit(cudaLimitMallocHeapSize, cap + (1ull << 30));
    cudaGetLastError();
    printf("\"heap\": {\"over_error\": \"%s\"}", name(e));
}

static void reset(size_t cap)
{
    size_t n = cap / 10 * 6;
    void *a = NULL, *b = NULL;
    cudaError_t first = cudaMalloc(&a, n);
    cudaError_t r = cudaDeviceReset();
    cudaError_t again = cudaMalloc(&b, n);
    if (again == cudaSuccess)
        cudaFree(b);
    cudaGetLastError();
    printf("\"reset\": {\"bytes\": %zu, \"first_error\": \"%s\", \"reset_error\": \"%s\", "
           "\"again_error\": \"%s\"}",
           n, name(first), name(r), name(again));
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: runtime_paths CAP_BYTES\n");
        return 2;
    }
    size_t cap = strtoull(argv[1], NULL, 10);
    int version = 0;
    cudaRuntimeGetVersion(&version);
    printf("{\"runtime_version\": %d, \"cap\": %zu, ", version, cap);
    props();
    printf(", ");
    malloc_until_refused();
    printf(", ");
    graph(cap);
    printf(", ");
    capture(cap);
    printf(", ");
    heap(cap);
    printf(", ");
    reset(cap);
    printf("}\n");
    return 0;
}
