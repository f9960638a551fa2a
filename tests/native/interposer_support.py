"""Helpers for the interposer tests (``test_interposer*.py``): not a test module.

- :class:`AgentLib`: ``libfgpu-agent.so`` through :mod:`ctypes` with the exact signatures
  the agent uses (create, open, gate, limits, sweep, snapshot);
- :func:`fake_env`: the environment of a process run against the fake driver (a stand-in
  for ``libcuda.so.1`` written for the tests), with or without the interposer;
- :data:`WORKER`: the path of ``interposer_worker.py``, a CUDA program in Python (ctypes)
  that reaches the driver through ``dlopen("libcuda.so.1")`` like the CUDA runtime does;
- :func:`unshare_pid` and :func:`in_new_pid_namespace`: run a process as pid 1 of a new pid
  namespace (a container's, as far as pids go), or skip where that cannot be done.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fgpu.agent.interposer.segment import Snapshot, agent_library

MAX_GPUS = 16
UUID_LEN = 96
GATE_OPEN = 0
GATE_CLOSED = 1
FLAG_MEMORY_CAP = 0x1
FLAG_GATING = 0x2
MIB = 1 << 20

WORKER = Path(__file__).with_name("interposer_worker.py")


class AgentLib:
    """``libfgpu-agent.so`` called directly, with the product's ctypes signatures
    (:func:`fgpu.agent.interposer.segment.agent_library`); one mapped segment per object."""

    def __init__(self, native: Path) -> None:
        lib = agent_library(native)  # the signatures fgpu.agent.interposer uses
        self.lib = lib
        self.seg: int | None = None

    def create(
        self,
        path: Path,
        uuids: list[str],
        limits: list[int],
        *,
        flags: int = FLAG_MEMORY_CAP | FLAG_GATING,
        max_inflight: int = 0,
        workload_id: str = "w-test",
    ) -> None:
        """Create the segment file and map it (``self.seg``)."""
        n = len(uuids)
        arr_u = (ctypes.c_char_p * n)(*(u.encode() for u in uuids))
        arr_l = (ctypes.c_uint64 * n)(*limits)
        rc = self.lib.fgpu_agent_create(
            str(path).encode(), workload_id.encode(), n, arr_u, arr_l, flags, max_inflight, -1, -1
        )
        if rc != 0:
            raise OSError(-rc, os.strerror(-rc), str(path))
        self.open(path)

    def open(self, path: Path) -> None:
        why = ctypes.create_string_buffer(512)
        seg = self.lib.fgpu_agent_open(str(path).encode(), why, len(why))
        if not seg:
            raise OSError(why.value.decode())
        self.seg = seg

    def close(self) -> None:
        if self.seg:
            self.lib.fgpu_agent_close(self.seg)
            self.seg = None

    def snapshot(self) -> Snapshot:
        snap = Snapshot()
        rc = self.lib.fgpu_agent_snapshot(self.seg, ctypes.byref(snap))
        assert rc == 0, rc
        return snap

    def set_gate(self, gate: int) -> None:
        assert self.lib.fgpu_agent_set_gate(self.seg, gate) == 0

    def beat(self) -> None:
        assert self.lib.fgpu_agent_beat(self.seg) == 0

    def set_max_inflight(self, n: int) -> None:
        assert self.lib.fgpu_agent_set_max_inflight(self.seg, n) == 0

    def set_memory_limit(self, gpu: int, limit: int) -> None:
        assert self.lib.fgpu_agent_set_memory_limit(self.seg, gpu, limit) == 0

    def sweep(self) -> int:
        return int(self.lib.fgpu_agent_sweep(self.seg))


def fake_env(
    native: Path,
    state: Path,
    gpus: str,
    *,
    seg: Path | None = None,
    preload: bool = True,
    **extra: str,
) -> dict[str, str]:
    """Environment for a process on the fake driver.

    Args:
        native: the built native folder (``fgpu/_native`` layout).
        state: the fake driver's shared state file (``FGPU_FAKE_GPU_STATE``).
        gpus: ``FGPU_FAKE_GPUS`` (``"GPU-uuid=A100-80GB:81920,..."``, MiB).
        seg: the segment (``FGPU_SEG``), or None for none.
        preload: put ``libfgpu.so`` in ``LD_PRELOAD``.
        extra: more variables (``FGPU_LOG="debug"``...).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FGPU_", "LD_PRELOAD"))}
    env["LD_LIBRARY_PATH"] = str(native / "fakecuda")
    env["FGPU_FAKE_GPU_STATE"] = str(state)
    env["FGPU_FAKE_GPUS"] = gpus
    if seg is not None:
        env["FGPU_SEG"] = str(seg)
    if preload:
        env["LD_PRELOAD"] = str(native / "libfgpu.so")
    env.update(extra)
    return env


def unshare_pid() -> str:
    """util-linux ``unshare``, once it has made a pid namespace here; skips the test with the
    reason otherwise (not installed, or no permission to make namespaces)."""
    path = shutil.which("unshare")
    if path is None:
        pytest.skip("util-linux unshare is not installed: no pid namespaces to test with")
    probe = subprocess.run(
        [*in_new_pid_namespace(path), "true"], capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a pid namespace here (unshare: {probe.stderr.strip()})")
    return path


def in_new_pid_namespace(unshare: str) -> list[str]:
    """The argv prefix that runs a program as pid 1 of a new pid namespace with its own
    ``/proc``; killing the unshare process kills it (``--kill-child``)."""
    return [unshare, "--pid", "--fork", "--mount-proc", "--kill-child"]
