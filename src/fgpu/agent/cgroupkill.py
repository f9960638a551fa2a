"""Ending every process of a workload's cgroup, and removing the cgroup (issue 27).

A workload's processes can leave its process group and session (``setsid``), but not its
cgroup: the cgroups are the agent's (root's), and moving a process needs write access to the
``cgroup.procs`` of the common ancestor of both cgroups. So when a workload ends, whatever
it left running is found in its cgroup(s) and killed before its share is given to anyone
else:

- **cgroup v2** with ``cgroup.kill`` (Linux 5.14; Linux admin guide, "Control Group v2",
  section "Core Interface Files"): writing ``1`` SIGKILLs every process of the cgroup and
  its descendants, also those forked meanwhile.
- otherwise (cgroup v1 hierarchies, older kernels): SIGKILL to each pid of ``cgroup.procs``,
  read again until it is empty (a process may fork between the read and the kill).

A frozen cgroup (``cgroup.freeze``) is thawed first. Where the host has no writable cgroup
hierarchy there is no cgroup to empty: the wrapper kills the workload's process group, and a
process that left it (``setsid``) is out of reach (``docs/`` and the README say so).

Only the standard library: the wrapper (:mod:`fgpu.agent.runner`) imports it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

KILL_TIMEOUT_S = 5.0
"""How long :func:`kill_cgroup` keeps killing and waiting for the cgroup to empty."""


def cgroup_pids(directory: str | Path) -> list[int]:
    """The processes in cgroup ``directory`` (``cgroup.procs``); empty when it is gone."""
    try:
        with open(os.path.join(directory, "cgroup.procs"), encoding="ascii") as handle:
            return [int(line) for line in handle.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []
    except OSError as exc:
        if exc.errno == 19:  # ENODEV: removed while open
            return []
        raise


def _write(path: str, text: str) -> bool:
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write(text)
    except OSError:
        return False
    return True


def kill_cgroup(directory: str | Path, timeout_s: float = KILL_TIMEOUT_S) -> list[int]:
    """SIGKILL every process in cgroup ``directory`` and wait until it is empty (at most
    ``timeout_s``; see the module docstring for how).

    Returns:
        the pids found in it at the first look (empty: it was empty or gone).
    """
    folder = str(directory)
    found = cgroup_pids(folder)
    if not found:
        return []
    freeze = os.path.join(folder, "cgroup.freeze")
    if os.path.exists(freeze):
        _write(freeze, "0")
    kill_file = os.path.join(folder, "cgroup.kill")
    use_kill_file = os.path.exists(kill_file)
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    pids = found
    while pids:
        if not (use_kill_file and _write(kill_file, "1")):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            break
        time.sleep(pause)  # dying processes leave the cgroup a moment after the signal
        pause = min(pause * 2, 0.05)
        pids = cgroup_pids(folder)
    return found


def remove_cgroup(directory: str | Path, timeout_s: float = 1.0) -> bool:
    """``rmdir`` the cgroup, retried for ``timeout_s`` while its last processes exit; True
    when it is gone."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while True:
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        else:
            return True


def end_cgroups(directories: Iterable[str | Path]) -> list[int]:
    """:func:`kill_cgroup` then :func:`remove_cgroup` for each; the pids that were killed."""
    killed: list[int] = []
    folders = list(directories)
    for folder in folders:
        killed += kill_cgroup(folder)
    for folder in folders:
        remove_cgroup(folder)
    return killed


def session_pids(session: int) -> list[int]:
    """Live processes whose session id is ``session`` (a scan of ``/proc``)."""
    out: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        with contextlib.suppress(IndexError, ValueError):
            if fields[0] not in (b"Z", b"X", b"x") and int(fields[3]) == session:
                out.append(int(name))
    return out


def kill_session(session: int, spare: int | None = None) -> list[int]:
    """SIGKILL every live process of ``session`` but ``spare`` (where there is no cgroup);
    the pids."""
    pids = [p for p in session_pids(session) if p != spare]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


__all__ = [
    "KILL_TIMEOUT_S",
    "cgroup_pids",
    "end_cgroups",
    "kill_cgroup",
    "kill_session",
    "remove_cgroup",
    "session_pids",
]
