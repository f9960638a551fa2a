/*
 * selfload.c - a test stand-in of a driver that dlopens itself while it loads: built with
 * the fake driver's sources into selfload/libcuda.so.1 (native/build.py). Its constructor
 * opens its own absolute path and then "libcuda.so.1" with dlopen, the way a driver that
 * loads its own components may, and says on stderr what each open gave (the tests read
 * it). Through libfgpu.so's dlopen route this deadlocked before: the route loaded the driver
 * inside a pthread_once and the driver's own dlopen asked the route again, on that once.
 */
#include <dlfcn.h>
#include <stdio.h>

__attribute__((constructor)) static void fk_selfload(void)
{
    Dl_info self;
    const char *path = NULL;
    if (dladdr((void *)&fk_selfload, &self) != 0)
        path = self.dli_fname;
    void *by_path = path != NULL ? dlopen(path, RTLD_NOW) : NULL;
    void *by_name = dlopen("libcuda.so.1", RTLD_NOW);
    fprintf(stderr, "fgpu-selfload: dlopen(%s) %s, dlopen(libcuda.so.1) %s, same %s\n",
            path != NULL ? path : "?", by_path != NULL ? "ok" : "failed",
            by_name != NULL ? "ok" : "failed", by_path == by_name ? "yes" : "no");
}
