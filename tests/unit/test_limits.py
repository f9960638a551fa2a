"""launch_env: the framework and MPS limits given to a workload, and the PyTorch shim (run
against a stand-in ``torch`` package, since torch is not installed here)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fgpu.agent.limits import SHIM_DIR, GpuGrant, MpsSettings, launch_env


def grant(memory: int, device: int = 40960, compute: int = 500, uuid: str = "GPU-a") -> GpuGrant:
    return GpuGrant(uuid=uuid, device_memory_mib=device, memory_mib=memory, compute_milli=compute)


def test_shim_and_fractions_per_gpu() -> None:
    env = launch_env(
        [grant(20480), grant(4096, 81920, uuid="GPU-b"), grant(1, 3, uuid="GPU-c")],
        env={"PYTHONPATH": "/opt/mine"},
    )
    assert env == {
        "FGPU_TORCH_MEMORY_FRACTION": "0.500000,0.050000,0.333333",
        "PYTHONPATH": f"{SHIM_DIR}{os.pathsep}/opt/mine",
    }


def test_allocator_option_is_merged_and_keeps_a_smaller_user_value() -> None:
    grants = [grant(20480), grant(10240, uuid="GPU-b")]
    plain = launch_env(grants, torch_shim=False, torch_alloc_conf=True)
    assert plain == {"PYTORCH_ALLOC_CONF": "per_process_memory_fraction:0.250000"}

    mine = {"PYTORCH_ALLOC_CONF": "expandable_segments:True,per_process_memory_fraction:0.1"}
    merged = launch_env(grants, env=mine, torch_shim=False, torch_alloc_conf=True)
    assert merged == {
        "PYTORCH_ALLOC_CONF": "expandable_segments:True,per_process_memory_fraction:0.1"
    }

    alias = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    merged = launch_env(grants, env=alias, torch_shim=False, torch_alloc_conf=True)
    assert merged == {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,per_process_memory_fraction:0.250000"
    }


def test_mps_limits_per_client() -> None:
    env = launch_env(
        [grant(4096, compute=300), grant(4096, compute=300, uuid="GPU-b")],
        mps=MpsSettings(pipe_directory="/run/mps", log_directory="/var/log/mps"),
        torch_shim=False,
    )
    assert env == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M,1=4096M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PIPE_DIRECTORY": "/run/mps",
        "CUDA_MPS_LOG_DIRECTORY": "/var/log/mps",
    }


def test_no_grants_no_variables() -> None:
    assert launch_env([]) == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device_memory_mib": 0}, "device memory"),
        ({"memory_mib": 0}, "memory quota"),
        ({"memory_mib": 50000}, "memory quota"),
        ({"compute_milli": 0}, "compute share"),
    ],
    ids=["no-device-memory", "zero-quota", "quota-above-device", "zero-share"],
)
def test_grant_rejects_bad_figures(kwargs: dict[str, int], message: str) -> None:
    figures = {"uuid": "GPU-a", "device_memory_mib": 40960, "memory_mib": 1, "compute_milli": 1}
    figures.update(kwargs)
    with pytest.raises(ValueError, match=message):
        GpuGrant(**figures)  # type: ignore[arg-type]


FAKE_TORCH = '''
"""A stand-in for torch: CUDA initialises lazily and runs queued calls then."""
from . import cuda
'''
FAKE_CUDA = """
calls = []
_queued = []
_ready = False
def is_initialized():
    return _ready
def _lazy_call(fn):
    _queued.append(fn)
def _lazy_init():
    global _ready
    _ready = True
    for fn in _queued:
        fn()
def device_count():
    return 2
def set_per_process_memory_fraction(fraction, device=None):
    calls.append((fraction, device))
"""


def run_python(code: str, tmp_path: Path, fractions: str, extra_path: str = "") -> str:
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True, exist_ok=True)
    (fake / "torch" / "__init__.py").write_text(FAKE_TORCH)
    (fake / "torch" / "cuda.py").write_text(FAKE_CUDA)
    env = launch_env([grant(1), grant(1)], env={"PYTHONPATH": f"{fake}{extra_path}"})
    env["FGPU_TORCH_MEMORY_FRACTION"] = fractions
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip() + done.stderr.strip()


def test_shim_sets_the_fraction_when_cuda_starts(tmp_path: Path) -> None:
    code = """
        import torch
        print(torch.cuda.calls)
        torch.cuda._lazy_init()
        print(torch.cuda.calls)
    """
    out = run_python(code, tmp_path, "0.5,0.25")
    assert out.splitlines() == ["[]", "[(0.5, 0), (0.25, 1)]"]


def test_shim_does_not_import_torch_by_itself(tmp_path: Path) -> None:
    code = "import sys; print('torch' in sys.modules, 'sitecustomize' in sys.modules)"
    assert run_python(code, tmp_path, "0.5,0.25") == "False True"


def test_shim_ignores_a_malformed_fraction(tmp_path: Path) -> None:
    code = """
        import torch
        torch.cuda._lazy_init()
        print(torch.cuda.calls)
    """
    assert run_python(code, tmp_path, "0.5,2") == "[]"


def test_shim_runs_the_environments_own_sitecustomize(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS = True\n")
    code = "import builtins; print(getattr(builtins, 'THEIRS', False))"
    assert run_python(code, tmp_path, "0.5", extra_path=f"{os.pathsep}{theirs}") == "True"
