/*
 * fakecuda.h - the extra entry point of the fake CUDA driver (native/fakecuda, a stand-in
 * for tests): not part of NVIDIA's API. Look it up with dlsym(RTLD_DEFAULT, ...) so a program
 * also runs where the real driver is loaded (the symbol is then absent).
 */
#ifndef FGPU_FAKECUDA_H
#define FGPU_FAKECUDA_H

#include "cuda_api.h"

/* Device time (ns) that kernels, copies and memsets of process `pid` have held the GPU with
 * this uuid (pid 0: all processes), from the machine-wide state. A process that exited keeps
 * its figure until its slot is reused. Errors: CUDA_ERROR_INVALID_VALUE (NULL argument),
 * CUDA_ERROR_NOT_INITIALIZED (no state file), CUDA_ERROR_INVALID_DEVICE (unknown uuid),
 * CUDA_ERROR_NOT_FOUND (no process with that pid). */
CUresult fgpuFakeDeviceTime(const char *uuid, int pid, unsigned long long *ns);
typedef CUresult (*fgpuFakeDeviceTime_t)(const char *uuid, int pid, unsigned long long *ns);

#endif /* FGPU_FAKECUDA_H */
