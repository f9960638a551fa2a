/*
 * cudemo_main.c - fgpu-cudemo's command line, kernels (spin), events, device info and the
 * cuGetProcAddress check. See cudemo.c for the commands and their output.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudemo.h"

static const char spin_image[] = "FGPUFAKE spin module";

static CUfunction spin_function(CUmodule *m)
{
    CUfunction f;
    CHECK(api.cuModuleLoadData(m, spin_image));
    CHECK(api.cuModuleGetFunction(&f, *m, "spin"));
    return f;
}

static CUresult launch_one(CUfunction f, CUstream s, void **params, const char *how)
{
    if (strcmp(how, "ex") == 0) {
        CUlaunchConfig cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
        cfg.blockDimX = 32;
        cfg.blockDimY = cfg.blockDimZ = 1;
        cfg.hStream = s;
        return api.cuLaunchKernelEx(&cfg, f, params, NULL);
    }
    if (strcmp(how, "coop") == 0)
        return api.cuLaunchCooperativeKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params);
    return api.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
}

static int cmd_spin(uint64_t ns, long count, const char *how, int own_stream)
{
    CUmodule m;
    CUfunction f = spin_function(&m);
    CUstream s = NULL;
    CUevent e0, e1;
    CUgraphExec exec = NULL;
    CUgraph g = NULL;
    void *params[] = {&ns};
    if (own_stream)
        CHECK(api.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    if (strcmp(how, "graph") == 0) {
        CUgraphNode node;
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.func = f;
        p.gridDimX = p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = 32;
        p.blockDimY = p.blockDimZ = 1;
        p.kernelParams = params;
        CHECK(api.cuGraphCreate(&g, 0));
        CHECK(api.cuGraphAddKernelNode_v2(&node, g, NULL, 0, &p));
        CHECK(api.cuGraphInstantiateWithFlags(&exec, g, 0));
    }
    CHECK(api.cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CHECK(api.cuEventCreate(&e1, CU_EVENT_DEFAULT));
    uint64_t t0 = now_ns(), in_launch = 0;
    CHECK(api.cuEventRecord(e0, s));
    for (long i = 0; i < count; i++) {
        uint64_t t = now_ns();
        CUresult rc = exec != NULL ? api.cuGraphLaunch(exec, s) : launch_one(f, s, params, how);
        in_launch += now_ns() - t;
        if (rc != CUDA_SUCCESS)
            fail(exec != NULL ? "cuGraphLaunch" : "launch", rc);
    }
    CHECK(api.cuEventRecord(e1, s));
    CHECK(api.cuStreamSynchronize(s));
    uint64_t wall = now_ns() - t0;
    float ms = 0;
    CHECK(api.cuEventElapsedTime(&ms, e0, e1));
    printf("{\"launches\":%ld,\"how\":\"%s\",\"stream\":%s,\"kernel_ns\":%llu,\"wall_ns\":%llu,"
           "\"event_ms\":%.3f,\"launch_ns_total\":%llu,\"pid\":%d}\n",
           count, how, own_stream ? "true" : "false", (unsigned long long)ns,
           (unsigned long long)wall, ms, (unsigned long long)in_launch, (int)getpid());
    if (exec != NULL) {
        CHECK(api.cuGraphExecDestroy(exec));
        CHECK(api.cuGraphDestroy(g));
    }
    CHECK(api.cuEventDestroy_v2(e0));
    CHECK(api.cuEventDestroy_v2(e1));
    if (s != NULL)
        CHECK(api.cuStreamDestroy_v2(s));
    CHECK(api.cuModuleUnload(m));
    return 0;
}

/* e0, kernel, e1, kernel, e2 on one stream: queries before and after completion. */
static int cmd_events(uint64_t ns)
{
    CUmodule m;
    CUfunction f = spin_function(&m);
    CUevent e[3];
    void *params[] = {&ns};
    for (int i = 0; i < 3; i++)
        CHECK(api.cuEventCreate(&e[i], CU_EVENT_DEFAULT));
    CHECK(api.cuEventRecord(e[0], NULL));
    CHECK(api.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    CHECK(api.cuEventRecord(e[1], NULL));
    CHECK(api.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    CHECK(api.cuEventRecord(e[2], NULL));
    float early = -1, ms01 = -1, ms12 = -1, ms02 = -1;
    CUresult query_before = api.cuEventQuery(e[2]);
    CUresult elapsed_before = api.cuEventElapsedTime(&early, e[0], e[2]);
    CHECK(api.cuEventSynchronize(e[2]));
    CUresult query_after = api.cuEventQuery(e[2]);
    CHECK(api.cuEventElapsedTime(&ms01, e[0], e[1]));
    CHECK(api.cuEventElapsedTime(&ms12, e[1], e[2]));
    CHECK(api.cuEventElapsedTime(&ms02, e[0], e[2]));
    printf("{\"kernel_ns\":%llu,\"query_before\":%d,\"elapsed_before\":%d,\"query_after\":%d,"
           "\"ms01\":%.3f,\"ms12\":%.3f,\"ms02\":%.3f}\n",
           (unsigned long long)ns, query_before, elapsed_before, query_after, ms01, ms12, ms02);
    for (int i = 0; i < 3; i++)
        CHECK(api.cuEventDestroy_v2(e[i]));
    CHECK(api.cuModuleUnload(m));
    return 0;
}

static int cmd_info(void)
{
    int version = 0, count = 0;
    CHECK(api.cuDriverGetVersion(&version));
    CHECK(api.cuDeviceGetCount(&count));
    printf("{\"driver_version\":%d,\"count\":%d,\"devices\":[", version, count);
    for (int i = 0; i < count; i++) {
        CUdevice d;
        CUuuid uuid;
        char name[256], text[33];
        size_t total;
        CHECK(api.cuDeviceGet(&d, i));
        CHECK(api.cuDeviceGetName(name, sizeof name, d));
        CHECK(api.cuDeviceGetUuid_v2(&uuid, d));
        CHECK(api.cuDeviceTotalMem_v2(&total, d));
        hex(uuid.bytes, sizeof uuid.bytes, text);
        printf("%s{\"ordinal\":%d,\"name\":\"%s\",\"uuid_hex\":\"%s\",\"total\":%zu}",
               i ? "," : "", i, name, text, total);
    }
    printf("]}\n");
    return 0;
}

struct expect {
    const char *name;
    int version;
    int flags;
    const char *symbol; /* what dlsym must give for the same function */
};

static const struct expect expected[] = {
    {"cuInit", 12040, 0, "cuInit"},
    {"cuMemAlloc", 12040, 0, "cuMemAlloc_v2"},
    {"cuMemFree", 12040, 0, "cuMemFree_v2"},
    {"cuMemGetInfo", 12040, 0, "cuMemGetInfo_v2"},
    {"cuMemAllocPitch", 12040, 0, "cuMemAllocPitch_v2"},
    {"cuMemAllocManaged", 12040, 0, "cuMemAllocManaged"},
    {"cuMemCreate", 12040, 0, "cuMemCreate"},
    {"cuMemAllocAsync", 12040, 0, "cuMemAllocAsync"},
    {"cuMemAllocAsync", 12040, 2, "cuMemAllocAsync_ptsz"},
    {"cuMemAllocFromPoolAsync", 12040, 2, "cuMemAllocFromPoolAsync_ptsz"},
    {"cuMemFreeAsync", 12040, 2, "cuMemFreeAsync_ptsz"},
    {"cuArrayCreate", 12040, 0, "cuArrayCreate_v2"},
    {"cuArray3DCreate", 12040, 0, "cuArray3DCreate_v2"},
    {"cuMipmappedArrayCreate", 12040, 0, "cuMipmappedArrayCreate"},
    {"cuGraphAddMemAllocNode", 12040, 0, "cuGraphAddMemAllocNode"},
    {"cuGraphAddKernelNode", 12040, 0, "cuGraphAddKernelNode_v2"},
    {"cuGraphAddKernelNode", 11080, 0, "cuGraphAddKernelNode"},
    {"cuGraphLaunch", 12040, 0, "cuGraphLaunch"},
    {"cuGraphLaunch", 12040, 2, "cuGraphLaunch_ptsz"},
    {"cuIpcOpenMemHandle", 12040, 0, "cuIpcOpenMemHandle_v2"},
    {"cuLaunchKernel", 12040, 0, "cuLaunchKernel"},
    {"cuLaunchKernel", 12040, 1, "cuLaunchKernel"},
    {"cuLaunchKernel", 12040, 2, "cuLaunchKernel_ptsz"},
    {"cuLaunchKernelEx", 12040, 2, "cuLaunchKernelEx_ptsz"},
    {"cuLaunchCooperativeKernel", 12040, 2, "cuLaunchCooperativeKernel_ptsz"},
    {"cuMemcpyHtoDAsync", 12040, 2, "cuMemcpyHtoDAsync_v2_ptsz"},
    {"cuMemsetD32Async", 12040, 0, "cuMemsetD32Async"},
    {"cuEventRecord", 12040, 2, "cuEventRecord_ptsz"},
    {"cuStreamSynchronize", 12040, 2, "cuStreamSynchronize_ptsz"},
    {"cuGetProcAddress", 12040, 0, "cuGetProcAddress_v2"},
    {"cuGetProcAddress", 11080, 0, "cuGetProcAddress"},
    {"cuDeviceGetUuid", 12040, 0, "cuDeviceGetUuid_v2"},
    {"cuDevicePrimaryCtxRelease", 12040, 0, "cuDevicePrimaryCtxRelease_v2"},
};

static int cmd_procaddr(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        printf("{\"call\":\"dlopen\",\"error\":\"%s\"}\n", dlerror());
        return 2;
    }
    __typeof__(&cuGetProcAddress_v2) gpa2 =
        (__typeof__(&cuGetProcAddress_v2))dlsym(lib, "cuGetProcAddress_v2");
    __typeof__(&cuGetProcAddress) gpa1 =
        (__typeof__(&cuGetProcAddress))dlsym(lib, "cuGetProcAddress");
    if (gpa2 == NULL || gpa1 == NULL) {
        printf("{\"call\":\"dlsym\",\"error\":\"cuGetProcAddress or _v2 missing\"}\n");
        return 2;
    }
    size_t n = sizeof expected / sizeof expected[0], ok = 0, bad = 0;
    printf("{\"checked\":%zu,\"mismatches\":[", n);
    for (size_t i = 0; i < n; i++) {
        const struct expect *e = &expected[i];
        void *p = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        CUresult rc = gpa2(e->name, &p, e->version, (cuuint64_t)e->flags, &st);
        void *want = dlsym(lib, e->symbol);
        if (rc == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_SUCCESS && p != NULL && p == want) {
            ok++;
        } else {
            printf("%s\"%s@%d/%d->%s\"", bad++ ? "," : "", e->name, e->version, e->flags,
                   e->symbol);
        }
    }
    void *p = NULL, *v1 = NULL;
    CUdriverProcAddressQueryResult st_unknown, st_old;
    CUresult unknown = gpa2("cuNoSuchFunction", &p, 12040, 0, &st_unknown);
    CUresult old = gpa2("cuLaunchKernelEx", &p, 11000, 0, &st_old);
    CUresult v1rc = gpa1("cuMemAlloc", &v1, 11080, 0);
    printf("],\"ok\":%zu,\"unknown_result\":%d,\"unknown_status\":%d,\"old_result\":%d,"
           "\"old_status\":%d,\"v1_result\":%d,\"v1_same\":%s}\n",
           ok, unknown, (int)st_unknown, old, (int)st_old, v1rc,
           v1 != NULL && v1 == dlsym(lib, "cuMemAlloc_v2") ? "true" : "false");
    return 0;
}

static unsigned long long number(const char *what, const char *text)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-') {
        fprintf(stderr, "fgpu-cudemo: %s '%s' is not a non-negative integer\n", what, text);
        exit(64);
    }
    return v;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: fgpu-cudemo [--dlopen] [--ptsz] [--device N] [--ready] COMMAND\n"
            "  info | meminfo | procaddr\n"
            "  alloc API BYTES | alloc-until-oom API CHUNK | hold BYTES [API]\n"
            "  threads N API BYTES | spin NS COUNT [--graph|--ex|--coop] [--stream]\n"
            "  events NS | ipc-open HEX | bench-launch COUNT | bench-alloc COUNT BYTES\n"
            "  bench-batch COUNT SIZE | bursts NS COUNT BURSTS IDLE_US\n"
            "  ctx-bursts NS COUNT ROUNDS IDLE_US\n"
            "API: mem pitch managed vmm async pool array array3d mipmap graph ipc module\n");
    return 64;
}

int main(int argc, char **argv)
{
    int i = 1, ready = 0;
    self_path = argv[0];
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--dlopen") == 0)
            dlopen_mode = 1;
        else if (strcmp(argv[i], "--ptsz") == 0)
            ptsz_mode = 1;
        else if (strcmp(argv[i], "--ready") == 0)
            ready = 1;
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device_ordinal = (int)number("--device", argv[++i]);
        else
            return usage();
    }
    if (i >= argc)
        return usage();
    const char *cmd = argv[i++];
    int left = argc - i;
    char **a = argv + i;
    if (strcmp(cmd, "procaddr") == 0)
        return cmd_procaddr();
    setup();
    if (ready) { /* tests start several processes together: "go" is a line on stdin */
        char line[64];
        printf("{\"ready\":%d}\n", (int)getpid());
        fflush(stdout);
        if (fgets(line, sizeof line, stdin) == NULL)
            return 0;
    }
    if (strcmp(cmd, "info") == 0)
        return cmd_info();
    if (strcmp(cmd, "meminfo") == 0) {
        size_t f, t;
        meminfo(&f, &t);
        printf("{\"free\":%zu,\"total\":%zu}\n", f, t);
        return 0;
    }
    if (strcmp(cmd, "alloc") == 0 && left == 2)
        return cmd_alloc(a[0], number("BYTES", a[1]));
    if (strcmp(cmd, "alloc-until-oom") == 0 && left == 2)
        return cmd_until_oom(a[0], number("CHUNK", a[1]));
    if (strcmp(cmd, "hold") == 0 && (left == 1 || left == 2))
        return cmd_hold(number("BYTES", a[0]), left == 2 ? a[1] : "mem");
    if (strcmp(cmd, "threads") == 0 && left == 3)
        return cmd_threads((int)number("N", a[0]), a[1], number("BYTES", a[2]));
    if (strcmp(cmd, "bench-launch") == 0 && left == 1)
        return cmd_bench_launch((long)number("COUNT", a[0]));
    if (strcmp(cmd, "bench-alloc") == 0 && left == 2)
        return cmd_bench_alloc((long)number("COUNT", a[0]), number("BYTES", a[1]));
    if (strcmp(cmd, "bench-batch") == 0 && left == 2)
        return cmd_bench_batch((long)number("COUNT", a[0]), (long)number("SIZE", a[1]));
    if (strcmp(cmd, "bursts") == 0 && left == 4)
        return cmd_bursts(number("NS", a[0]), (long)number("COUNT", a[1]),
                          (long)number("BURSTS", a[2]), (long)number("IDLE_US", a[3]));
    if (strcmp(cmd, "ctx-bursts") == 0 && left == 4)
        return cmd_ctx_bursts(number("NS", a[0]), (long)number("COUNT", a[1]),
                              (long)number("ROUNDS", a[2]), (long)number("IDLE_US", a[3]));
    if (strcmp(cmd, "events") == 0 && left == 1)
        return cmd_events(number("NS", a[0]));
    if (strcmp(cmd, "ipc-open") == 0 && left == 1)
        return cmd_ipc_open(a[0]);
    if (strcmp(cmd, "spin") == 0 && left >= 2) {
        const char *how = "kernel";
        int own_stream = 0;
        for (int k = 2; k < left; k++) {
            if (strcmp(a[k], "--graph") == 0 || strcmp(a[k], "--ex") == 0 ||
                strcmp(a[k], "--coop") == 0)
                how = a[k] + 2;
            else if (strcmp(a[k], "--stream") == 0)
                own_stream = 1;
            else
                return usage();
        }
        return cmd_spin(number("NS", a[0]), (long)number("COUNT", a[1]), how, own_stream);
    }
    return usage();
}
