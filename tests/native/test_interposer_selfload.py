"""The dlopen route does not deadlock when the driver dlopens itself while it loads.

``selfload/libcuda.so.1`` is a test stand-in: the fake driver (itself a stand-in for
``libcuda.so.1``) with a constructor that dlopens its own absolute path and then
``libcuda.so.1``. A program that dlopens the driver through ``libfgpu.so`` used to hang for
ever: the route loaded the driver inside a ``pthread_once`` and the driver's own dlopen asked
the route again, on that same once. The processes run with a generous deadline: a hang is a
failure, never a slow pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.native.interposer_support import MIB, WORKER, AgentLib, fake_env

from fgpu import native as fgpu_native

UUID = "GPU-11111111-2222-3333-4444-555555555555"
GPUS = f"{UUID}=A100-80GB:81920"
CAP = 1024 * MIB
DEADLINE_S = 120
CUDA_ERROR_OUT_OF_MEMORY = 2


@pytest.fixture(scope="module")
def native() -> Path:
    return fgpu_native.ensure_built()


@pytest.fixture
def seg(tmp_path: Path, native: Path) -> Iterator[tuple[AgentLib, Path]]:
    agent = AgentLib(native)
    path = tmp_path / "seg"
    agent.create(path, [UUID], [CAP])
    yield agent, path
    agent.close()


def selfload_env(native: Path, tmp_path: Path, seg: Path) -> dict[str, str]:
    driver = native / "selfload" / "libcuda.so.1"
    env = fake_env(native, tmp_path / "fakegpu", GPUS, seg=seg)
    env["LD_LIBRARY_PATH"] = str(driver.parent)
    env["FGPU_REAL_LIBCUDA"] = str(driver)
    return env


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail("the process hung: the dlopen route deadlocked on the driver's own dlopen")


def selfload_lines(stderr: str) -> list[str]:
    """What the stand-in's constructor said: it really opened itself by path and by name."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("fgpu-selfload:")]
    assert lines, stderr
    assert all("failed" not in ln and "same yes" in ln for ln in lines), lines
    return lines


def test_a_driver_that_dlopens_itself_while_loading_does_not_hang_the_route(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    # a program that does not link the driver: its dlopen("libcuda.so.1") is the first
    # load, made by the route inside its pthread_once (what the CUDA runtime does)
    env = {**selfload_env(native, tmp_path, seg[1]), "FGPU_TEST_NATIVE": str(native)}
    proc = run([sys.executable, str(WORKER), "alloc", str(CAP + MIB)], env)
    assert proc.returncode == 0, proc.stderr
    selfload_lines(proc.stderr)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rc"] == CUDA_ERROR_OUT_OF_MEMORY, "the driver reached by the route is capped"
    assert out["oom_count"] == 1


def test_a_linked_program_on_that_driver_is_capped_on_both_roads(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    env = selfload_env(native, tmp_path, seg[1])
    for args in (["--dlopen"], []):
        proc = run([str(native / "bin" / "fgpu-cupaths"), *args, "ctx", "reset", "734003200"], env)
        assert proc.returncode == 0, proc.stderr
        selfload_lines(proc.stderr)
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["alloc_error"] == out["again_error"] == "CUDA_SUCCESS", out
        assert out["free_allocated"] == CAP - 700 * MIB


def test_the_driver_opened_through_the_route_is_hooked_and_capped(
    native: Path, tmp_path: Path, seg: tuple[AgentLib, Path]
) -> None:
    env = selfload_env(native, tmp_path, seg[1])
    proc = run([str(native / "bin" / "fgpu-cupaths"), "--dlopen", "totalmem"], env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["total_mem"] == CAP
