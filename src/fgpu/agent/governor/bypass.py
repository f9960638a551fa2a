"""Processes of a workload held at launch that use the GPU without the interposer.

A workload held at launch is governed by its gate: the interposer in each of its processes
waits there. A process of the same workload that uses the GPU without the interposer (started
with ``LD_PRELOAD`` removed, or one that loads the driver some other way) is not held, and the
planner, which sees the workload launching through the gate, leaves the freezer alone: that
process then runs as much as it likes (issue 27: 0.45 of a GPU on a 0.3 strict share). The
gate-closed check of :mod:`fgpu.agent.governor.runtime` needs a gate closed for longer than
NVML's sample period to see it; this check does not wait for one.

The check compares two lists, every :attr:`GovernorConfig.obey_poll_s`:

- the processes NVML lists on the GPUs (``nvmlDeviceGetComputeRunningProcesses``: a process
  with a context there; the fake driver's per-process figures in its shape) that belong to
  the workload (its process group or cgroup, as the freezer sees it);
- the processes that hold an entry of its segment (:meth:`Segment.processes`). The
  interposer claims the entry in ``cuInit``, before the driver knows the process, so a
  process that only opens a context through the interposer holds one, and so does a child
  that inherited ``LD_PRELOAD`` once it calls ``cuInit``.

A process of the first list missing from the second for :data:`BYPASS_GRACE_S` in a row is a
bypass. Entries are matched by the pid in the owner's pid namespace and that namespace
(``/proc/<pid>/status`` NSpid and ``/proc/<pid>/ns/pid``), and by start time where the
process shares the agent's pid namespace (pid reuse).

What this does not see: the entries are in the workload's own part of the segment, so a
process that writes an entry for itself passes; a process that used the interposer and then
``exec``'d without it keeps its entry. Both are left to the gate-closed check and to the
comparison of reported with measured device time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fgpu.agent.backend import GpuProcess
from fgpu.agent.interposer.segment import AttachedProcess
from fgpu.agent.process import DEAD_STATES, proc_stat

BYPASS_GRACE_S = 0.5
"""How long a process of the workload may be on the GPU without an entry before it counts as
a bypass. The interposer claims its entry before the driver lists the process, so this only
covers the two reads not being one instant and a loaded machine (the agent reads NVML, then
the segment); a bypass is seen within it plus one poll (0.1 s)."""


@dataclass(frozen=True, slots=True)
class Bypass:
    """A process of a workload that uses a GPU without holding an entry of its segment.

    Attributes:
        pid: its pid (the host's).
        gpu_uuid: the GPU NVML lists it on.
        used_mib: the device memory NVML says it holds there, MiB.
        seen_s: how long it has been seen so, seconds.
    """

    pid: int
    gpu_uuid: str
    used_mib: int
    seen_s: float


def _pidns(pid: int | str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _inner_pid(pid: int) -> int | None:
    """The pid of ``pid`` in its own pid namespace (the last NSpid figure)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    fields = line.split()[1:]
                    return int(fields[-1]) if fields else None
    except (OSError, ValueError):
        return None
    return None


def attached_pids(
    pids: Iterable[int],
    entries: Sequence[AttachedProcess],
    starts: Mapping[int, int] | None = None,
) -> set[int]:
    """Which of ``pids`` (the host's) hold one of ``entries``.

    A process in the agent's pid namespace matches an entry of that namespace with its pid
    and start time (``starts``: pid -> start ticks already read; else read here); one in
    another namespace matches an entry of its namespace with its pid there. An entry whose
    namespace is unknown (``(0, 0)``) matches by pid alone.
    """
    own = _pidns("self")
    by_pid: dict[int, list[AttachedProcess]] = {}
    for entry in entries:
        by_pid.setdefault(entry.pid, []).append(entry)
    found: set[int] = set()
    for pid in pids:
        ns = _pidns(pid)
        if ns is None:
            continue
        inner = pid if ns == own else _inner_pid(pid)
        if inner is None:
            continue
        for entry in by_pid.get(inner, ()):
            if entry.pidns == (0, 0):
                found.add(pid)
            elif entry.pidns == ns:
                if ns != own:
                    found.add(pid)
                    continue
                start = (starts or {}).get(pid)
                if start is None:
                    stat = proc_stat(pid)
                    start = None if stat is None else stat.start_ticks
                if start == entry.start_ticks:
                    found.add(pid)
    return found


class BypassWatch:
    """Remembers since when each process of each workload has been on the GPU without an
    entry (one per governor; not thread-safe: the governor's loop calls it).

    Args:
        grace_s: :data:`BYPASS_GRACE_S` unless given.
    """

    def __init__(self, grace_s: float = BYPASS_GRACE_S) -> None:
        if grace_s < 0:
            raise ValueError(f"grace_s: {grace_s} is negative")
        self.grace_ns = int(grace_s * 1e9)
        self._since: dict[str, dict[tuple[int, int], int]] = {}

    def look(
        self,
        workload_id: str,
        on_gpu: Sequence[GpuProcess],
        entries: Sequence[AttachedProcess],
        now_ns: int,
    ) -> Bypass | None:
        """One look at a workload.

        Args:
            workload_id: the workload.
            on_gpu: its processes NVML lists now, per GPU (only the workload's).
            entries: the holders of its segment's entries now.
            now_ns: monotonic clock, ns.

        Returns:
            The first process (lowest pid) without an entry for :attr:`grace_ns` or longer,
            or None. Processes that ended or got an entry are forgotten.
        """
        live: dict[int, GpuProcess] = {}
        starts: dict[int, int] = {}
        for proc in on_gpu:
            if proc.pid not in starts:
                stat = proc_stat(proc.pid)
                if stat is None or stat.state in DEAD_STATES:
                    continue  # ending: the driver frees its context at exit
                starts[proc.pid] = stat.start_ticks
            if proc.pid not in live or proc.used_mib > live[proc.pid].used_mib:
                live[proc.pid] = proc
        bare = set(live) - attached_pids(live, entries, starts)
        known = self._since.get(workload_id, {})
        since: dict[tuple[int, int], int] = {}
        for pid in bare:
            key = (pid, starts[pid])
            since[key] = known.get(key, now_ns)
        if since:
            self._since[workload_id] = since
        else:
            self._since.pop(workload_id, None)
        late = sorted(pid for (pid, _), first in since.items() if now_ns - first >= self.grace_ns)
        if not late:
            return None
        pid = late[0]
        first = min(v for (p, _), v in since.items() if p == pid)
        proc = live[pid]
        return Bypass(pid, proc.gpu_uuid, proc.used_mib, (now_ns - first) / 1e9)

    def forget(self, workload_id: str) -> None:
        """Drop what is remembered of a workload (it ended, or is frozen for good)."""
        self._since.pop(workload_id, None)


__all__ = ["BYPASS_GRACE_S", "Bypass", "BypassWatch", "attached_pids"]
