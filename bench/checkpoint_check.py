"""Step 8 of ``bench/gpu_check.py`` (issue 28): suspend a PyTorch training process to host
memory through the CUDA checkpoint API and restore it, on a lent GPU.

A small training process (:data:`TRAIN`: a three-layer MLP on fixed random data, Adam, one
JSON line ``{"step", "loss", "t"}`` per step to a file, plus a ballast tensor of a stated
size filled with a pattern, so that the copy moves a known amount) runs on the GPU. From
outside, :func:`round_trip` locks and checkpoints it through
:class:`fgpu.agent.checkpoint.Suspender` (device memory to host memory), measures the copy
time and the GPU memory in use through NVML (it must fall by about the process's memory),
checks that no step is written while it is checkpointed, restores and unlocks it, and
checks that the memory is back and the steps go on. :func:`loss_continues` then says whether
the loss continued from where it was (not reset: the process was not restarted) and kept
going down; the process checks its ballast at its end.

It skips, saying why (:func:`skip_reason`), without a GPU (NVML not loadable or no device),
without PyTorch with CUDA, on a driver below r570 (the checkpoint API came with CUDA 12.8,
driver r570), or where ``libcuda.so.1`` lacks the API. The same :func:`round_trip` runs in
the tests against fgpu's fake driver with a non-PyTorch worker
(``tests/native/test_checkpoint_check.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fgpu.agent.checkpoint import CheckpointDriver, Suspender

CHECKPOINT_API_DRIVER = 570
"""The first driver branch with ``cuCheckpointProcess*`` (CUDA 12.8)."""

TRAIN = textwrap.dedent(
    """
    import json, sys, time, torch
    progress, steps, ballast_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    x = torch.randn(4096, 256, device="cuda")
    y = torch.randn(4096, 1, device="cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 1),
    ).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ballast = torch.full((ballast_mib * 2**20,), 7, dtype=torch.uint8, device="cuda")
    with open(progress, "a", buffering=1) as out:
        for step in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            record = {"step": step, "loss": loss.item(), "t": time.monotonic()}
            out.write(json.dumps(record) + "\\n")
            time.sleep(0.02)
    print(json.dumps({"ballast_intact": bool((ballast == 7).all().item())}))
    """
)


def driver_branch(version: str | None) -> int | None:
    """The branch of an NVIDIA driver version (``"570.86.15"`` -> 570); None if unreadable."""
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def skip_reason(
    gpu_error: str | None, torch_cuda: str | None, driver_version: str | None, probe_error: str
) -> str | None:
    """Why the step cannot run here, or None.

    Args:
        gpu_error: why NVML found no GPU (None: it found one).
        torch_cuda: None when PyTorch with CUDA runs here, else what failed.
        driver_version: NVML's driver version string.
        probe_error: :func:`fgpu.agent.checkpoint.probe`'s reason ("" when the API is there).
    """
    if gpu_error is not None:
        return f"no GPU: {gpu_error}"
    if torch_cuda is not None:
        return f"no PyTorch with CUDA: {torch_cuda}"
    branch = driver_branch(driver_version)
    if branch is not None and branch < CHECKPOINT_API_DRIVER:
        return (
            f"driver {driver_version} is below r{CHECKPOINT_API_DRIVER}: no CUDA checkpoint "
            "API (CUDA 12.8 and later)"
        )
    if probe_error:
        return f"no checkpoint API: {probe_error}"
    return None


def torch_cuda_problem(python: str = sys.executable) -> str | None:
    """None when ``python`` imports torch and sees a CUDA device, else why not."""
    done = subprocess.run(
        [python, "-c", "import torch; assert torch.cuda.is_available(), 'no CUDA device'"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def read_progress(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of a progress file (a half-written last line is left out)."""
    if not path.exists():
        return []
    out: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def _wait(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.05)


def round_trip(
    driver: CheckpointDriver,
    pid: int,
    progress: Callable[[], list[dict[str, Any]]],
    used_mib: Callable[[], int],
    *,
    steps_before: int = 20,
    steps_after: int = 20,
    pause_s: float = 2.0,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Checkpoint process ``pid`` once it wrote ``steps_before`` steps, hold it
    ``pause_s`` seconds, restore it, and wait for ``steps_after`` more steps.

    Args:
        driver: the checkpoint API.
        pid: the CUDA process.
        progress: its progress records so far (one per step).
        used_mib: GPU memory in use now (MiB), measured from outside the process.

    Returns:
        ``copy_to_host_s`` and ``copy_to_device_s`` (the checkpoint and restore calls),
        ``suspend_total_s`` and ``restore_total_s``, the memory in use before, while
        checkpointed and after (``used_mib_*``), ``state_checkpointed`` (the driver's state
        then), ``steps_while_checkpointed`` (expected 0), ``resumed_at`` (the index of the
        first record written after the restore) and ``records``.

    Raises:
        TimeoutError: the process did not write its steps within ``timeout_s``.
        fgpu.agent.checkpoint.CheckpointError: the driver refused.
    """
    _wait(lambda: len(progress()) >= steps_before, "steps before the checkpoint", timeout_s)
    suspender = Suspender(driver)
    used_before = used_mib()
    suspended = suspender.suspend("train", [pid])
    state = driver.state(pid)
    used_checkpointed = used_mib()
    held_at = len(progress())
    time.sleep(pause_s)  # a benchmark's hold, not a test's wait
    steps_while = len(progress()) - held_at
    restored = suspender.restore("train", [pid])
    used_after = used_mib()
    resumed_at = len(progress())
    _wait(
        lambda: len(progress()) >= resumed_at + steps_after,
        "steps after the restore",
        timeout_s,
    )
    return {
        "copy_to_host_s": suspended.copy_s,
        "suspend_total_s": suspended.total_s,
        "copy_to_device_s": restored.copy_s,
        "restore_total_s": restored.total_s,
        "used_mib_before": used_before,
        "used_mib_checkpointed": used_checkpointed,
        "used_mib_after": used_after,
        "state_checkpointed": state,
        "steps_while_checkpointed": steps_while,
        "resumed_at": resumed_at,
        "records": progress(),
    }


def loss_continues(records: list[dict[str, Any]], resumed_at: int) -> dict[str, bool | None]:
    """Whether training went on after the restore as it was before it.

    ``steps_continue``: the first step after is the one after the last before (the process
    was not restarted); ``loss_not_reset``: the first loss after is below the first loss of
    the run and within 5 % of the last before; ``loss_keeps_going_down``: the mean of the
    last five losses after is below the mean of the first five after. Loss checks are None
    for records without a loss (the fake driver's worker)."""
    before, after = records[:resumed_at], records[resumed_at:]
    if not before or not after:
        return {"steps_continue": False, "loss_not_reset": None, "loss_keeps_going_down": None}
    steps = after[0].get("step") == before[-1].get("step", -2) + 1
    if "loss" not in before[0] or "loss" not in after[0]:
        return {"steps_continue": steps, "loss_not_reset": None, "loss_keeps_going_down": None}
    first, last_before, first_after = before[0]["loss"], before[-1]["loss"], after[0]["loss"]
    head = [r["loss"] for r in after[:5]]
    tail = [r["loss"] for r in after[-5:]]
    return {
        "steps_continue": steps,
        "loss_not_reset": first_after < first and first_after <= last_before * 1.05,
        "loss_keeps_going_down": sum(tail) / len(tail) < sum(head) / len(head),
    }


def checkpoint_training(
    workdir: Path,
    uuid: str,
    used_mib: Callable[[], int],
    driver: CheckpointDriver,
    *,
    ballast_mib: int = 4096,
    python: str = sys.executable,
) -> dict[str, Any]:
    """Run :data:`TRAIN` on GPU ``uuid`` (``CUDA_VISIBLE_DEVICES``) and :func:`round_trip`
    it; the result adds :func:`loss_continues`, the process's own ballast check, the
    memory freed and given back (MiB) and the copy rates (GB/s of the ballast)."""
    import os

    progress = workdir / "ckpt-progress.jsonl"
    script = workdir / "ckpt_train.py"
    script.write_text(TRAIN)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}
    proc = subprocess.Popen(
        [python, str(script), str(progress), "200", str(ballast_mib)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out = round_trip(driver, proc.pid, lambda: read_progress(progress), used_mib)
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = stdout.strip().splitlines()
    out["ballast_intact"] = json.loads(lines[-1]).get("ballast_intact") if lines else None
    out["exit"] = proc.returncode
    if proc.returncode:
        out["stderr"] = stderr[-2000:]
    out.update(loss_continues(out["records"], out["resumed_at"]))
    out["freed_mib"] = out["used_mib_before"] - out["used_mib_checkpointed"]
    out["back_mib"] = out["used_mib_after"] - out["used_mib_checkpointed"]
    out["ballast_mib"] = ballast_mib
    for key, name in (("copy_to_host_s", "to_host_gb_s"), ("copy_to_device_s", "to_device_gb_s")):
        out[name] = ballast_mib * 2**20 / 1e9 / out[key] if out[key] > 0 else None
    records = out.pop("records")
    out["losses"] = [round(r["loss"], 6) for r in records if "loss" in r]
    out["expected"] = {
        "memory_freed": out["freed_mib"] >= ballast_mib * 0.9,
        "memory_back": out["back_mib"] >= ballast_mib * 0.9,
        "no_step_while_checkpointed": out["steps_while_checkpointed"] == 0,
        "steps_continue": out["steps_continue"],
        "loss_not_reset": out["loss_not_reset"],
        "loss_keeps_going_down": out["loss_keeps_going_down"],
        "ballast_intact": out["ballast_intact"],
    }
    return out


def nvml_used_mib(uuid: str) -> Callable[[], int]:
    """GPU ``uuid``'s memory in use (MiB) as NVML reports it (NVML initialised)."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)

    def used() -> int:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) // 2**20

    return used


def step(
    workdir: Path, uuid: str | None, gpu_error: str | None, driver_version: str | None
) -> dict[str, Any]:
    """Step 8 of gpu_check: ``{"skipped": reason}`` or :func:`checkpoint_training`'s
    result."""
    from fgpu.agent.checkpoint import probe

    torch_problem = None if gpu_error else torch_cuda_problem()
    driver, probe_error = (None, "") if gpu_error or torch_problem else probe("libcuda.so.1")
    why = skip_reason(gpu_error, torch_problem, driver_version, probe_error)
    if why is not None or driver is None or uuid is None:
        return {"skipped": why or "no checkpoint API"}
    return checkpoint_training(workdir, uuid, nvml_used_mib(uuid), driver)


__all__ = [
    "CHECKPOINT_API_DRIVER",
    "TRAIN",
    "checkpoint_training",
    "driver_branch",
    "loss_continues",
    "nvml_used_mib",
    "read_progress",
    "round_trip",
    "skip_reason",
    "step",
    "torch_cuda_problem",
]
