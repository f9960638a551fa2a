"""The governor's pure planner: who may run on each GPU now (DESIGN.md section 7).

:func:`plan` takes the time and a :class:`NodeState` snapshot and returns a :class:`Plan`:
freeze/thaw actions (with reasons), the leases it grants, and when to plan again. It reads
no clock, does no I/O and is deterministic; :class:`fgpu.agent.governor.runtime.Governor`
executes its plans and :mod:`fgpu.agent.governor.virtual` runs it on a virtual clock.

Model (one time-sliced GPU behaves like one CPU core under a lease scheduler):

- **Leases.** On each GPU at most one busy workload holds a lease at a time; the others that
  are busy are frozen. Leases start and end on a grid of ``lease_ns`` counted from the period
  start, so that a workload spread over several GPUs (a gang) finds all its GPUs free at the
  same instants; a lease shorter than ``min_lease_ns`` to the next grid point runs on to the
  one after.
- **Periods.** Time is cut into periods of ``period_ns`` (a multiple of ``lease_ns``). In each
  period a workload has a *budget* of run time on each of its GPUs:

  - ``strict``: ``share * period / 1000``; the budget is a cap.
  - ``fair``: ``share * period * (1000 - S_strict) / (1000 * S_fair)``, where ``S_strict`` and
    ``S_fair`` are the shares of the busy strict and fair workloads on the GPU: the time the
    strict ones and the idle ones leave goes to the busy fair ones in proportion to their
    shares (proportional share, as in stride scheduling: Waldspurger and Weihl, "Stride
    Scheduling", MIT/LCS/TM-528, 1995). Since shares on a GPU add up to at most 1000, the
    budget is at least ``share * period / 1000``. When every busy fair workload has used its
    budget and time is left, they keep taking leases (phase 2), so the GPU is never idle
    while a fair workload is busy.

  Workloads are ordered by ``(phase, -priority, used / share, workload_id)``: those with
  budget left first, then higher priority, then the one furthest behind its share.
- **Priority.** A workload *holds* a GPU's priority while it is busy and for
  ``resume_after_ns`` after it last went idle (hysteresis). Workloads of lower priority than
  the highest holder on a GPU are *suppressed* there: ``pause`` freezes them whatever their
  activity; ``compress`` caps them at ``min(share, floor_milli)`` as a strict budget. A
  higher-priority workload that wants a GPU ends a lower-priority lease at once.
- **Borrowed work never outranks work within its quota** (issue 25). A workload running
  beyond its queue's quota (``borrowed``: on capacity lent by other queues, see
  :mod:`fgpu.sched.borrowing`) never suppresses, and never ends the lease of, a workload
  that runs within its own queue's quota, whatever their priorities: an in-quota workload
  is suppressed only by an in-quota holder of higher priority. Among workloads of the same
  standing (both borrowed, or both within quota), and for a borrowed workload against an
  in-quota one of higher priority, the priority rule is unchanged.
- **Squeezed workloads** (DESIGN.md section 5, squeeze before evict) lent their compute to
  the workloads that squeezed them: they are suppressed in the same way (paused, or
  compressed) while one of their squeezers holds the GPU, whatever the priorities, and run
  on their share when all of them have let go. Their shares are not counted in the 1000
  milli of a GPU: compute of the workloads that are not squeezed adds up to at most 1000.
- **Gangs.** A workload on several GPUs runs only when it may run on every one of them: it
  is eligible only if eligible on each, holds one lease covering all of them, and is paused
  on all of them when paused on one. Its run time counts on each of its GPUs.
- **Idle workloads run.** A workload that is not busy is left thawed (it is not using the
  GPU, and a frozen process could not announce that it is busy again), unless paused.

A workload alone on a GPU in ``fair`` mode is never frozen (it is always the best
candidate), unless it is part of a gang that must wait for another GPU.

Units: times are integer nanoseconds of one monotonic clock; shares are milli-GPU.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

MILLI = 1000


class ComputeMode(enum.StrEnum):
    """How a GPU's time is divided (DESIGN.md section 7)."""

    STRICT = "strict"
    """Each workload gets its share of every period, no more."""
    FAIR = "fair"
    """Shares are guaranteed minimums; unused time goes to busy workloads by share."""


class PriorityPolicy(enum.StrEnum):
    """What happens to lower-priority workloads while a higher-priority one is busy."""

    PAUSE = "pause"
    """Frozen until the higher-priority one has been idle for the hysteresis delay."""
    COMPRESS = "compress"
    """Held to a floor share (strict) until then."""


class RunState(enum.StrEnum):
    """What the governor wants of a workload (and what ``fgpu top`` shows)."""

    RUNNING = "running"
    FROZEN_BY_SHARE = "frozen-by-share"
    """Busy, but another workload holds the lease or its budget for the period is used."""
    FROZEN_BY_PRIORITY = "frozen-by-priority"
    """Paused, or compressed and waiting, because a higher-priority workload is busy."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerConfig:
    """Time constants of the planner, integer nanoseconds.

    Attributes:
        period_ns: accounting period; shares hold over each period (default 100 ms).
        lease_ns: lease grid; a lease lasts at most this long before the next decision
            (default 10 ms). Must divide ``period_ns``.
        min_lease_ns: shortest lease worth granting (default 1 ms): a budget remainder below
            it is not granted in ``strict`` (so a strict workload may get up to this much less
            than its share in a period) and is rounded into phase 2 in ``fair``.
        resume_after_ns: hysteresis: how long a higher-priority workload must have been idle
            before lower ones resume (default 500 ms).

    The defaults come from ``bench/governor.py`` (see ``docs/governor.md``).

    Raises:
        ValueError: a non-positive period or lease, a lease that does not divide the period,
            or ``min_lease_ns`` outside ``[0, lease_ns]``, or a negative hysteresis.
    """

    period_ns: int = 100_000_000
    lease_ns: int = 10_000_000
    min_lease_ns: int = 1_000_000
    resume_after_ns: int = 500_000_000

    def __post_init__(self) -> None:
        if self.period_ns <= 0 or self.lease_ns <= 0:
            raise ValueError("period_ns and lease_ns must be positive")
        if self.period_ns % self.lease_ns:
            raise ValueError(
                f"lease_ns ({self.lease_ns}) must divide period_ns ({self.period_ns})",
            )
        if not 0 <= self.min_lease_ns <= self.lease_ns:
            raise ValueError("min_lease_ns must be between 0 and lease_ns")
        if self.resume_after_ns < 0:
            raise ValueError("resume_after_ns must not be negative")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuPolicy:
    """Per-GPU settings.

    Attributes:
        mode: compute mode of workloads that do not choose one.
        priority_policy: ``pause`` or ``compress`` for workloads that do not choose.
        floor_milli: the share a compressed workload is held to (default 100 = 10 %).

    Raises:
        ValueError: ``floor_milli`` outside 0-1000.
    """

    mode: ComputeMode = ComputeMode.FAIR
    priority_policy: PriorityPolicy = PriorityPolicy.PAUSE
    floor_milli: int = 100

    def __post_init__(self) -> None:
        if not 0 <= self.floor_milli <= MILLI:
            raise ValueError(f"floor_milli must be 0-1000, got {self.floor_milli}")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadState:
    """One workload as the planner sees it.

    Attributes:
        workload_id: its id (also the last tie-break).
        shares: GPU uuid -> compute share on that GPU, milli-GPU (1-1000). Several GPUs make
            a gang.
        priority: higher wins (DESIGN.md section 5 classes).
        mode: its compute mode, or None for each GPU's.
        priority_policy: ``pause``/``compress`` when suppressed, or None for each GPU's.
        busy: whether it is using (or about to use) the GPU.
        squeezed_by: ids of the workloads that squeezed it (empty when it is not squeezed);
            it is suppressed on a GPU while one of them holds it there.
        borrowed: whether it runs beyond its queue's quota (on capacity lent by other
            queues); it then never suppresses a workload that is not borrowed.
        idle_since_ns: when it last went from busy to idle; None when busy or never busy.
        state: what was last executed for it.
        used_ns: run time it received while busy in the period that starts at
            :attr:`NodeState.period_start_ns`.

    Raises:
        ValueError: no GPUs, a share outside 1-1000, or negative ``used_ns``.
    """

    workload_id: str
    shares: Mapping[str, int]
    priority: int = 50
    mode: ComputeMode | None = None
    priority_policy: PriorityPolicy | None = None
    busy: bool = True
    squeezed_by: frozenset[str] = frozenset()
    borrowed: bool = False
    idle_since_ns: int | None = None
    state: RunState = RunState.RUNNING
    used_ns: int = 0

    def __post_init__(self) -> None:
        if not self.shares:
            raise ValueError(f"workload {self.workload_id}: no GPUs")
        for uuid, share in self.shares.items():
            if not 0 < share <= MILLI:
                raise ValueError(
                    f"workload {self.workload_id}: share on {uuid} must be 1-1000, got {share}",
                )
        if self.used_ns < 0:
            raise ValueError(f"workload {self.workload_id}: used_ns must be >= 0")


@dataclass(frozen=True, slots=True)
class Lease:
    """``workload_id`` may run on a GPU until ``until_ns``."""

    workload_id: str
    until_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeState:
    """Everything :func:`plan` needs.

    Attributes:
        config: time constants.
        gpus: GPU uuid -> its policy; every GPU a workload names must be here.
        workloads: the governed workloads.
        period_start_ns: start of the period ``used_ns`` figures belong to.
        leases: GPU uuid -> the lease granted by the previous plan (if any).
    """

    config: PlannerConfig
    gpus: Mapping[str, GpuPolicy]
    workloads: Sequence[WorkloadState]
    period_start_ns: int
    leases: Mapping[str, Lease] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Freeze:
    """Stop ``workload_id`` (or, when it is already frozen, record the new reason)."""

    workload_id: str
    reason: RunState
    message: str


@dataclass(frozen=True, slots=True)
class Thaw:
    """Let ``workload_id`` run."""

    workload_id: str
    message: str


Action = Freeze | Thaw


@dataclass(frozen=True, slots=True)
class Plan:
    """What :func:`plan` decided.

    Attributes:
        actions: freezes first (workload id order), then thaws; only for workloads whose
            state changes.
        states: workload id -> wanted state, for every workload.
        leases: GPU uuid -> lease, for GPUs with a lease holder.
        period_start_ns: the period ``now`` is in (later than the input's when a period
            boundary passed: the caller starts counting ``used_ns`` afresh).
        wake_ns: plan again at this time at the latest (a lease ends, a period ends, or a
            hysteresis delay runs out); earlier when activity changes. The lease of a holder
            alone on its GPUs with a fair share does not count: renewing it changes nothing.
        blockers: workload id -> why it is suppressed (for event messages).
    """

    actions: tuple[Action, ...]
    states: Mapping[str, RunState]
    leases: Mapping[str, Lease]
    period_start_ns: int
    wake_ns: int
    blockers: Mapping[str, str]


@dataclass(slots=True)
class _Slot:
    """One workload's standing on one GPU."""

    share: int
    strict: bool
    paused: bool
    compressed: bool
    budget_ns: int = 0


def _holding(w: WorkloadState, now: int, resume_after: int) -> bool:
    if w.busy:
        return True
    return w.idle_since_ns is not None and now - w.idle_since_ns < resume_after


def _outranks(a: WorkloadState, b: WorkloadState) -> bool:
    """Whether ``a``'s priority suppresses ``b``: higher, and not borrowed against a
    workload within its quota."""
    return a.priority > b.priority and (b.borrowed or not a.borrowed)


def plan(now: int, state: NodeState) -> Plan:
    """Decide who runs on each GPU at time ``now`` (see the module docstring).

    Args:
        now: current time, ns (same clock as every time in ``state``).
        state: the snapshot.

    Returns:
        The :class:`Plan`.

    Raises:
        ValueError: ``now`` is before ``state.period_start_ns``, a workload names a GPU not
            in ``state.gpus``, or two workloads share an id.
    """
    cfg = state.config
    if now < state.period_start_ns:
        raise ValueError(f"now ({now}) is before the period start ({state.period_start_ns})")
    periods = (now - state.period_start_ns) // cfg.period_ns
    period_start = state.period_start_ns + periods * cfg.period_ns
    period_end = period_start + cfg.period_ns
    fresh = periods > 0

    by_id: dict[str, WorkloadState] = {}
    for w in state.workloads:
        if w.workload_id in by_id:
            raise ValueError(f"workload {w.workload_id} given twice")
        for uuid in w.shares:
            if uuid not in state.gpus:
                raise ValueError(f"workload {w.workload_id}: unknown GPU {uuid}")
        by_id[w.workload_id] = w
    used = {wid: 0 if fresh else w.used_ns for wid, w in by_id.items()}

    members: dict[str, list[str]] = {uuid: [] for uuid in state.gpus}
    for wid in sorted(by_id):
        for uuid in by_id[wid].shares:
            members[uuid].append(wid)

    # Priority: per GPU, the highest priority among workloads that hold it (among the
    # in-quota holders only, for an in-quota workload: borrowed ones never outrank it).
    slots: dict[str, dict[str, _Slot]] = {}
    blockers: dict[str, str] = {}
    for uuid, wids in members.items():
        policy = state.gpus[uuid]
        holding = [by_id[w] for w in wids if _holding(by_id[w], now, cfg.resume_after_ns)]
        holding_ids = {h.workload_id for h in holding}
        gpu_slots: dict[str, _Slot] = {}
        for wid in wids:
            w = by_id[wid]
            above = [h for h in holding if _outranks(h, w)]
            top = max((h.priority for h in above), default=None)
            top_name = min((h.workload_id for h in above if h.priority == top), default="")
            squeezer = min(w.squeezed_by & holding_ids, default=None)
            suppressed = squeezer is not None or top is not None
            how = w.priority_policy or policy.priority_policy
            is_paused = suppressed and how is PriorityPolicy.PAUSE
            is_compressed = suppressed and how is PriorityPolicy.COMPRESS
            share = w.shares[uuid]
            if is_compressed:
                share = min(share, policy.floor_milli)
            strict = is_compressed or (w.mode or policy.mode) is ComputeMode.STRICT
            gpu_slots[wid] = _Slot(share, strict, is_paused, is_compressed)
            if suppressed and wid not in blockers:
                verb = "paused" if is_paused else f"compressed to {policy.floor_milli} milli"
                if squeezer is not None:
                    name, who = squeezer, f"squeezed by {squeezer}, which"
                else:
                    name, who = top_name, f"{top_name} (priority {top})"
                blockers[wid] = (
                    f"{verb}: {who} is busy on {uuid}"
                    if by_id[name].busy
                    else f"{verb}: {who} was busy on {uuid} "
                    f"less than {cfg.resume_after_ns // 1_000_000} ms ago"
                )
        slots[uuid] = gpu_slots

    paused = {wid for wid in by_id if any(slots[g][wid].paused for g in by_id[wid].shares)}
    active = {wid for wid, w in by_id.items() if w.busy and wid not in paused}

    # Budgets per GPU from the active workloads' shares.
    for gpu_slots in slots.values():
        s_strict = sum(s.share for w, s in gpu_slots.items() if w in active and s.strict)
        s_fair = sum(s.share for w, s in gpu_slots.items() if w in active and not s.strict)
        for s in gpu_slots.values():
            if s.strict or s_fair == 0:
                s.budget_ns = s.share * cfg.period_ns // MILLI
            else:
                spare = max(0, MILLI - s_strict)
                s.budget_ns = s.share * cfg.period_ns * spare // (MILLI * s_fair)

    # Eligibility, phase and lease cap of each active workload.
    phase: dict[str, int] = {}
    cap: dict[str, int | None] = {}
    ratio: dict[str, Fraction] = {}
    for wid in sorted(active):
        w = by_id[wid]
        phases: list[int] = []
        caps: list[int] = []
        for uuid in w.shares:
            s = slots[uuid][wid]
            left = s.budget_ns - used[wid]
            if left >= max(cfg.min_lease_ns, 1):
                phases.append(1)
                caps.append(left)
            elif not s.strict:
                phases.append(2)
            else:
                phases = []
                break
        if not phases:
            continue
        phase[wid] = max(phases)
        cap[wid] = min(caps) if caps else None
        ratio[wid] = max(Fraction(used[wid], slots[g][wid].share) for g in w.shares)

    def key(wid: str) -> tuple[int, int, Fraction, str]:
        return (phase[wid], -by_id[wid].priority, ratio[wid], wid)

    def lease_end(wid: str) -> int:
        grid = period_start + ((now - period_start) // cfg.lease_ns + 1) * cfg.lease_ns
        if grid - now < cfg.min_lease_ns:
            grid += cfg.lease_ns
        limit = cap[wid]
        return grid if limit is None else min(grid, now + limit)

    # Keep the leases still valid; end the others.
    leases: dict[str, Lease] = {}
    holders: dict[str, int] = {}
    for uuid in sorted(state.leases):
        lease = state.leases[uuid]
        wid = lease.workload_id
        if wid in holders or wid not in phase or now >= lease.until_ns:
            continue
        w = by_id[wid]
        if any(state.leases.get(g) != lease for g in w.shares):
            continue  # not one lease over all its GPUs: decide afresh
        waiting_better = any(
            other != wid
            and other in phase
            and (
                phase[other] < phase[wid]
                or (phase[other] == phase[wid] and _outranks(by_id[other], w))
            )
            for g in w.shares
            for other in members[g]
        )
        if waiting_better:
            continue
        limit = cap[wid]
        until = lease.until_ns if limit is None else min(lease.until_ns, now + limit)
        holders[wid] = until
    for wid, until in holders.items():
        for g in by_id[wid].shares:
            leases[g] = Lease(wid, until)

    # Grant free GPUs, best candidates first; a gang needs all its GPUs free.
    for wid in sorted((w for w in phase if w not in holders), key=key):
        gpus = by_id[wid].shares
        if any(g in leases for g in gpus):
            continue
        until = lease_end(wid)
        holders[wid] = until
        for g in gpus:
            leases[g] = Lease(wid, until)

    # Wanted states and the actions that get there.
    states: dict[str, RunState] = {}
    for wid, w in by_id.items():
        suppressed = any(slots[g][wid].paused or slots[g][wid].compressed for g in w.shares)
        if wid in paused:
            states[wid] = RunState.FROZEN_BY_PRIORITY
        elif wid in holders or not w.busy:
            states[wid] = RunState.RUNNING
        elif suppressed:
            states[wid] = RunState.FROZEN_BY_PRIORITY
        else:
            states[wid] = RunState.FROZEN_BY_SHARE
    compressed = {
        wid
        for wid, w in by_id.items()
        if any(slots[g][wid].compressed and not slots[g][wid].paused for g in w.shares)
    }
    freezes: list[Action] = []
    thaws: list[Action] = []
    for wid in sorted(by_id):
        before, after = by_id[wid].state, states[wid]
        if before is after:
            continue
        if after is RunState.RUNNING:
            thaws.append(Thaw(wid, _thaw_message(before, by_id[wid].busy, wid in compressed)))
        else:
            message = blockers.get(wid, "") if after is RunState.FROZEN_BY_PRIORITY else ""
            freezes.append(Freeze(wid, after, message or "waiting for its share"))

    wake = period_end
    for wid, until in holders.items():
        shares = by_id[wid].shares
        if all(members[g] == [wid] and not slots[g][wid].strict for g in shares):
            continue  # alone and fair on its GPUs: its renewal changes nothing before then
        wake = min(wake, until)
    for w in by_id.values():
        if not w.busy and w.idle_since_ns is not None:
            expiry = w.idle_since_ns + cfg.resume_after_ns
            if expiry > now:
                wake = min(wake, expiry)
    return Plan(
        actions=tuple(freezes + thaws),
        states=states,
        leases=leases,
        period_start_ns=period_start,
        wake_ns=max(wake, now + 1),
        blockers=blockers,
    )


def _thaw_message(before: RunState, busy: bool, compressed: bool = False) -> str:
    if compressed and busy:
        return "compressed lease granted"  # still held to the floor by a busier priority
    if before is RunState.FROZEN_BY_PRIORITY:
        return "resumed: no higher-priority workload is busy"
    if not busy:
        return "idle: left running"
    return "lease granted"


__all__ = [
    "MILLI",
    "Action",
    "ComputeMode",
    "Freeze",
    "GpuPolicy",
    "Lease",
    "NodeState",
    "Plan",
    "PlannerConfig",
    "PriorityPolicy",
    "RunState",
    "Thaw",
    "WorkloadState",
    "plan",
]
