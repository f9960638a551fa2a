"""libfgpu's tails (native/interposer/launch_ring.c): launches that join an open tail of their
stream get no event of their own, and what the agent reads stays right.

Against the fake driver (a stand-in for ``libcuda.so.1`` written for the tests) with
fgpu-cudemo: GPU time of short kernels in bursts counts the kernels and not the pauses
between the bursts (the program waits through an event of its own, which the interposer
does not see); under a bound on launches in flight, short kernels share an operation and
the bound still holds; a closed gate drains the open tails, so the agent sees nothing in
flight; the launches counter counts every launch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.native.interposer_support import GATE_CLOSED, GATE_OPEN, MIB, AgentLib, fake_env

from fgpu import native as fgpu_native

UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPUS = f"{UUID}=A100-80GB:81920"
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def native() -> Path:
    return fgpu_native.ensure_built()


@pytest.fixture
def seg(tmp_path: Path, native: Path) -> Iterator[tuple[AgentLib, Path]]:
    agent = AgentLib(native)
    path = tmp_path / "seg"
    agent.create(path, [UUID], [1024 * MIB])
    yield agent, path
    agent.close()


@pytest.fixture
def env(native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]) -> dict[str, str]:
    return fake_env(native, tmp_path / "fakegpu", GPUS, seg=seg[1])


def start(native: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(native / "bin" / "fgpu-cudemo"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> dict[str, object]:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    out: dict[str, object] = json.loads(stdout.strip().splitlines()[-1])
    return out


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def device_time(env: dict[str, str], pid: int) -> int:
    """The fake driver's own figure: fgpuFakeDeviceTime(uuid, pid), ns."""
    code = (
        "import ctypes\n"
        "lib = ctypes.CDLL('libcuda.so.1')\n"
        "ns = ctypes.c_ulonglong()\n"
        f"rc = lib.fgpuFakeDeviceTime(b'{UUID}', {pid}, ctypes.byref(ns))\n"
        "print(rc, ns.value)\n"
    )
    plain = {k: v for k, v in env.items() if k not in ("LD_PRELOAD", "FGPU_SEG")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=plain, capture_output=True, text=True, check=True
    )
    rc, ns = out.stdout.split()
    assert rc == "0", out.stdout
    return int(ns)


@pytest.mark.parametrize("max_inflight", [0, 2], ids=["unbounded", "bounded-2"])
def test_gpu_time_of_bursts_counts_the_kernels_not_the_pauses(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path], max_inflight: int
) -> None:
    agent, _ = seg
    agent.set_max_inflight(max_inflight)
    bursts, count, kernel_ns, idle_us = 6, 40, 200_000, 30_000
    args = ["bursts", str(kernel_ns), str(count), str(bursts), str(idle_us)]
    out = finish(start(native, env, *args))
    snap = agent.snapshot()
    measured = snap.gpus[0].gpu_time_ns
    truth = device_time(env, int(out["pid"]))  # type: ignore[call-overload]
    assert truth >= bursts * count * kernel_ns
    # the pauses (6 x 30 ms, about as long as the kernels) are not GPU time; the last tail of
    # a burst (at most about 1 ms of its 8) may be charged by the stream's latest measured
    # time per call, which varies with the machine's load
    assert abs(measured - truth) <= 0.15 * truth, (measured, truth)
    assert (snap.launches, snap.inflight) == (bursts * count, 0)


def test_short_kernels_under_a_bound_keep_within_it(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path]
) -> None:
    agent, _ = seg
    agent.set_max_inflight(2)
    proc = start(native, env, "spin", str(20_000), "600")
    seen: list[int] = []
    while proc.poll() is None:
        seen.append(agent.snapshot().inflight)
        time.sleep(0.0005)
    out = finish(proc)
    assert max(seen) <= 2, "a tail counts as one operation in flight"
    snap = agent.snapshot()
    assert (snap.launches, snap.inflight) == (600, 0)
    truth = device_time(env, int(out["pid"]))  # type: ignore[call-overload]
    assert abs(snap.gpus[0].gpu_time_ns - truth) <= 0.05 * truth, (snap.gpus[0].gpu_time_ns, truth)


def test_a_closed_gate_drains_the_open_tails(
    native: Path, env: dict[str, str], seg: tuple[AgentLib, Path]
) -> None:
    agent, _ = seg  # unbounded: launches join tails
    bursts, count = 3, 40
    # each burst ends waiting on the program's own event, which the interposer does not see,
    # so the burst's last tail stays open through the pause that follows it
    proc = start(native, env, "bursts", str(200_000), str(count), str(bursts), str(400_000))
    try:
        wait_for(lambda: agent.snapshot().launches > count, "the second burst")
        agent.set_gate(GATE_CLOSED)

        def held_and_drained() -> bool:
            agent.beat()  # the agent is alive: a silent one's gate would count as open
            snap = agent.snapshot()
            return bool(snap.waiting == 1 and snap.inflight == 0)

        wait_for(held_and_drained, "the program held at the gate with nothing in flight")
        launched = agent.snapshot().launches
        assert launched < bursts * count, "held before the end"
        agent.set_gate(GATE_OPEN)
        out = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out["launches"] == bursts * count
    snap = agent.snapshot()
    assert (snap.launches, snap.inflight, snap.waiting) == (bursts * count, 0, 0)


def test_a_closed_gate_drains_the_tails_of_another_context(native: Path, tmp_path: Path) -> None:
    other = "GPU-99999999-8888-7777-6666-555555555555"
    agent = AgentLib(native)
    path = tmp_path / "seg2"
    agent.create(path, [UUID, other], [1024 * MIB, 1024 * MIB])
    env = fake_env(native, tmp_path / "fakegpu2", f"{GPUS},{other}=A100-80GB:81920", seg=path)
    rounds, count = 3, 40
    # device 0's context, then device 1's, each burst ending on an event of the program's
    # own: when the program is held at the gate in one context, the other context's last
    # tail is still open and only the interposer can end it (with that context made current)
    proc = start(native, env, "ctx-bursts", str(200_000), str(count), str(rounds), "300000")
    try:
        wait_for(lambda: agent.snapshot().launches > 2 * count, "the second round")
        agent.set_gate(GATE_CLOSED)

        def held_and_drained() -> bool:
            agent.beat()
            snap = agent.snapshot()
            return bool(snap.waiting == 1 and snap.inflight == 0)

        wait_for(held_and_drained, "the program held at the gate with nothing in flight")
        agent.set_gate(GATE_OPEN)
        out = finish(proc)
        snap = agent.snapshot()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        agent.close()
    assert out["launches"] == 2 * rounds * count
    assert (snap.launches, snap.inflight, snap.waiting) == (2 * rounds * count, 0, 0)
