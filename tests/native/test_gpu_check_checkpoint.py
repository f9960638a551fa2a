"""The CPU side of ``bench/gpu_check.py``'s ``checkpoint_training`` step (issue 28; it trains
with PyTorch only on a lent GPU).

Here: the step skips with its reason (no GPU, no PyTorch, a driver below r570 or without the
checkpoint API) and writes it into the script's JSON; and its round trip (lock, checkpoint,
copy time, GPU memory freed and back through NVML, no step while checkpointed, steps going
on) runs against fgpu's fake driver and fake NVML with a CUDA worker that is not PyTorch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.native.fakecuda_support import GPU_A, FakeGpus

from fgpu.native import ensure_built

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "ckpt_worker.py"
sys.path.insert(0, str(ROOT / "bench"))

import checkpoint_check  # noqa: E402  (bench/checkpoint_check.py)

SKIPS = [
    # (NVML's error, PyTorch's, driver version, probe's error) -> reason starts with
    ("NVML: library not found", None, None, "", "no GPU: NVML: library not found"),
    (None, "ModuleNotFoundError: torch", "575.51", "", "no PyTorch with CUDA: Module"),
    (None, None, "550.54.15", "", "driver 550.54.15 is below r570: no CUDA checkpoint API"),
    (None, None, "570.86.15", "libcuda.so.1 has no cuCheckpoint", "no checkpoint API: libcuda"),
]


@pytest.mark.parametrize(("gpu", "torch", "driver", "probe", "reason"), SKIPS)
def test_the_step_says_why_it_skips(
    gpu: str | None, torch: str | None, driver: str | None, probe: str, reason: str
) -> None:
    got = checkpoint_check.skip_reason(gpu, torch, driver, probe)
    assert got is not None
    assert got.startswith(reason)


def test_it_runs_where_everything_is_there() -> None:
    assert checkpoint_check.skip_reason(None, None, "570.86.15", "") is None
    assert checkpoint_check.driver_branch("580.65.06") == 580
    assert checkpoint_check.driver_branch("unknown") is None


def test_without_a_gpu_the_json_says_the_step_was_skipped_and_why(tmp_path: Path) -> None:
    spec = subprocess.run(
        [sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], capture_output=True
    )
    if spec.returncode == 0:
        pytest.skip("NVML loads here: on a GPU machine the step runs for real")
    out = tmp_path / "gpu-check.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_check.py"),
            "--only",
            "checkpoint_training",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["checkpoint_training"]["skipped"].startswith("no GPU: NVML")
    assert set(result) == {
        "bench",
        "gpu",
        "driver",
        "skipped",
        "checkpoint_training",
        "total_seconds",
    }


def test_losses_that_continue_and_ones_that_were_reset() -> None:
    going = [{"step": i, "loss": 1.0 - 0.01 * i} for i in range(40)]
    assert checkpoint_check.loss_continues(going, 20) == {
        "steps_continue": True,
        "loss_not_reset": True,
        "loss_keeps_going_down": True,
    }
    restarted = going[:20] + [{"step": i, "loss": 1.0 - 0.01 * i} for i in range(20)]
    judged = checkpoint_check.loss_continues(restarted, 20)
    assert judged["steps_continue"] is False
    assert judged["loss_not_reset"] is False
    flat = going[:20] + [{"step": 20 + i, "loss": 0.8} for i in range(20)]
    assert checkpoint_check.loss_continues(flat, 20)["loss_keeps_going_down"] is False
    steps_only = [{"step": i} for i in range(10)]
    assert checkpoint_check.loss_continues(steps_only, 5) == {
        "steps_continue": True,
        "loss_not_reset": None,
        "loss_keeps_going_down": None,
    }


CONTROL = textwrap.dedent(
    """
    import json, subprocess, sys
    from pathlib import Path
    import pynvml
    import checkpoint_check
    from fgpu.agent.checkpoint import CheckpointDriver

    worker, progress, gpu = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    stop = progress.with_name("stop")
    driver = CheckpointDriver("libcuda.so.1")
    pynvml.nvmlInit()
    used = checkpoint_check.nvml_used_mib(gpu)
    with progress.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, worker, "256", "--until", str(stop), "--step-ms", "20"], stdout=out
        )
    try:
        def steps():
            return [r for r in checkpoint_check.read_progress(progress) if "step" in r]
        got = checkpoint_check.round_trip(
            driver, proc.pid, steps, used, steps_before=10, steps_after=10, pause_s=0.5
        )
        stop.touch()  # the worker stops after its step, checks its memory and exits
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    got["judged"] = checkpoint_check.loss_continues(got.pop("records"), got["resumed_at"])
    got["exit"] = proc.returncode
    got["last"] = checkpoint_check.read_progress(progress)[-1]
    print(json.dumps(got))
    """
)


def test_the_round_trip_against_the_fake_driver(tmp_path: Path) -> None:
    """The step's checkpoint and restore of a running CUDA process, on the fake driver (in a
    process of its own: the fake keeps its first state file): its 256 MiB leave the GPU in
    NVML's count and come back, no step runs while it is checkpointed, the steps go on after,
    and the worker finds its memory contents intact."""
    fake = FakeGpus(ensure_built(), tmp_path / "fakegpu.state", f"{GPU_A}=A100-80GB:1024")
    env = fake.env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "bench")])
    done = subprocess.run(
        [sys.executable, "-c", CONTROL, str(WORKER), str(tmp_path / "progress.jsonl"), GPU_A],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["used_mib_before"] == 256
    assert got["used_mib_checkpointed"] == 0
    assert got["used_mib_after"] == 256
    assert got["state_checkpointed"] == "checkpointed"
    assert got["steps_while_checkpointed"] == 0
    assert got["copy_to_host_s"] > 0
    assert got["copy_to_device_s"] > 0
    assert got["judged"]["steps_continue"] is True
    assert got["exit"] == 0
    assert got["last"] == {"intact": True}
