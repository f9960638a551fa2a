"""The knobs of the decision core and what one round returns (:mod:`fgpu.sched.decide`,
whose docstring states the rules they refer to; importable from there too)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fgpu.sched.workload import Action, Hold, Resources

PREEMPT_DELAY_S = 300.0
"""The recommended wait before evicting (rule 10), seconds: in the replay of issue 28 most
evictions at once were of work started on capacity a waiting preemptor would have had
within minutes."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Knobs of the decision core (times in seconds).

    Attributes:
        min_runtime_s: a workload runs at least this long before it can be a victim.
        aging_interval_s: None (off) or the wait after which effective priority rises.
        aging_step: priority gained per interval.
        aging_max: most priority aging can add.
        reservation_after_s: None (off) or the wait after which a large workload reserves.
        reservation_min_gpus: GPU count from which a workload counts as large.
        reclaim_within_fair_share: True (the rule above); False is the naive rule "reclaim
            whenever below fair share", kept only to show in tests that it thrashes.
        max_preemptors_per_round: bound on victim searches per pass of a round (cost
            control; rule 12: the non-preemptible pass and the rest have one each).
        squeeze: squeeze before evict (rule 7) for queues that do not choose
            (``QueueSpec.squeeze`` None); False evicts as before.
        suspend: suspend rather than evict (rule 9) where the victim is suspendable and
            its node's suspend budget has room; False evicts as before.
        preempt_wait_below: preemptors of a priority below this wait before they preempt
            (rule 10); at or above it (default 100: ``high`` and ``critical``) at once.
        preempt_delay_s: how long such a preemptor waits, seconds since it was submitted,
            for queues that do not choose (``QueueSpec.preempt_delay_s`` None); 0 (the
            default here, so that a shell that sets nothing keeps its behaviour): at once.
            :data:`PREEMPT_DELAY_S` (300 s) is the delay issue 28 recommends, the default of
            ``fgpu sim replay --preempt-delay``, ``fgpu serve --preempt-delay`` (queues:
            ``fgpu queue create|set --preempt-delay``) and ``fgpu k8s scheduler
            --preempt-delay``; shells pass it from their own flags.
    """

    min_runtime_s: float = 0.0
    aging_interval_s: float | None = None
    aging_step: int = 1
    aging_max: int = 50
    reservation_after_s: float | None = None
    reservation_min_gpus: int = 2
    reclaim_within_fair_share: bool = True
    max_preemptors_per_round: int = 16
    squeeze: bool = True
    suspend: bool = True
    preempt_wait_below: int = 100
    preempt_delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    """What one round decided.

    Attributes:
        actions: Place, Preempt and Wait actions, in decision order.
        holds: the holds to pass to the next round (workload id -> hold).
        fair_share: queue -> fair share this round.
        allocated: leaf queue -> resources counted as allocated (before this round's
            placements; terminating victims count for their preemptor's hold).
        warnings: configuration warnings.
    """

    actions: list[Action]
    holds: dict[str, Hold]
    fair_share: dict[str, Resources]
    allocated: dict[str, Resources]
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class OutsideUse:
    """Resources held outside the cluster state given to :meth:`Scheduler.decide`.

    Attributes:
        capacity: the capacity they are held on (added to the cluster's for fair share).
        allocated: leaf queue -> resources its workloads hold there.
        nonpreemptible_milli: leaf queue -> milli-GPU of that held by non-preemptible work.
    """

    capacity: Resources = field(default_factory=Resources)
    allocated: Mapping[str, Resources] = field(default_factory=dict)
    nonpreemptible_milli: Mapping[str, int] = field(default_factory=dict)


__all__ = ["PREEMPT_DELAY_S", "Decision", "OutsideUse", "SchedulerConfig"]
