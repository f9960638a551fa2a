"""The agent's side of a workload's interposer segment (``native/include/fgpu_seg.h``).

One segment per workload, in two small files (under ``/run/fgpu`` as root) that the agent
creates before launch and every process of the workload maps through the interposer
(``FGPU_SEG`` names the first):

- the **control part** (``<path>.ctl``, :func:`control_path`): the workload's memory caps,
  its gate (may it launch now?), the bound on launches in flight and the agent's heartbeat.
  Owned by the agent's user, mode 0644: the workload maps it read-only and, running as
  another user, can neither open it for writing nor make its mapping writable (issue 27);
- the **workload part** (``<path>``, owned by the workload's user, mode 0600): the
  interposers' memory reservations, the GPU time of their completed work and when they last
  launched. The workload writes it, so the agent never trusts it for enforcement: the memory
  guard and the governor check what the driver (NVML) says of each process.

:class:`Segment` does all of it through ``libfgpu-agent.so`` (``native/interposer/agent.c``),
which is compiled from the same segment code as the interposer itself (``seg.c``): creating
the file, the gate's release store and futex wake, the sweep that reclaims the reservations
of dead processes exactly once (compare-and-swap, racing the interposers' own sweeps; each
judges only processes of a pid namespace it can see), and a snapshot of the counters.
Nothing here reads or writes the segment's bytes directly.

Units: bytes for memory, nanoseconds of ``CLOCK_MONOTONIC`` for times.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_GPUS = 16
MAX_PROCS = 128
ID_LEN = 64
UUID_LEN = 96
STALE_NS = 1_500_000_000
"""A gate closed by an agent silent for longer than this counts as open (``FGPU_SEG_STALE_NS``,
1.5 s: a held workload resumes within 2 s of the agent's death, with margin for the gate's
100 ms wait and the beat interval; ``bench/gate_resume.py`` measures it)."""

GATE_OPEN = 0
GATE_CLOSED = 1
FLAG_MEMORY_CAP = 0x1
FLAG_GATING = 0x2


class AgentGpu(ctypes.Structure):
    """``struct fgpu_agent_gpu`` (``native/interposer/agent.c``)."""

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
    """``struct fgpu_agent_snapshot`` (``native/interposer/agent.c``)."""

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


class AgentProc(ctypes.Structure):
    """``struct fgpu_agent_proc`` (``native/interposer/agent.c``)."""

    _fields_ = [
        ("pid", ctypes.c_int32),
        ("pad0", ctypes.c_uint32),
        ("start_ticks", ctypes.c_uint64),
        ("pidns_dev", ctypes.c_uint64),
        ("pidns_ino", ctypes.c_uint64),
    ]


@dataclass(frozen=True, slots=True)
class AttachedProcess:
    """A process that holds an entry of the segment: it claimed one through the interposer
    (at ``cuInit`` or its first gated call). The entries are in the workload's part, so this
    is the workload's own word.

    Attributes:
        pid: its pid in its own pid namespace.
        start_ticks: its start time, clock ticks after boot (``/proc/<pid>/stat`` field 22).
        pidns: ``(st_dev, st_ino)`` of its ``/proc/self/ns/pid``; ``(0, 0)`` when unknown.
    """

    pid: int
    start_ticks: int
    pidns: tuple[int, int]


CONTROL_SUFFIX = ".ctl"
"""The control part's file is the segment's path with this added (``FGPU_SEG_CTL_SUFFIX``)."""


def control_path(path: Path) -> Path:
    """The control part's file of the segment ``path``."""
    return path.with_name(path.name + CONTROL_SUFFIX)


class SegmentError(RuntimeError):
    """A segment file that cannot be created or mapped, or is not an fgpu segment."""


def agent_library(native_dir: Path | None = None) -> ctypes.CDLL:
    """``libfgpu-agent.so`` with its ctypes signatures (loaded once per folder).

    Functions return 0 or a negative errno unless said otherwise.

    Raises:
        SegmentError: the library is missing or does not load, or its snapshot layout is not
            :class:`Snapshot`'s.
    """
    if native_dir is None:
        from fgpu.native import lib_dir

        native_dir = lib_dir()
    path = native_dir / "libfgpu-agent.so"
    with _LOAD:
        lib = _LIBS.get(path)
        if lib is not None:
            return lib
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise SegmentError(f"cannot load {path}: {exc}") from exc
        u32, u64, ptr = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
        signatures: dict[str, tuple[list[object], object]] = {
            "fgpu_agent_segment_size": ([], u32),
            "fgpu_agent_snapshot_size": ([], u32),
            "fgpu_agent_create": (
                [
                    ctypes.c_char_p,  # path
                    ctypes.c_char_p,  # workload id
                    u32,  # ngpus
                    ctypes.POINTER(ctypes.c_char_p),  # uuids[ngpus]
                    ctypes.POINTER(u64),  # limits[ngpus], bytes, 0 = no cap
                    u32,  # flags
                    u32,  # max_inflight
                    ctypes.c_int32,  # uid (-1: keep)
                    ctypes.c_int32,  # gid (-1: keep)
                ],
                ctypes.c_int,
            ),
            # NULL, and the reason in the buffer, when the file is not a usable segment
            "fgpu_agent_open": ([ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t], ptr),
            "fgpu_agent_close": ([ptr], ctypes.c_int),
            "fgpu_agent_set_gate": ([ptr, u32], ctypes.c_int),
            "fgpu_agent_beat": ([ptr], ctypes.c_int),
            "fgpu_agent_set_max_inflight": ([ptr, u32], ctypes.c_int),
            "fgpu_agent_set_memory_limit": ([ptr, u32, u64], ctypes.c_int),
            "fgpu_agent_set_uuid": ([ptr, u32, ctypes.c_char_p], ctypes.c_int),
            "fgpu_agent_sweep": ([ptr], u64),  # bytes given back
            "fgpu_agent_snapshot": ([ptr, ctypes.POINTER(Snapshot)], ctypes.c_int),
            # held entries (may exceed max), or -errno
            "fgpu_agent_procs": ([ptr, ctypes.POINTER(AgentProc), u32], ctypes.c_int),
        }
        for name, (args, result) in signatures.items():
            function = getattr(lib, name)
            function.argtypes = args
            function.restype = result
        if lib.fgpu_agent_snapshot_size() != ctypes.sizeof(Snapshot):
            raise SegmentError(f"{path}: snapshot layout differs from fgpu's (rebuild it)")
        _LIBS[path] = lib
        return lib


_LIBS: dict[Path, ctypes.CDLL] = {}
_LOAD = threading.Lock()


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
    """A workload's segment at one instant (each counter read once; not one atomic instant).

    Attributes:
        gate_closed: whether launches are held now.
        max_inflight: operations (an entry of events or an open tail of launches, see
            native/interposer/README.md) a process may have in flight (0: unbounded).
        last_launch_ns: ``CLOCK_MONOTONIC`` of its latest gated call, at most one clock
            tick (1-4 ms) behind; 0 before any.
        launches: gated calls that went to the driver (a thread's calls that joined a tail
            without the lock are added at its next call that takes it, within a tick).
        gate_waits: gated calls that had to wait at the gate.
        processes: processes that ever used the driver through the interposer.
        live_processes: processes holding an entry now.
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
    live_processes: int
    inflight: int
    waiting: int
    gpus: tuple[GpuStats, ...]

    @property
    def gpu_time_ns(self) -> int:
        """Device time charged to the workload: the most on any one of its GPUs (a workload on
        several GPUs runs on all at once), ns."""
        return max((g.gpu_time_ns for g in self.gpus), default=0)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise SegmentError(f"{what}: {os.strerror(-rc)}")


class Segment:
    """A mapped segment (see the module docstring). Thread-safe for the agent's own use.

    Create one with :meth:`create` (before the workload starts) or :meth:`open` (an existing
    file, e.g. after the agent restarted); :meth:`close` unmaps it and :meth:`remove` also
    deletes the file.
    """

    def __init__(self, path: Path, handle: int, lib: ctypes.CDLL) -> None:
        self.path = path
        self._handle: int | None = handle
        self._lib = lib
        self._lock = threading.Lock()
        first = self.stats()
        self.uuids = tuple(g.uuid for g in first.gpus)

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
        """Write a new segment atomically (each file a temporary one renamed into place: the
        control part mode 0644 owned by this process's user, the workload part mode 0600 owned
        by ``uid``/``gid``) and map it.

        Args:
            path: the file; its folder must exist.
            workload_id: the workload (at most 63 bytes).
            uuids: its GPUs in ``CUDA_VISIBLE_DEVICES`` order (1-16, each under 96 bytes).
            memory_limits: its cap on each GPU, bytes (0: none).
            flags: :data:`FLAG_MEMORY_CAP` and/or :data:`FLAG_GATING`.
            max_inflight: launches a process may keep in flight (0: unbounded).
            uid, gid: owner of the workload part (the workload's user; needs root to differ
                from ours): only that user (and root) can map it. The control part stays
                ours: a workload of another user can only read it.

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
        raw = [u.encode() for u in uuids]
        for uuid, text in zip(raw, uuids, strict=True):
            if not uuid or len(uuid) >= UUID_LEN:
                raise ValueError(f"uuids: {text!r} must be 1-{UUID_LEN - 1} bytes")
        for limit in memory_limits:
            if not 0 <= limit < 2**64:
                raise ValueError(f"memory_limits: {limit} must be 0..2**64-1 bytes")
        if not 0 <= max_inflight < 2**31:
            raise ValueError(f"max_inflight: {max_inflight} not in 0..2**31-1")
        lib = agent_library()
        n = len(raw)
        rc = lib.fgpu_agent_create(
            str(path).encode(),
            wid,
            n,
            (ctypes.c_char_p * n)(*raw),
            (ctypes.c_uint64 * n)(*memory_limits),
            flags,
            max_inflight,
            -1 if uid is None else uid,
            -1 if gid is None else gid,
        )
        _check(rc, f"cannot create segment {path}")
        return cls.open(path)

    @classmethod
    def open(cls, path: Path) -> Segment:
        """Map an existing segment.

        Raises:
            SegmentError: missing, unreadable, too small, or not an fgpu segment (the native
                library's reason).
        """
        lib = agent_library()
        why = ctypes.create_string_buffer(512)
        handle = lib.fgpu_agent_open(str(path).encode(), why, len(why))
        if not handle:
            raise SegmentError(why.value.decode(errors="replace") or f"cannot open {path}")
        return cls(path, handle, lib)

    def close(self) -> None:
        """Unmap (idempotent). The file stays."""
        with self._lock:
            if self._handle is not None:
                self._lib.fgpu_agent_close(self._handle)
                self._handle = None

    def remove(self) -> None:
        """Open the gate (nothing stays held), unmap and delete both files."""
        with contextlib.suppress(SegmentError):
            self.set_gate(closed=False)
        self.close()
        for path in (self.path, control_path(self.path)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _mapped(self) -> int:
        if self._handle is None:
            raise SegmentError(f"{self.path}: closed")
        return self._handle

    # -- the agent's writes -------------------------------------------------------------------

    def set_gate(self, *, closed: bool) -> None:
        """Hold (``closed=True``) or release the workload's launches (opening wakes every
        thread waiting at the gate); renews the heartbeat.

        Raises:
            SegmentError: closed, or the wake failed.
        """
        with self._lock:
            value = GATE_CLOSED if closed else GATE_OPEN
            _check(self._lib.fgpu_agent_set_gate(self._mapped(), value), "gate")

    def beat(self) -> None:
        """Say the agent is alive (at least every second while a gate may be closed)."""
        with self._lock:
            _check(self._lib.fgpu_agent_beat(self._mapped()), "heartbeat")

    def set_uuids(self, uuids: Sequence[str]) -> None:
        """Rename the segment's GPUs, in order (a workload restored onto other GPUs: each
        process keeps its device ordinals, which now stand for these). Call it while the
        workload's processes are stopped (the interposer reads the names without a lock).

        Raises:
            ValueError: not one UUID per GPU of the segment, or one empty or of
                :data:`UUID_LEN` bytes or more (named, with its value).
        """
        if len(uuids) != len(self.uuids):
            raise ValueError(f"uuids: {len(uuids)} given for a segment of {len(self.uuids)} GPUs")
        raw = [u.encode() for u in uuids]
        for uuid, text in zip(raw, uuids, strict=True):
            if not uuid or len(uuid) >= UUID_LEN:
                raise ValueError(f"uuids: {text!r} must be 1-{UUID_LEN - 1} bytes")
        with self._lock:
            for i, uuid in enumerate(raw):
                _check(self._lib.fgpu_agent_set_uuid(self._mapped(), i, uuid), "uuid")
            self.uuids = tuple(uuids)

    def set_max_inflight(self, value: int) -> None:
        """Launches each process may keep in flight (0: unbounded).

        Raises:
            ValueError: negative or over 2**31.
        """
        if not 0 <= value < 2**31:
            raise ValueError(f"max_inflight: {value} not in 0..2**31-1")
        with self._lock:
            _check(self._lib.fgpu_agent_set_max_inflight(self._mapped(), value), "max_inflight")

    def sweep(self) -> int:
        """Give back the reservations of the workload's dead processes (kill -9 included).

        Each entry is named by pid, start time and pid namespace. Those of this process's own
        pid namespace are judged by its ``/proc``; those of other namespaces (containers
        sharing the segment) only when this process runs in the host's pid namespace with
        the host's ``/proc``, where every namespace's processes are seen (a namespace with
        none left frees its entries); elsewhere they are left alone.

        Returns:
            Bytes given back, over all GPUs.
        """
        with self._lock:
            return int(self._lib.fgpu_agent_sweep(self._mapped()))

    # -- reads --------------------------------------------------------------------------------

    def processes(self) -> list[AttachedProcess]:
        """The processes that hold an entry now (see :class:`AttachedProcess`), in entry
        order; at most ``FGPU_SEG_MAX_PROCS`` (128)."""
        out = (AgentProc * MAX_PROCS)()
        with self._lock:
            n = int(self._lib.fgpu_agent_procs(self._mapped(), out, MAX_PROCS))
        _check(min(n, 0), "processes")
        return [
            AttachedProcess(e.pid, e.start_ticks, (e.pidns_dev, e.pidns_ino))
            for e in out[: min(n, MAX_PROCS)]
        ]

    def stats(self) -> SegmentStats:
        """The segment now (see :class:`SegmentStats`)."""
        snap = Snapshot()
        with self._lock:
            _check(self._lib.fgpu_agent_snapshot(self._mapped(), ctypes.byref(snap)), "snapshot")
        gpus = tuple(
            GpuStats(
                uuid=g.uuid.decode(errors="replace"),
                memory_limit=g.memory_limit,
                memory_reserved=g.memory_reserved,
                memory_peak=g.memory_peak,
                gpu_time_ns=g.gpu_time_ns,
                oom_count=g.oom_count,
                oom_last_bytes=g.oom_last_bytes,
            )
            for g in snap.gpus[: snap.ngpus]
        )
        return SegmentStats(
            gate_closed=snap.gate != GATE_OPEN,
            max_inflight=snap.max_inflight,
            last_launch_ns=snap.last_launch_ns,
            launches=snap.launches,
            gate_waits=snap.gate_waits,
            processes=snap.processes,
            live_processes=snap.live_processes,
            inflight=snap.inflight,
            waiting=snap.waiting,
            gpus=gpus,
        )


__all__ = [
    "CONTROL_SUFFIX",
    "FLAG_GATING",
    "FLAG_MEMORY_CAP",
    "GATE_CLOSED",
    "GATE_OPEN",
    "AgentProc",
    "AttachedProcess",
    "GpuStats",
    "Segment",
    "SegmentError",
    "SegmentStats",
    "Snapshot",
    "agent_library",
    "control_path",
]
