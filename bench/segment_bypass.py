"""Benchmark: the bypasses of issue 27 (point 4), each tried by a real user's workload on the
fake CUDA driver (``native/fakecuda``, a stand-in for a GPU; no GPU here).

Two workloads of ``fgpu-test-alice`` (created when missing) share one pretend A100-80GB under
the real governor in ``strict`` mode, both holding 1 ms kernels through the interposer: a
neighbour with a share of 700 and an attacker with 300. From another process of the same
user, the attacker then tries, one scenario at a time:

- ``gate``: write 0 (open) into its gate, every 0.2 ms;
- ``heartbeat``: write 1 ns (long stale: the gate then counts as open) into the agent's
  heartbeat, every 0.2 ms;
- ``exec``: its workload uses CUDA through the interposer, then execs a kernel loop without
  ``LD_PRELOAD`` (``env -u LD_PRELOAD -u FGPU_SEG``).
- ``devtime``: write 0 into its own device-time counter (its part of the segment), every
  0.2 ms, to be charged less.
- ``mixed``: its process group runs two kernel loops at once, one through the interposer and
  one started without ``LD_PRELOAD`` (``env -u LD_PRELOAD -u FGPU_SEG``), so the gate holds
  only half of it.

``share`` is the attacker's part of the device time over a window (the fake driver's own
per-process count: the ground truth), target 0.3; ``of_wall`` each side's device time over
the window's length; ``events`` the governor's ``gate-ignored``
events and how long after the attack began the first came.

``memory``: the attacker (cap 8 GiB) lifts its cap (writes 0, "no cap", into its memory
limit where it can) and lowers its reservations (writes 0 into its ``memory_reserved``
before each allocation), then allocates 8 GiB at a time until it holds 72 GiB; the memory
guard (its default interval, policy kill) stops it. ``held_s`` is from holding 72 GiB to the
guard's stop, per trial. ``bursts``: holding over the cap for L seconds, then freeing: the
fraction of trials the guard saw (``detected``), per L.

``burst``: short bursts, as an attacker tuned to the guard's interval would make them. The
guard runs (policy kill) from before the workloads start. A neighbour (quota 24 GiB) holds
18 GiB and allocates and frees 4 GiB more every millisecond, in quota; the attacker (quota
8 GiB) takes 7.5 times its quota (8 allocations of 7.5 GiB, writing 0 into its reservations
before each) for 2 ms every 300 ms. Over ``--window`` seconds: whether and when the guard
stopped the attacker (``detected``, ``stopped_after_ms`` from the start of its first burst),
the bursts it made (at least the one it was stopped in), and the neighbour's in-quota
allocations that failed (``neighbour_failed``).

The offsets written come from the ``fgpu_seg.h`` of the tree whose ``fgpu`` is imported, so
the same script measures an older tree (``PYTHONPATH=<old>/src``) for a before/after pair.
Run as root. Prints one JSON object and writes it to ``--out``. Usage:
``python bench/segment_bypass.py [--window S] [--trials N] [--only LIST] [--label TEXT]
[--out PATH]``.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import platform
import pwd
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import fgpu
from fgpu.agent.backend import SimulatedBackend
from fgpu.agent.fakegpu import FakeDriverBackend, device_time
from fgpu.agent.governor.freezer import SignalFreezer
from fgpu.agent.governor.plan import ComputeMode, GpuPolicy
from fgpu.agent.governor.runtime import GovernedWorkload, Governor, GovernorConfig
from fgpu.agent.interposer.preload import FakeGpu, SegmentDir, fake_driver_env, preload_env
from fgpu.agent.interposer.segment import Segment
from fgpu.agent.launcher import Launcher, LaunchSpec
from fgpu.agent.memguard import GuardedWorkload, MemoryGuard, MemoryViolation
from fgpu.agent.process import ProcessHandle, group_pids
from fgpu.log_files import stream_text
from fgpu.native import ensure_built, fake_driver_dir, lib_dir

USER = "fgpu-test-alice"
PYTHON = "/usr/bin/python3"
GIB = 1 << 30
MIB = 1 << 20

OFFSETS_C = r"""
#include <stddef.h>
#include <stdio.h>
#include "fgpu_seg.h"
int main(void) {
#ifdef FGPU_SEG_CTL_SUFFIX
    printf("{\"agent_file\": \"ctl\", \"gate\": %zu, \"beat\": %zu, \"limit0\": %zu,"
           " \"reserved0\": %zu}\n", offsetof(struct fgpu_seg_ctl, gate),
           offsetof(struct fgpu_seg_ctl, agent_beat_ns),
           offsetof(struct fgpu_seg_ctl, gpus[0].memory_limit),
           offsetof(struct fgpu_seg, gpus[0].memory_reserved));
    printf("%zu\n", offsetof(struct fgpu_seg, gpus[0].gpu_time_ns));
#else
    printf("{\"agent_file\": \"seg\", \"gate\": %zu, \"beat\": %zu, \"limit0\": %zu,"
           " \"reserved0\": %zu}\n", offsetof(struct fgpu_seg, gate),
           offsetof(struct fgpu_seg, agent_beat_ns),
           offsetof(struct fgpu_seg, gpus[0].memory_limit),
           offsetof(struct fgpu_seg, gpus[0].memory_reserved));
    printf("%zu\n", offsetof(struct fgpu_seg, gpus[0].gpu_time_ns));
#endif
    return 0;
}
"""

POKER = r"""
import json, os, sys, time
path = sys.argv[1]
offset, size, value = (int(a) for a in sys.argv[2:5])
period = float(sys.argv[5])
try:
    fd = os.open(path, os.O_RDWR)
except OSError as exc:
    print(json.dumps({"open": exc.strerror}), flush=True)
    sys.exit(0)
print(json.dumps({"open": "ok"}), flush=True)
data = value.to_bytes(size, "little")
while True:
    os.pwrite(fd, data, offset)
    time.sleep(period)
"""

HOG = r"""
import ctypes, json, os, sys, time
seg, limit_file, limit_off, res_off = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
chunk, target, hold = int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
def poke(path, off):
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        return exc.strerror
    os.pwrite(fd, bytes(8), off)
    os.close(fd)
    return "ok"
lifted = poke(limit_file, limit_off)
cu = ctypes.CDLL("libcuda.so.1")
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cu.cuInit(0); cu.cuDeviceGet(ctypes.byref(dev), 0)
cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cu.cuCtxSetCurrent(ctx)
ptrs, held = [], 0
while held < target:
    poke(seg, res_off)
    p = ctypes.c_uint64()
    rc = cu.cuMemAlloc_v2(ctypes.byref(p), chunk)
    if rc != 0:
        break
    ptrs.append(p.value); held += chunk
print(json.dumps({"lifted": lifted, "held": held, "at_ns": time.monotonic_ns()}), flush=True)
if hold > 0:
    time.sleep(hold)
    for p in ptrs:
        cu.cuMemFree_v2(p)
    print(json.dumps({"freed_ns": time.monotonic_ns()}), flush=True)
while True:
    time.sleep(3600)
"""


SPIKER = r"""
import ctypes, json, os, sys, time
seg, res_off = sys.argv[1], int(sys.argv[2])
chunk, count = int(sys.argv[3]), int(sys.argv[4])
hold, period = float(sys.argv[5]), float(sys.argv[6])
fd = os.open(seg, os.O_RDWR)
cu = ctypes.CDLL("libcuda.so.1")
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cu.cuInit(0); cu.cuDeviceGet(ctypes.byref(dev), 0)
cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cu.cuCtxSetCurrent(ctx)
print(json.dumps({"start_ns": time.monotonic_ns()}), flush=True)  # the first burst follows
n = 0
while True:
    ptrs, at = [], time.monotonic_ns()
    for _ in range(count):
        os.pwrite(fd, bytes(8), res_off)
        p = ctypes.c_uint64()
        if cu.cuMemAlloc_v2(ctypes.byref(p), chunk) != 0:
            break
        ptrs.append(p.value)
    time.sleep(hold)
    for p in ptrs:
        cu.cuMemFree_v2(p)
    n += 1
    print(json.dumps({"burst": n, "at_ns": at, "held": len(ptrs) * chunk}), flush=True)
    time.sleep(period)
"""

NEIGHBOUR = r"""
import ctypes, json, sys, time
hold, extra, window = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
cu = ctypes.CDLL("libcuda.so.1")
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cu.cuInit(0); cu.cuDeviceGet(ctypes.byref(dev), 0)
cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cu.cuCtxSetCurrent(ctx)
base = ctypes.c_uint64()
assert cu.cuMemAlloc_v2(ctypes.byref(base), hold) == 0
print(json.dumps({"ready": True}), flush=True)
tries = failed = 0
end = time.monotonic() + window
while time.monotonic() < end:
    p = ctypes.c_uint64()
    tries += 1
    if cu.cuMemAlloc_v2(ctypes.byref(p), extra) != 0:
        failed += 1
    else:
        cu.cuMemFree_v2(p.value)
    time.sleep(0.001)
print(json.dumps({"tries": tries, "failed": failed}), flush=True)
while True:
    time.sleep(3600)
"""


def ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", USER])
        return pwd.getpwnam(USER)


def wait_until(check: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.user = ensure_user()
        self.state = root / "segs" / "fake-gpus.state"
        self.backend = FakeDriverBackend.wrap(
            SimulatedBackend("1xA100-80GB"), fake_driver_dir(), self.state
        )
        device = self.backend.gpus()[0]
        self.gpu = FakeGpu(device.uuid, device.model, device.memory_mib)
        self.segments = SegmentDir(root / "segs")
        self.launcher = Launcher()
        self.handles: list[ProcessHandle] = []
        self.pokers: list[subprocess.Popen[str]] = []
        self.trials = 0
        (root / "poker.py").write_text(POKER)
        (root / "hog.py").write_text(HOG)
        (root / "spiker.py").write_text(SPIKER)
        (root / "neighbour.py").write_text(NEIGHBOUR)
        tree = Path(fgpu.__file__).resolve().parents[2]
        (root / "off.c").write_text(OFFSETS_C)
        cc = os.environ.get("CC", "cc")
        include = tree / "native" / "include"
        subprocess.run(
            [cc, f"-I{include}", "-o", str(root / "off"), str(root / "off.c")], check=True
        )
        lines = subprocess.check_output([str(root / "off")], text=True).splitlines()
        self.offsets: dict[str, Any] = json.loads(lines[0])
        self.offsets["gpu_time0"] = int(lines[1])

    def agent_file(self, segment: Segment) -> Path:
        if self.offsets["agent_file"] == "ctl":
            return segment.path.with_name(segment.path.name + ".ctl")
        return segment.path

    def segment(self, wid: str, memory_gib: int) -> Segment:
        return self.segments.create(
            wid,
            [self.gpu.uuid],
            [memory_gib * 1024],
            max_inflight=2,
            uid=self.user.pw_uid,
            gid=self.user.pw_gid,
        )

    def env(self, segment: Segment) -> dict[str, str]:
        env = {"PATH": "/usr/bin:/bin"}
        env.update(fake_driver_env(fake_driver_dir(), self.state, [self.gpu], env))
        env.update(preload_env(lib_dir(), segment.path, env))
        return env

    def launch(self, wid: str, argv: list[str], segment: Segment) -> ProcessHandle:
        spec = LaunchSpec(
            workload_id=wid,
            argv=argv,
            log_dir=self.root / "logs",
            cwd="/",
            env=self.env(segment),
            uid=self.user.pw_uid,
            gid=self.user.pw_gid,
            gpu_uuids=[self.gpu.uuid],
            compute_milli=300,
            memory_mib=segment.stats().gpus[0].memory_limit // MIB,
        )
        handle = self.launcher.launch(spec)
        self.handles.append(handle)
        return handle

    def poke(self, path: Path, offset: int, size: int, value: int) -> str:
        proc = subprocess.Popen(
            [
                PYTHON,
                str(self.root / "poker.py"),
                str(path),
                *map(str, (offset, size, value)),
                "2e-4",
            ],
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pokers.append(proc)
        assert proc.stdout is not None
        got: str = json.loads(proc.stdout.readline())["open"]
        return got

    def stop_all(self) -> None:
        for proc in self.pokers:
            proc.kill()
            proc.wait()
        self.pokers.clear()
        for handle in self.handles:
            self.launcher.signal(handle, signal.SIGKILL)
        for handle in self.handles:
            with contextlib.suppress(Exception):
                wait_until(lambda h=handle: not self.launcher.is_same_process(h), "exit", 10)
        self.handles.clear()

    def first_lines(self, handle: ProcessHandle, n: int) -> list[dict[str, Any]]:
        found: list[str] = []

        def ready() -> bool:
            path = handle.stdout_path
            found[:] = stream_text(path).splitlines()
            return len(found) >= n

        wait_until(ready, f"{n} lines from {handle.workload_id}")
        return [json.loads(line) for line in found[:n]]


def share_scenario(b: Bench, attack: str, window_s: float) -> dict[str, Any]:
    cudemo = str(lib_dir() / "bin" / "fgpu-cudemo")
    spin = [cudemo, "spin", "1000000", "100000000"]
    seg_n = b.segment(f"n-{attack}", 8)
    seg_a = b.segment(f"a-{attack}", 8)
    if attack == "exec":
        argv = [
            "/bin/sh",
            "-c",
            f"{cudemo} spin 1000000 20 >/dev/null && "
            f"exec env -u LD_PRELOAD -u FGPU_SEG {cudemo} spin 1000000 100000000",
        ]
    elif attack == "mixed":
        argv = [
            "/bin/sh",
            "-c",
            f"{cudemo} spin 1000000 100000000 >/dev/null & "
            f"env -u LD_PRELOAD -u FGPU_SEG {cudemo} spin 1000000 100000000 >/dev/null & wait",
        ]
    else:
        argv = spin
    neighbour = b.launch(f"n-{attack}", spin, seg_n)
    attacker = b.launch(f"a-{attack}", argv, seg_a)
    gov = Governor(
        [b.gpu.uuid],
        config=GovernorConfig(gpu_policy=GpuPolicy(mode=ComputeMode.STRICT)),
        freezer=SignalFreezer(),
        backend=b.backend,
    )
    out: dict[str, Any] = {"attack": attack}
    try:
        gov.update(
            [
                GovernedWorkload(
                    workload_id=f"n-{attack}",
                    handle=neighbour,
                    gpu_uuids=(b.gpu.uuid,),
                    compute_milli=(700,),
                    segment=seg_n,
                ),
                GovernedWorkload(
                    workload_id=f"a-{attack}",
                    handle=attacker,
                    gpu_uuids=(b.gpu.uuid,),
                    compute_milli=(300,),
                    segment=seg_a,
                ),
            ]
        )
        gov.start()
        wait_until(lambda: seg_n.stats().launches > 0, "the neighbour to launch")
        wait_until(lambda: seg_a.stats().processes > 0, "the attacker to use the interposer")
        started = time.monotonic_ns()
        if attack == "gate":
            out["write"] = b.poke(b.agent_file(seg_a), b.offsets["gate"], 4, 0)
        elif attack == "heartbeat":
            out["write"] = b.poke(b.agent_file(seg_a), b.offsets["beat"], 8, 1)
        elif attack == "devtime":
            out["write"] = b.poke(seg_a.path, b.offsets["gpu_time0"], 8, 0)
        mine: list[int] = [attacker.pgid]
        if attack == "mixed":  # both loops of the attacker's group, as NVML lists them

            def both() -> bool:
                group = set(group_pids(attacker))
                mine[:] = sorted({p.pid for p in b.backend.process_memory() if p.pid in group})
                return len(mine) == 2

            wait_until(both, "both of the attacker's loops on the GPU")
        time.sleep(1.5)  # settle: the governor reacts, the window then measures
        pids = [neighbour.pgid, *mine]
        before = device_time(b.state, b.gpu.uuid, pids)
        time.sleep(window_s)
        after = device_time(b.state, b.gpu.uuid, pids)
        used = {p: after[p] - before[p] for p in pids}
        total = sum(used.values())
        theirs = sum(used[p] for p in mine)
        out["share"] = round(theirs / total, 3) if total else None
        # each side's device time over the window's wall time: the neighbour's is below its
        # 0.7 where the machine's CPUs cannot keep its launches coming
        out["of_wall"] = {
            "attacker": round(theirs / (window_s * 1e9), 3),
            "neighbour": round(used[neighbour.pgid] / (window_s * 1e9), 3),
        }
        out["target_share"] = 0.3
        events = [e for e in gov.events.since(0) if e.kind == "gate-ignored"]
        out["gate_ignored_events"] = len(events)
        if events:
            out["first_event_after_ms"] = round((events[0].mono_ns - started) / 1e6, 1)
        out["held"] = out["share"] is not None and out["share"] <= 0.35
    finally:
        gov.close()
        b.stop_all()
        seg_n.remove()
        seg_a.remove()
    return out


def memory_trial(b: Bench, hold_s: float) -> dict[str, Any]:
    """One attacker (cap 8 GiB) taking 72 GiB; the guard stops it. hold_s 0: until stopped."""
    b.trials += 1
    wid = f"hog-{b.trials}"  # a log file of its own
    seg = b.segment(wid, 8)
    stopped: list[int] = []
    taken: list[int] = []

    def stop(workload: GuardedWorkload, violation: MemoryViolation) -> None:
        stopped.append(time.monotonic_ns())
        b.launcher.signal(workload.handle, signal.SIGKILL)

    guard = MemoryGuard(b.backend, stop=stop)
    argv = [
        PYTHON,
        str(b.root / "hog.py"),
        str(seg.path),
        str(b.agent_file(seg)),
        str(b.offsets["limit0"]),
        str(b.offsets["reserved0"]),
        str(8 * GIB),
        str(72 * GIB),
        str(hold_s),
    ]
    try:
        handle = b.launch(wid, argv, seg)
        guard.update(
            [GuardedWorkload(workload_id=wid, handle=handle, quotas_mib={b.gpu.uuid: 8192})]
        )
        guard.start()
        first = b.first_lines(handle, 1)[0]
        taken.append(first["at_ns"])
        out: dict[str, Any] = {"lifted_limit": first["lifted"], "held_gib": first["held"] // GIB}
        if hold_s > 0:

            def over() -> bool:
                text = stream_text(handle.stdout_path)
                return bool(stopped) or "freed_ns" in text

            wait_until(over, "the burst to end", 30)
            if not stopped:
                time.sleep(0.3)  # a look that began during the burst acts after it
            out["detected"] = bool(stopped)
        else:
            wait_until(lambda: bool(stopped), "the guard to stop the hog", 30)
            out["held_s"] = round((stopped[0] - taken[0]) / 1e9, 3)
        return out
    finally:
        guard.close()
        b.stop_all()
        seg.remove()


def memory(b: Bench, trials: int, bursts: list[float]) -> dict[str, Any]:
    interval = inspect.signature(MemoryGuard).parameters["interval_s"].default
    held = [memory_trial(b, 0.0) for _ in range(trials)]
    out: dict[str, Any] = {
        "guard_interval_s": interval,
        "lifted_limit": held[0]["lifted_limit"],
        "held_gib": [t["held_gib"] for t in held],
        "held_s": [t["held_s"] for t in held],
        "bursts": {},
    }
    for length in bursts:
        seen = [memory_trial(b, length)["detected"] for _ in range(trials)]
        out["bursts"][f"{length:g}s"] = {"detected": round(sum(seen) / len(seen), 2)}
    return out


def burst_trial(b: Bench, window_s: float) -> dict[str, Any]:
    """The ``burst`` attack (module docstring), once."""
    b.trials += 1
    seg_a, seg_n = b.segment(f"spk-{b.trials}", 8), b.segment(f"spn-{b.trials}", 24)
    stopped: list[int] = []
    found: list[MemoryViolation] = []

    def stop(workload: GuardedWorkload, violation: MemoryViolation) -> None:
        stopped.append(time.monotonic_ns())
        found.append(violation)
        b.launcher.signal(workload.handle, signal.SIGKILL)

    guard = MemoryGuard(b.backend, stop=stop)
    guard.start()  # before the workloads, as under fgpu serve (accounting on, where it is)
    neighbour_argv = [PYTHON, str(b.root / "neighbour.py"), str(18 * GIB), str(4 * GIB)]
    spiker_argv = [
        PYTHON,
        str(b.root / "spiker.py"),
        str(seg_a.path),
        str(b.offsets["reserved0"]),
        str(int(7.5 * GIB)),
        "8",
        "0.002",
        "0.3",
    ]
    try:
        neighbour = b.launch(f"spn-{b.trials}", [*neighbour_argv, str(window_s)], seg_n)
        b.first_lines(neighbour, 1)
        attacker = b.launch(f"spk-{b.trials}", spiker_argv, seg_a)
        guard.update(
            [
                GuardedWorkload(
                    workload_id=f"spk-{b.trials}",
                    handle=attacker,
                    quotas_mib={b.gpu.uuid: 8192},
                ),
                GuardedWorkload(
                    workload_id=f"spn-{b.trials}",
                    handle=neighbour,
                    quotas_mib={b.gpu.uuid: 24 * 1024},
                ),
            ]
        )
        start = b.first_lines(attacker, 1)[0]["start_ns"]
        result = b.first_lines(neighbour, 2)[1]  # its window began when it was ready
        lines = attacker.stdout_path.read_text().splitlines()
        bursts = [json.loads(line) for line in lines if '"burst"' in line]
        out: dict[str, Any] = {
            # the guard may stop it before it says what the first burst held
            "burst_held_gib": bursts[0]["held"] / GIB if bursts else None,
            "bursts": max(len(bursts), 1 if stopped else 0),
            "detected": bool(stopped),
            "neighbour_tries": result["tries"],
            "neighbour_failed": result["failed"],
        }
        if stopped:
            out["stopped_after_ms"] = round((stopped[0] - start) / 1e6, 1)
            out["event"] = found[0].message
        out["guard_says"] = getattr(guard, "describe_bursts", lambda: "(no such report)")()
        return out
    finally:
        guard.close()
        b.stop_all()
        seg_a.remove()
        seg_n.remove()


def guard_cost(b: Bench, counts: tuple[int, ...] = (1, 8), looks: int = 50) -> dict[str, Any]:
    """CPU time of one look of the memory guard (its default ``pids_of``: a scan of /proc per
    workload), with n workloads spinning on the GPU; and its part of one core at the default
    interval."""
    interval = inspect.signature(MemoryGuard).parameters["interval_s"].default
    out: dict[str, Any] = {"guard_interval_s": interval}
    cudemo = str(lib_dir() / "bin" / "fgpu-cudemo")
    for n in counts:
        segs, guarded = [], []
        for i in range(n):
            seg = b.segment(f"cost{n}-{i}", 8)
            segs.append(seg)
            handle = b.launch(f"cost{n}-{i}", [cudemo, "spin", "1000000", "100000000"], seg)
            guarded.append(
                GuardedWorkload(
                    workload_id=f"cost{n}-{i}", handle=handle, quotas_mib={b.gpu.uuid: 8192}
                )
            )
        guard = MemoryGuard(b.backend, stop=lambda _w, _v: None)
        guard.update(guarded)
        wait_until(lambda n=n: len(b.backend.process_memory()) >= n, "the workloads on the GPU")
        spent = []
        for _ in range(looks):
            start = time.thread_time_ns()
            guard.check()
            spent.append((time.thread_time_ns() - start) / 1e6)
        ms = statistics.median(spent)
        out[f"{n}_workloads"] = {
            "look_cpu_ms_median": round(ms, 2),
            "core_share": round(ms / (interval * 1000), 3),
        }
        b.stop_all()
        for seg in segs:
            seg.remove()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=4.0, help="measuring window, s")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--label", default="", help="which tree this is (stored)")
    parser.add_argument(
        "--only",
        default="none,gate,heartbeat,exec,devtime,mixed,memory,burst,guardcost",
        help="comma-separated scenarios to run (default: all)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/segment-bypass.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: the workloads run as another user")
    chosen = set(args.only.split(","))
    ensure_built()
    root = Path(tempfile.mkdtemp(prefix="fgpu-bench-bypass-", dir="/dev/shm"))
    root.chmod(0o755)
    try:
        b = Bench(root)
        result = {
            "bench": "segment-bypass",
            "label": args.label,
            "tree": str(Path(fgpu.__file__).resolve().parents[2]),
            "driver": "fake (native/fakecuda): no GPU on this machine",
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "segment_layout": b.offsets["agent_file"],
            "window_s": args.window,
            "compute": [
                share_scenario(b, a, args.window)
                for a in ("none", "gate", "heartbeat", "exec", "devtime", "mixed")
                if a in chosen
            ],
            "burst": [burst_trial(b, args.window) for _ in range(args.trials)]
            if "burst" in chosen
            else None,
            "memory": memory(b, args.trials, [0.05, 0.15, 0.3, 1.0])
            if "memory" in chosen
            else None,
            "guard_cost": guard_cost(b) if "guardcost" in chosen else None,
        }
        b.backend.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
