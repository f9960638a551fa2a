"""libfgpu across processes: one shared cap, raced; fork, threads, exec and kill -9.

Real processes on the fake driver (a stand-in for libcuda.so.1 written for the tests), with
libfgpu.so preloaded. The worker (``interposer_worker.py``) reaches the driver like the CUDA
runtime: ``dlopen("libcuda.so.1")``, and with ``--procaddr`` every entry point through
``cuGetProcAddress_v2``. Reservations are read back with libfgpu-agent.so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.native.interposer_support import (
    MIB,
    WORKER,
    AgentLib,
    fake_env,
)

from fgpu import native as fgpu_native

UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPUS = f"{UUID}=A100-80GB:81920"
DEADLINE_S = 60.0
CAP_BYTES = 1024 * MIB


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


def env_for(native: Path, tmp_path: Path, seg_path: Path | None, **extra: str) -> dict[str, str]:
    env = fake_env(native, tmp_path / "fakegpu", GPUS, seg=seg_path, **extra)
    env["FGPU_TEST_NATIVE"] = str(native)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), *sys.path])
    return env


def run_worker(env: dict[str, str], *args: str, procaddr: bool = False) -> dict[str, object]:
    argv = [sys.executable, str(WORKER), *(["--procaddr"] if procaddr else []), *args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def wait_for(cond, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("procaddr", [False, True], ids=["dlsym", "cuGetProcAddress_v2"])
def test_eight_processes_racing_never_pass_one_cap(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path], procaddr: bool
) -> None:
    agent, path = seg
    rounds, nproc, each = 200, 8, 300 * MIB  # cap 1024 MiB: 3 of 8 fit each round
    out = run_worker(
        env_for(native, tmp_path, path),
        "race",
        str(rounds),
        str(each),
        str(nproc),
        procaddr=procaddr,
    )
    assert out["exit"] == [0] * nproc
    rows = out["rounds"]
    assert isinstance(rows, list)
    assert [sum(1 for r in row if r == 1) for row in rows] == [3] * rounds
    assert all(r in (0, 1) for row in rows for r in row), "refusals are CUDA_ERROR_OUT_OF_MEMORY"
    snap = agent.snapshot()
    assert snap.gpus[0].memory_peak <= 1024 * MIB
    assert snap.gpus[0].memory_peak == 3 * each
    assert snap.gpus[0].oom_count == rounds * (nproc - 3)
    assert snap.gpus[0].oom_last_bytes == each
    assert snap.gpus[0].memory_reserved == 0, "every process gave its memory back"
    assert snap.processes == nproc


def test_threads_give_everything_back(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    agent, path = seg
    out = run_worker(env_for(native, tmp_path, path), "threads", "8", "200", str(200 * MIB))
    assert out["errors"] == []
    assert out["reserved"] == 0
    assert out["peak"] <= 1024 * MIB
    assert agent.snapshot().live_processes == 0, "the entry was given back at exit"


def test_fork_children_neither_take_nor_give_back_the_parents_memory(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    _, path = seg
    out = run_worker(env_for(native, tmp_path, path), "fork", str(100 * MIB))
    assert out["before"]["reserved"] == 100 * MIB
    assert out["after_children"]["reserved"] == 100 * MIB
    assert out["after_children"]["live"] == 1
    assert out["end"]["reserved"] == 0


def test_exec_reclaims_the_previous_image(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    agent, path = seg
    out = run_worker(env_for(native, tmp_path, path), "exec", str(600 * MIB), str(700 * MIB))
    # 600 + 700 would pass the 1024 MiB cap: the new image got its old entry back first
    assert out["rc"] == 0
    assert out["reserved"] == 700 * MIB
    assert out["live"] == 1
    assert agent.snapshot().processes == 1, "the same entry, not a second one"


def test_exec_into_a_program_without_cuda_gives_back_at_load(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    out = run_worker(env_for(native, tmp_path, path := seg[1]), "exec-quiet", str(600 * MIB))
    assert path.exists()
    assert out["reserved"] == 0, "the old image's 600 MiB were given back when libfgpu loaded"
    assert out["live"] == 1, "the entry stays with the process"


def start_holder(env: dict[str, str], nbytes: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), "hold", str(nbytes)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr is not None else "no output"
    assert json.loads(line) == {"ready": 0}
    return proc


def test_kill_9_is_swept_by_the_agent_once(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    agent, path = seg
    env = env_for(native, tmp_path, path)
    holder = start_holder(env, 700 * MIB)
    assert agent.snapshot().gpus[0].memory_reserved == 700 * MIB
    assert agent.sweep() == 0, "a live process keeps its memory"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert agent.sweep() == 700 * MIB
    assert agent.sweep() == 0
    snap = agent.snapshot()
    assert (snap.gpus[0].memory_reserved, snap.live_processes) == (0, 0)


def test_kill_9_is_swept_by_the_next_process_that_needs_the_memory(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    agent, path = seg
    env = env_for(native, tmp_path, path)
    holder = start_holder(env, 700 * MIB)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert agent.snapshot().gpus[0].memory_reserved == 700 * MIB
    out = run_worker(env, "alloc", str(700 * MIB))  # fits only once the dead one is swept
    assert out["rc"] == 0
    assert out["reserved"] == 700 * MIB
    assert agent.snapshot().gpus[0].oom_count == 0


def test_a_refused_process_sees_out_of_memory_and_the_event_is_counted(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    agent, path = seg
    env = env_for(native, tmp_path, path)
    holder = start_holder(env, 700 * MIB)
    try:
        out = run_worker(env, "alloc", str(400 * MIB))
        assert out["rc"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
        snap = agent.snapshot()
        assert (snap.gpus[0].oom_count, snap.gpus[0].oom_last_bytes) == (1, 400 * MIB)
        assert snap.gpus[0].memory_reserved == 700 * MIB
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("procaddr", [False, True], ids=["dlsym", "cuGetProcAddress_v2"])
def test_destroying_a_context_gives_back_what_it_held(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path], procaddr: bool
) -> None:
    _, path = seg
    out = run_worker(
        env_for(native, tmp_path, path), "ctxdestroy", str(300 * MIB), procaddr=procaddr
    )
    assert out["held"]["reserved"] == 300 * MIB  # type: ignore[index]
    assert out["after"]["reserved"] == 0  # type: ignore[index]


def test_real_libcuda_path_is_used_when_the_loader_cannot_find_the_driver(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    agent, path = seg
    env = env_for(native, tmp_path, path)
    del env["LD_LIBRARY_PATH"]  # dlopen("libcuda.so.1") alone would fail here
    env["FGPU_REAL_LIBCUDA"] = str(native / "fakecuda" / "libcuda.so.1")
    out = run_worker(env, "alloc", str(2048 * MIB))
    assert out["rc"] == 2, "reached the driver named by FGPU_REAL_LIBCUDA, through the hooks"
    assert agent.snapshot().gpus[0].oom_count == 1


def test_concurrent_sweeps_give_each_dead_process_back_exactly_once(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    agent, path = seg
    env = env_for(native, tmp_path, path)
    survivor = start_holder(env, 200 * MIB)
    doomed = [start_holder(env, 100 * MIB) for _ in range(6)]
    try:
        assert agent.snapshot().gpus[0].memory_reserved == 800 * MIB
        for p in doomed:
            p.send_signal(signal.SIGKILL)
        for p in doomed:
            p.wait()
        # four processes that each need 700 MiB sweep while the agent sweeps too
        racers = [
            subprocess.Popen(
                [sys.executable, str(WORKER), "alloc", str(700 * MIB)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        swept = 0
        while any(r.poll() is None for r in racers):
            swept += agent.sweep()
        swept += agent.sweep()
        for r in racers:
            assert r.returncode == 0, r.stderr.read() if r.stderr else ""
        assert swept <= 600 * MIB
        snap = agent.snapshot()
        # a dead process given back twice would take the survivor's 200 MiB down with it
        assert snap.gpus[0].memory_reserved == 200 * MIB
        assert snap.live_processes == 1
        assert snap.gpus[0].memory_peak <= CAP_BYTES
    finally:
        survivor.kill()
        survivor.wait()
