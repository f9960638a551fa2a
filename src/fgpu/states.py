"""One vocabulary of workload states, for every view: ``fgpu ls``, ``fgpu top``, their
``--json``, the API and the dashboard (issue 25, point 6; the table in ``docs/states.md``).

A workload's *phase* (``pending``, ``running``, ``paused``, ``succeeded``, ``failed``,
``cancelled``) says where it is in its life; its *state* says what happens to it beyond the
phase, in one word of :data:`STATES`, or nothing. The word is the same everywhere: the API
field ``state`` (and ``gpu_state``, ``GpuHolder.state``), ``fgpu ls``'s STATE column (the
word, then the details :func:`state_text` adds), ``fgpu top``'s holders and the dashboard's
marks. The node agent's governor keeps its own internal names (``frozen-by-share``,
``frozen-by-priority``); :func:`governor_word` turns them into these words at the edge.

Priorities are named the same way everywhere too: :func:`priority_word` (``normal``, or the
number where no class has it).

Pure: no I/O, and no imports of fgpu (the command line's fast path loads it).
"""

from __future__ import annotations

PRIORITY_CLASSES: dict[str, int] = {
    "very-low": 25,
    "low": 40,
    "normal": 50,
    "high": 100,
    "critical": 125,
}
"""The named priorities of DESIGN.md section 5, as :data:`fgpu.sched.workload.PRIORITY_CLASSES`
has them (a test keeps the two equal; this module does not import the decision core so that
the command line starts fast)."""

RUNNING = "running"
"""On a governed GPU: allowed to run now (no mark; listings show nothing beyond the phase)."""
PAUSED_BY_PRIORITY = "paused-by-priority"
WAITING_FOR_SHARE = "waiting-for-share"
SQUEEZED = "squeezed"
SUSPENDED = "suspended"
STOPPING = "stopping"
PREEMPTED = "preempted"
RECLAIMED = "reclaimed"

STATES: dict[str, str] = {
    PAUSED_BY_PRIORITY: "running, but held back while a higher-priority workload on its GPU "
    "is busy (paused, or compressed to a floor share); it resumes when that one goes idle",
    WAITING_FOR_SHARE: "running, but it used its compute share of the governor's period; it "
    "runs again in the next period",
    SQUEEZED: "running with its memory, but its compute is lent to higher-priority work of "
    "its queue (squeeze before evict); it gets it back when that work ends",
    SUSPENDED: "pending: its GPU memory is in host memory and its processes are frozen on "
    "their node; it is restored there when its GPU has room",
    STOPPING: "running or paused, and being stopped (cancel or preemption): SIGTERM sent, "
    "SIGKILL after the grace period",
    PREEMPTED: "pending again after higher-priority work of its queue took its place; shown "
    "with the preemptor and the restart count until it runs again",
    RECLAIMED: "pending again after a queue below its fair share took its place; shown with "
    "the workload that reclaimed it and the restart count until it runs again",
}
"""Every state word and what it means (the documentation's table is checked against it)."""

_GOVERNOR = {
    "running": RUNNING,
    "frozen-by-priority": PAUSED_BY_PRIORITY,
    "frozen-by-share": WAITING_FOR_SHARE,
}


def governor_word(raw: str | None) -> str | None:
    """The governor's state (``running``, ``frozen-by-priority``, ``frozen-by-share``) as a
    word of :data:`STATES` (or :data:`RUNNING`); None stays None, an unknown name as it is."""
    if raw is None:
        return None
    return _GOVERNOR.get(raw, raw)


def workload_state(
    *,
    phase: str,
    stopping: bool,
    squeezed: bool,
    suspended: bool,
    gpu_state: str | None,
    preempted_kind: str | None,
) -> str | None:
    """The one state word of a workload, or None when nothing happens beyond its phase.

    Args:
        phase: its phase.
        stopping: being stopped (holding its allocation with a stop requested).
        squeezed: its compute lent (squeeze before evict).
        suspended: pending and suspended to host memory.
        gpu_state: the governor's state, already a word (:func:`governor_word`), or None.
        preempted_kind: ``preemption`` or ``reclaim`` for a workload put back to pending by
            the decision core that has not run since; None otherwise.

    Returns:
        A key of :data:`STATES`, or None. Precedence: stopping, squeezed, suspended,
        paused-by-priority / waiting-for-share, preempted / reclaimed.
    """
    if stopping:
        return STOPPING
    if squeezed:
        return SQUEEZED
    if suspended:
        return SUSPENDED
    if gpu_state in (PAUSED_BY_PRIORITY, WAITING_FOR_SHARE):
        return gpu_state
    if phase == "pending" and preempted_kind is not None:
        return RECLAIMED if preempted_kind == "reclaim" else PREEMPTED
    return None


def state_text(
    state: str | None,
    *,
    restarts: int = 0,
    by: str | None = None,
    squeezed_by: list[str] | None = None,
    suspended_host_mib: int | None = None,
) -> str:
    """The state as ``fgpu ls`` and the dashboard write it: the word, then its details.

    ``preempted by train (restart 2)``, ``reclaimed by serve (restart 1)``,
    ``squeezed by 3f2a9c``, ``suspended (4GiB in host memory)``; the other words alone; ""
    for None.

    Args:
        state: a key of :data:`STATES` or None.
        restarts: how many times it went back to pending.
        by: the preempting workload, named as ``fgpu ls`` names it (its NAME), or None.
        squeezed_by: ids of the workloads that squeezed it.
        suspended_host_mib: host memory a suspended workload holds, MiB.
    """
    if state is None:
        return ""
    if state in (PREEMPTED, RECLAIMED):
        who = f" by {by}" if by else ""
        return f"{state}{who} (restart {restarts})"
    if state == SQUEEZED and squeezed_by:
        return f"{state} by {', '.join(squeezed_by)}"
    if state == SUSPENDED and suspended_host_mib is not None:
        return f"{state} ({memory_text(suspended_host_mib)} in host memory)"
    return state


def priority_word(priority: int) -> str:
    """``normal`` for 50 (the class of that number, :data:`PRIORITY_CLASSES`), else the
    number as text (``75``)."""
    return _PRIORITY_NAMES.get(priority) or str(priority)


_PRIORITY_NAMES = {value: name for name, value in PRIORITY_CLASSES.items()}


def memory_text(mib: int) -> str:
    """MiB as ``fgpu ls`` writes memory: ``20GiB``, ``1.5GiB``, ``512MiB``."""
    if mib >= 1024:
        return f"{mib / 1024:.2f}".rstrip("0").rstrip(".") + "GiB"
    return f"{mib}MiB"


__all__ = [
    "PAUSED_BY_PRIORITY",
    "PREEMPTED",
    "PRIORITY_CLASSES",
    "RECLAIMED",
    "RUNNING",
    "SQUEEZED",
    "STATES",
    "STOPPING",
    "SUSPENDED",
    "WAITING_FOR_SHARE",
    "governor_word",
    "memory_text",
    "priority_word",
    "state_text",
    "workload_state",
]
