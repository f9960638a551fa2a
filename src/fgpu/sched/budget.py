"""Admission of work placed outside the decision core's round by the queues' GPU rules.

The single-machine service's MIG pass (:mod:`fgpu.server.mig_pool`) and the Kubernetes
scheduler's MIG pass (:mod:`fgpu.k8s.mig`) place MIG instances after the core's round;
:class:`QueueBudget` admits each placement by the same rules the core applies (DESIGN.md
section 5): the queue and its ancestors stay within their GPU limits, and non-preemptible
work stays within its queue's GPU quota.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from fgpu.sched.reasons import gpus, limit_text
from fgpu.sched.workload import QueueTree


class QueueBudget:
    """GPU milli-GPU per queue, for admitting MIG workloads by the core's rules (DESIGN.md
    section 5): a placement keeps the queue and its ancestors within their GPU limits, and
    non-preemptible work within its queue's GPU quota.

    Args:
        tree: the queue tree.
        held: leaf queue -> milli-GPU its workloads hold now (shares and MIG instances).
        nonpreemptible: leaf queue -> the part of that held by non-preemptible work.
    """

    def __init__(
        self, tree: QueueTree, held: Mapping[str, int], nonpreemptible: Mapping[str, int]
    ) -> None:
        self._tree = tree
        self._subtree: dict[str, int] = defaultdict(int)
        self._nonpreemptible: dict[str, int] = defaultdict(int, nonpreemptible)
        for queue, milli in held.items():
            if queue in tree:
                for name in self._ancestors(queue):
                    self._subtree[name] += milli

    def _ancestors(self, queue: str) -> list[str]:
        out = [queue]
        parent = self._tree[queue].parent
        while parent is not None:
            out.append(parent)
            parent = self._tree[parent].parent
        return out

    def admit(self, queue: str, milli: int, preemptible: bool) -> str | None:
        """Why ``milli`` more for ``queue`` is refused, or None when it is admitted."""
        if queue not in self._tree:
            return f"unknown queue {queue!r}"
        for name in self._ancestors(queue):
            limit = self._tree[name].limit
            after = self._subtree[name] + milli
            if limit is not None and after > limit.gpu_milli:
                return (
                    f"queue {name} would exceed its limit "
                    f"({limit_text('gpu', after, limit.gpu_milli)})"
                )
        if not preemptible:
            quota = self._tree[queue].quota.gpu_milli
            used = self._nonpreemptible[queue]
            if used + milli > quota:
                return (
                    f"non-preemptible work must stay within the quota of queue {queue} "
                    f"(quota {gpus(quota)} GPUs, in use {gpus(used)}, needs {gpus(milli)})"
                )
        return None

    def charge(self, queue: str, milli: int, preemptible: bool, sign: int = 1) -> None:
        """Count ``milli`` (``sign`` -1: give it back) for ``queue`` and its ancestors."""
        for name in self._ancestors(queue):
            self._subtree[name] += sign * milli
        if not preemptible:
            self._nonpreemptible[queue] += sign * milli


__all__ = ["QueueBudget"]
