/*
 * dlshim.c - the body of libfgpu-dlcuda.so and libfgpu-dlnvml.so (empty on purpose).
 *
 * What matters is the link line (native/build.py): DT_NEEDED libfgpu.so first, then the real
 * driver (libcuda.so.1 or libnvidia-ml.so.1), RUNPATH $ORIGIN. A dlopen of the driver is sent
 * here by libfgpu.so's dlopen (resolve.c), and dlsym on the returned handle searches this
 * shim, then libfgpu.so (the hooks), then the real driver (everything else).
 */
typedef int fgpu_dlshim_translation_unit_is_not_empty;
