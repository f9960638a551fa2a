/*
 * cudemo.c - fgpu-cudemo, a small CUDA driver API program for tests and benchmarks. It runs
 * against whatever libcuda.so.1 the loader finds (the fake driver, the interposer, the real
 * driver) and prints one JSON line per command on stdout.
 *
 *   fgpu-cudemo [--dlopen] [--ptsz] [--device N] COMMAND ARGS
 *     --dlopen     take every entry point from dlopen("libcuda.so.1") + cuGetProcAddress_v2
 *                  (as the CUDA runtime does) instead of the linked symbols
 *     --ptsz       per-thread default stream entry points (_ptsz)
 *     --ready      after set-up print {"ready":PID} and wait for a line on stdin
 *   info | meminfo
 *   alloc API BYTES            API: mem pitch managed vmm async pool array array3d mipmap
 *                              graph ipc module
 *   alloc-until-oom API CHUNK  allocates CHUNK-byte pieces until an error
 *   hold BYTES [API]           allocates, prints, waits until stdin closes, frees
 *   threads N API BYTES        N threads allocate BYTES each at once
 *   spin NS COUNT [--graph] [--stream] [--ex] [--coop]
 *   events NS                  event timing around one NS-long kernel
 *   procaddr                   cuGetProcAddress_v2 against dlsym, name by name
 *   ipc-open HEX               opens an IPC handle (used by "alloc ipc")
 * This file: entry points (linked or through cuGetProcAddress) and the allocation commands;
 * cudemo_main.c: the rest. "size" in alloc output is the device memory the documented model of the fake driver takes.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudemo.h"

struct cudemo_api api;
int ptsz_mode, dlopen_mode, device_ordinal;
CUdevice dev;
CUcontext ctx;
const char *self_path;
static CUmemoryPool pool;

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *err_name(CUresult rc)
{
    const char *name = NULL;
    if (api.cuGetErrorName == NULL || api.cuGetErrorName(rc, &name) != CUDA_SUCCESS || !name)
        return "CUDA_ERROR_UNRECOGNIZED";
    return name;
}

void fail(const char *call, CUresult rc)
{
    printf("{\"call\":\"%s\",\"result\":%d,\"error\":\"%s\"}\n", call, rc, err_name(rc));
    exit(1);
}


static void load_api(void)
{
    if (!dlopen_mode) {
#define LINKED(f, name, ptsz) api.f = ptsz_mode ? ptsz : f;
        CUDEMO_API(LINKED)
        return;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        printf("{\"call\":\"dlopen\",\"error\":\"%s\"}\n", dlerror());
        exit(2);
    }
    __typeof__(&cuGetProcAddress_v2) gpa =
        (__typeof__(&cuGetProcAddress_v2))dlsym(lib, "cuGetProcAddress_v2");
    if (gpa == NULL) {
        printf("{\"call\":\"dlsym\",\"error\":\"no cuGetProcAddress_v2\"}\n");
        exit(2);
    }
    cuuint64_t flags = ptsz_mode ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                 : CU_GET_PROC_ADDRESS_DEFAULT;
#define RESOLVE(f, name, ptsz)                                                           \
    do {                                                                                 \
        void *p_ = NULL;                                                                 \
        CUdriverProcAddressQueryResult st_;                                              \
        CUresult rc_ = gpa(name, &p_, CUDEMO_CUDA_VERSION, flags, &st_);                 \
        if (rc_ != CUDA_SUCCESS || p_ == NULL) {                                         \
            printf("{\"call\":\"cuGetProcAddress_v2\",\"symbol\":\"%s\",\"result\":%d,"  \
                   "\"status\":%d}\n",                                                   \
                   name, rc_, (int)st_);                                                 \
            exit(2);                                                                     \
        }                                                                                \
        api.f = (__typeof__(&f))p_;                                                      \
    } while (0);
    CUDEMO_API(RESOLVE)
}

void setup(void)
{
    load_api();
    CUresult rc = api.cuInit(0);
    if (rc != CUDA_SUCCESS)
        fail("cuInit", rc);
    CHECK(api.cuDeviceGet(&dev, device_ordinal));
    CHECK(api.cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(api.cuCtxSetCurrent(ctx));
}

void meminfo(size_t *free_b, size_t *total)
{
    CHECK(api.cuMemGetInfo_v2(free_b, total));
}

/* ------------------------------------------------------------------ allocations */

struct held {
    int kind;
    CUdeviceptr dptr;
    size_t size; /* the fake driver's modelled device memory */
    CUarray array;
    CUmipmappedArray mipmap;
    CUmemGenericAllocationHandle vmm;
    CUmodule module;
};

enum { H_MEM = 1, H_ASYNC, H_ARRAY, H_MIPMAP, H_VMM, H_GRAPH, H_MODULE };
#define MIB2 (2ull << 20)
#define ROUND_UP(x, a) (((x) + (a)-1) / (a) * (a))

static CUresult alloc_graph(size_t bytes, struct held *h)
{
    CUgraph g;
    CUgraphNode node;
    CUgraphExec exec;
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = dev;
    p.bytesize = bytes;
    CHECK(api.cuGraphCreate(&g, 0));
    CUresult rc = api.cuGraphAddMemAllocNode(&node, g, NULL, 0, &p);
    if (rc == CUDA_SUCCESS && (rc = api.cuGraphInstantiateWithFlags(&exec, g, 0)) == CUDA_SUCCESS) {
        rc = api.cuGraphLaunch(exec, NULL);
        if (rc == CUDA_SUCCESS)
            rc = api.cuStreamSynchronize(NULL);
        api.cuGraphExecDestroy(exec);
    }
    api.cuGraphDestroy(g);
    h->kind = H_GRAPH;
    h->dptr = p.dptr;
    h->size = ROUND_UP(bytes, MIB2);
    return rc;
}

static CUresult do_alloc(const char *kind, size_t bytes, struct held *h)
{
    memset(h, 0, sizeof *h);
    h->kind = H_MEM;
    h->size = bytes;
    if (strcmp(kind, "mem") == 0 || strcmp(kind, "ipc") == 0)
        return api.cuMemAlloc_v2(&h->dptr, bytes);
    if (strcmp(kind, "managed") == 0)
        return api.cuMemAllocManaged(&h->dptr, bytes, CU_MEM_ATTACH_GLOBAL);
    if (strcmp(kind, "pitch") == 0) {
        size_t pitch = 0, height = bytes % 4096 == 0 ? 8 : 1, width = bytes / height;
        h->size = ROUND_UP(width, 512) * height;
        return api.cuMemAllocPitch_v2(&h->dptr, &pitch, width, height, 4);
    }
    if (strcmp(kind, "async") == 0 || strcmp(kind, "pool") == 0) {
        h->kind = H_ASYNC;
        CUresult rc;
        if (kind[0] == 'a') {
            rc = api.cuMemAllocAsync(&h->dptr, bytes, NULL);
        } else {
            if (pool == NULL) {
                CUmemPoolProps props;
                memset(&props, 0, sizeof props);
                props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
                props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                props.location.id = dev;
                CHECK(api.cuMemPoolCreate(&pool, &props));
            }
            h->size = ROUND_UP(bytes, MIB2); /* one allocation in a fresh pool */
            rc = api.cuMemAllocFromPoolAsync(&h->dptr, bytes, pool, NULL);
        }
        return rc == CUDA_SUCCESS ? api.cuStreamSynchronize(NULL) : rc;
    }
    if (strcmp(kind, "array") == 0) { /* float4 elements, 4 rows when they fit */
        CUDA_ARRAY_DESCRIPTOR d = {bytes / 16, 0, CU_AD_FORMAT_FLOAT, 4};
        if (bytes % 64 == 0) {
            d.Width = bytes / 64;
            d.Height = 4;
        } else if (bytes % 16 != 0) {
            d.Width = bytes;
            d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
            d.NumChannels = 1;
        }
        h->kind = H_ARRAY;
        return api.cuArrayCreate_v2(&h->array, &d);
    }
    if (strcmp(kind, "array3d") == 0) { /* half2 elements (4 bytes), 2 x 2 planes */
        CUDA_ARRAY3D_DESCRIPTOR d = {bytes / 16, 2, 2, CU_AD_FORMAT_HALF, 2, 0};
        if (bytes % 16 != 0) {
            d.Width = bytes;
            d.Height = d.Depth = 1;
            d.Format = CU_AD_FORMAT_UNSIGNED_INT8;
            d.NumChannels = 1;
        }
        h->kind = H_ARRAY;
        return api.cuArray3DCreate_v2(&h->array, &d);
    }
    if (strcmp(kind, "mipmap") == 0) { /* 1D, bytes: levels W, W/2, W/4 of 1-byte texels */
        size_t w = bytes * 4 / 7;
        CUDA_ARRAY3D_DESCRIPTOR d = {w, 0, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
        unsigned levels = w >= 4 ? 3 : 1;
        h->size = levels == 3 ? w + w / 2 + w / 4 : w;
        h->kind = H_MIPMAP;
        return api.cuMipmappedArrayCreate(&h->mipmap, &d, levels);
    }
    if (strcmp(kind, "vmm") == 0) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        h->kind = H_VMM;
        h->size = ROUND_UP(bytes, MIB2);
        CUresult rc = api.cuMemCreate(&h->vmm, h->size, &prop, 0);
        if (rc != CUDA_SUCCESS)
            return rc;
        CHECK(api.cuMemAddressReserve(&h->dptr, h->size, 0, 0, 0));
        CHECK(api.cuMemMap(h->dptr, h->size, 0, h->vmm, 0));
        CUmemAccessDesc access = {prop.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CHECK(api.cuMemSetAccess(h->dptr, h->size, &access, 1));
        return CUDA_SUCCESS;
    }
    if (strcmp(kind, "graph") == 0)
        return alloc_graph(bytes, h);
    if (strcmp(kind, "module") == 0) {
        char image[64];
        snprintf(image, sizeof image, "FGPUFAKE bytes=%zu", bytes);
        h->kind = H_MODULE;
        return api.cuModuleLoadData(&h->module, image);
    }
    fprintf(stderr, "fgpu-cudemo: unknown allocation API '%s' (mem pitch managed vmm async "
                    "pool array array3d mipmap graph ipc module)\n", kind);
    exit(64);
}

static void do_free(struct held *h)
{
    switch (h->kind) {
    case H_MEM: CHECK(api.cuMemFree_v2(h->dptr)); break;
    case H_ASYNC:
        CHECK(api.cuMemFreeAsync(h->dptr, NULL));
        CHECK(api.cuStreamSynchronize(NULL));
        break;
    case H_ARRAY: CHECK(api.cuArrayDestroy(h->array)); break;
    case H_MIPMAP: CHECK(api.cuMipmappedArrayDestroy(h->mipmap)); break;
    case H_VMM:
        CHECK(api.cuMemUnmap(h->dptr, h->size));
        CHECK(api.cuMemRelease(h->vmm));
        CHECK(api.cuMemAddressFree(h->dptr, h->size));
        break;
    case H_GRAPH:
        CHECK(api.cuMemFree_v2(h->dptr));
        CHECK(api.cuDeviceGraphMemTrim(dev));
        break;
    case H_MODULE: CHECK(api.cuModuleUnload(h->module)); break;
    }
}

void hex(const void *data, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", ((const unsigned char *)data)[i]);
}

/* "alloc ipc": a second process opens the handle and reports free memory around it. */
static void ipc_child(CUdeviceptr dptr, char *child_json, size_t len)
{
    CUipcMemHandle handle;
    char text[2 * sizeof handle + 1];
    CHECK(api.cuIpcGetMemHandle(&handle, dptr));
    hex(&handle, sizeof handle, text);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s%s--device %d ipc-open %s", self_path,
             dlopen_mode ? "--dlopen " : "", ptsz_mode ? "--ptsz " : "", device_ordinal, text);
    FILE *p = popen(cmd, "r");
    child_json[0] = '\0';
    if (p == NULL || fgets(child_json, (int)len, p) == NULL)
        snprintf(child_json, len, "null");
    if (p != NULL)
        pclose(p);
    child_json[strcspn(child_json, "\n")] = '\0';
}

int cmd_alloc(const char *kind, size_t bytes)
{
    size_t f0, f1, f2, total;
    struct held h;
    char child[1024] = "null";
    meminfo(&f0, &total);
    CUresult rc = do_alloc(kind, bytes, &h);
    meminfo(&f1, &total);
    if (rc == CUDA_SUCCESS && strcmp(kind, "ipc") == 0)
        ipc_child(h.dptr, child, sizeof child);
    if (rc == CUDA_SUCCESS)
        do_free(&h);
    meminfo(&f2, &total);
    size_t f3 = f2; /* a created pool keeps freed memory until trimmed or destroyed */
    if (pool != NULL) {
        CHECK(api.cuMemPoolDestroy(pool));
        pool = NULL;
        meminfo(&f3, &total);
    }
    printf("{\"api\":\"%s\",\"bytes\":%zu,\"size\":%zu,\"result\":%d,\"error\":\"%s\","
           "\"free_before\":%zu,\"free_during\":%zu,\"free_after\":%zu,\"free_end\":%zu,"
           "\"total\":%zu,\"ipc_child\":%s}\n",
           kind, bytes, h.size, rc, err_name(rc), f0, f1, f2, f3, total, child);
    return 0;
}

int cmd_ipc_open(const char *text)
{
    CUipcMemHandle handle;
    size_t f0, f1, total;
    CUdeviceptr p = 0;
    if (strlen(text) != 2 * sizeof handle) {
        fprintf(stderr, "fgpu-cudemo: ipc-open: handle '%s' is not %zu hex digits\n", text,
                2 * sizeof handle);
        return 64;
    }
    for (size_t i = 0; i < sizeof handle; i++) {
        unsigned v;
        sscanf(text + 2 * i, "%2x", &v);
        handle.reserved[i] = (char)v;
    }
    meminfo(&f0, &total);
    CUresult rc = api.cuIpcOpenMemHandle_v2(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    meminfo(&f1, &total);
    CUresult close_rc = rc == CUDA_SUCCESS ? api.cuIpcCloseMemHandle(p) : rc;
    printf("{\"result\":%d,\"error\":\"%s\",\"close\":%d,\"dptr\":%llu,\"free_before\":%zu,"
           "\"free_opened\":%zu}\n",
           rc, err_name(rc), close_rc, (unsigned long long)p, f0, f1);
    return 0;
}

int cmd_until_oom(const char *kind, size_t chunk)
{
    size_t cap = 1 << 16, n = 0, got = 0, f, total;
    struct held *all = calloc(cap, sizeof *all);
    CUresult rc = CUDA_SUCCESS;
    while (all != NULL && n < cap) {
        rc = do_alloc(kind, chunk, &all[n]);
        if (rc != CUDA_SUCCESS)
            break;
        got += all[n++].size;
    }
    meminfo(&f, &total);
    for (size_t i = 0; i < n; i++)
        do_free(&all[i]);
    free(all);
    printf("{\"api\":\"%s\",\"chunk\":%zu,\"count\":%zu,\"bytes\":%zu,\"size\":%zu,"
           "\"result\":%d,\"error\":\"%s\",\"free_at_error\":%zu,\"total\":%zu}\n",
           kind, chunk, n, n * chunk, got, rc, err_name(rc), f, total);
    return 0;
}

int cmd_hold(size_t bytes, const char *kind)
{
    struct held h;
    CUresult rc = do_alloc(kind, bytes, &h);
    printf("{\"held\":%zu,\"api\":\"%s\",\"pid\":%d,\"result\":%d,\"error\":\"%s\"}\n",
           rc == CUDA_SUCCESS ? h.size : 0, kind, (int)getpid(), rc, err_name(rc));
    fflush(stdout);
    char buf[256];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
    if (rc == CUDA_SUCCESS)
        do_free(&h);
    printf("{\"released\":%s}\n", rc == CUDA_SUCCESS ? "true" : "false");
    return 0;
}

struct thread_arg {
    const char *kind;
    size_t bytes;
    struct held h;
    CUresult rc;
    pthread_barrier_t *go;
};

static void *alloc_thread(void *p)
{
    struct thread_arg *a = p;
    CHECK(api.cuCtxSetCurrent(ctx));
    pthread_barrier_wait(a->go);
    a->rc = do_alloc(a->kind, a->bytes, &a->h);
    return NULL;
}

int cmd_threads(int n, const char *kind, size_t bytes)
{
    struct thread_arg *args = calloc((size_t)n, sizeof *args);
    pthread_t *tids = calloc((size_t)n, sizeof *tids);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, (unsigned)n);
    int ok = 0, oom = 0, other = 0;
    for (int i = 0; i < n; i++) {
        args[i] = (struct thread_arg){kind, bytes, {0}, 0, &go};
        pthread_create(&tids[i], NULL, alloc_thread, &args[i]);
    }
    for (int i = 0; i < n; i++)
        pthread_join(tids[i], NULL);
    for (int i = 0; i < n; i++) {
        ok += args[i].rc == CUDA_SUCCESS;
        oom += args[i].rc == CUDA_ERROR_OUT_OF_MEMORY;
        other += args[i].rc != CUDA_SUCCESS && args[i].rc != CUDA_ERROR_OUT_OF_MEMORY;
        if (args[i].rc == CUDA_SUCCESS)
            do_free(&args[i].h);
    }
    pthread_barrier_destroy(&go);
    free(args);
    free(tids);
    printf("{\"threads\":%d,\"api\":\"%s\",\"bytes\":%zu,\"ok\":%d,\"oom\":%d,\"other\":%d}\n",
           n, kind, bytes, ok, oom, other);
    return 0;
}

