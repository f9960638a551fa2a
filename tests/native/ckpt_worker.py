"""A CUDA workload for the checkpoint tests, on whichever ``libcuda.so.1`` the loader finds (the
fake driver in tests). Not a test module.

    python ckpt_worker.py MIB [--steps N | --until FILE] [--step-ms MS]

Allocates MIB MiB with cuMemAlloc_v2 on device 0, writes a pattern over all of it
(cuMemcpyHtoD_v2) and prints ``{"pid": ..., "ready": true}``. Then:

- without ``--steps``: reads commands from stdin, one a line, answering one JSON line each:
  ``launch NS`` (a spin kernel of NS ns, synchronised: ``{"launched": t}`` with the monotonic
  time it returned), ``check`` (reads everything back: ``{"intact": bool}``), ``uuid``
  (cuDeviceGetUuid of its device: ``{"uuid": hex}``), ``meminfo`` (cuMemGetInfo:
  ``{"free": b, "total": b}``), ``exit``.
- with ``--steps N`` (or ``--until FILE``): runs N spin kernels (or kernels until FILE
  exists) of MS ms each, synchronised, printing ``{"step": i}`` after each, then checks the
  pattern and exits 0 when it is intact, 3 when not (a workload for the service tests).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

MIB = 1 << 20


def pattern(nbytes: int) -> bytes:
    """A pattern that differs at every offset of a 4 KiB block and between blocks (each
    block starts with its number)."""
    block = bytes((i * 7 + 13) & 0xFF for i in range(4096))
    count = nbytes // 4096 + 1
    out = bytearray(block * count)
    for n in range(count):
        out[n * 4096 : n * 4096 + 8] = n.to_bytes(8, "little")
    return bytes(out[:nbytes])


class Cuda:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def check(self, name: str, *args: object) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise SystemExit(f"{name}: CUresult {rc}")


def main(argv: list[str]) -> int:
    mib = int(argv[0])
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else None
    until = argv[argv.index("--until") + 1] if "--until" in argv else None
    step_ms = int(argv[argv.index("--step-ms") + 1]) if "--step-ms" in argv else 100
    cuda = Cuda()
    cuda.check("cuInit", 0)
    ctx = ctypes.c_void_p()
    cuda.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), 0)
    cuda.check("cuCtxSetCurrent", ctx)
    module = ctypes.c_void_p()
    cuda.check("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(b"FGPUFAKE bytes=0"))
    spin = ctypes.c_void_p()
    cuda.check("cuModuleGetFunction", ctypes.byref(spin), module, b"spin")
    nbytes = mib * MIB
    dptr = ctypes.c_uint64()
    cuda.check("cuMemAlloc_v2", ctypes.byref(dptr), ctypes.c_size_t(nbytes))
    data = pattern(nbytes)
    cuda.check("cuMemcpyHtoD_v2", dptr, data, ctypes.c_size_t(nbytes))

    def launch(ns: int) -> None:
        dur = ctypes.c_uint64(ns)
        params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(dur), ctypes.c_void_p))
        cuda.check("cuLaunchKernel", spin, 1, 1, 1, 1, 1, 1, 0, None, params, None)
        cuda.check("cuCtxSynchronize")

    def intact() -> bool:
        back = ctypes.create_string_buffer(nbytes)
        cuda.check("cuMemcpyDtoH_v2", back, dptr, ctypes.c_size_t(nbytes))
        return back.raw == data

    def say(obj: dict[str, object]) -> None:
        print(json.dumps(obj), flush=True)

    say({"pid": os.getpid(), "ready": True})
    if steps is not None or until is not None:
        i = 0
        while (steps is None or i < steps) and (until is None or not os.path.exists(until)):
            launch(step_ms * 1_000_000)
            say({"step": i})
            i += 1
        ok = intact()
        say({"intact": ok})
        return 0 if ok else 3
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "launch":
            launch(int(cmd[1]))
            say({"launched": time.monotonic()})
        elif cmd[0] == "check":
            say({"intact": intact()})
        elif cmd[0] == "uuid":
            dev = ctypes.c_int(-1)
            cuda.check("cuCtxGetDevice", ctypes.byref(dev))
            raw = ctypes.create_string_buffer(16)
            cuda.check("cuDeviceGetUuid", raw, dev)
            say({"uuid": raw.raw.hex(), "device": dev.value})
        elif cmd[0] == "meminfo":
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            cuda.check("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
            say({"free": free.value, "total": total.value})
        elif cmd[0] == "exit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
