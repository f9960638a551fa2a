"""Which running workloads run on borrowed capacity: beyond their queue's quota (issue 25).

A queue's quota is its guarantee (DESIGN.md section 5): work within it is never reclaimed;
work beyond it runs on capacity lent by other queues and may be reclaimed. The node
governor uses the answer so that borrowed work never pauses or compresses another queue's
work that runs within its quota (:mod:`fgpu.agent.governor.plan`, "Priority").

Rule: inside each queue the running workloads fill the quota in the order the queue would
keep them under reclaim (the reverse of the victims' order of
:func:`fgpu.sched.victims.find_victims`): higher priority first, then the one running
longest, then by id. A workload is *borrowed* when the queue's counted GPU compute up to and
including it exceeds the queue's GPU quota. Compute is counted as
:func:`fgpu.sched.accounting.counted_gpu_milli` counts it (a squeezed workload's compute is
lent and counts 0, so it is never borrowed). A workload of a queue with no known quota is
not borrowed (nothing says it is beyond a quota).

Pure (no I/O, no clock).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Holding:
    """A running workload as :func:`borrowed` needs it.

    Attributes:
        workload_id: its id (the last tie-break).
        queue: its leaf queue.
        gpu_milli: the GPU compute it counts as allocated to its queue, milli-GPU (>= 0;
            see :func:`fgpu.sched.accounting.counted_gpu_milli`).
        priority: numeric priority (higher is kept first).
        started_at: when it started, seconds (earlier is kept first); None sorts last.

    Raises:
        ValueError: negative ``gpu_milli``.
    """

    workload_id: str
    queue: str
    gpu_milli: int
    priority: int
    started_at: float | None = None

    def __post_init__(self) -> None:
        if self.gpu_milli < 0:
            raise ValueError(
                f"workload {self.workload_id}: gpu_milli must be >= 0, got {self.gpu_milli}"
            )


def borrowed(running: Iterable[Holding], quota_milli: Mapping[str, int]) -> frozenset[str]:
    """The ids of the workloads in ``running`` that run beyond their queue's GPU quota.

    Args:
        running: every running workload that counts against a queue (all of a queue's
            running work must be given, or the cumulative sum is wrong).
        quota_milli: queue name -> its GPU quota, milli-GPU.

    Returns:
        The borrowed workloads' ids (see the module docstring for the rule).
    """
    by_queue: dict[str, list[Holding]] = defaultdict(list)
    for h in running:
        by_queue[h.queue].append(h)
    out: set[str] = set()
    for queue, items in by_queue.items():
        quota = quota_milli.get(queue)
        if quota is None:
            continue
        items.sort(
            key=lambda h: (
                -h.priority,
                h.started_at is None,
                h.started_at or 0.0,
                h.workload_id,
            )
        )
        total = 0
        for h in items:
            total += h.gpu_milli
            if h.gpu_milli > 0 and total > quota:
                out.add(h.workload_id)
    return frozenset(out)


__all__ = ["Holding", "borrowed"]
