"""The memory guard: stops a workload that holds more GPU memory than its quota.

Every ``interval_s`` the guard reads per-process device memory from the GPU backend (NVML
on real GPUs; on simulated GPUs, what workloads report through
:func:`fgpu.sdk.report_memory`, which the governor passes to
:meth:`~fgpu.agent.backend.SimulatedBackend.report_usage`), adds it up per workload and GPU
(a workload is its process group, or the governor's cgroup), and compares it with the quota.
Over quota:

- policy ``kill`` (default): a :data:`~fgpu.agent.events.MEMORY_EXCEEDED` event naming used
  and allowed MiB, then the workload is stopped: by the ``stop`` callback when given (the
  service records the stop and terminates it its own way), else thawed (governor) and sent
  SIGKILL. Its neighbours on the GPU are not touched.
- policy ``warn``: a :data:`~fgpu.agent.events.MEMORY_WARNING` event once per crossing (again
  only after it has gone under its quota and over again).

The enforcement is after the fact (up to one interval late: :data:`DEFAULT_INTERVAL_S`, so
that a burst over the quota held for longer than about that is seen, whatever the workload
wrote into its own part of the interposer's segment; ``bench/segment_bypass.py`` measures it).
A shorter burst, between two looks, is seen through the driver's own high-water mark: where
the backend has NVML accounting (``maxMemoryUsage`` of ``nvmlDeviceGetAccountingStats``: the
most device memory a process ever held; the guard turns accounting mode on at its first look,
which needs root), a workload one of whose processes peaked over its quota on a GPU is handled
as one over it now, with the peak named (:attr:`MemoryViolation.peak`). One process's peak is
a lower bound of the workload's (its processes' peaks need not have come at once), so a
burst split across processes is seen only where it lasts past a look. Where accounting is not
available, :attr:`MemoryGuard.burst_detection` and the log say that bursts shorter than the
interval are not seen. The framework limits of
:func:`fgpu.agent.limits.launch_env` are what keep a well-behaved workload under its quota
in the first place; the guard is for the ones that are not (DESIGN.md section 7).
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from fgpu.agent.backend import GpuBackend, GpuProcess, SimulatedBackend
from fgpu.agent.events import MEMORY_EXCEEDED, MEMORY_WARNING, EventLog
from fgpu.agent.governor.freezer import stat_fields
from fgpu.agent.launcher import Launcher
from fgpu.agent.process import DEAD_STATES, ProcessHandle, group_pids, proc_stat

OUTSIDE_MEMORY = "gpu-memory-outside"
"""Event kind: a process of no workload of this service holds GPU memory."""

log = logging.getLogger(__name__)


DEFAULT_INTERVAL_S = 0.1
"""Seconds between two looks at per-process GPU memory (issue 27: at 1 s, a workload that
took a whole GPU for 0.6-1 s by lying about its reservations left no trace)."""

NOT_GRANTED_MIB = 1024
"""What a workload may hold on a GPU it was not given: enough for a CUDA context opened by a
process that only looks at the device (a few hundred MiB on recent GPUs), not for work."""


class MemoryPolicy(enum.StrEnum):
    """What the guard does to a workload over its memory quota."""

    KILL = "kill"
    WARN = "warn"


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardedWorkload:
    """A workload and its memory quotas.

    Attributes:
        workload_id: its id.
        handle: its processes.
        quotas_mib: GPU uuid -> memory quota on that GPU, MiB. On a GPU not listed (one it
            was not given: it unset ``CUDA_VISIBLE_DEVICES``, say) it may hold at most
            :data:`NOT_GRANTED_MIB` (a context NVML lists for a process that only peeks).
    """

    workload_id: str
    handle: ProcessHandle
    quotas_mib: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class MemoryViolation:
    """A workload over its quota on one GPU.

    Attributes:
        workload_id: the workload.
        gpu_uuid: the GPU.
        used_mib: what its processes hold there, MiB.
        allowed_mib: its quota there, MiB.
        pids: its processes holding memory there, ascending.
        granted: whether the GPU is one of its own (else ``allowed_mib`` is
            :data:`NOT_GRANTED_MIB`).
        peak: found by a process's high-water mark (NVML accounting), not by what it holds
            now: ``used_mib`` is then the peak of ``pids[0]``, the process that reached it.
    """

    workload_id: str
    gpu_uuid: str
    used_mib: int
    allowed_mib: int
    pids: tuple[int, ...]
    granted: bool = True
    peak: bool = False

    @property
    def message(self) -> str:
        """The sentence for the event."""
        where = self.gpu_uuid if self.granted else f"{self.gpu_uuid}, a GPU it was not given"
        if self.peak:
            return (
                f"GPU memory over quota on {where}: process {self.pids[0]} peaked at "
                f"{self.used_mib} MiB (the driver's high-water mark, a burst between two "
                f"looks), allowed {self.allowed_mib} MiB"
            )
        return (
            f"GPU memory over quota on {where}: used {self.used_mib} MiB, "
            f"allowed {self.allowed_mib} MiB"
        )


def find_violations(
    usage: Sequence[GpuProcess],
    owners: Mapping[int, str],
    quotas: Mapping[str, Mapping[str, int]],
) -> list[MemoryViolation]:
    """Workloads over quota (pure).

    Args:
        usage: per (process, GPU) memory, MiB (:meth:`GpuBackend.process_memory`).
        owners: pid -> workload id, for the governed workloads' processes.
        quotas: workload id -> GPU uuid -> quota, MiB.

    Returns:
        One :class:`MemoryViolation` per (workload, GPU) whose summed use is above its quota
        (:data:`NOT_GRANTED_MIB` on a GPU it has no quota on), ordered by workload id then GPU
        uuid. Processes of no known workload are ignored.
    """
    used: dict[tuple[str, str], int] = {}
    pids: dict[tuple[str, str], list[int]] = {}
    for proc in usage:
        owner = owners.get(proc.pid)
        if owner is None or owner not in quotas:
            continue
        key = (owner, proc.gpu_uuid)
        used[key] = used.get(key, 0) + proc.used_mib
        pids.setdefault(key, []).append(proc.pid)
    found = []
    for (wid, gpu), mib in sorted(used.items()):
        granted = gpu in quotas[wid]
        allowed = quotas[wid][gpu] if granted else NOT_GRANTED_MIB
        if mib > allowed:
            found.append(
                MemoryViolation(wid, gpu, mib, allowed, tuple(sorted(pids[(wid, gpu)])), granted)
            )
    return found


def find_peak_violations(
    peaks: Sequence[GpuProcess],
    owners: Mapping[int, str],
    quotas: Mapping[str, Mapping[str, int]],
) -> list[MemoryViolation]:
    """Workloads one of whose processes peaked over the quota (pure).

    Args:
        peaks: per (process, GPU) high-water mark of device memory, MiB
            (``process_peak_memory`` of the NVML backends).
        owners: pid -> workload id, for the governed workloads' processes.
        quotas: workload id -> GPU uuid -> quota, MiB.

    Returns:
        One :class:`MemoryViolation` with ``peak`` set per (workload, GPU) where the highest
        peak of one of its processes is above its quota (:data:`NOT_GRANTED_MIB` on a GPU it
        has no quota on), naming that process first; ordered by workload id then GPU uuid.
        A single process's peak is a lower bound of the workload's, so no workload that never
        went over is reported.
    """
    top: dict[tuple[str, str], GpuProcess] = {}
    for proc in peaks:
        owner = owners.get(proc.pid)
        if owner is None or owner not in quotas:
            continue
        key = (owner, proc.gpu_uuid)
        best = top.get(key)
        if best is None or proc.used_mib > best.used_mib:
            top[key] = proc
    found = []
    for (wid, gpu), proc in sorted(top.items()):
        granted = gpu in quotas[wid]
        allowed = quotas[wid][gpu] if granted else NOT_GRANTED_MIB
        if proc.used_mib > allowed:
            found.append(
                MemoryViolation(wid, gpu, proc.used_mib, allowed, (proc.pid,), granted, True)
            )
    return found


def _group_owners(
    usage: Sequence[GpuProcess], workloads: Mapping[str, GuardedWorkload]
) -> dict[int, str]:
    """pid -> workload id for the processes holding GPU memory, by process group: what
    :func:`~fgpu.agent.process.group_pids` of every workload gives for them, reading
    ``/proc/<pid>/stat`` of each instead of a scan of ``/proc`` per workload (the guard
    looks every 0.1 s)."""
    by_group = {w.handle.pgid: w for w in workloads.values()}
    owners: dict[int, str] = {}
    for pid in {p.pid for p in usage}:
        stat = proc_stat(pid)
        if stat is None or stat.state in DEAD_STATES:
            continue
        w = by_group.get(stat.pgid)
        if w is not None and (
            w.handle.start_ticks is None or stat.start_ticks >= w.handle.start_ticks
        ):
            owners[pid] = w.workload_id
    return owners


class Thawer(Protocol):
    """What the guard needs of the governor: thaw a workload before it is signalled."""

    def before_signal(self, workload_id: str) -> None: ...


class MemoryGuard:
    """Polls per-process GPU memory and acts on workloads over quota (module docstring).

    Args:
        backend: where memory figures come from.
        policy: ``kill`` or ``warn``.
        interval_s: seconds between polls (thread started by :meth:`start`).
        events: where events go (default: a new :class:`EventLog`; pass the governor's to
            keep one log).
        stop: called as ``stop(workload, violation)`` to stop a workload under ``kill``;
            None: thaw it through ``governor`` and send SIGKILL to its process group.
        governor: anything with ``before_signal(workload_id)`` (the
            :class:`~fgpu.agent.governor.runtime.Governor`); used by the default ``stop``.
        pids_of: a workload's processes (default: its process group; pass
            ``lambda h: governor.pids(h.workload_id)`` to count processes that left it).
        clock: monotonic clock, ns (event stamps). wall: wall clock, s.
        inside: whether a process belongs to a workload of this service (its cgroup is one
            of the service's); None: not known (no cgroups), and GPU memory outside
            workloads is not looked for (:meth:`_note_outside`).
    """

    def __init__(
        self,
        backend: GpuBackend,
        *,
        inside: Callable[[int], bool] | None = None,
        policy: MemoryPolicy = MemoryPolicy.KILL,
        interval_s: float = DEFAULT_INTERVAL_S,
        events: EventLog | None = None,
        stop: Callable[[GuardedWorkload, MemoryViolation], None] | None = None,
        governor: Thawer | None = None,
        pids_of: Callable[[ProcessHandle], list[int]] = group_pids,
        clock: Callable[[], int] = time.monotonic_ns,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.backend = backend
        self.policy = policy
        self.interval_s = interval_s
        self.events = events if events is not None else EventLog()
        self._stop_workload = stop
        self._governor = governor
        self._pids_of = pids_of
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._workloads: dict[str, GuardedWorkload] = {}
        self._over: set[tuple[str, str]] = set()
        self._stopped: set[str] = set()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.burst_detection: dict[str, str] | None = None
        """GPU uuid -> ``"on"`` where NVML accounting shows bursts between looks, or why
        not; None before the first look."""
        self._inside = inside
        self._outside_seen: set[tuple[int, str]] = set()
        self.outside_mib: dict[str, int] = {}
        """GPU uuid -> MiB held by processes of no workload of this service, at the last
        look (:meth:`_note_outside`)."""

    def update(self, workloads: Sequence[GuardedWorkload]) -> None:
        """Guard exactly ``workloads`` from now on."""
        with self._lock:
            self._workloads = {w.workload_id: w for w in workloads}
            self._stopped &= set(self._workloads)
            self._over = {k for k in self._over if k[0] in self._workloads}

    def check(self) -> list[MemoryViolation]:
        """Poll once and act on what is over quota; returns the violations found (also the
        ones already acted on)."""
        with self._lock:
            workloads = dict(self._workloads)
        try:
            usage = self.backend.process_memory()
        except Exception as exc:
            log.warning("memory guard: cannot read per-process memory: %s", exc)
            return []
        self._forget_dead(usage)
        owners: dict[int, str] = {}
        if self._pids_of is group_pids:
            owners = _group_owners(usage, workloads)  # the same answer, one stat per GPU user
        else:
            for wid, w in workloads.items():
                for pid in self._pids_of(w.handle):
                    owners[pid] = wid
        self._note_outside(usage, owners)
        quotas = {wid: w.quotas_mib for wid, w in workloads.items()}
        found = find_violations(usage, owners, quotas)
        over_now = {(v.workload_id, v.gpu_uuid) for v in found}
        for violation in find_peak_violations(self._peaks(usage, owners), owners, quotas):
            key = (violation.workload_id, violation.gpu_uuid)
            if key not in over_now:  # what it holds now is the figure to give
                found.append(violation)
                over_now.add(key)
        for violation in found:
            self._act(workloads[violation.workload_id], violation)
        with self._lock:
            self._over = over_now | {k for k in self._over if k[0] in self._stopped}
        return found

    def _peaks(self, usage: Sequence[GpuProcess], owners: Mapping[int, str]) -> list[GpuProcess]:
        """The high-water marks of the governed workloads' processes on the GPU (empty
        without NVML accounting). Turns accounting on at the first call and says, once,
        where bursts between looks cannot be seen."""
        read = getattr(self.backend, "process_peak_memory", None)
        if self.burst_detection is None:
            enable = getattr(self.backend, "enable_accounting", None)
            found: dict[str, str] = {}
            if enable is not None:
                try:
                    found = dict(enable())
                except Exception as exc:
                    log.debug("memory guard: accounting mode: %s", exc)
            self.burst_detection = found
            off = {uuid: why for uuid, why in found.items() if why != "on"}
            if read is None or not found or off:
                where = ", ".join(f"{u} ({w})" for u, w in sorted(off.items())) or "any GPU"
                log.warning(
                    "memory guard: no NVML accounting on %s: a burst over a quota shorter "
                    "than the %g s interval is not seen",
                    where,
                    self.interval_s,
                )
        if read is None:
            return []
        mine = [p for p in usage if p.pid in owners]
        if not mine:
            return []
        try:
            return list(read(mine))
        except Exception as exc:
            log.debug("memory guard: cannot read peaks: %s", exc)
            return []

    def describe_bursts(self) -> str:
        """Whether bursts between two looks are seen, for ``fgpu nodes`` and logs."""
        found = self.burst_detection
        if found is None:
            return "burst detection not known yet (before the first look)"
        on = sorted(u for u, why in found.items() if why == "on")
        off = sorted(f"{u} ({why})" for u, why in found.items() if why != "on")
        if on and not off:
            return "bursts between looks seen by NVML accounting (per-process peak)"
        text = f"bursts shorter than {self.interval_s:g} s not seen"
        if off:
            text += " on " + ", ".join(off)
        return text if on or off else text + " (no NVML accounting)"

    def _note_outside(self, usage: Sequence[GpuProcess], owners: Mapping[int, str]) -> None:
        """GPU memory held by processes that belong to no workload of this service (what a
        workload left running after its end, or a program started outside fgpu): kept per
        GPU in :attr:`outside_mib`, and one :data:`OUTSIDE_MEMORY` event per process and GPU
        when first seen, naming the pid, its uid, the MiB and the GPU (workload id ``""``).
        Nothing without ``inside``."""
        if self._inside is None:
            return
        held: dict[tuple[int, str], int] = {}
        for proc in usage:
            if proc.pid in owners or self._inside(proc.pid):
                continue
            stat = proc_stat(proc.pid)
            if stat is None or stat.state in DEAD_STATES:
                continue  # ended since the report: holds nothing now
            key = (proc.pid, proc.gpu_uuid)
            held[key] = held.get(key, 0) + proc.used_mib
        per_gpu: dict[str, int] = {}
        for (pid, gpu), mib in sorted(held.items()):
            per_gpu[gpu] = per_gpu.get(gpu, 0) + mib
            if (pid, gpu) in self._outside_seen:
                continue
            try:
                uid: int | str = os.stat(f"/proc/{pid}").st_uid
            except OSError:
                uid = "unknown"
            self.events.add(
                self._wall(),
                self._clock(),
                "",
                OUTSIDE_MEMORY,
                "GPU memory outside fgpu",
                f"process {pid} (uid {uid}) holds {mib} MiB of GPU {gpu} and belongs to no "
                "running workload",
            )
        self._outside_seen = set(held)
        self.outside_mib = per_gpu

    def _act(self, workload: GuardedWorkload, violation: MemoryViolation) -> None:
        wid = violation.workload_id
        key = (wid, violation.gpu_uuid)
        with self._lock:
            if wid in self._stopped or (self.policy is MemoryPolicy.WARN and key in self._over):
                return
            if self.policy is MemoryPolicy.KILL:
                self._stopped.add(wid)
        if self.policy is MemoryPolicy.WARN:
            self.events.add(
                self._wall(),
                self._clock(),
                wid,
                MEMORY_WARNING,
                "memory quota",
                f"{violation.message}; left running (policy warn)",
            )
            return
        self.events.add(
            self._wall(),
            self._clock(),
            wid,
            MEMORY_EXCEEDED,
            "memory quota",
            f"{violation.message}; stopped (policy kill)",
        )
        if self._stop_workload is not None:
            self._stop_workload(workload, violation)
            return
        if self._governor is not None:
            self._governor.before_signal(wid)
        Launcher().signal(workload.handle, signal.SIGKILL)

    def _forget_dead(self, usage: Sequence[GpuProcess]) -> None:
        """Simulated GPUs keep reports until told; drop those of processes that ended."""
        backend = self.backend
        if not isinstance(backend, SimulatedBackend):
            return
        for pid in {p.pid for p in usage}:
            fields = stat_fields(pid)
            if fields is None or fields[0] in "ZXx":
                backend.forget_process(pid)

    def start(self) -> None:
        """Turn NVML accounting on where the backend can (so that processes started from now
        on have a high-water mark), then poll every ``interval_s`` in a daemon thread
        (idempotent)."""
        if self._thread is not None:
            return
        self._peaks([], {})
        self._thread = threading.Thread(target=self._run, name="fgpu-memguard", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            try:
                self.check()
            except Exception:
                log.exception("memory guard: check failed")

    def close(self) -> None:
        """Stop polling; idempotent."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()


__all__ = [
    "DEFAULT_INTERVAL_S",
    "OUTSIDE_MEMORY",
    "GuardedWorkload",
    "MemoryGuard",
    "MemoryPolicy",
    "MemoryViolation",
    "Thawer",
    "find_peak_violations",
    "find_violations",
]
