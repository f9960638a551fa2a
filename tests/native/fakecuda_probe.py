"""Reads the fake driver's state through ctypes, in a process of its own (the fake libraries
keep the first state file they open for the life of a process). Not a test module.

    python fakecuda_probe.py devtime UUID PID      -> {"result": r, "ns": n}
    python fakecuda_probe.py nvml-procs UUID       -> {"procs": [[pid, bytes], ...]}
    python fakecuda_probe.py nvml-util UUID SINCE_US -> {"gpu": %, "procs": [[pid, sm%, ts]]}
    python fakecuda_probe.py nvml-memory UUID      -> {"total": b, "used": b, "free": b}
    python fakecuda_probe.py nvml-init             -> {"result": r}
"""

from __future__ import annotations

import ctypes
import json
import sys


class Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class ProcessInfo(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class UtilSample(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def nvml_device(nvml: ctypes.CDLL, uuid: str) -> ctypes.c_void_p:
    rc = nvml.nvmlInit_v2()
    if rc != 0:
        raise SystemExit(f"nvmlInit_v2: {rc}")
    handle = ctypes.c_void_p()
    rc = nvml.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle))
    if rc != 0:
        raise SystemExit(f"nvmlDeviceGetHandleByUUID: {rc}")
    return handle


def main(argv: list[str]) -> dict[str, object]:
    cmd = argv[0]
    if cmd == "devtime":
        cuda = ctypes.CDLL("libcuda.so.1")
        ns = ctypes.c_ulonglong(0)
        rc = cuda.fgpuFakeDeviceTime(argv[1].encode(), int(argv[2]), ctypes.byref(ns))
        return {"result": rc, "ns": ns.value}
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    if cmd == "nvml-init":
        return {"result": nvml.nvmlInit_v2()}
    dev = nvml_device(nvml, argv[1])
    if cmd == "nvml-memory":
        mem = Memory()
        rc = nvml.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(mem))
        return {"result": rc, "total": mem.total, "used": mem.used, "free": mem.free}
    if cmd == "nvml-procs":
        count = ctypes.c_uint(0)
        first = nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(count), None)
        infos = (ProcessInfo * (count.value + 4))()
        count.value += 4
        rc = nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(count), infos)
        procs = [[infos[i].pid, infos[i].usedGpuMemory] for i in range(count.value)]
        return {"first": first, "result": rc, "procs": procs}
    if cmd == "nvml-util":
        util = Utilization()
        rc_dev = nvml.nvmlDeviceGetUtilizationRates(dev, ctypes.byref(util))
        count = ctypes.c_uint(0)
        since = ctypes.c_ulonglong(int(argv[2]))
        first = nvml.nvmlDeviceGetProcessUtilization(dev, None, ctypes.byref(count), since)
        samples = (UtilSample * max(count.value, 1))()
        rc = nvml.nvmlDeviceGetProcessUtilization(dev, samples, ctypes.byref(count), since)
        procs = [[s.pid, s.smUtil, s.timeStamp] for s in samples[: count.value]] if rc == 0 else []
        return {"gpu_result": rc_dev, "gpu": util.gpu, "first": first, "result": rc, "procs": procs}
    raise SystemExit(f"unknown probe command {cmd!r}")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
