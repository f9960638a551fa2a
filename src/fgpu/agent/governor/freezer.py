"""Freeze and thaw a workload's processes as one unit (DESIGN.md section 7).

Two mechanisms, chosen by :func:`detect_freezer`:

- :class:`CgroupFreezer`: each workload's processes are moved into their own cgroup v2
  (``<root>/<workload id>``) and frozen by writing ``cgroup.freeze``; the freeze is
  confirmed by ``frozen 1`` in ``cgroup.events`` (Linux admin guide, "Control Group v2",
  section "Core Interface Files"). Processes forked later stay in the cgroup, also those
  that leave the process group. Needs a writable cgroup v2 hierarchy (root, or a delegated
  subtree).
- :class:`SignalFreezer`: ``SIGSTOP``/``SIGCONT`` to the workload's process group, confirmed
  by state ``T`` in ``/proc/<pid>/stat`` for each member. Works anywhere, but a child that
  moves to another process group escapes, and the workload can ``SIGCONT`` itself
  (``docs/governor.md`` lists the limits).

Both confirm a freeze before returning from :meth:`Freezer.wait_frozen`, so the next lease
is granted only once the previous holder has stopped: ``killpg`` and ``cgroup.freeze`` return
before every task has stopped (a running task stops at its next scheduling point).

The unit is the workload's :class:`~fgpu.agent.process.ProcessHandle`: the process group
``pgid`` (the command and what it forks); the launcher's wrapper (``pid``) is outside it and
keeps running to record the exit code.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from fgpu.agent.cgroupsweep import remove_stale_neighbours
from fgpu.agent.process import DEAD_STATES, ProcessHandle, group_pids, stat_after_name

log = logging.getLogger(__name__)

_POLL_S = 0.0001
"""Sleep between looks while waiting for a freeze to take effect."""

_SAFE = re.compile(r"[^A-Za-z0-9._-]")

NEIGHBOUR_AGE_S = 3600.0
"""How long another agent's empty cgroup must have stayed unchanged before an agent's start
removes it (:meth:`CgroupFreezer.remove_empty_neighbours`): long enough that a live agent
started by an older fgpu, which cannot recreate its subtree, is not caught between two
workloads."""


def stat_fields(pid: int) -> tuple[str, int, int, int] | None:
    """``(state, pgid, session, start_ticks)`` of ``pid`` from ``/proc/<pid>/stat`` (fields 3,
    5, 6 and 22), or None when the process is gone or unreadable."""
    fields = stat_after_name(pid)
    if fields is None:
        return None
    try:
        return fields[0].decode(), int(fields[2]), int(fields[3]), int(fields[19])
    except (IndexError, ValueError):
        return None


class Hastener:
    """Makes runnable members of a workload reach their stop sooner.

    A task asked to stop (SIGSTOP, or the cgroup freezer) stops only when it next runs; a
    runnable task waiting behind a CPU-bound one may wait a whole scheduler slice or tick
    (4 ms at ``HZ=250``). :meth:`boost` raises such tasks (every thread) to ``SCHED_FIFO``
    priority 1 so the scheduler runs them at once, which puts them straight into the stop;
    :meth:`restore` puts their own policy back once the freeze is confirmed (or timed out).
    A stopped task runs no user code while boosted. Needs CAP_SYS_NICE (root); without it
    nothing happens. Tasks already real-time are left alone.
    """

    def __init__(self) -> None:
        self._saved: dict[int, tuple[int, int]] = {}

    def boost(self, pids: list[int]) -> None:
        for pid in pids:
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                fields = stat_fields(tid)
                if fields is None or fields[0] != "R" or tid in self._saved:
                    continue
                try:
                    policy = os.sched_getscheduler(tid)
                    if policy not in (os.SCHED_OTHER, os.SCHED_BATCH):
                        continue
                    priority = os.sched_getparam(tid).sched_priority
                    os.sched_setscheduler(
                        tid,
                        os.SCHED_FIFO | getattr(os, "SCHED_RESET_ON_FORK", 0),
                        os.sched_param(1),
                    )
                except (OSError, AttributeError):
                    continue
                self._saved[tid] = (policy, priority)

    def restore(self) -> None:
        for tid, (policy, priority) in self._saved.items():
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, policy, os.sched_param(priority))
        self._saved.clear()


def belongs_to(pid: int, handle: ProcessHandle) -> bool:
    """Whether ``pid`` is part of the workload: in its process group or its wrapper's session
    (the wrapper leads the session), and started no earlier than the wrapper."""
    fields = stat_fields(pid)
    if fields is None:
        return False
    state, pgid, session, ticks = fields
    if state in DEAD_STATES:
        return False
    if handle.start_ticks is not None and ticks < handle.start_ticks:
        return False
    return pgid == handle.pgid or session == handle.pid


class Freezer(Protocol):
    """A freeze mechanism. Calls for one workload come from one thread at a time."""

    @property
    def kind(self) -> str:
        """``"cgroup-v2"`` or ``"signal"`` (for ``fgpu top`` and the bench)."""
        ...

    def adopt(self, handle: ProcessHandle) -> None:
        """Start governing the workload: set it up and make sure it is thawed (a previous
        agent may have left it frozen)."""
        ...

    def freeze(self, handle: ProcessHandle) -> None:
        """Ask the workload to stop; returns at once (see :meth:`wait_frozen`)."""
        ...

    def wait_frozen(self, handle: ProcessHandle, timeout_s: float) -> bool:
        """Wait until every process of the workload has stopped; False after ``timeout_s``."""
        ...

    def thaw(self, handle: ProcessHandle) -> None:
        """Let the workload run again; returns at once."""
        ...

    def is_frozen(self, handle: ProcessHandle) -> bool:
        """Whether the workload is frozen now (every live process stopped)."""
        ...

    def pids(self, handle: ProcessHandle) -> list[int]:
        """The workload's live processes, ascending."""
        ...

    def owns(self, handle: ProcessHandle, pid: int) -> bool:
        """Whether process ``pid`` belongs to the workload (authenticates hints)."""
        ...

    def release(self, handle: ProcessHandle) -> None:
        """Stop governing the workload: thaw it and clean up what :meth:`adopt` set up."""
        ...

    def close(self) -> None:
        """Clean up what is left (empty cgroups of ended workloads)."""
        ...


def _wrapper_alive(handle: ProcessHandle) -> bool:
    """The launcher's wrapper lives as long as the workload's command: while it does, the
    process group id cannot have been reused by someone else."""
    fields = stat_fields(handle.pid)
    if fields is None or fields[0] in DEAD_STATES:
        return False
    return handle.start_ticks is None or fields[3] == handle.start_ticks


class SignalFreezer:
    """``SIGSTOP``/``SIGCONT`` to the workload's process group (see the module docstring).

    Member pids are cached (a ``/proc`` scan costs about a millisecond) and rescanned when
    older than ``rescan_s``; killpg reaches members forked since, but only cached members are
    checked when confirming a freeze.

    Args:
        rescan_s: how old the cached member list may get, seconds.
        hasten: boost still-runnable members while waiting for the stop (:class:`Hastener`).
        clock: monotonic clock in seconds (tests pass a fake).
    """

    def __init__(
        self,
        rescan_s: float = 1.0,
        *,
        hasten: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rescan_s = rescan_s
        self._hasten = hasten
        self._clock = clock
        self._members: dict[int, tuple[float, list[int]]] = {}

    @property
    def kind(self) -> str:
        return "signal"

    def _cached(self, handle: ProcessHandle, fresh: bool = False) -> list[int]:
        now = self._clock()
        entry = self._members.get(handle.pgid)
        if fresh or entry is None or now - entry[0] > self._rescan_s:
            entry = (now, group_pids(handle))
            self._members[handle.pgid] = entry
        return entry[1]

    def _signal(self, handle: ProcessHandle, sig: signal.Signals) -> None:
        if not _wrapper_alive(handle):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pgid, sig)

    def adopt(self, handle: ProcessHandle) -> None:
        self._cached(handle, fresh=True)
        self._signal(handle, signal.SIGCONT)

    def freeze(self, handle: ProcessHandle) -> None:
        self._signal(handle, signal.SIGSTOP)

    @staticmethod
    def _stopped(pid: int, pgid: int) -> bool:
        fields = stat_fields(pid)
        return fields is None or fields[0] in "TtZXx" or fields[1] != pgid

    def wait_frozen(self, handle: ProcessHandle, timeout_s: float) -> bool:
        deadline = self._clock() + timeout_s
        waiting = list(self._cached(handle))
        hastener = Hastener() if self._hasten else None
        try:
            while True:
                waiting = [p for p in waiting if not self._stopped(p, handle.pgid)]
                if not waiting:
                    return True
                if self._clock() >= deadline:
                    self._cached(handle, fresh=True)
                    return False
                if hastener is not None:
                    hastener.boost(waiting)
                time.sleep(_POLL_S)
        finally:
            if hastener is not None:
                hastener.restore()

    def thaw(self, handle: ProcessHandle) -> None:
        self._signal(handle, signal.SIGCONT)
        self._cached(handle)  # rescan off the freeze path when the list is stale

    def is_frozen(self, handle: ProcessHandle) -> bool:
        pids = self._cached(handle, fresh=True)
        return bool(pids) and all(self._stopped(p, handle.pgid) for p in pids)

    def pids(self, handle: ProcessHandle) -> list[int]:
        return list(self._cached(handle))

    def owns(self, handle: ProcessHandle, pid: int) -> bool:
        return belongs_to(pid, handle)

    def release(self, handle: ProcessHandle) -> None:
        self._signal(handle, signal.SIGCONT)
        self._members.pop(handle.pgid, None)

    def close(self) -> None:
        self._members.clear()


def cgroup2_mount(mounts: str = "/proc/self/mounts") -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` on pure v2 systems,
    ``/sys/fs/cgroup/unified`` on hybrid ones), or None."""
    try:
        with open(mounts, encoding="utf-8") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "cgroup2":
                    return Path(parts[1])
    except OSError:
        return None
    return None


class _GroupFiles:
    """A workload cgroup's control files, opened once at :meth:`CgroupFreezer.adopt` and
    kept open until :meth:`CgroupFreezer.release`: a freeze, a thaw or a look then opens no
    file, so they keep working when the process has run out of file descriptors."""

    __slots__ = ("events", "freeze", "procs")

    def __init__(self, group: Path) -> None:
        flags = os.O_CLOEXEC
        self.freeze = os.open(group / "cgroup.freeze", os.O_WRONLY | flags)
        try:
            self.events = os.open(group / "cgroup.events", os.O_RDONLY | flags)
            try:
                self.procs = os.open(group / "cgroup.procs", os.O_RDONLY | flags)
            except BaseException:
                os.close(self.events)
                raise
        except BaseException:
            os.close(self.freeze)
            raise

    def close(self) -> None:
        for fd in (self.freeze, self.events, self.procs):
            with contextlib.suppress(OSError):
                os.close(fd)


_GONE = (errno.ENODEV, errno.ENOENT)
"""Errors of a kept-open control file whose cgroup was removed."""


def _read_all(fd: int) -> bytes:
    """The whole content of a kept-open control file (read from its start)."""
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, 65536, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


class CgroupFreezer:
    """One cgroup v2 per workload under ``root``, frozen with ``cgroup.freeze``.

    The control files of each governed workload's cgroup stay open from :meth:`adopt` to
    :meth:`release` (three descriptors a workload), so freezing, thawing and checking open
    no file.

    Args:
        root: the parent cgroup directory fgpu may create children in (created when
            missing), e.g. ``/sys/fs/cgroup/fgpu``.
        hasten: boost still-runnable members while waiting for the freeze (:class:`Hastener`).

    Raises:
        OSError: ``root`` cannot be created or a child cgroup there has no ``cgroup.freeze``
            (kernel before 5.2, or not a cgroup v2 directory).
    """

    def __init__(self, root: Path, *, hasten: bool = False) -> None:
        self.root = root
        self._hasten = hasten
        root.mkdir(exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        try:
            if not (probe / "cgroup.freeze").exists():
                raise OSError(errno.ENOTSUP, "no cgroup.freeze (not cgroup v2, or kernel < 5.2)")
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
        self._left: set[Path] = set()
        self._files: dict[Path, _GroupFiles] = {}
        self._placed: dict[tuple[str, int], Path] = {}

    @property
    def kind(self) -> str:
        return "cgroup-v2"

    def path(self, handle: ProcessHandle) -> Path:
        """The workload's cgroup directory: the one it started in when that is a child of
        ``root`` (its host-limits cgroup, :mod:`fgpu.agent.hostlimits`), else
        ``<root>/<workload id>-<pgid>``."""
        placed = self._placed.get((handle.workload_id, handle.pgid))
        if placed is not None:
            return placed
        name = _SAFE.sub("_", handle.workload_id) or "workload"
        return self.root / f"{name}-{handle.pgid}"

    def _started_in(self, handle: ProcessHandle) -> Path | None:
        """The cgroup the workload's command is in when it is a child of ``root`` (the
        wrapper started it in its host-limits cgroup), else None."""
        try:
            text = Path(f"/proc/{handle.pgid}/cgroup").read_text(encoding="utf-8")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("0::"):
                group = self._mount_root() / line[3:].lstrip("/")
                if group.parent == self.root and belongs_to(handle.pgid, handle):
                    return group
        return None

    @staticmethod
    def _write(path: Path, text: str) -> None:
        with open(path, "w", encoding="ascii") as handle:
            handle.write(text)

    def _set_freeze(self, handle: ProcessHandle, data: bytes) -> None:
        """Write ``data`` to the workload's ``cgroup.freeze`` (kept open once adopted);
        nothing when its cgroup is gone."""
        files = self._files.get(self.path(handle))
        if files is None:
            with contextlib.suppress(FileNotFoundError):
                self._write(self.path(handle) / "cgroup.freeze", data.decode())
            return
        try:
            os.pwrite(files.freeze, data, 0)
        except OSError as exc:
            if exc.errno not in _GONE:
                raise

    def adopt(self, handle: ProcessHandle) -> None:
        self._sweep()  # cgroups of ended workloads whose last members were still exiting
        started_in = self._started_in(handle)
        if started_in is not None:
            self._placed[(handle.workload_id, handle.pgid)] = started_in
        group = self.path(handle)
        try:
            group.mkdir(exist_ok=True)
        except FileNotFoundError:  # another agent's start removed this empty subtree
            self.root.mkdir(exist_ok=True)
            group.mkdir(exist_ok=True)
        if group not in self._files:
            self._files[group] = _GroupFiles(group)
        self._set_freeze(handle, b"0")
        moved: set[int] = set()
        for _ in range(10):  # members may fork while they are being moved
            found = [p for p in group_pids(handle) if p not in moved]
            if not found:
                break
            for pid in found:
                try:
                    self._write(group / "cgroup.procs", str(pid))
                except ProcessLookupError:
                    pass
                except OSError as exc:
                    if exc.errno != errno.ESRCH:
                        raise
                moved.add(pid)

    def freeze(self, handle: ProcessHandle) -> None:
        self._set_freeze(handle, b"1")

    def _frozen_now(self, handle: ProcessHandle) -> bool:
        files = self._files.get(self.path(handle))
        try:
            if files is not None:
                text = os.pread(files.events, 4096, 0).decode("ascii")
            else:
                text = (self.path(handle) / "cgroup.events").read_text(encoding="ascii")
        except FileNotFoundError:
            return True  # gone: nothing runs
        except OSError as exc:
            if exc.errno in _GONE:
                return True
            raise
        return "frozen 1" in text

    def wait_frozen(self, handle: ProcessHandle, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        hastener = Hastener() if self._hasten else None
        try:
            while not self._frozen_now(handle):
                if time.monotonic() >= deadline:
                    return False
                if hastener is not None:
                    hastener.boost(self.pids(handle))
                time.sleep(_POLL_S)
            return True
        finally:
            if hastener is not None:
                hastener.restore()

    def thaw(self, handle: ProcessHandle) -> None:
        self._set_freeze(handle, b"0")

    def is_frozen(self, handle: ProcessHandle) -> bool:
        return bool(self.pids(handle)) and self._frozen_now(handle)

    def pids(self, handle: ProcessHandle) -> list[int]:
        files = self._files.get(self.path(handle))
        if files is None:
            return self.pids_in(self.path(handle))
        try:
            text = _read_all(files.procs)
        except OSError as exc:
            if exc.errno in _GONE:
                return []
            raise
        return sorted(int(line) for line in text.split())

    @staticmethod
    def pids_in(group: Path) -> list[int]:
        """The processes in cgroup directory ``group`` (empty when it is gone)."""
        try:
            text = (group / "cgroup.procs").read_text(encoding="ascii")
        except FileNotFoundError:
            return []
        return sorted(int(line) for line in text.split())

    def owns(self, handle: ProcessHandle, pid: int) -> bool:
        relative = "/" + str(self.path(handle).relative_to(self._mount_root()))
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8")
        except OSError:
            return False
        for line in text.splitlines():
            if line.startswith("0::") and line[3:] == relative:
                return True
        return belongs_to(pid, handle)

    def _mount_root(self) -> Path:
        mount = cgroup2_mount()
        return mount if mount is not None and self.root.is_relative_to(mount) else self.root

    def release(self, handle: ProcessHandle) -> None:
        self.thaw(handle)
        group = self.path(handle)
        self._placed.pop((handle.workload_id, handle.pgid), None)
        files = self._files.pop(group, None)
        if files is not None:
            files.close()
        try:
            group.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            self._left.add(group)  # processes left (a straggler): remove later
        self._sweep()

    def _sweep(self) -> None:
        for group in list(self._left):
            try:
                group.rmdir()
            except FileNotFoundError:
                self._left.discard(group)
            except OSError:
                continue
            else:
                self._left.discard(group)

    def recover(self) -> list[Path]:
        """Thaw every workload cgroup under ``root`` (left frozen by an agent that died) and
        remove the empty ones; returns the cgroups still holding processes."""
        busy: list[Path] = []
        for group in sorted(p for p in self.root.iterdir() if p.is_dir()):
            with contextlib.suppress(OSError):
                self._write(group / "cgroup.freeze", "0")
            try:
                group.rmdir()
            except OSError:
                busy.append(group)
        return busy

    def remove_empty_neighbours(self, min_age_s: float = NEIGHBOUR_AGE_S) -> list[Path]:
        """Remove the empty cgroups other agents left beside ``root`` (their subtrees under
        the same parent, and the workload cgroups in them) when unchanged for ``min_age_s``:
        what a killed agent whose state folder is gone leaves behind. A cgroup with
        processes is never removed (the kernel refuses); an agent that is alive but idle
        that long recreates its subtree when it next needs it. Returns what was removed."""
        return remove_stale_neighbours(self.root, min_age_s)

    def close(self) -> None:
        """Close the kept control files; remove the empty cgroups of ended workloads, and
        ``root`` itself when empty."""
        for files in self._files.values():
            files.close()
        self._files.clear()
        self._sweep()
        with contextlib.suppress(OSError):
            self.root.rmdir()


def detect_freezer(
    prefer: str = "auto",
    *,
    cgroup_root: Path | None = None,
    hasten: bool = True,
) -> Freezer:
    """The freeze mechanism to use.

    Args:
        prefer: ``"auto"`` (cgroup v2 when usable, else signals), ``"cgroup"`` or
            ``"signal"``.
        cgroup_root: parent cgroup for workloads (default ``<cgroup2 mount>/fgpu``); a
            relative path is taken under ``<cgroup2 mount>/fgpu`` (one subtree per agent,
            so that one agent's recovery never thaws another's workloads; at start the
            empty subtrees and cgroups that dead agents left there are removed).
        hasten: boost tasks that are asked to stop so they stop within about a millisecond
            rather than a scheduler tick (see :class:`Hastener`; default on, a no-op without
            CAP_SYS_NICE).

    Raises:
        ValueError: unknown ``prefer``.
        OSError: ``prefer="cgroup"`` and cgroup v2 is not usable here.
    """
    if prefer not in ("auto", "cgroup", "signal"):
        raise ValueError(f"unknown freezer {prefer!r}; use auto, cgroup or signal")
    if prefer == "signal":
        return SignalFreezer(hasten=hasten)
    root = cgroup_root
    if root is None or not root.is_absolute():
        mount = cgroup2_mount()
        if mount is None:
            if prefer == "cgroup":
                raise OSError(errno.ENOENT, "no cgroup v2 hierarchy is mounted")
            return SignalFreezer(hasten=hasten)
        shared = root is not None
        root = mount / "fgpu" / root if root is not None else mount / "fgpu"
    else:
        shared = False
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        freezer = CgroupFreezer(root, hasten=hasten)
    except OSError as exc:
        if prefer == "cgroup":
            raise
        log.info("cgroup v2 freezer unusable at %s (%s); using SIGSTOP/SIGCONT", root, exc)
        return SignalFreezer(hasten=hasten)
    freezer.recover()
    if shared:  # one subtree per agent under <mount>/fgpu: sweep what dead ones left
        freezer.remove_empty_neighbours()
    return freezer


__all__ = [
    "CgroupFreezer",
    "Freezer",
    "Hastener",
    "SignalFreezer",
    "belongs_to",
    "cgroup2_mount",
    "detect_freezer",
    "stat_fields",
]
