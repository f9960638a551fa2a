/*
 * cupaths.c - fgpu-cupaths: a test program that reaches device memory by the driver API
 * roads beside the allocation calls, the way the CUDA runtime does: graph memory nodes
 * (cuGraphAddMemAllocNode, cuGraphAddNode / _v2, stream capture of cuMemAllocAsync, a child
 * graph holding them moved into its parent) under
 * every instantiate entry point (cuGraphInstantiateWithFlags, cuGraphInstantiateWithParams
 * with and without upload, cuGraphUpload, the pre-12.0 cuGraphInstantiate / _v2), the malloc
 * heap limit, primary-context release and reset (cudaDeviceReset), context destroy, and
 * cuDeviceTotalMem. One JSON line on stdout.
 *
 * Built twice: by native/build.py against fgpu's own declarations (cuda_api.h), and by the
 * tests with nvcc against the toolkit's own cuda.h (-DFGPU_WITH_CUDA_H), where the names are
 * cuda.h's macros (cuMemAlloc -> cuMemAlloc_v2, cuGraphAddNode -> cuGraphAddNode_v2,
 * cuStreamBeginCapture -> cuStreamBeginCapture_v2 ...) exactly as a CUDA program compiles
 * them. --dlopen: every function from dlopen("libcuda.so.1") + dlsym of that versioned name
 * (the road of programs that load the driver themselves).
 *
 * usage: fgpu-cupaths [--dlopen] totalmem
 *        fgpu-cupaths [--dlopen] graph ROAD INST BYTES free|keep|reset
 *            (keep: no free node, cuMemFree after the launch; reset: a free node, and the
 *            executable graph is left to cuDevicePrimaryCtxReset instead of destroyed)
 *            ROAD: allocnode addnode addnode-v1 capture child
 *            INST: flags params params-upload upload legacy legacy-v1
 *        fgpu-cupaths [--dlopen] heap BYTES LOWER
 *        fgpu-cupaths [--dlopen] ctx reset|release|release-held|destroy|destroy-async BYTES
 *            (destroy-async: the first allocation is cuMemAllocAsync, which outlives its
 *            context)
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FGPU_WITH_CUDA_H
#include <cuda.h>
#else
#include "cuda_api.h"
/* what cuda.h's macros make of the names (CUDA 13) */
#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
#define cuMemGetInfo cuMemGetInfo_v2
#define cuDeviceTotalMem cuDeviceTotalMem_v2
#define cuCtxDestroy cuCtxDestroy_v2
#define cuStreamDestroy cuStreamDestroy_v2
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuDevicePrimaryCtxReset cuDevicePrimaryCtxReset_v2
#define cuGraphAddNode cuGraphAddNode_v2
#define cuStreamBeginCapture cuStreamBeginCapture_v2
#endif

#define STR_(x) #x
#define STR(x) STR_(x) /* the name after macro expansion: the symbol a program links to */

#define APIS(X)                                                                             \
    X(cuInit)                                                                               \
    X(cuDevicePrimaryCtxRetain)                                                             \
    X(cuDevicePrimaryCtxRelease)                                                            \
    X(cuDevicePrimaryCtxReset)                                                              \
    X(cuCtxSetCurrent)                                                                      \
    X(cuCtxDestroy)                                                                         \
    X(cuCtxSetLimit)                                                                        \
    X(cuDeviceTotalMem)                                                                     \
    X(cuMemAlloc)                                                                           \
    X(cuMemFree)                                                                            \
    X(cuMemGetInfo)                                                                         \
    X(cuMemAllocAsync)                                                                      \
    X(cuMemFreeAsync)                                                                       \
    X(cuStreamCreate)                                                                       \
    X(cuStreamDestroy)                                                                      \
    X(cuStreamSynchronize)                                                                  \
    X(cuStreamBeginCapture)                                                                 \
    X(cuStreamEndCapture)                                                                   \
    X(cuGraphCreate)                                                                        \
    X(cuGraphAddMemAllocNode)                                                               \
    X(cuGraphAddMemFreeNode)                                                                \
    X(cuGraphAddNode)                                                                       \
    X(cuGraphInstantiateWithFlags)                                                          \
    X(cuGraphInstantiateWithParams)                                                         \
    X(cuGraphUpload)                                                                        \
    X(cuGraphLaunch)                                                                        \
    X(cuGraphExecDestroy)                                                                   \
    X(cuGraphDestroy)

#define DECL(name) static __typeof__(&name) p_##name;
APIS(DECL)

/* symbols cuda.h no longer names (pre-12.0 instantiate, the 12.2 cuGraphAddNode, the v2
 * context create): found by their exported names */
typedef CUresult (*legacy_instantiate_fn)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
typedef CUresult (*addnode_v1_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                  CUgraphNodeParams *);
typedef CUresult (*ctx_create_v2_fn)(CUcontext *, unsigned int, CUdevice);
static void *lib = RTLD_DEFAULT;

static const char *err_name(CUresult r)
{
    switch ((int)r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    default: return "CUDA_ERROR_OTHER";
    }
}

static int resolve(int use_dlopen)
{
    if (use_dlopen) {
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            printf("{\"error\": \"dlopen\", \"why\": \"%s\"}\n", dlerror());
            return -1;
        }
#define LOAD(name) p_##name = (__typeof__(p_##name))dlsym(lib, STR(name));
        APIS(LOAD)
    } else {
#define LINK(name) p_##name = &name;
        APIS(LINK)
    }
#define CHECK(name)                                                                         \
    if (p_##name == NULL) {                                                                 \
        printf("{\"error\": \"missing\", \"symbol\": \"%s\"}\n", STR(name));                \
        return -1;                                                                          \
    }
    APIS(CHECK)
    return 0;
}

static CUcontext primary(void)
{
    CUcontext c = NULL;
    if (p_cuDevicePrimaryCtxRetain(&c, 0) != CUDA_SUCCESS || p_cuCtxSetCurrent(c) != CUDA_SUCCESS)
        return NULL;
    return c;
}

static unsigned long long free_now(void)
{
    size_t f = 0, t = 0;
    return p_cuMemGetInfo(&f, &t) == CUDA_SUCCESS ? (unsigned long long)f : 0ull;
}

static int totalmem(void)
{
    size_t total = 0, f = 0, t = 0;
    CUresult r = p_cuDeviceTotalMem(&total, 0);
    if (r == CUDA_SUCCESS && primary() != NULL)
        r = p_cuMemGetInfo(&f, &t);
    printf("{\"error\": \"%s\", \"total_mem\": %zu, \"meminfo_total\": %zu}\n", err_name(r), total,
           t);
    return 0;
}

static void alloc_params(CUDA_MEM_ALLOC_NODE_PARAMS *p, size_t bytes)
{
    memset(p, 0, sizeof *p);
    p->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->poolProps.location.id = 0;
    p->bytesize = bytes;
}

/* Build the graph by ROAD: one alloc node of bytes, and a free node of it unless keep. */
static CUresult build(const char *road, size_t bytes, int keep, CUstream s, CUgraph *g,
                      CUdeviceptr *dptr)
{
    CUresult r;
    if (strcmp(road, "capture") == 0) {
        if ((r = p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL)) != CUDA_SUCCESS)
            return r;
        r = p_cuMemAllocAsync(dptr, bytes, s);
        if (r == CUDA_SUCCESS && !keep)
            r = p_cuMemFreeAsync(*dptr, s);
        CUresult e = p_cuStreamEndCapture(s, g);
        return r != CUDA_SUCCESS ? r : e;
    }
    if ((r = p_cuGraphCreate(g, 0)) != CUDA_SUCCESS)
        return r;
    CUgraphNode a, f;
    if (strcmp(road, "allocnode") == 0) {
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        alloc_params(&p, bytes);
        r = p_cuGraphAddMemAllocNode(&a, *g, NULL, 0, &p);
        *dptr = p.dptr;
        if (r == CUDA_SUCCESS && !keep)
            r = p_cuGraphAddMemFreeNode(&f, *g, &a, 1, *dptr);
        return r;
    }
    if (strcmp(road, "child") == 0) { /* the nodes in a child graph moved into g (CUDA 13) */
        CUgraph child = NULL;
        CUgraphNode c;
        if ((r = build("addnode", bytes, keep, s, &child, dptr)) != CUDA_SUCCESS)
            return r;
        CUgraphNodeParams np;
        memset(&np, 0, sizeof np);
        np.type = CU_GRAPH_NODE_TYPE_GRAPH;
        np.graph.graph = child;
        np.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
        r = p_cuGraphAddNode(&c, *g, NULL, NULL, 0, &np);
        if (r != CUDA_SUCCESS)
            p_cuGraphDestroy(child);
        return r;
    }
    addnode_v1_fn v1 = NULL;
    if (strcmp(road, "addnode-v1") == 0) {
        v1 = (addnode_v1_fn)dlsym(lib, "cuGraphAddNode");
        if (v1 == NULL)
            return CUDA_ERROR_NOT_FOUND;
    } else if (strcmp(road, "addnode") != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    alloc_params(&np.alloc, bytes);
    r = v1 ? v1(&a, *g, NULL, 0, &np) : p_cuGraphAddNode(&a, *g, NULL, NULL, 0, &np);
    *dptr = np.alloc.dptr;
    if (r != CUDA_SUCCESS || keep)
        return r;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
    np.free.dptr = *dptr;
    return v1 ? v1(&f, *g, &a, 1, &np) : p_cuGraphAddNode(&f, *g, &a, NULL, 1, &np);
}

static CUresult instantiate(const char *inst, CUgraphExec *x, CUgraph g, CUstream s)
{
    if (strcmp(inst, "flags") == 0)
        return p_cuGraphInstantiateWithFlags(x, g, 0);
    if (strcmp(inst, "upload") == 0) {
        CUresult r = p_cuGraphInstantiateWithFlags(x, g, 0);
        return r == CUDA_SUCCESS ? p_cuGraphUpload(*x, s) : r;
    }
    if (strcmp(inst, "params") == 0 || strcmp(inst, "params-upload") == 0) {
        CUDA_GRAPH_INSTANTIATE_PARAMS p;
        memset(&p, 0, sizeof p);
        if (strcmp(inst, "params-upload") == 0) {
            p.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
            p.hUploadStream = s;
        }
        return p_cuGraphInstantiateWithParams(x, g, &p);
    }
    const char *name = strcmp(inst, "legacy") == 0      ? "cuGraphInstantiate_v2"
                       : strcmp(inst, "legacy-v1") == 0 ? "cuGraphInstantiate"
                                                        : NULL;
    if (name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    legacy_instantiate_fn f = (legacy_instantiate_fn)dlsym(lib, name);
    if (f == NULL)
        return CUDA_ERROR_NOT_FOUND;
    char log[64];
    CUgraphNode err = NULL;
    return f(x, g, &err, log, sizeof log);
}

static int graph(const char *road, const char *inst, size_t bytes, const char *how)
{
    int keep = strcmp(how, "keep") == 0, reset = strcmp(how, "reset") == 0;
    CUstream s = NULL;
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    CUdeviceptr d = 0;
    unsigned long long before = free_now(), inst_free = 0, launched = 0;
    CUresult r = p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    CUresult built = r == CUDA_SUCCESS ? build(road, bytes, keep, s, &g, &d) : r;
    CUresult ri = built == CUDA_SUCCESS ? instantiate(inst, &x, g, s) : built;
    CUresult rl = ri;
    if (ri == CUDA_SUCCESS) {
        inst_free = free_now();
        rl = p_cuGraphLaunch(x, s);
        if (rl == CUDA_SUCCESS)
            rl = p_cuStreamSynchronize(s);
        launched = free_now();
        if (!reset)
            p_cuGraphExecDestroy(x);
    }
    if (keep && rl == CUDA_SUCCESS)
        p_cuMemFree(d);
    if (reset) { /* the executable graph and the stream end with the context */
        if (p_cuDevicePrimaryCtxReset(0) != CUDA_SUCCESS || primary() == NULL)
            rl = CUDA_ERROR_INVALID_CONTEXT;
        s = NULL;
    }
    unsigned long long after = free_now();
    if (g != NULL)
        p_cuGraphDestroy(g);
    if (s != NULL)
        p_cuStreamDestroy(s);
    printf("{\"build_error\": \"%s\", \"inst_error\": \"%s\", \"launch_error\": \"%s\", "
           "\"bytes\": %zu, \"free_before\": %llu, \"free_instantiated\": %llu, "
           "\"free_launched\": %llu, \"free_after\": %llu}\n",
           err_name(built), err_name(ri), err_name(rl), bytes, before, inst_free, launched,
           after);
    return 0;
}

static int heap(size_t bytes, size_t lower)
{
    CUresult r1 = p_cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, bytes);
    unsigned long long f1 = free_now();
    CUresult r2 = p_cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, lower);
    unsigned long long f2 = free_now();
    CUresult r3 = p_cuDevicePrimaryCtxReset(0);
    unsigned long long f3 = primary() != NULL ? free_now() : 0;
    printf("{\"set_error\": \"%s\", \"free_set\": %llu, \"lower_error\": \"%s\", "
           "\"free_lowered\": %llu, \"reset_error\": \"%s\", \"free_reset\": %llu}\n",
           err_name(r1), f1, err_name(r2), f2, err_name(r3), f3);
    return 0;
}

static int ctx(const char *mode, size_t bytes)
{
    CUdeviceptr d1 = 0, d2 = 0;
    CUcontext c = NULL;
    CUresult r, rm;
    int destroy = strncmp(mode, "destroy", 7) == 0;
    if (destroy) {
        ctx_create_v2_fn create = (ctx_create_v2_fn)dlsym(lib, "cuCtxCreate_v2");
        r = create != NULL ? create(&c, 0, 0) : CUDA_ERROR_NOT_FOUND;
    } else {
        r = p_cuDevicePrimaryCtxRetain(&c, 0);
        if (r == CUDA_SUCCESS && strcmp(mode, "release-held") == 0)
            r = p_cuDevicePrimaryCtxRetain(&c, 0); /* a second holder: release keeps it */
        if (r == CUDA_SUCCESS)
            r = p_cuCtxSetCurrent(c);
    }
    CUresult r1 = r;
    if (r == CUDA_SUCCESS && strcmp(mode, "destroy-async") == 0) {
        r1 = p_cuMemAllocAsync(&d1, bytes, NULL);
        if (r1 == CUDA_SUCCESS)
            r1 = p_cuStreamSynchronize(NULL);
    } else if (r == CUDA_SUCCESS) {
        r1 = p_cuMemAlloc(&d1, bytes);
    }
    unsigned long long f1 = free_now();
    if (strcmp(mode, "reset") == 0)
        rm = p_cuDevicePrimaryCtxReset(0);
    else if (destroy)
        rm = p_cuCtxDestroy(c);
    else
        rm = p_cuDevicePrimaryCtxRelease(0);
    if (strcmp(mode, "release-held") != 0 && primary() == NULL)
        rm = CUDA_ERROR_INVALID_CONTEXT;
    if (strcmp(mode, "release-held") == 0)
        p_cuCtxSetCurrent(c);
    CUresult r2 = p_cuMemAlloc(&d2, bytes);
    unsigned long long f2 = free_now();
    printf("{\"alloc_error\": \"%s\", \"free_allocated\": %llu, \"%s_error\": \"%s\", "
           "\"again_error\": \"%s\", \"free_again\": %llu}\n",
           err_name(r1), f1, mode, err_name(rm), err_name(r2), f2);
    return 0;
}

int main(int argc, char **argv)
{
    int a = 1, use_dlopen = 0;
    if (a < argc && strcmp(argv[a], "--dlopen") == 0) {
        use_dlopen = 1;
        a++;
    }
    if (a >= argc) {
        fprintf(stderr, "usage: fgpu-cupaths [--dlopen] totalmem | graph ROAD INST BYTES "
                        "free|keep|reset | heap BYTES LOWER | ctx MODE BYTES\n");
        return 2;
    }
    if (resolve(use_dlopen) != 0)
        return 1;
    CUresult r = p_cuInit(0);
    if (r != CUDA_SUCCESS) {
        printf("{\"error\": \"%s\", \"at\": \"cuInit\"}\n", err_name(r));
        return 1;
    }
    const char *cmd = argv[a++];
    int left = argc - a;
    if (strcmp(cmd, "totalmem") == 0 && left == 0)
        return totalmem();
    if (strcmp(cmd, "ctx") == 0 && left == 2)
        return ctx(argv[a], strtoull(argv[a + 1], NULL, 10));
    if (primary() == NULL) {
        printf("{\"error\": \"no primary context\"}\n");
        return 1;
    }
    if (strcmp(cmd, "graph") == 0 && left == 4)
        return graph(argv[a], argv[a + 1], strtoull(argv[a + 2], NULL, 10), argv[a + 3]);
    if (strcmp(cmd, "heap") == 0 && left == 2)
        return heap(strtoull(argv[a], NULL, 10), strtoull(argv[a + 1], NULL, 10));
    fprintf(stderr, "fgpu-cupaths: unknown command or wrong arguments: %s\n", cmd);
    return 2;
}
