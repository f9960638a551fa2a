"""The CPU side of ``bench/gpu_check.py``'s ``runtime_paths`` step (it runs only on a GPU).

Here: ``native/tests/runtime_paths.cu`` builds with the toolkit's ``nvcc`` (skipped with the
reason where no toolkit is installed) into a program that refuses wrong arguments before any
CUDA call, and the judgement of its output flags every road that let memory through.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CAP = 4 << 30


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def test_runtime_program_builds_with_nvcc(gpu_check: ModuleType, tmp_path: Path) -> None:
    try:
        nvcc = gpu_check.find_nvcc()
    except FileNotFoundError as exc:
        pytest.skip(f"no CUDA toolkit here: {exc}")
    exe = gpu_check.build_runtime_program(tmp_path, nvcc)
    assert exe.exists()
    usage = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2
    assert "usage: runtime_paths CAP_BYTES" in usage.stderr
    if shutil.which("nm"):
        undefined = subprocess.run(
            ["nm", "-D", "--undefined-only", str(exe)], capture_output=True, text=True, check=True
        ).stdout
        # the runtime is linked in and loads the driver itself (dlopen), as on the GPU machine
        assert " cuInit" not in undefined
        assert "dlopen" in undefined


def test_a_failing_nvcc_is_an_error_naming_the_source(
    gpu_check: ModuleType, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeError, match=r"runtime_paths\.cu"):
        gpu_check.build_runtime_program(tmp_path, "false")


def capped_run() -> dict[str, Any]:
    """runtime_paths.cu's output where every road held the 4 GiB cap."""
    return {
        "runtime_version": 13000,
        "cap": CAP,
        "props": {"error": "cudaSuccess", "total_global_mem": CAP, "meminfo_total": CAP},
        "malloc": {"chunk": 256 << 20, "count": 15, "error": "cudaErrorMemoryAllocation"},
        "graph": {"over_error": "cudaErrorMemoryAllocation", "half_error": "cudaSuccess"},
        "capture": {
            "capture_error": "cudaSuccess",
            "alloc_error": "cudaSuccess",
            "instantiate_error": "cudaErrorMemoryAllocation",
        },
        "heap": {"over_error": "cudaErrorMemoryAllocation"},
        "reset": {"first_error": "cudaSuccess", "again_error": "cudaSuccess"},
    }


def test_every_expectation_holds_for_a_capped_run(gpu_check: ModuleType) -> None:
    held = gpu_check.runtime_expectations(capped_run(), CAP)
    assert len(held) == 8
    assert all(held.values()), held


@pytest.mark.parametrize(
    ("step", "key", "value", "expectation"),
    [
        ("props", "total_global_mem", 80 << 30, "total_global_mem_is_the_cap"),
        ("malloc", "count", 64, "malloc_stops_at_the_cap"),
        ("graph", "over_error", "cudaSuccess", "graph_past_the_cap_refused"),
        (
            "capture",
            "instantiate_error",
            "cudaSuccess",
            "captured_malloc_async_past_the_cap_refused",
        ),
        ("heap", "over_error", "cudaSuccess", "heap_limit_past_the_cap_refused"),
        ("reset", "again_error", "cudaErrorMemoryAllocation", "allocate_again_after_device_reset"),
    ],
)
def test_a_road_that_let_memory_through_is_flagged(
    gpu_check: ModuleType, step: str, key: str, value: object, expectation: str
) -> None:
    run = capped_run()
    run[step][key] = value
    held = gpu_check.runtime_expectations(run, CAP)
    assert held[expectation] is False
    assert sum(not v for v in held.values()) == 1, held


def test_a_run_that_died_holds_nothing(gpu_check: ModuleType) -> None:
    held = gpu_check.runtime_expectations({"exit": -11, "stderr": "Segmentation fault"}, CAP)
    assert not any(held.values())
