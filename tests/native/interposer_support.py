"""Helpers for the interposer tests (``test_interposer*.py``): not a test module.

- :class:`AgentLib`: ``libfgpu-agent.so`` through :mod:`ctypes` with the exact signatures
  the agent uses (create, open, gate, limits, sweep, snapshot);
- :func:`fake_env`: the environment of a process run against the fake driver (a stand-in
  for ``libcuda.so.1`` written for the tests), with or without the interposer;
- :data:`WORKER`: the path of ``interposer_worker.py``, a CUDA program in Python (ctypes)
  that reaches the driver through ``dlopen("libcuda.so.1")`` like the CUDA runtime does.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

MAX_GPUS = 16
UUID_LEN = 96
GATE_OPEN = 0
GATE_CLOSED = 1
FLAG_MEMORY_CAP = 0x1
FLAG_GATING = 0x2
MIB = 1 << 20

WORKER = Path(__file__).with_name("interposer_worker.py")


class AgentGpu(ctypes.Structure):
    """``struct fgpu_agent_gpu`` (native/interposer/agent.c)."""

    _fields_ = [
        ("uuid", ctypes.c_char * UUID_LEN),
        ("memory_limit", ctypes.c_uint64),
        ("memory_reserved", ctypes.c_uint64),
        ("memory_peak", ctypes.c_uint64),
        ("gpu_time_ns", ctypes.c_uint64),
        ("oom_count", ctypes.c_uint64),
        ("oom_last_bytes", ctypes.c_uint64),
    ]


class Snapshot(ctypes.Structure):
    """``struct fgpu_agent_snapshot`` (native/interposer/agent.c)."""

    _fields_ = [
        ("ngpus", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("gate", ctypes.c_uint32),
        ("max_inflight", ctypes.c_uint32),
        ("launches", ctypes.c_uint64),
        ("gate_waits", ctypes.c_uint64),
        ("last_launch_ns", ctypes.c_uint64),
        ("processes", ctypes.c_uint64),
        ("live_processes", ctypes.c_uint32),
        ("inflight", ctypes.c_uint32),
        ("waiting", ctypes.c_uint32),
        ("pad0", ctypes.c_uint32),
        ("gpus", AgentGpu * MAX_GPUS),
    ]


class AgentLib:
    """``libfgpu-agent.so`` with its ctypes signatures; one mapped segment per object."""

    def __init__(self, native: Path) -> None:
        lib = ctypes.CDLL(str(native / "libfgpu-agent.so"))
        lib.fgpu_agent_segment_size.argtypes = []
        lib.fgpu_agent_segment_size.restype = ctypes.c_uint32
        lib.fgpu_agent_snapshot_size.argtypes = []
        lib.fgpu_agent_snapshot_size.restype = ctypes.c_uint32
        lib.fgpu_agent_create.argtypes = [
            ctypes.c_char_p,  # path
            ctypes.c_char_p,  # workload_id
            ctypes.c_uint32,  # ngpus
            ctypes.POINTER(ctypes.c_char_p),  # uuids[ngpus]
            ctypes.POINTER(ctypes.c_uint64),  # limits[ngpus], bytes, 0 = no cap
            ctypes.c_uint32,  # flags
            ctypes.c_uint32,  # max_inflight
            ctypes.c_int32,  # uid (-1: keep)
            ctypes.c_int32,  # gid (-1: keep)
        ]
        lib.fgpu_agent_create.restype = ctypes.c_int
        lib.fgpu_agent_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.fgpu_agent_open.restype = ctypes.c_void_p
        lib.fgpu_agent_close.argtypes = [ctypes.c_void_p]
        lib.fgpu_agent_close.restype = ctypes.c_int
        lib.fgpu_agent_set_gate.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        lib.fgpu_agent_set_gate.restype = ctypes.c_int
        lib.fgpu_agent_set_max_inflight.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        lib.fgpu_agent_set_max_inflight.restype = ctypes.c_int
        lib.fgpu_agent_set_memory_limit.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_uint64,
        ]
        lib.fgpu_agent_set_memory_limit.restype = ctypes.c_int
        lib.fgpu_agent_beat.argtypes = [ctypes.c_void_p]
        lib.fgpu_agent_beat.restype = ctypes.c_int
        lib.fgpu_agent_sweep.argtypes = [ctypes.c_void_p]
        lib.fgpu_agent_sweep.restype = ctypes.c_uint64
        lib.fgpu_agent_snapshot.argtypes = [ctypes.c_void_p, ctypes.POINTER(Snapshot)]
        lib.fgpu_agent_snapshot.restype = ctypes.c_int
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
