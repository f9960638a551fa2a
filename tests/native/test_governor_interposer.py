"""The governor holding workloads at kernel launch through the interposer, on the fake driver.

Real processes (``fgpu-cudemo`` launching "spin" kernels of a fixed length) run against the
fake CUDA driver, with libfgpu preloaded and one segment each; the real
:class:`~fgpu.agent.governor.runtime.Governor` opens and closes their gates. The fake driver
runs one kernel at a time per device across processes and counts each process's device
time: that is the ground truth the shares are checked against (in device time, within 2
points, over a measuring window).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fgpu.agent.fakegpu import device_time
from fgpu.agent.governor.freezer import SignalFreezer
from fgpu.agent.governor.plan import ComputeMode, GpuPolicy, PriorityPolicy, RunState
from fgpu.agent.governor.runtime import GovernedWorkload, Governor, GovernorConfig
from fgpu.agent.interposer.preload import FakeGpu, SegmentDir, fake_driver_env, preload_env
from fgpu.agent.interposer.segment import Segment
from fgpu.agent.launcher import Launcher, LaunchSpec
from fgpu.agent.process import ProcessHandle
from fgpu.native import ensure_built, fake_driver_dir, lib_dir

UUID = "GPU-fa4e0000-0000-4000-8000-000000000001"
GPU = FakeGpu(UUID, "A100-80GB", 81920)
KERNEL_NS = 1_000_000  # 1 ms kernels: many leases per measuring window
WINDOW_S = 8.0
DEADLINE_S = 60.0

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux only")


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.02)


@dataclass
class Machine:
    """One pretend GPU, a segment folder and the workloads launched on it."""

    root: Path
    state: Path
    segments: SegmentDir
    launcher: Launcher
    handles: list[ProcessHandle]

    def env(self, segment: Segment | None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(fake_driver_env(fake_driver_dir(), self.state, [GPU], env))
        if segment is not None:
            env.update(preload_env(lib_dir(), segment.path, env))
        return env

    def launch(
        self, wid: str, argv: list[str], *, memory_mib: int = 8192, max_inflight: int = 2
    ) -> tuple[ProcessHandle, Segment]:
        segment = self.segments.create(
            wid, [UUID], [memory_mib], max_inflight=max_inflight, uid=None, gid=None
        )
        spec = LaunchSpec(
            workload_id=wid,
            argv=argv,
            log_dir=self.root / "logs",
            env=self.env(segment),
            gpu_uuids=[UUID],
            compute_milli=500,
            memory_mib=memory_mib,
        )
        handle = self.launcher.launch(spec)
        self.handles.append(handle)
        return handle, segment

    def device_time(self) -> dict[int, int]:
        """The fake driver's device time per pid on the GPU (ns)."""
        return device_time(self.state, UUID, [h.pgid for h in self.handles])


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    ensure_built()
    m = Machine(
        root=tmp_path,
        state=tmp_path / "fake-gpus.state",
        segments=SegmentDir(tmp_path / "segs"),
        launcher=Launcher(),
        handles=[],
    )
    yield m
    for handle in m.handles:
        m.launcher.signal(handle, 9)


def spin(count: int = 10_000_000, kernel_ns: int = KERNEL_NS) -> list[str]:
    return [str(lib_dir() / "bin" / "fgpu-cudemo"), "spin", str(kernel_ns), str(count)]


def governor(policy: GpuPolicy, *, max_inflight: int = 2) -> Governor:
    return Governor(
        [UUID],
        config=GovernorConfig(gpu_policy=policy, max_inflight=max_inflight),
        freezer=SignalFreezer(),
    )


def measure(m: Machine, pids: list[int]) -> dict[int, float]:
    """Each pid's share of the device time over one window."""
    before = m.device_time()
    time.sleep(WINDOW_S)  # the measuring window (its length is not what the test checks)
    after = m.device_time()
    used = {p: after[p] - before[p] for p in pids}
    total = sum(used.values())
    assert total > 0, f"no device time at all in the window: {before} -> {after}"
    return {p: used[p] / total for p in pids}


def active(segment: Segment) -> Callable[[], bool]:
    return lambda: segment.stats().launches > 0


@pytest.mark.parametrize(
    ("mode", "shares"),
    [
        (ComputeMode.STRICT, (700, 300)),
        (ComputeMode.STRICT, (100, 900)),
    ],
    ids=["strict-700-300", "strict-100-900"],
)
def test_strict_shares_in_device_time(
    machine: Machine, mode: ComputeMode, shares: tuple[int, int]
) -> None:
    gov = governor(GpuPolicy(mode=mode))
    launched = [machine.launch(f"w{i}", spin()) for i in range(2)]
    try:
        gov.update(
            [
                GovernedWorkload(
                    workload_id=f"w{i}",
                    handle=h,
                    gpu_uuids=(UUID,),
                    compute_milli=(share,),
                    segment=seg,
                )
                for i, ((h, seg), share) in enumerate(zip(launched, shares, strict=True))
            ]
        )
        gov.start()
        for _, seg in launched:
            wait_until(active(seg), "both workloads launching")
        wait_until(
            lambda: all(v.enforcement == "interposer" for v in gov.snapshot().workloads),
            "the governor holding both at launch",
        )
        got = measure(machine, [h.pgid for h, _ in launched])
    finally:
        gov.close()
    for (h, _), share in zip(launched, shares, strict=True):
        assert abs(got[h.pgid] - share / 1000) <= 0.02, (got, shares)


def test_fair_shares_with_one_idle_in_device_time(machine: Machine) -> None:
    """Fair 500/300/200 with the 200 idle (it holds memory, never launches): the busy two
    split the device 500:300."""
    gov = governor(GpuPolicy(mode=ComputeMode.FAIR))
    hold = [str(lib_dir() / "bin" / "fgpu-cudemo"), "hold", str(1 << 20)]
    launched = [
        machine.launch("a", spin()),
        machine.launch("b", spin()),
        machine.launch("idle", hold),
    ]
    try:
        gov.update(
            [
                GovernedWorkload(
                    workload_id=wid, handle=h, gpu_uuids=(UUID,), compute_milli=(s,), segment=seg
                )
                for wid, (h, seg), s in zip(
                    ("a", "b", "idle"), launched, (500, 300, 200), strict=True
                )
            ]
        )
        gov.start()
        for _, seg in launched[:2]:
            wait_until(active(seg), "the busy workloads launching")
        wait_until(lambda: launched[2][1].stats().processes > 0, "the idle one using CUDA")
        wait_until(
            lambda: (
                {v.workload_id: v.busy for v in gov.snapshot().workloads}
                == {"a": True, "b": True, "idle": False}
            ),
            "a and b busy, idle idle",
        )
        got = measure(machine, [h.pgid for h, _ in launched])
    finally:
        gov.close()
    a, b, idle = (got[h.pgid] for h, _ in launched)
    assert idle == 0.0
    assert abs(a - 0.625) <= 0.02, got
    assert abs(b - 0.375) <= 0.02, got


def test_a_closed_gate_stops_the_device_within_two_kernels(machine: Machine) -> None:
    """With one launch in flight allowed, closing the gate lets at most the running kernel and
    one already past the gate finish: the workload's device time grows by at most two
    kernels after the close, then not at all while the gate stays closed."""
    kernel = 20_000_000
    handle, seg = machine.launch("w", spin(kernel_ns=kernel), max_inflight=1)
    wait_until(active(seg), "the workload launching")
    seg.set_gate(closed=True)
    at_close = machine.device_time()[handle.pgid]
    wait_until(lambda: seg.stats().inflight == 0, "the launches in flight to finish")
    drained = machine.device_time()[handle.pgid]
    time.sleep(0.5)  # a window in which nothing may run (a later launch would show)
    later = machine.device_time()[handle.pgid]
    assert seg.stats().waiting == 1  # its launching thread waits at the gate
    assert drained - at_close <= 2 * kernel
    assert later == drained
    seg.set_gate(closed=False)
    wait_until(lambda: machine.device_time()[handle.pgid] > later, "running again once open")


def test_a_busy_higher_priority_workload_pauses_a_lower_one_at_launch(machine: Machine) -> None:
    gov = governor(GpuPolicy(mode=ComputeMode.FAIR, priority_policy=PriorityPolicy.PAUSE))
    low_h, low_seg = machine.launch("low", spin())
    try:
        specs = [
            GovernedWorkload(
                workload_id="low",
                handle=low_h,
                gpu_uuids=(UUID,),
                compute_milli=(500,),
                priority=40,
                segment=low_seg,
            )
        ]
        gov.update(specs)
        gov.start()
        wait_until(active(low_seg), "low launching")
        high_h, high_seg = machine.launch("high", spin())
        specs.append(
            GovernedWorkload(
                workload_id="high",
                handle=high_h,
                gpu_uuids=(UUID,),
                compute_milli=(500,),
                priority=125,
                segment=high_seg,
            )
        )
        gov.update(specs)

        def state(wid: str) -> RunState:
            return next(v.state for v in gov.snapshot().workloads if v.workload_id == wid)

        wait_until(lambda: state("low") is RunState.FROZEN_BY_PRIORITY, "low paused")
        wait_until(lambda: low_seg.stats().inflight == 0, "low's launches drained")
        paused = machine.device_time()
        wait_until(  # high runs alone meanwhile: at least 100 ms of it
            lambda: machine.device_time()[high_h.pgid] > paused[high_h.pgid] + 100_000_000,
            "high on the GPU",
        )
        later = machine.device_time()
        assert later[low_h.pgid] == paused[low_h.pgid]
        machine.launcher.signal(high_h, 9)
        gov.update(specs[:1])
        wait_until(lambda: state("low") is RunState.RUNNING, "low resumed")
        wait_until(
            lambda: machine.device_time()[low_h.pgid] > later[low_h.pgid], "low on the GPU again"
        )
        kinds = [
            e.kind
            for e in gov.events.since(0)
            if e.workload_id == "low" and e.kind in ("paused", "resumed")
        ]
        assert kinds == ["paused", "resumed"]
    finally:
        gov.close()


def test_closing_the_governor_opens_every_gate(machine: Machine) -> None:
    gov = governor(GpuPolicy(mode=ComputeMode.STRICT))
    launched = [machine.launch(f"w{i}", spin()) for i in range(2)]
    gov.update(
        [
            GovernedWorkload(
                workload_id=f"w{i}", handle=h, gpu_uuids=(UUID,), compute_milli=(500,), segment=s
            )
            for i, (h, s) in enumerate(launched)
        ]
    )
    gov.start()
    for _, seg in launched:
        wait_until(active(seg), "launching")
    wait_until(lambda: any(s.stats().gate_closed for _, s in launched), "a gate closed by share")
    gov.close()
    assert not any(s.stats().gate_closed for _, s in launched)
