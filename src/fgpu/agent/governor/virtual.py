"""Run the planner on a virtual clock, with freezes and thaws taking effect at once.

Tests use this to assert the exact actions of :func:`fgpu.agent.governor.plan.plan` over
time and to check properties over whole periods; it is also a quick way to see what a
configuration does. The driver keeps the planner's state the way the real executor does:
a running, busy workload is charged the time between two steps; ``used_ns`` starts afresh
when the plan reports a new period; ``idle_since_ns`` is set when a workload goes idle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fgpu.agent.governor.plan import (
    Action,
    GpuPolicy,
    Lease,
    NodeState,
    PlannerConfig,
    RunState,
    WorkloadState,
    plan,
)


@dataclass(frozen=True, slots=True)
class Activity:
    """At ``at_ns``, workload ``workload_id`` becomes busy (True) or idle (False)."""

    at_ns: int
    workload_id: str
    busy: bool


@dataclass(frozen=True, slots=True)
class Step:
    """The actions one plan call returned (only steps with actions are recorded)."""

    at_ns: int
    actions: tuple[Action, ...]


@dataclass(frozen=True, slots=True)
class Slice:
    """From ``start_ns`` to ``end_ns`` these workloads ran while busy (sorted ids) and these
    were busy but not paused by priority (``active``)."""

    start_ns: int
    end_ns: int
    running: tuple[str, ...]
    active: tuple[str, ...]


@dataclass(slots=True)
class VirtualRun:
    """What :func:`run_virtual` saw.

    Attributes:
        steps: each plan call that had actions, in time order.
        used: period start -> workload id -> busy run time received in that period, ns.
        slices: the timeline, one slice per interval between plan calls.
        final: the last state.
    """

    steps: list[Step] = field(default_factory=list)
    used: dict[int, dict[str, int]] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    final: NodeState | None = None


def run_virtual(
    config: PlannerConfig,
    gpus: Mapping[str, GpuPolicy],
    workloads: Sequence[WorkloadState],
    until_ns: int,
    activity: Sequence[Activity] = (),
    *,
    start_ns: int = 0,
) -> VirtualRun:
    """Plan and execute from ``start_ns`` to ``until_ns`` on a virtual clock.

    Args:
        config, gpus: as in :class:`NodeState`.
        workloads: the initial states (``state`` is normally ``RUNNING``: just launched).
        until_ns: end of the run.
        activity: busy/idle changes, any order (applied in time order, before planning).
        start_ns: the first period starts here.

    Returns:
        A :class:`VirtualRun`.
    """
    pending = sorted(activity, key=lambda a: a.at_ns)
    state = NodeState(
        config=config,
        gpus=gpus,
        workloads=list(workloads),
        period_start_ns=start_ns,
    )
    run = VirtualRun()
    now = start_ns
    index = 0
    while now < until_ns:
        current = {w.workload_id: w for w in state.workloads}
        while index < len(pending) and pending[index].at_ns <= now:
            change = pending[index]
            index += 1
            w = current[change.workload_id]
            if change.busy != w.busy:
                current[w.workload_id] = dataclasses.replace(
                    w,
                    busy=change.busy,
                    idle_since_ns=None if change.busy else now,
                )
        state = dataclasses.replace(state, workloads=list(current.values()))
        decided = plan(now, state)
        if decided.actions:
            run.steps.append(Step(now, decided.actions))
        fresh = decided.period_start_ns != state.period_start_ns
        later = min(decided.wake_ns, until_ns)
        if index < len(pending):
            later = min(later, max(pending[index].at_ns, now + 1))
        updated: list[WorkloadState] = []
        running: list[str] = []
        active: list[str] = []
        for w in current.values():
            wanted = decided.states[w.workload_id]
            used = 0 if fresh else w.used_ns
            if wanted is RunState.RUNNING and w.busy:
                used += later - now
                running.append(w.workload_id)
            if w.busy and wanted is not RunState.FROZEN_BY_PRIORITY:
                active.append(w.workload_id)
            updated.append(dataclasses.replace(w, state=wanted, used_ns=used))
        period = run.used.setdefault(decided.period_start_ns, {})
        for w in updated:
            period[w.workload_id] = w.used_ns
        run.slices.append(Slice(now, later, tuple(sorted(running)), tuple(sorted(active))))
        leases: dict[str, Lease] = dict(decided.leases)
        state = dataclasses.replace(
            state,
            workloads=updated,
            period_start_ns=decided.period_start_ns,
            leases=leases,
        )
        now = later
    run.final = state
    return run


__all__ = ["Activity", "Slice", "Step", "VirtualRun", "run_virtual"]
