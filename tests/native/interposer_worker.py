"""A CUDA program in Python for the interposer tests (run as a script, not collected).

It reaches the driver the way the CUDA runtime does: ``dlopen("libcuda.so.1")`` (ctypes),
then, with ``--procaddr``, every entry point through ``cuGetProcAddress_v2``. Under
``LD_PRELOAD=libfgpu.so`` that dlopen is answered with the interposer's shim. Results are
printed as one JSON line on stdout; a failing driver call exits with status 3 and says which.

Modes (``python interposer_worker.py [--procaddr] MODE ARGS``):
  race ROUNDS BYTES NPROC   NPROC forked processes allocate BYTES at once, ROUNDS times,
                            synchronised by a barrier; prints successes per round
  hold BYTES                allocate, print {"ready": ...}, sleep until killed
  threads N ITERS BYTES     N threads allocate and free ITERS times each
  fork BYTES                allocate, fork two children (one _exit, one normal exit), free
  exec BYTES NEXT           allocate BYTES, exec itself into "alloc NEXT"
  alloc BYTES               allocate, print the result and the segment snapshot, exit
  ctxdestroy BYTES          allocate in a new context, destroy the context without freeing
  exec-quiet BYTES          allocate BYTES, exec itself into "snapshot" (no CUDA call after)
  snapshot                  print the segment snapshot (no CUDA call)
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
import os
import sys
import threading
import time

CUDA_ERROR_OUT_OF_MEMORY = 2
PROCADDR = "--procaddr" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--procaddr"]

cu = ctypes.CDLL("libcuda.so.1")
u64 = ctypes.c_uint64

_PROTOS = {
    "cuInit": ("cuInit", [ctypes.c_uint]),
    "cuDeviceGet": ("cuDeviceGet", [ctypes.POINTER(ctypes.c_int), ctypes.c_int]),
    "cuDevicePrimaryCtxRetain": (
        "cuDevicePrimaryCtxRetain",
        [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int],
    ),
    "cuCtxSetCurrent": ("cuCtxSetCurrent", [ctypes.c_void_p]),
    "cuCtxCreate_v2": (
        "cuCtxCreate",
        [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int],
    ),
    "cuCtxDestroy_v2": ("cuCtxDestroy", [ctypes.c_void_p]),
    "cuMemAlloc_v2": ("cuMemAlloc", [ctypes.POINTER(u64), ctypes.c_size_t]),
    "cuMemFree_v2": ("cuMemFree", [u64]),
}


# the cudaVersion each name is asked at: cuCtxCreate's (pctx, flags, dev) prototype is the
# one a driver answers at 3020..11030 (at 11040 it is cuCtxCreate_v3, at 12050 _v4)
_VERSIONS = {"cuCtxCreate_v2": 3020}


def _fn(name: str):
    base, argtypes = _PROTOS[name]
    if not PROCADDR:
        f = getattr(cu, name)
    else:
        ptr = ctypes.c_void_p()
        status = ctypes.c_int()
        gpa = cu.cuGetProcAddress_v2
        gpa.argtypes = [
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            u64,
            ctypes.POINTER(ctypes.c_int),
        ]
        version = _VERSIONS.get(name, 12040)
        rc = gpa(base.encode(), ctypes.byref(ptr), version, 0, ctypes.byref(status))
        if rc != 0 or not ptr.value:
            print(f"cuGetProcAddress_v2({base}) = {rc}", file=sys.stderr)
            sys.exit(3)
        f = ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(ptr.value)
    f.argtypes = argtypes
    f.restype = ctypes.c_int
    return f


def check(rc: int, what: str) -> None:
    if rc != 0:
        print(f"{what} = {rc}", file=sys.stderr)
        sys.exit(3)


def init() -> ctypes.c_void_p:
    check(_fn("cuInit")(0), "cuInit")
    dev = ctypes.c_int()
    check(_fn("cuDeviceGet")(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(_fn("cuDevicePrimaryCtxRetain")(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(_fn("cuCtxSetCurrent")(ctx), "cuCtxSetCurrent")
    return ctx


def alloc(nbytes: int) -> tuple[int, int]:
    ptr = u64()
    rc = _fn("cuMemAlloc_v2")(ctypes.byref(ptr), nbytes)
    return rc, ptr.value


def free(ptr: int) -> None:
    check(_fn("cuMemFree_v2")(ptr), "cuMemFree_v2")


def snapshot() -> dict[str, int]:
    """The segment as the agent library reads it (FGPU_TEST_NATIVE names the folder)."""
    native = os.environ["FGPU_TEST_NATIVE"]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pathlib import Path

    from interposer_support import AgentLib

    agent = AgentLib(Path(native))
    agent.open(Path(os.environ["FGPU_SEG"]))
    snap = agent.snapshot()
    out = {
        "reserved": int(snap.gpus[0].memory_reserved),
        "peak": int(snap.gpus[0].memory_peak),
        "oom_count": int(snap.gpus[0].oom_count),
        "live": int(snap.live_processes),
    }
    agent.close()
    return out


def _racer(rounds: int, nbytes: int, barrier, results, me: int, nproc: int) -> None:
    init()
    for r in range(rounds):
        barrier.wait()
        rc, ptr = alloc(nbytes)
        results[r * nproc + me] = 1 if rc == 0 else (0 if rc == CUDA_ERROR_OUT_OF_MEMORY else -rc)
        barrier.wait()  # everyone has tried: now give back
        if rc == 0:
            free(ptr)
    os._exit(0)


def race(rounds: int, nbytes: int, nproc: int) -> None:
    ctx = mp.get_context("fork")  # before any CUDA call in this process
    barrier = ctx.Barrier(nproc)
    results = ctx.Array("i", rounds * nproc, lock=False)
    procs = [
        ctx.Process(target=_racer, args=(rounds, nbytes, barrier, results, i, nproc))
        for i in range(nproc)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    rows = [list(results[r * nproc : (r + 1) * nproc]) for r in range(rounds)]
    print(json.dumps({"rounds": rows, "exit": [p.exitcode for p in procs]}))


def hold(nbytes: int) -> None:
    init()
    rc, _ = alloc(nbytes)
    print(json.dumps({"ready": rc}), flush=True)
    while True:
        time.sleep(3600)


def threads(n: int, iters: int, nbytes: int) -> None:
    ctx = init()
    errors: list[int] = []

    def run() -> None:
        check(_fn("cuCtxSetCurrent")(ctx), "cuCtxSetCurrent")
        for _ in range(iters):
            rc, ptr = alloc(nbytes)
            if rc == 0:
                free(ptr)
            elif rc != CUDA_ERROR_OUT_OF_MEMORY:
                errors.append(rc)

    ts = [threading.Thread(target=run) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(json.dumps({"errors": errors, **snapshot()}))


def fork(nbytes: int) -> None:
    init()
    rc, ptr = alloc(nbytes)
    check(rc, "cuMemAlloc_v2")
    before = snapshot()
    for how in ("_exit", "exit"):
        pid = os.fork()
        if pid == 0:
            if how == "_exit":
                os._exit(0)
            sys.exit(0)  # destructors run: must not give back the parent's memory
        os.waitpid(pid, 0)
    after_children = snapshot()
    free(ptr)
    print(json.dumps({"before": before, "after_children": after_children, "end": snapshot()}))


def do_exec(nbytes: int, next_bytes: int) -> None:
    init()
    check(alloc(nbytes)[0], "cuMemAlloc_v2")
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "alloc", str(next_bytes)])


def exec_quiet(nbytes: int) -> None:
    init()
    check(alloc(nbytes)[0], "cuMemAlloc_v2")
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "snapshot"])


def alloc_once(nbytes: int) -> None:
    init()
    rc, _ = alloc(nbytes)
    print(json.dumps({"rc": rc, **snapshot()}))


def ctx_destroy(nbytes: int) -> None:
    init()
    dev = ctypes.c_int()
    check(_fn("cuDeviceGet")(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(_fn("cuCtxCreate_v2")(ctypes.byref(ctx), 0, dev), "cuCtxCreate_v2")
    check(alloc(nbytes)[0], "cuMemAlloc_v2")
    held = snapshot()
    check(_fn("cuCtxDestroy_v2")(ctx), "cuCtxDestroy_v2")
    print(json.dumps({"held": held, "after": snapshot()}))


def main() -> None:
    mode, rest = ARGS[0], [int(a) for a in ARGS[1:]]
    if mode == "race":
        race(*rest)
    elif mode == "hold":
        hold(*rest)
    elif mode == "threads":
        threads(*rest)
    elif mode == "fork":
        fork(*rest)
    elif mode == "exec":
        do_exec(*rest)
    elif mode == "alloc":
        alloc_once(*rest)
    elif mode == "ctxdestroy":
        ctx_destroy(*rest)
    elif mode == "exec-quiet":
        exec_quiet(*rest)
    elif mode == "snapshot":
        print(json.dumps(snapshot()))
    else:
        print(
            f"mode {mode!r}: see the modes in this file's docstring",
            file=sys.stderr,
        )
        sys.exit(2)


if __name__ == "__main__":
    main()
