"""What is known about a launched workload's processes, and how to recognise them later.

:class:`ProcessHandle` is what the launcher returns and the store keeps; :class:`ProcessState`
is what :meth:`fgpu.agent.launcher.Launcher.poll` answers. The functions here read Linux
``/proc`` to tell whether a pid still names the same process (:func:`is_same_process`, the
guard against pid reuse that re-adoption after a restart relies on) and whether any of a
workload's process group is left (:func:`group_alive`). The node agent runs on Linux; where
``/proc`` is missing the start-tick checks fall back to psutil's ``create_time``.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

CREATE_TIME_TOLERANCE_S = 2.0
"""How far a process's psutil ``create_time`` may be from the recorded one and still count as
the same process, when the boot-relative start time is not available. psutil computes it as
boot time plus start ticks, and the kernel's boot time (``btime`` in ``/proc/stat``) moves by
a second now and then as the wall clock is disciplined; a pid is not reused within two
seconds of its previous holder's start unless 32768+ processes start in that time."""


@dataclass(frozen=True, slots=True)
class ProcessHandle:
    """Everything needed to find a launched workload again, also from another process.

    Store it with :meth:`to_dict` and load it with :meth:`from_dict`.

    Attributes:
        workload_id: the spec's id.
        pid: the wrapper's pid.
        create_time: the wrapper's start, psutil ``create_time`` (seconds since the epoch).
        pgid: the workload's process group (equal to the command's pid; the wrapper's own pid
            when the command never started).
        stdout_path, stderr_path: the workload's logs.
        exit_path: where the wrapper records the outcome.
        start_ticks: the wrapper's start in clock ticks since boot (Linux
            ``/proc/<pid>/stat`` field 22); unlike ``create_time`` it does not move with the
            wall clock. None where unavailable.
        boot_id: the kernel's boot id (``/proc/sys/kernel/random/boot_id``) when launched;
            start ticks count from boot, so they only compare within one boot. None where
            unavailable.
    """

    workload_id: str
    pid: int
    create_time: float
    pgid: int
    stdout_path: Path
    stderr_path: Path
    exit_path: Path
    start_ticks: int | None = None
    boot_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (paths as strings)."""
        return {
            "workload_id": self.workload_id,
            "pid": self.pid,
            "create_time": self.create_time,
            "pgid": self.pgid,
            "stdout_path": str(self.stdout_path),
            "stderr_path": str(self.stderr_path),
            "exit_path": str(self.exit_path),
            "start_ticks": self.start_ticks,
            "boot_id": self.boot_id,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessHandle:
        """Inverse of :meth:`to_dict`.

        Raises:
            KeyError, TypeError, ValueError: a field is missing or malformed.
        """
        ticks = data.get("start_ticks")
        boot = data.get("boot_id")
        return cls(
            workload_id=str(data["workload_id"]),
            pid=int(data["pid"]),
            create_time=float(data["create_time"]),
            pgid=int(data["pgid"]),
            stdout_path=Path(data["stdout_path"]),
            stderr_path=Path(data["stderr_path"]),
            exit_path=Path(data["exit_path"]),
            start_ticks=int(ticks) if ticks is not None else None,
            boot_id=str(boot) if boot is not None else None,
        )


class ProcessStatus(enum.Enum):
    """Where a launched workload is."""

    RUNNING = "running"
    """The wrapper lives; the command has not finished."""
    EXITED = "exited"
    """The outcome is recorded (exit code, possibly 125-127 for a failed start)."""
    LOST = "lost"
    """The wrapper is gone without a record (killed, machine rebooted, files removed)."""


@dataclass(frozen=True, slots=True)
class ProcessState:
    """Answer of :meth:`Launcher.poll`.

    Attributes:
        status: running, exited or lost.
        exit_code: for ``EXITED``: exit status, ``-N`` for signal ``N``, 125-127 for a
            failed start (see :mod:`fgpu.agent.runner`); else None.
        reason: for ``EXITED``, why it could not start or which signal ended it (None for a
            plain exit); for ``LOST``, what is known.
    """

    status: ProcessStatus
    exit_code: int | None = None
    reason: str | None = None

    @property
    def running(self) -> bool:
        return self.status is ProcessStatus.RUNNING


@dataclass(frozen=True, slots=True)
class ProcStat:
    """One process as ``/proc/<pid>/stat`` shows it."""

    pid: int
    state: str
    pgid: int
    start_ticks: int


DEAD_STATES = frozenset("ZXx")


def stat_after_name(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (index 0 is field 3,
    the state; index ``n - 3`` is field ``n``), or None when the process is gone or
    unreadable. The command name (field 2) may hold spaces and parentheses, so the fields
    are taken after its last ``)``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def proc_stat(pid: int) -> ProcStat | None:
    """State, process group and start (clock ticks since boot) of ``pid`` from
    ``/proc/<pid>/stat`` (Linux; fields 3, 5 and 22), or None."""
    fields = stat_after_name(pid)
    if fields is None:
        return None
    try:
        return ProcStat(pid, fields[0].decode(), int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    """This boot's id (Linux ``/proc/sys/kernel/random/boot_id``), or None."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), or None."""
    stat = proc_stat(pid)
    return stat.start_ticks if stat else None


def group_members(pgid: int) -> list[ProcStat]:
    """Every process whose process group is ``pgid`` (a scan of ``/proc``)."""
    members: list[ProcStat] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return members
    for name in names:
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat is not None and stat.pgid == pgid:
                members.append(stat)
    return members


def is_same_process(handle: ProcessHandle) -> bool:
    """Whether the wrapper ``handle`` names still lives: a process with that pid exists, is
    not a zombie, and started when the handle says (in the same boot, at the same
    boot-relative start tick when both are known, else psutil ``create_time`` within
    :data:`CREATE_TIME_TOLERANCE_S`). False for a
    pid that is free or was reused by another process."""
    try:
        proc = psutil.Process(handle.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        create_time = proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    if handle.boot_id is not None and boot_id() not in (None, handle.boot_id):
        return False  # the machine rebooted since: every process is new
    if handle.start_ticks is not None:
        ticks = start_ticks(handle.pid)
        if ticks is not None:
            return ticks == handle.start_ticks
    return bool(abs(create_time - handle.create_time) <= CREATE_TIME_TOLERANCE_S)


def group_alive(handle: ProcessHandle) -> bool:
    """Whether a live (not zombie) process of the workload's group is left that started no
    earlier than the wrapper (so a group id reused by someone else does not count). Zombies
    do not count: where pid 1 does not reap orphans they stay in the group for good."""
    try:
        os.killpg(handle.pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass

    def ours(stat: ProcStat | None) -> bool:
        return (
            stat is not None
            and stat.pgid == handle.pgid
            and stat.state not in DEAD_STATES
            and (handle.start_ticks is None or stat.start_ticks >= handle.start_ticks)
        )

    if ours(proc_stat(handle.pgid)):  # the usual case: the group leader still runs
        return True
    return any(ours(m) for m in group_members(handle.pgid))


def group_pids(handle: ProcessHandle) -> list[int]:
    """Pids of the live (not zombie) processes in the workload's group that started no
    earlier than the wrapper, ascending (a scan of ``/proc``)."""
    return sorted(
        m.pid
        for m in group_members(handle.pgid)
        if m.state not in DEAD_STATES
        and (handle.start_ticks is None or m.start_ticks >= handle.start_ticks)
    )
