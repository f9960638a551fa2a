"""Helpers for the fake-driver tests (``test_fakecuda.py``): not a test module.

:class:`FakeGpus` is one test's fake machine: the fake driver's state file (a stand-in for
``libcuda.so.1`` / ``libnvidia-ml.so.1`` written for the tests keeps machine-wide state in
``FGPU_FAKE_GPU_STATE``, created from ``FGPU_FAKE_GPUS`` on first use), the environment of
its processes, and runners for fgpu-cudemo and ``fakecuda_probe.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MIB = 1 << 20
GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
TWO_GPUS = f"{GPU_A}=A100-80GB:1024,{GPU_B}=H100-80GB:2048"
PROBE = Path(__file__).with_name("fakecuda_probe.py")
RUN_TIMEOUT_S = 300


class FakeGpus:
    """One test's fake machine: its state file and the environment of its processes.

    Args:
        native: the built native folder (``fgpu/_native`` layout).
        state: the state file (``FGPU_FAKE_GPU_STATE``); created on first use.
        gpus: ``FGPU_FAKE_GPUS`` (``UUID=MODEL:MIB,...``).
    """

    def __init__(self, native: Path, state: Path, gpus: str) -> None:
        self.native = native
        self.state = state
        self.gpus = gpus

    def env(self, *, visible: str | None = None, **extra: str) -> dict[str, str]:
        """Environment for a process on the fake driver: inherited variables without any
        FGPU_ / CUDA_VISIBLE_DEVICES / LD_PRELOAD, plus the fake's, plus ``extra``."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("FGPU_", "LD_PRELOAD", "CUDA_VISIBLE_DEVICES"))
        }
        env["LD_LIBRARY_PATH"] = str(self.native / "fakecuda")
        env["FGPU_FAKE_GPU_STATE"] = str(self.state)
        env["FGPU_FAKE_GPUS"] = self.gpus
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        env.update(extra)
        return env

    @property
    def cudemo(self) -> Path:
        return self.native / "bin" / "fgpu-cudemo"

    def run(self, *args: str, env: dict[str, str] | None = None, ok: bool = True) -> dict[str, Any]:
        """Runs fgpu-cudemo; returns its last JSON line. ``ok``: exit status 0 required."""
        proc = subprocess.run(
            [str(self.cudemo), *args],
            env=env or self.env(),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        if ok:
            assert proc.returncode == 0, (
                f"{args}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
            )
        lines = proc.stdout.strip().splitlines()
        assert lines, f"{args}: no output; stderr: {proc.stderr}"
        out: dict[str, Any] = json.loads(lines[-1])
        out["_returncode"] = proc.returncode
        out["_stderr"] = proc.stderr
        return out

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Starts fgpu-cudemo with pipes (for hold and --ready)."""
        return subprocess.Popen(
            [str(self.cudemo), *args],
            env=env or self.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def probe(self, *args: str, env: dict[str, str] | None = None) -> Any:
        """Runs fakecuda_probe.py (ctypes on the fake libraries in a fresh process)."""
        proc = subprocess.run(
            [sys.executable, str(PROBE), *args],
            env=env or self.env(),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert proc.returncode == 0, f"probe {args}: exit {proc.returncode}\n{proc.stderr}"
        return json.loads(proc.stdout.strip().splitlines()[-1])
