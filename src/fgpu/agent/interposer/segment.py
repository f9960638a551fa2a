"""The agent's side of a workload's interposer segment (``native/include/fgpu_seg.h``).

One segment per workload: a small file (normally under ``/dev/shm``) that the agent creates
before launch and every process of the workload maps through the interposer (``FGPU_SEG``).
The agent writes the workload's memory caps, its gate (may it launch now?), the bound on
launches in flight and a heartbeat; the interposers write their memory reservations, the GPU
time of their completed work and when they last launched.

:class:`Segment` maps the file and reads and writes it through a :mod:`ctypes` mirror of the
C layout (field offsets are checked against the C compiler's in the tests). Plain aligned
4- and 8-byte loads and stores are single-copy atomic on x86-64 and AArch64, which is all the
agent needs for the fields it writes alone (gate, limits, heartbeat) and for reading counters;
reclaiming the reservations of dead processes races with the interposers' own sweeps and
needs compare-and-swap, so :meth:`Segment.sweep` calls ``fgpu_agent_sweep`` in the native
agent library (the same C code the interposer uses).

Units: bytes for memory, nanoseconds of ``CLOCK_MONOTONIC`` for times.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0x55504746
VERSION = 1
MAX_GPUS = 16
MAX_PROCS = 128
ID_LEN = 64
UUID_LEN = 96
STALE_NS = 2_000_000_000
"""A gate closed by an agent silent for longer than this counts as open (``FGPU_SEG_STALE_NS``)."""

GATE_OPEN = 0
GATE_CLOSED = 1
FLAG_MEMORY_CAP = 0x1
FLAG_GATING = 0x2

_FUTEX_WAKE = 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}


class SegGpu(ctypes.Structure):
    """``struct fgpu_seg_gpu``."""

    _fields_ = [
        ("uuid", ctypes.c_char * UUID_LEN),
        ("memory_limit", ctypes.c_uint64),
        ("memory_reserved", ctypes.c_uint64),
        ("memory_peak", ctypes.c_uint64),
        ("gpu_time_ns", ctypes.c_uint64),
        ("oom_count", ctypes.c_uint64),
        ("oom_last_bytes", ctypes.c_uint64),
    ]


class SegProc(ctypes.Structure):
    """``struct fgpu_seg_proc``."""

    _fields_ = [
        ("pid", ctypes.c_int32),
        ("pad0", ctypes.c_uint32),
        ("start_ticks", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * MAX_GPUS),
        ("inflight", ctypes.c_uint32),
        ("waiting", ctypes.c_uint32),
    ]


class SegLayout(ctypes.Structure):
    """``struct fgpu_seg``."""

    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("ngpus", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("pad0", ctypes.c_uint32),
        ("workload_id", ctypes.c_char * ID_LEN),
        ("gate", ctypes.c_uint32),
        ("max_inflight", ctypes.c_uint32),
        ("last_launch_ns", ctypes.c_uint64),
        ("launches", ctypes.c_uint64),
        ("gate_waits", ctypes.c_uint64),
        ("processes", ctypes.c_uint64),
        ("agent_beat_ns", ctypes.c_uint64),
        ("gpus", SegGpu * MAX_GPUS),
        ("procs", SegProc * MAX_PROCS),
    ]


SIZE = ctypes.sizeof(SegLayout)


class SegmentError(RuntimeError):
    """A segment file that cannot be created or mapped, or is not an fgpu segment."""


@dataclass(frozen=True, slots=True)
class GpuStats:
    """One GPU of a workload as its segment shows it.

    Attributes:
        uuid: the GPU (or MIG instance) uuid.
        memory_limit: the cap, bytes (0: none).
        memory_reserved: bytes reserved now by the workload's live and unswept processes.
        memory_peak: the highest ``memory_reserved`` seen, bytes.
        gpu_time_ns: device time of the workload's completed gated work there, ns.
        oom_count: allocations the cap refused.
        oom_last_bytes: size of the last refused allocation, bytes.
    """

    uuid: str
    memory_limit: int
    memory_reserved: int
    memory_peak: int
    gpu_time_ns: int
    oom_count: int
    oom_last_bytes: int


@dataclass(frozen=True, slots=True)
class SegmentStats:
    """A workload's segment at one instant.

    Attributes:
        gate_closed: whether launches are held now.
        max_inflight: launches a process may have in flight (0: unbounded).
        last_launch_ns: ``CLOCK_MONOTONIC`` of its latest gated call, 0 before any.
        launches: gated calls that went to the driver.
        gate_waits: gated calls that had to wait at the gate.
        processes: processes that ever used the driver through the interposer.
        live_pids: pids holding an entry now.
        inflight: gated operations in flight, summed over the entries.
        waiting: threads held at the gate now, summed over the entries.
        gpus: per GPU, in ``CUDA_VISIBLE_DEVICES`` order.
    """

    gate_closed: bool
    max_inflight: int
    last_launch_ns: int
    launches: int
    gate_waits: int
    processes: int
    live_pids: tuple[int, ...]
    inflight: int
    waiting: int
    gpus: tuple[GpuStats, ...]

    @property
    def gpu_time_ns(self) -> int:
        """Device time charged to the workload: the most on any one of its GPUs (a workload on
        several GPUs runs on all at once), ns."""
        return max((g.gpu_time_ns for g in self.gpus), default=0)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


_LIBC: ctypes.CDLL | None = None
_AGENT: ctypes.CDLL | None = None
_LOAD = threading.Lock()


def _agent_lib() -> ctypes.CDLL:
    """The native agent library (``libfgpu-agent.so``), loaded once."""
    global _AGENT
    with _LOAD:
        if _AGENT is None:
            from fgpu.native import lib_dir

            path = lib_dir() / "libfgpu-agent.so"
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise SegmentError(f"cannot load {path}: {exc}") from exc
            lib.fgpu_agent_sweep.argtypes = [ctypes.c_void_p]
            lib.fgpu_agent_sweep.restype = ctypes.c_uint64
            _AGENT = lib
        return _AGENT


class Segment:
    """A mapped segment (see the module docstring). Thread-safe for the agent's own use.

    Create one with :meth:`create` (before the workload starts) or :meth:`open` (an existing
    file, e.g. after the agent restarted); :meth:`close` unmaps it and :meth:`remove` also
    deletes the file.
    """

    def __init__(self, path: Path, mapping: mmap.mmap) -> None:
        self.path = path
        self._map = mapping
        self._view = SegLayout.from_buffer(mapping)
        self._lock = threading.Lock()
        if self._view.magic != MAGIC or self._view.version != VERSION:
            raise SegmentError(f"{path}: not an fgpu segment of version {VERSION}")
        if self._view.size != SIZE:
            raise SegmentError(f"{path}: size {self._view.size} differs from {SIZE}")
        self.workload_id = self._view.workload_id.decode()
        self.uuids = tuple(self._view.gpus[i].uuid.decode() for i in range(self._view.ngpus))

    # -- life cycle ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: Path,
        workload_id: str,
        uuids: Sequence[str],
        memory_limits: Sequence[int],
        *,
        flags: int = FLAG_MEMORY_CAP | FLAG_GATING,
        max_inflight: int = 0,
        uid: int | None = None,
        gid: int | None = None,
    ) -> Segment:
        """Write a new segment file atomically (a temporary file renamed into place) and map it.

        Args:
            path: the file; its folder must exist.
            workload_id: the workload (at most 63 bytes).
            uuids: its GPUs in ``CUDA_VISIBLE_DEVICES`` order (1-16, each under 96 bytes).
            memory_limits: its cap on each GPU, bytes (0: none).
            flags: :data:`FLAG_MEMORY_CAP` and/or :data:`FLAG_GATING`.
            max_inflight: launches a process may keep in flight (0: unbounded).
            uid, gid: owner of the file (the workload's user; needs root to differ from ours).
                The file's mode is 0600: only that user (and root) can map it.

        Raises:
            ValueError: a bad argument (names the argument and the value).
            SegmentError: the file cannot be written.
        """
        if not 1 <= len(uuids) <= MAX_GPUS:
            raise ValueError(f"uuids: {len(uuids)} GPUs, need 1-{MAX_GPUS}")
        if len(memory_limits) != len(uuids):
            raise ValueError(
                f"memory_limits: {len(memory_limits)} values for {len(uuids)} GPUs",
            )
        wid = workload_id.encode()
        if not wid or len(wid) >= ID_LEN:
            raise ValueError(f"workload_id: {workload_id!r} must be 1-{ID_LEN - 1} bytes")
        layout = SegLayout()
        layout.magic, layout.version, layout.size = MAGIC, VERSION, SIZE
        layout.ngpus, layout.flags = len(uuids), flags
        layout.workload_id = wid
        layout.gate = GATE_OPEN
        layout.max_inflight = max_inflight
        layout.agent_beat_ns = time.monotonic_ns()
        for i, (uuid, limit) in enumerate(zip(uuids, memory_limits, strict=True)):
            raw = uuid.encode()
            if not raw or len(raw) >= UUID_LEN:
                raise ValueError(f"uuids: {uuid!r} must be 1-{UUID_LEN - 1} bytes")
            if limit < 0:
                raise ValueError(f"memory_limits: {limit} must not be negative")
            layout.gpus[i].uuid = raw
            layout.gpus[i].memory_limit = limit
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, bytes(layout))
                if uid is not None or gid is not None:
                    os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise SegmentError(f"cannot create segment {path}: {exc}") from exc
        return cls.open(path)

    @classmethod
    def open(cls, path: Path) -> Segment:
        """Map an existing segment.

        Raises:
            SegmentError: missing, unreadable, too small, or not an fgpu segment.
        """
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise SegmentError(f"cannot open segment {path}: {exc}") from exc
        try:
            if os.fstat(fd).st_size < SIZE:
                raise SegmentError(f"{path}: shorter than a segment ({SIZE} bytes)")
            mapping = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(path, mapping)

    def close(self) -> None:
        """Unmap (idempotent). The file stays."""
        with self._lock:
            if self._map.closed:
                return
            del self._view
            self._map.close()

    def remove(self) -> None:
        """Open the gate (nothing stays held), unmap and delete the file."""
        with contextlib.suppress(ValueError, AttributeError):
            self.set_gate(closed=False)
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    @property
    def closed(self) -> bool:
        return self._map.closed

    # -- the agent's writes -------------------------------------------------------------------

    def set_gate(self, *, closed: bool) -> None:
        """Hold (``closed=True``) or release the workload's launches. Opening wakes every
        thread waiting at the gate (``FUTEX_WAKE`` on the gate word)."""
        value = GATE_CLOSED if closed else GATE_OPEN
        with self._lock:
            view = self._view
            view.agent_beat_ns = time.monotonic_ns()
            if view.gate == value:
                return
            view.gate = value
            if not closed:
                self._wake(ctypes.addressof(view) + SegLayout.gate.offset)

    def beat(self) -> None:
        """Say the agent is alive (at least every second while a gate may be closed)."""
        with self._lock:
            self._view.agent_beat_ns = time.monotonic_ns()

    def set_max_inflight(self, value: int) -> None:
        """Launches each process may keep in flight (0: unbounded).

        Raises:
            ValueError: negative or over 2**31.
        """
        if not 0 <= value < 2**31:
            raise ValueError(f"max_inflight: {value} not in 0..2**31-1")
        with self._lock:
            self._view.max_inflight = value

    def sweep(self) -> int:
        """Give back the reservations of the workload's dead processes (kill -9 included).

        Returns:
            Bytes given back, over all GPUs.
        """
        with self._lock:
            return int(_agent_lib().fgpu_agent_sweep(ctypes.addressof(self._view)))

    @staticmethod
    def _wake(address: int) -> None:
        global _LIBC
        if _LIBC is None:
            _LIBC = _libc()
        number = _SYS_FUTEX.get(os.uname().machine)
        if number is None:
            return  # waiters poll the gate too (every few ms), so they still see it open
        _LIBC.syscall(
            ctypes.c_long(number),
            ctypes.c_void_p(address),
            ctypes.c_int(_FUTEX_WAKE),
            ctypes.c_int(2**31 - 1),
            None,
            None,
            ctypes.c_int(0),
        )

    # -- reads --------------------------------------------------------------------------------

    def stats(self) -> SegmentStats:
        """The segment now (see :class:`SegmentStats`)."""
        with self._lock:
            view = self._view
            pids: list[int] = []
            inflight = waiting = 0
            for proc in view.procs:
                if proc.pid > 0:
                    pids.append(proc.pid)
                    inflight += proc.inflight
                    waiting += proc.waiting
            gpus = tuple(
                GpuStats(
                    uuid=g.uuid.decode(),
                    memory_limit=g.memory_limit,
                    memory_reserved=g.memory_reserved,
                    memory_peak=g.memory_peak,
                    gpu_time_ns=g.gpu_time_ns,
                    oom_count=g.oom_count,
                    oom_last_bytes=g.oom_last_bytes,
                )
                for g in view.gpus[: view.ngpus]
            )
            return SegmentStats(
                gate_closed=view.gate != GATE_OPEN,
                max_inflight=view.max_inflight,
                last_launch_ns=view.last_launch_ns,
                launches=view.launches,
                gate_waits=view.gate_waits,
                processes=view.processes,
                live_pids=tuple(pids),
                inflight=inflight,
                waiting=waiting,
                gpus=gpus,
            )


__all__ = [
    "FLAG_GATING",
    "FLAG_MEMORY_CAP",
    "SIZE",
    "GpuStats",
    "Segment",
    "SegmentError",
    "SegmentStats",
]
