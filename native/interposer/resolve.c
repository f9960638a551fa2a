/*
 * resolve.c - where the real functions are, and the dlopen interposer's decision.
 *
 * Owns: loading the real driver (FGPU_REAL_LIBCUDA, default "libcuda.so.1": the library the
 * dynamic linker would load, through LD_LIBRARY_PATH and the ld.so cache) and the real NVML,
 * filling fgpu_real with dlsym on *their* handles (a handle's scope holds the library and its
 * dependencies, never the preloaded libfgpu.so, so a real pointer can never be our hook);
 * finding the real dlopen (dlsym(RTLD_NEXT), lazily, once); and fgpu_dlopen_route, which the
 * exported dlopen (dlopen_<arch>.S) calls before it jumps to the real dlopen.
 *
 * Why a dlopen interposer and not a dlsym override: a program that dlopens the driver
 * (the CUDA runtime, frameworks) asks the handle for cuGetProcAddress and friends. We hand it
 * the handle of a tiny shim, libfgpu-dlcuda.so, whose DT_NEEDED are libfgpu.so and then
 * libcuda.so.1: dlsym on that handle searches shim -> libfgpu.so -> the real driver, so hooked
 * names resolve to our hooks and every other name to the driver, with glibc's own dlsym.
 * Overriding dlsym (HAMi-core) puts our code under every symbol lookup of the process and
 * deadlocks or breaks unrelated programs; this way dlsym is never touched.
 *
 * Why the exported dlopen is assembly: glibc resolves a relative name (RUNPATH, $ORIGIN) from
 * the *caller's* object, found by dlopen's return address. A C wrapper that calls the real
 * dlopen would make every relative dlopen look like it came from libfgpu.so. The assembly
 * entry saves the arguments, asks fgpu_dlopen_route which name to open, restores and jumps
 * (no call) to the real dlopen, so the return address is still the original caller's.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fgpu.h"

struct fgpu_real fgpu_real;

void *(*fgpu_real_dlopen)(const char *, int);

static pthread_once_t dlopen_once = PTHREAD_ONCE_INIT;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int cuda_ok;
static int nvml_ok;
/* Set while this thread is inside the real dlopen of the driver or NVML (load_cuda,
 * load_nvml): a driver that dlopens itself (or any libcuda.so.1 path) from its constructors
 * must get the real dlopen and must not wait on the pthread_once it runs under (a deadlock
 * before); a hook it calls meanwhile answers "not initialised". */
static _Thread_local int loading_driver;
static char shim_cuda[600];
static char shim_nvml[600];

static void *dlopen_unavailable(const char *file, int mode)
{
    (void)file;
    (void)mode;
    return NULL;
}

static void find_real_dlopen(void)
{
    void *p = dlsym(RTLD_NEXT, "dlopen");
    if (p == NULL) {
        fgpu_log(FGPU_LOG_ERROR, "the next dlopen after libfgpu.so was not found: %s",
                 dlerror());
        p = (void *)&dlopen_unavailable;
    }
    fgpu_real_dlopen = (void *(*)(const char *, int))p;
}

void *fgpu_call_real_dlopen(const char *file, int mode)
{
    pthread_once(&dlopen_once, find_real_dlopen);
    return fgpu_real_dlopen(file, mode);
}

/* dlsym that refuses to hand back one of our own exports (never loop into ourselves) */
static void *real_sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    Dl_info info;
    if (p != NULL && dladdr(p, &info) != 0 && info.dli_fbase != NULL) {
        Dl_info self;
        if (dladdr((void *)&real_sym, &self) != 0 && self.dli_fbase == info.dli_fbase)
            return NULL;
    }
    return p;
}

static void load_cuda(void)
{
    fgpu_init();
    loading_driver = 1;
    void *h = fgpu_call_real_dlopen(fgpu_g.real_libcuda, RTLD_NOW | RTLD_LOCAL);
    loading_driver = 0;
    if (h == NULL) {
        fgpu_log(FGPU_LOG_WARN, "cannot load the CUDA driver %s: %s", fgpu_g.real_libcuda,
                 dlerror());
        return;
    }
#define FGPU_HOOK(name) fgpu_real.name = (__typeof__(fgpu_real.name))real_sym(h, #name);
#define FGPU_HELPER(name) FGPU_HOOK(name)
#include "hooks.h"
    cuda_ok = 1;
}

static void load_nvml(void)
{
    fgpu_init();
    loading_driver = 1;
    void *h = fgpu_call_real_dlopen(fgpu_g.real_libnvml, RTLD_NOW | RTLD_LOCAL);
    loading_driver = 0;
    if (h == NULL) {
        fgpu_log(FGPU_LOG_WARN, "cannot load NVML %s: %s", fgpu_g.real_libnvml, dlerror());
        return;
    }
#define FGPU_NVML_HOOK(name) fgpu_real.name = (__typeof__(fgpu_real.name))real_sym(h, #name);
#define FGPU_NVML_HELPER(name) FGPU_NVML_HOOK(name)
#include "hooks.h"
    nvml_ok = 1;
}

int fgpu_resolve_cuda(void)
{
    if (loading_driver)
        return -1;
    pthread_once(&cuda_once, load_cuda);
    return cuda_ok ? 0 : -1;
}

int fgpu_resolve_nvml(void)
{
    if (loading_driver)
        return -1;
    pthread_once(&nvml_once, load_nvml);
    return nvml_ok ? 0 : -1;
}

static int base_is(const char *file, const char *a, const char *b)
{
    const char *slash = strrchr(file, '/');
    const char *base = slash != NULL ? slash + 1 : file;
    return strcmp(base, a) == 0 || strcmp(base, b) == 0;
}

static const char *shim_for(char *buf, size_t n, const char *name)
{
    if (buf[0] == '\0')
        snprintf(buf, n, "%s/%s", fgpu_g.self_dir, name);
    struct stat st;
    if (stat(buf, &st) != 0) {
        fgpu_log(FGPU_LOG_WARN, "%s is missing: the driver opened by dlopen is not hooked", buf);
        return NULL;
    }
    return buf;
}

/* Called by the exported dlopen: the name the real dlopen should open. Only the driver's
 * names are changed (to the shim), and only when the interposer is active. */
FGPU_HIDDEN const char *fgpu_dlopen_route(const char *file, int mode);
const char *fgpu_dlopen_route(const char *file, int mode)
{
    pthread_once(&dlopen_once, find_real_dlopen);
    if (file == NULL || loading_driver)
        return file; /* loading the driver: what it opens itself is its own business */
    int cuda = base_is(file, "libcuda.so.1", "libcuda.so");
    int nvml = !cuda && base_is(file, "libnvidia-ml.so.1", "libnvidia-ml.so");
    if (!cuda && !nvml) {
        fgpu_init_env();
        if (file[0] == '/' && strcmp(file, fgpu_g.real_libcuda) == 0)
            cuda = 1;
        else if (file[0] == '/' && strcmp(file, fgpu_g.real_libnvml) == 0)
            nvml = 1;
        else
            return file; /* every other library: untouched */
    }
    fgpu_init();
    if (!fgpu_g.active)
        return file;
    if (mode & RTLD_NOLOAD) {
        /* "is it loaded?": answer with the shim only if the driver is loaded, as the
         * driver's own handle would; the shim is loaded here so that the caller's NOLOAD
         * open of it succeeds */
        void *loaded = fgpu_call_real_dlopen(file, RTLD_LAZY | RTLD_NOLOAD);
        if (loaded == NULL)
            return file;
        const char *s = cuda ? shim_for(shim_cuda, sizeof shim_cuda, "libfgpu-dlcuda.so")
                             : shim_for(shim_nvml, sizeof shim_nvml, "libfgpu-dlnvml.so");
        if (s == NULL || (cuda ? fgpu_resolve_cuda() : fgpu_resolve_nvml()) != 0 ||
            fgpu_call_real_dlopen(s, RTLD_LAZY | (mode & RTLD_GLOBAL)) == NULL)
            return file;
        return s;
    }
    /* load the real library first (same name rules as its DT_NEEDED in the shim), so the
     * shim's dependency matches it by soname; if it cannot be loaded from here, let the
     * caller's own dlopen try (and fail or succeed) exactly as it would have */
    if (cuda) {
        if (fgpu_resolve_cuda() != 0)
            return file;
        const char *s = shim_for(shim_cuda, sizeof shim_cuda, "libfgpu-dlcuda.so");
        return s != NULL ? s : file;
    }
    if (fgpu_resolve_nvml() != 0)
        return file;
    const char *s = shim_for(shim_nvml, sizeof shim_nvml, "libfgpu-dlnvml.so");
    return s != NULL ? s : file;
}
