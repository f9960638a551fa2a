"""A workload cannot lift its own limits (issue 27, point 4), tried as an attacker would.

Real processes of a real local user (``fgpu-test-alice``) run against the fake CUDA driver
(a stand-in for a GPU) with libfgpu preloaded; the agent's side (segment, governor, memory
guard) runs here as root, as ``fgpu serve`` does. Each bypass that worked before:

- writing ``gate = 0``, an old heartbeat or a zero memory limit into the segment: the
  agent's part is now a file the workload's user can only read (``<seg>.ctl``), so the
  rewrite is refused and the held process stays held;
- lowering its own reservations (the part it may write) to allocate past the cap: the
  memory guard, which reads per-process memory from (the fake) NVML, stops it;
- an ``exec`` without ``LD_PRELOAD`` after using CUDA (launches that skip the gate): the
  governor sees its GPU time (NVML per-process utilization) while its gate is closed and
  freezes it for good, with a ``gate-ignored`` event;
- writing its own device time down (to be charged less): NVML's figure for its processes
  is far above what it reported, so the same happens.

The pretend GPUs' NVML is loaded into this process once (module fixture), so every test of
this module shares one fake driver state file.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.localusers import ALICE, ensure_users, uid_of

from fgpu.agent.backend import SimulatedBackend
from fgpu.agent.events import GATE_IGNORED, MEMORY_EXCEEDED
from fgpu.agent.fakegpu import FakeDriverBackend, device_time
from fgpu.agent.governor.freezer import SignalFreezer
from fgpu.agent.governor.plan import ComputeMode, GpuPolicy, RunState
from fgpu.agent.governor.runtime import GovernedWorkload, Governor, GovernorConfig
from fgpu.agent.interposer.preload import FakeGpu, SegmentDir, fake_driver_env, preload_env
from fgpu.agent.interposer.segment import Segment
from fgpu.agent.launcher import Launcher, LaunchSpec
from fgpu.agent.memguard import GuardedWorkload, MemoryGuard, MemoryViolation
from fgpu.agent.process import ProcessHandle
from fgpu.log_files import stream_text
from fgpu.native import ensure_built, fake_driver_dir, lib_dir

MIB = 1 << 20
DEADLINE_S = 60.0
PYTHON = "/usr/bin/python3"  # the workload's user cannot reach a Python under /root

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="Linux only"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run workloads as a user"),
    pytest.mark.skipif(not os.access(PYTHON, os.X_OK), reason=f"needs {PYTHON}"),
]


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.02)


@dataclass
class Box:
    """One pretend GPU measured through the fake NVML, and alice's workloads on it."""

    root: Path
    state: Path
    gpu: FakeGpu
    backend: FakeDriverBackend
    segments: SegmentDir
    launcher: Launcher
    handles: list[ProcessHandle]
    uid: int
    gid: int

    def segment(self, wid: str, memory_mib: int) -> Segment:
        return self.segments.create(
            wid, [self.gpu.uuid], [memory_mib], max_inflight=2, uid=self.uid, gid=self.gid
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
            uid=self.uid,
            gid=self.gid,
            gpu_uuids=[self.gpu.uuid],
            compute_milli=300,
            memory_mib=segment.stats().gpus[0].memory_limit // MIB,
        )
        handle = self.launcher.launch(spec)
        self.handles.append(handle)
        return handle

    def device_time(self, pids: list[int]) -> dict[int, int]:
        return device_time(self.state, self.gpu.uuid, pids)


@pytest.fixture(scope="module")
def box() -> Iterator[Box]:
    ensure_users()
    ensure_built()
    root = Path(tempfile.mkdtemp(prefix="fgpu-test-bypass-", dir="/dev/shm"))
    root.chmod(0o755)  # alice reaches the segment folder, the state file and the scripts
    shutil.copy(Path(__file__).with_name("segment_attacker.py"), root)
    saved = {k: os.environ.get(k) for k in ("FGPU_FAKE_GPU_STATE", "FGPU_FAKE_GPUS")}
    state = root / "segs" / "fake-gpus.state"
    backend = FakeDriverBackend.wrap(SimulatedBackend("1xA100-80GB"), fake_driver_dir(), state)
    for key, value in saved.items():  # the fake NVML has read them; leave the rest alone
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    device = backend.gpus()[0]
    b = Box(
        root=root,
        state=state,
        gpu=FakeGpu(device.uuid, device.model, device.memory_mib),
        backend=backend,
        segments=SegmentDir(root / "segs"),
        launcher=Launcher(),
        handles=[],
        uid=uid_of(ALICE),
        gid=pwd.getpwnam(ALICE).pw_gid,
    )
    yield b
    for handle in b.handles:
        b.launcher.signal(handle, 9)
    backend.close()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cleanup(box: Box) -> Iterator[None]:
    yield
    for handle in box.handles:
        box.launcher.signal(handle, 9)
    box.handles.clear()


def strict_governor(box: Box, **config: float) -> Governor:
    """A strict governor of the box's GPU, signal freezer (``config``: more
    :class:`GovernorConfig` fields)."""
    return Governor(
        [box.gpu.uuid],
        config=GovernorConfig(gpu_policy=GpuPolicy(mode=ComputeMode.STRICT), **config),  # type: ignore[arg-type]
        freezer=SignalFreezer(),
        backend=box.backend,
    )


def govern(gov: Governor, box: Box, *shares: tuple[str, ProcessHandle, int, Segment]) -> None:
    """Hand ``gov`` the workloads (id, handle, compute milli, segment) and start it."""
    gov.update(
        [
            GovernedWorkload(
                workload_id=wid,
                handle=handle,
                gpu_uuids=(box.gpu.uuid,),
                compute_milli=(milli,),
                segment=segment,
            )
            for wid, handle, milli, segment in shares
        ]
    )
    gov.start()


def attacker(box: Box, *args: str) -> list[str]:
    return [PYTHON, str(box.root / "segment_attacker.py"), *args]


def first_line(handle: ProcessHandle) -> dict[str, object]:
    text: list[str] = []

    def ready() -> bool:
        lines = stream_text(handle.stdout_path).splitlines()
        text[:] = lines
        return bool(lines)

    wait_until(ready, f"the first line of {handle.workload_id}'s output")
    found: dict[str, object] = json.loads(text[0])
    return found


def test_a_held_workload_cannot_rewrite_its_gate_heartbeat_or_cap(box: Box, cleanup: None) -> None:
    seg = box.segment("w-rewrite", 1024)
    stop = threading.Event()

    def beat() -> None:  # the agent's heartbeat, as the governor keeps it
        while not stop.wait(0.2):
            seg.beat()

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        spin = [str(lib_dir() / "bin" / "fgpu-cudemo"), "spin", "1000000", "100000000"]
        handle = box.launch("w-rewrite", spin, seg)
        pid = handle.pgid
        wait_until(lambda: seg.stats().launches > 0, "the workload to launch")
        seg.set_gate(closed=True)
        wait_until(lambda: seg.stats().waiting > 0, "the workload to wait at its gate")
        # alice, from inside the workload, rewrites what she can and attacks the rest
        done = box.launch("w-rewrite-attack", attacker(box, "rewrite"), seg)
        attempts = first_line(done)
        assert attempts == {
            "workload_part": "zeroed",  # its own counters: its own to spoil
            "control_part": "EACCES",  # open(O_RDWR) of the agent's file
            "mprotect": "EACCES",  # a read-only mapping of it cannot become writable
            "chmod": "EPERM",  # nor the file
        }
        stats = seg.stats()
        assert stats.gate_closed
        assert stats.gpus[0].memory_limit == 1024 * MIB
        # the held process still runs nothing: the fake driver's own count of its device
        # time does not move over a window while its gate stays closed
        before = box.device_time([pid])[pid]
        time.sleep(0.5)  # the window in which an escaped launcher would show
        assert box.device_time([pid])[pid] == before, "launches went past a closed gate"
        seg.set_gate(closed=False)  # the process was held, not dead: it resumes
        wait_until(lambda: box.device_time([pid])[pid] > before, "the workload to resume")
    finally:
        stop.set()
        beater.join()
        seg.remove()


def test_the_memory_guard_stops_a_workload_that_rewrote_its_reservations(
    box: Box, cleanup: None
) -> None:
    seg = box.segment("w-burst", 1024)
    stopped: list[MemoryViolation] = []
    guard = MemoryGuard(box.backend, stop=lambda _w, v: stopped.append(v))
    try:
        handle = box.launch("w-burst", attacker(box, "burst", str(1024 * MIB), str(700 * MIB)), seg)
        guard.update(
            [GuardedWorkload(workload_id="w-burst", handle=handle, quotas_mib={box.gpu.uuid: 1024})]
        )
        result = first_line(handle)
        # the interposer's cap counts what the workload writes into its own part: zeroing
        # its reservations let the second 700 MiB through (1400 MiB under a 1024 MiB cap)
        assert (result["first"], result["second"]) == (0, 0), result
        guard.start()
        wait_until(lambda: bool(stopped), "the memory guard to stop the workload")
        assert (stopped[0].used_mib, stopped[0].allowed_mib) == (1400, 1024)
        events = [e for e in guard.events.since(0) if e.kind == MEMORY_EXCEEDED]
        assert events
        assert "used 1400 MiB, allowed 1024 MiB" in events[0].message
    finally:
        guard.close()
        seg.remove()


def test_a_workload_that_execs_without_the_interposer_is_frozen_with_an_event(
    box: Box, cleanup: None
) -> None:
    """alice's workload uses CUDA through the interposer (so the governor holds it at launch),
    then execs a kernel loop without LD_PRELOAD: launches that never meet the gate."""
    seg_a = box.segment("w-exec", 8192)
    seg_b = box.segment("w-neighbour", 8192)
    cudemo = str(lib_dir() / "bin" / "fgpu-cudemo")
    escape = (
        f"{cudemo} spin 1000000 20 >/dev/null && "
        f"exec env -u LD_PRELOAD -u FGPU_SEG {cudemo} spin 1000000 100000000"
    )
    a = box.launch("w-exec", ["/bin/sh", "-c", escape], seg_a)
    b = box.launch("w-neighbour", [cudemo, "spin", "1000000", "100000000"], seg_b)
    gov = strict_governor(box)
    try:
        govern(gov, box, ("w-exec", a, 300, seg_a), ("w-neighbour", b, 700, seg_b))

        def ignored() -> bool:
            return any(e.kind == GATE_IGNORED for e in gov.events.since(0))

        wait_until(ignored, "a gate-ignored event")
        event = next(e for e in gov.events.since(0) if e.kind == GATE_IGNORED)
        assert event.workload_id == "w-exec"
        view = {w.workload_id: w for w in gov.snapshot().workloads}
        assert view["w-exec"].enforcement == "signal"  # held by the freezer from now on
        assert view["w-neighbour"].enforcement == "interposer"

        # frozen whenever the plan holds it: seen stopped (SIGSTOP) at some frozen step
        def stopped_while_frozen() -> bool:
            w = {v.workload_id: v for v in gov.snapshot().workloads}["w-exec"]
            return w.state is not RunState.RUNNING and gov.freezer.is_frozen(a)

        wait_until(stopped_while_frozen, "the workload stopped by the freezer while held")
    finally:
        gov.close()
        seg_a.remove()
        seg_b.remove()


GPU_TIME_OFFSET_C = r"""
#include <stddef.h>
#include <stdio.h>
#include "fgpu_seg.h"
int main(void) { printf("%zu\n", offsetof(struct fgpu_seg, gpus[0].gpu_time_ns)); return 0; }
"""

POKER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
print("open", flush=True)
while True:
    os.pwrite(fd, bytes(8), int(sys.argv[2]))
    time.sleep(0.0002)
"""


def test_a_workload_that_writes_its_device_time_down_is_frozen_with_an_event(
    box: Box, cleanup: None, tmp_path: Path
) -> None:
    """alice's workload launches through the interposer, and another of her processes keeps
    writing 0 into its device time counter (the workload's own part of the segment)."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    include = Path(__file__).resolve().parents[2] / "native" / "include"
    (tmp_path / "off.c").write_text(GPU_TIME_OFFSET_C)
    subprocess.run([cc, f"-I{include}", "-o", str(tmp_path / "off"), str(tmp_path / "off.c")])
    offset = int(subprocess.check_output([str(tmp_path / "off")]))
    (box.root / "poker.py").write_text(POKER)
    seg_a = box.segment("w-devtime", 8192)
    seg_b = box.segment("w-devtime-neighbour", 8192)
    spin = [str(lib_dir() / "bin" / "fgpu-cudemo"), "spin", "1000000", "100000000"]
    a = box.launch("w-devtime", spin, seg_a)
    b = box.launch("w-devtime-neighbour", spin, seg_b)
    gov = strict_governor(box)
    poker = subprocess.Popen(
        [PYTHON, str(box.root / "poker.py"), str(seg_a.path), str(offset)],
        user=box.uid,
        group=box.gid,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert poker.stdout is not None
        assert poker.stdout.readline().strip() == "open"  # its own part: it may write it
        govern(gov, box, ("w-devtime", a, 300, seg_a), ("w-devtime-neighbour", b, 700, seg_b))

        def ignored() -> list[str]:
            return [e.workload_id for e in gov.events.since(0) if e.kind == GATE_IGNORED]

        wait_until(lambda: bool(ignored()), "a gate-ignored event")
        assert ignored() == ["w-devtime"]
        event = next(e for e in gov.events.since(0) if e.kind == GATE_IGNORED)
        assert "reported" in event.message
        view = {w.workload_id: w for w in gov.snapshot().workloads}
        assert view["w-devtime"].enforcement == "signal"
        assert view["w-devtime-neighbour"].enforcement == "interposer"
    finally:
        poker.kill()
        poker.wait()
        gov.close()
        seg_a.remove()
        seg_b.remove()


def test_a_process_of_a_held_workload_that_skips_the_interposer_is_caught(
    box: Box, cleanup: None
) -> None:
    """alice's workload runs two kernel loops in one process group: one through the
    interposer (held at its gate), one started without ``LD_PRELOAD`` (never held). The
    governor sees a process of the workload on the GPU that holds no entry of its segment
    and freezes the workload, with an event naming the process."""
    seg_a = box.segment("w-mixed", 8192)
    seg_b = box.segment("w-mixed-neighbour", 8192)
    cudemo = str(lib_dir() / "bin" / "fgpu-cudemo")
    mixed = (
        f"{cudemo} spin 1000000 100000000 >/dev/null & "
        f"env -u LD_PRELOAD -u FGPU_SEG {cudemo} spin 1000000 100000000 >/dev/null & wait"
    )
    a = box.launch("w-mixed", ["/bin/sh", "-c", mixed], seg_a)
    b = box.launch("w-mixed-neighbour", [cudemo, "spin", "1000000", "100000000"], seg_b)
    # the other checks out of the way (the gate-closed one waits 30 s after a gate closes,
    # the device-time one never finds too little reported), so that only the comparison of
    # NVML's processes with the segment's entries can see the bypass
    gov = strict_governor(box, obey_grace_s=30, obey_report_ratio=0)
    try:
        govern(gov, box, ("w-mixed", a, 300, seg_a), ("w-mixed-neighbour", b, 700, seg_b))

        def events() -> list[str]:
            return [e.workload_id for e in gov.events.since(0) if e.kind == GATE_IGNORED]

        wait_until(lambda: bool(events()), "a gate-ignored event")
        assert events() == ["w-mixed"]  # the neighbour, through the interposer, is not
        event = next(e for e in gov.events.since(0) if e.kind == GATE_IGNORED)
        assert event.reason == "interposer bypassed"
        attached = {p.pid for p in seg_a.processes()}
        bare = [pid for pid in gov.pids("w-mixed") if pid not in attached]
        named = int(event.message.split()[1])  # "process <pid> used <gpu> ..."
        assert named in bare, (event.message, attached)
        assert "without the interposer" in event.message
        view = {w.workload_id: w for w in gov.snapshot().workloads}
        assert view["w-mixed"].enforcement == "signal"  # held by the freezer from now on
        assert view["w-mixed-neighbour"].enforcement == "interposer"
    finally:
        gov.close()
        seg_a.remove()
        seg_b.remove()


def test_processes_that_use_the_gpu_through_the_interposer_are_not_taken_for_a_bypass(
    box: Box, cleanup: None
) -> None:
    """No false alarm: a process that only opens a context through the interposer (and then
    waits), and children that inherited ``LD_PRELOAD`` (a shell's two kernel loops), all hold
    an entry before the driver lists them."""
    seg = box.segment("w-legit", 8192)
    cudemo = str(lib_dir() / "bin" / "fgpu-cudemo")
    script = (
        f"{PYTHON} {box.root / 'segment_attacker.py'} context & "
        f"{cudemo} spin 1000000 100000000 >/dev/null & "
        f"{cudemo} spin 1000000 100000000 >/dev/null & wait"
    )
    handle = box.launch("w-legit", ["/bin/sh", "-c", script], seg)
    gov = strict_governor(box)
    try:
        govern(gov, box, ("w-legit", handle, 300, seg))

        def on_gpu() -> set[int]:
            pids = set(gov.pids("w-legit"))
            return {p.pid for p in box.backend.process_memory() if p.pid in pids}

        wait_until(lambda: len(on_gpu()) == 3, "three processes of the workload on the GPU")
        assert on_gpu() <= {p.pid for p in seg.processes()}
        # the check has looked for at least three times its grace: no event, still governed
        # at launch
        looked = time.monotonic()
        wait_until(lambda: time.monotonic() - looked > 3 * gov.config.bypass_grace_s, "looks")
        assert [e for e in gov.events.since(0) if e.kind == GATE_IGNORED] == []
        view = {w.workload_id: w for w in gov.snapshot().workloads}
        assert view["w-legit"].enforcement == "interposer"
    finally:
        gov.close()
        seg.remove()


def test_the_memory_guard_sees_bursts_shorter_than_its_interval(box: Box, cleanup: None) -> None:
    """alice's workload (quota 1024 MiB) lies about its reservations and takes 7.5 times its
    quota for 2 ms, then frees it: gone before the guard's next look, but the driver's
    high-water mark (NVML accounting) keeps the peak, and the guard stops it at that look."""
    seg = box.segment("w-spikes", 1024)
    stopped: list[MemoryViolation] = []
    # looks only when told (check), so that no look can fall inside the burst
    guard = MemoryGuard(box.backend, interval_s=3600, stop=lambda _w, v: stopped.append(v))
    try:
        guard.start()  # accounting on before the workload starts, as under fgpu serve
        assert guard.burst_detection == {box.gpu.uuid: "on"}
        # one burst (the next would come in an hour): 8 x 960 MiB = 7680 MiB for 2 ms
        spike = attacker(box, "spikes", str(960 * MIB), "8", "0.002", "3600")
        handle = box.launch("w-spikes", spike, seg)
        guard.update(
            [
                GuardedWorkload(
                    workload_id="w-spikes", handle=handle, quotas_mib={box.gpu.uuid: 1024}
                )
            ]
        )
        first = first_line(handle)  # printed once the burst's memory is freed
        assert (first["spike"], first["held"]) == (0, 7680 * MIB)  # the cap let it through
        held_now = sum(p.used_mib for p in box.backend.process_memory() if p.pid == handle.pgid)
        assert held_now < 1024  # what a look without the peak sees: nothing over the quota
        found = guard.check()
        assert [(v.workload_id, v.peak, v.used_mib, v.allowed_mib) for v in found] == [
            ("w-spikes", True, 7680, 1024)
        ]
        assert stopped == found  # policy kill: stopped
        events = [e for e in guard.events.since(0) if e.kind == MEMORY_EXCEEDED]
        assert len(events) == 1
        assert "peaked at 7680 MiB" in events[0].message
        assert "allowed 1024 MiB" in events[0].message
        assert "bursts between looks seen" in guard.describe_bursts()
    finally:
        guard.close()
        seg.remove()
