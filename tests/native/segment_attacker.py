"""A workload that tries to lift its own limits (issue 27), run as the workload's user by
``test_segment_bypass.py`` (a script, not collected). Prints one JSON line on stdout.

Modes (``python segment_attacker.py MODE ARGS``; ``FGPU_SEG`` names the segment):
  rewrite           every file of the segment that opens for writing is overwritten with
                    zeros through a shared mapping (gate 0 = open, heartbeat 0 = stale,
                    memory limits 0 = no cap, reservations 0); then the control part is
                    mapped read-only and made writable with mprotect, and chmod'ed. Says
                    what each attempt got: "zeroed" or the errno's name.
  burst CAP BYTES   a CUDA program: allocates BYTES, zeroes the segment's reservations
                    (``rewrite``), allocates BYTES again (over CAP if 2 * BYTES > CAP), prints
                    {"first": rc, "second": rc}, then holds the memory until killed.
  context           a CUDA program that opens a context and nothing more, then waits.
  spikes CHUNK COUNT HOLD PERIOD
                    a CUDA program: COUNT allocations of CHUNK bytes, each after zeroing the
                    segment's reservations, held HOLD seconds, then freed; again every
                    PERIOD seconds, for ever. Prints {"spike": rc, "held": bytes, "ns": ...}
                    after the first.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import sys
import time

PROT_READ, PROT_WRITE, MAP_SHARED = 1, 2, 1


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def rewrite() -> dict[str, str]:
    seg = os.environ["FGPU_SEG"]
    ctl = seg + ".ctl"
    out: dict[str, str] = {}
    for name, path in (("workload_part", seg), ("control_part", ctl)):
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            out[name] = _errno_name(exc)
            continue
        try:
            size = os.fstat(fd).st_size
            with mmap.mmap(fd, size, mmap.MAP_SHARED, PROT_READ | PROT_WRITE) as m:
                m[:] = bytes(size)
            out[name] = "zeroed"
        finally:
            os.close(fd)
    # a read-only mapping of the control part, made writable
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    try:
        fd = os.open(ctl, os.O_RDONLY)
    except OSError as exc:
        out["mprotect"] = _errno_name(exc)
    else:
        size = os.fstat(fd).st_size
        addr = libc.mmap(None, size, PROT_READ, MAP_SHARED, fd, 0)
        os.close(fd)
        if addr in (None, ctypes.c_void_p(-1).value):
            out["mprotect"] = "map failed: " + errno.errorcode.get(ctypes.get_errno(), "?")
        elif libc.mprotect(addr, size, PROT_READ | PROT_WRITE) != 0:
            out["mprotect"] = errno.errorcode.get(ctypes.get_errno(), "?")
        else:
            ctypes.memset(addr, 0, size)
            out["mprotect"] = "zeroed"
    try:
        os.chmod(ctl, 0o666)
        out["chmod"] = "done"
    except OSError as exc:
        out["chmod"] = _errno_name(exc)
    return out


def _cuda() -> ctypes.CDLL:
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    for rc in (
        cu.cuInit(0),
        cu.cuDeviceGet(ctypes.byref(dev), 0),
        cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
        cu.cuCtxSetCurrent(ctx),
    ):
        if rc != 0:
            print(json.dumps({"init": rc}), flush=True)
            sys.exit(3)
    return cu


def burst(nbytes: int) -> None:
    cu = _cuda()
    first, second = ctypes.c_uint64(), ctypes.c_uint64()
    rc1 = cu.cuMemAlloc_v2(ctypes.byref(first), nbytes)
    attempts = rewrite()
    rc2 = cu.cuMemAlloc_v2(ctypes.byref(second), nbytes)
    print(json.dumps({"first": rc1, "second": rc2, "rewrite": attempts}), flush=True)
    while True:
        time.sleep(3600)


def context() -> None:
    _cuda()
    print(json.dumps({"context": 0}), flush=True)
    while True:
        time.sleep(3600)


def spikes(chunk: int, count: int, hold_s: float, period_s: float) -> None:
    cu = _cuda()
    said = False
    while True:
        ptrs, rc = [], 0
        start = time.monotonic_ns()
        for _ in range(count):
            rewrite()  # its reservations back to 0: the cap lets the next chunk through
            ptr = ctypes.c_uint64()
            rc = cu.cuMemAlloc_v2(ctypes.byref(ptr), chunk)
            if rc != 0:
                break
            ptrs.append(ptr.value)
        time.sleep(hold_s)
        for p in ptrs:
            cu.cuMemFree_v2(p)
        held = time.monotonic_ns() - start
        if not said:
            print(json.dumps({"spike": rc, "held": len(ptrs) * chunk, "ns": held}), flush=True)
            said = True
        time.sleep(period_s)


def main() -> None:
    mode = sys.argv[1]
    if mode == "rewrite":
        print(json.dumps(rewrite()), flush=True)
    elif mode == "burst":
        burst(int(sys.argv[3]))
    elif mode == "context":
        context()
    elif mode == "spikes":
        spikes(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
