"""libfgpu under AddressSanitizer and UndefinedBehaviorSanitizer.

Everything (interposer, fake driver, fgpu-cudemo) is built once with ``sanitize=True`` into a
temporary folder, and a subset runs with the ASan runtime preloaded first (an instrumented
preload needs it ahead of itself): allocations against the cap on both paths, a kill -9
swept by the next process that needs the memory, a sweep that must leave a live process of
another pid namespace alone, and launches held at a closed gate. Any
sanitizer report fails the test (halt_on_error), and stderr must not mention one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.native.interposer_support import (
    GATE_CLOSED,
    GATE_OPEN,
    MIB,
    AgentLib,
    fake_env,
    in_new_pid_namespace,
    unshare_pid,
)

from fgpu import native as fgpu_native

UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPUS = f"{UUID}=A100-80GB:81920"
CAP = 1024 * MIB
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def asan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fgpu_native.ensure_built(sanitize=True, out_dir=tmp_path_factory.mktemp("asan"))


def asan_runtime() -> str:
    out = subprocess.run(
        [os.environ.get("CC", "cc"), "-print-file-name=libasan.so"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert os.path.isabs(out), f"the compiler knows no libasan.so: {out!r}"
    return out


@pytest.fixture
def seg(tmp_path: Path) -> Iterator[tuple[AgentLib, Path]]:
    # the test process is not instrumented: it reads the segment with the normal agent library
    agent = AgentLib(fgpu_native.ensure_built())
    path = tmp_path / "seg"
    agent.create(path, [UUID], [CAP])
    yield agent, path
    agent.close()


@pytest.fixture
def env(asan_dir: Path, tmp_path: Path, seg: tuple[AgentLib, Path]) -> dict[str, str]:
    e = fake_env(asan_dir, tmp_path / "fakegpu", GPUS, seg=seg[1])
    e["LD_PRELOAD"] = f"{asan_runtime()}:{asan_dir / 'libfgpu.so'}"
    e["ASAN_OPTIONS"] = "halt_on_error=1:detect_leaks=1"
    e["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    return e


def cudemo(native: Path, env: dict[str, str], *args: str) -> dict[str, object]:
    proc = subprocess.run(
        [str(native / "bin" / "fgpu-cudemo"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Sanitizer" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_sanitized_caps_sweep_and_gate(
    asan_dir: Path, env: dict[str, str], seg: tuple[AgentLib, Path]
) -> None:
    agent, _ = seg
    for path in ([], ["--dlopen"]):
        for api in ("mem", "pitch", "vmm", "array3d", "graph", "pool"):
            over = cudemo(asan_dir, env, *path, "alloc", api, str(CAP + MIB))
            assert over["error"] == "CUDA_ERROR_OUT_OF_MEMORY", (path, api)
            fits = cudemo(asan_dir, env, *path, "alloc", api, str(300 * MIB))
            assert fits["error"] == "CUDA_SUCCESS", (path, api)
    assert agent.snapshot().gpus[0].memory_reserved == 0

    # kill -9: the next process that needs the memory sweeps the dead one
    holder = subprocess.Popen(
        [str(asan_dir / "bin" / "fgpu-cudemo"), "hold", str(800 * MIB)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    held = json.loads(holder.stdout.readline())
    assert held["error"] == "CUDA_SUCCESS"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert agent.snapshot().gpus[0].memory_reserved == 800 * MIB
    again = cudemo(asan_dir, env, "alloc", "mem", str(800 * MIB))
    assert again["error"] == "CUDA_SUCCESS"
    assert agent.snapshot().gpus[0].memory_reserved == 0

    # launches wait at a closed gate, go when it opens; bounded in flight
    agent.set_max_inflight(2)
    agent.set_gate(GATE_CLOSED)
    base = agent.snapshot().launches  # the graph allocations above launched graphs
    proc = subprocess.Popen(
        [str(asan_dir / "bin" / "fgpu-cudemo"), "spin", str(1_000_000), "10", "--stream"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while agent.snapshot().waiting != 1:
            agent.beat()
            assert time.monotonic() < deadline, "the launcher never waited at the gate"
            time.sleep(0.005)
        assert agent.snapshot().launches == base
        agent.set_gate(GATE_OPEN)
        stdout, stderr = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Sanitizer" not in stderr, stderr
    assert proc.returncode == 0, stderr
    assert json.loads(stdout.strip().splitlines()[-1])["launches"] == 10
    snap = agent.snapshot()
    assert (snap.launches, snap.inflight, snap.waiting) == (base + 10, 0, 0)


def test_sanitized_sweep_leaves_another_pid_namespace_alone(
    asan_dir: Path, env: dict[str, str], seg: tuple[AgentLib, Path], tmp_path: Path
) -> None:
    agent, _ = seg
    unshare = unshare_pid()
    # the holder is pid 1 of its own namespace (its own fake-driver state: its own memory)
    holder_env = {**env, "FGPU_FAKE_GPU_STATE": str(tmp_path / "fakegpu-holder")}
    holder = subprocess.Popen(
        [
            *in_new_pid_namespace(unshare),
            str(asan_dir / "bin" / "fgpu-cudemo"),
            "hold",
            str(800 * MIB),
        ],
        env=holder_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line, holder.stderr.read() if holder.stderr is not None else "no output"
        assert json.loads(line)["error"] == "CUDA_SUCCESS"
        # over the cap: this process sweeps, and must not take the holder's 800 MiB
        over = cudemo(asan_dir, env, "alloc", "mem", str(300 * MIB))
        assert over["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
        assert agent.snapshot().gpus[0].memory_reserved == 800 * MIB
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("rule", ["names", "pointers"])
def test_sanitized_procaddr_rules(asan_dir: Path, env: dict[str, str], rule: str) -> None:
    # the driver's rule over the generated table, in the interposer and in the fake driver
    out = cudemo(asan_dir, {**env, "FGPU_PROCADDR": rule}, "procaddr")
    assert out["mismatches"] == []
    assert out["ok"] == out["checked"]


def test_sanitized_graph_capture_heap_and_context_roads(
    asan_dir: Path, env: dict[str, str], seg: tuple[AgentLib, Path]
) -> None:
    agent, _ = seg

    def cupaths(*args: str) -> dict[str, object]:
        proc = subprocess.run(
            [str(asan_dir / "bin" / "fgpu-cupaths"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert "Sanitizer" not in proc.stderr, proc.stderr
        assert proc.returncode == 0, proc.stderr
        out: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
        return out

    for path in ([], ["--dlopen"]):
        for road, inst in (
            ("addnode", "params"),
            ("capture", "upload"),
            ("allocnode", "legacy"),
            ("child", "flags"),
        ):
            over = cupaths(*path, "graph", road, inst, str(CAP + MIB), "free")
            assert over["inst_error"] == "CUDA_ERROR_OUT_OF_MEMORY", (path, road, over)
            fits = cupaths(*path, "graph", road, inst, str(300 * MIB), "keep")
            assert fits["free_launched"] == CAP - 300 * MIB, (path, road, fits)
            assert fits["free_after"] == CAP, (path, road, fits)
        heap = cupaths(*path, "heap", str(300 * MIB), str(MIB))
        assert heap["free_set"] == CAP - 300 * MIB, heap
        assert heap["free_reset"] == CAP, heap
        for mode in ("reset", "release", "destroy"):
            ended = cupaths(*path, "ctx", mode, str(700 * MIB))
            assert ended["again_error"] == "CUDA_SUCCESS", (path, mode, ended)
        assert cupaths(*path, "totalmem")["total_mem"] == CAP
    assert agent.snapshot().gpus[0].memory_reserved == 0
