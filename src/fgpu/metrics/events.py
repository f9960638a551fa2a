"""Counters and histograms observed where things happen (a workload ends, a victim is
stopped, a round runs, a workload starts). Labels are bounded: phases, kinds, queue names
(configured by admins) and priority classes, never workload ids."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from fgpu.metrics.names import SERIES
from fgpu.sched.workload import PRIORITY_CLASSES

ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Seconds: a round over 1,000 workloads takes milliseconds; seconds mean trouble."""
START_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)
"""Seconds from submission to start: from an idle machine to hours in a busy queue."""

_PREEMPT_KINDS = {"preemption": "preempt", "reclaim": "reclaim"}


def priority_class(priority: int) -> str:
    """The highest priority class at or below ``priority`` (``very-low`` below every class):
    a bounded label for any numeric priority (DESIGN.md section 5)."""
    best = "very-low"
    best_value = -1
    for name, value in PRIORITY_CLASSES.items():
        if best_value < value <= priority:
            best, best_value = name, value
    return best


class EventMetrics:
    """The event series of one process, registered in ``registry``.

    Attributes:
        workloads: ``fgpu_workloads_total{phase}``.
        preemptions: ``fgpu_preemptions_total{kind}`` (preempt, reclaim).
        gpu_seconds_lost: ``fgpu_gpu_seconds_lost_total{queue, reason}`` (preempt, reclaim,
            suspend, restore).
        memory_violations: ``fgpu_memory_violations_total``.
        round_seconds: ``fgpu_scheduling_round_seconds``.
        submission_to_start: ``fgpu_submission_to_start_seconds{queue, priority}``.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.workloads = Counter(
            "fgpu_workloads", "Workloads that ended, by phase.", ["phase"], registry=registry
        )
        self.preemptions = Counter(
            "fgpu_preemptions",
            "Victims stopped: preempt (same queue) or reclaim (across queues).",
            ["kind"],
            registry=registry,
        )
        self.gpu_seconds_lost = Counter(
            "fgpu_gpu_seconds_lost",
            SERIES["fgpu_gpu_seconds_lost_total"].help,
            ["queue", "reason"],
            registry=registry,
        )
        self.memory_violations = Counter(
            "fgpu_memory_violations",
            "Workloads found over their GPU memory quota by the memory guard.",
            registry=registry,
        )
        self.round_seconds = Histogram(
            "fgpu_scheduling_round_seconds",
            "Duration of one scheduling round, seconds.",
            buckets=ROUND_BUCKETS,
            registry=registry,
        )
        self.submission_to_start = Histogram(
            "fgpu_submission_to_start_seconds",
            "From submission to start, seconds.",
            ["queue", "priority"],
            buckets=START_BUCKETS,
            registry=registry,
        )

    def ended(self, phase: str) -> None:
        """A workload ended in ``phase`` (succeeded, failed, cancelled)."""
        self.workloads.labels(phase=phase).inc()

    def preempted(self, kind: str) -> None:
        """A victim was stopped; ``kind`` is the core's ``preemption`` or ``reclaim``."""
        self.preemptions.labels(kind=_PREEMPT_KINDS.get(kind, kind)).inc()

    def lost(self, queue: str, reason: str, gpu_seconds: float) -> None:
        """``gpu_seconds`` of ``queue``'s work lost; ``reason``: the core's ``preemption``
        or ``reclaim`` (an eviction), ``suspend`` or ``restore`` (copy time)."""
        if gpu_seconds > 0:
            label = _PREEMPT_KINDS.get(reason, reason)
            self.gpu_seconds_lost.labels(queue=queue, reason=label).inc(gpu_seconds)

    def started(self, queue: str, priority: int, waited_s: float) -> None:
        """A workload started ``waited_s`` seconds after its submission."""
        self.submission_to_start.labels(queue=queue, priority=priority_class(priority)).observe(
            max(0.0, waited_s)
        )
