"""The accounting of one round of the decision core (:mod:`fgpu.sched.decide`, rules 2, 3
and 5): what each queue holds and wants, its fair share and guarantee, the order key, and
admission against limits and the non-preemptible quota rule. Amounts are resource vectors
(:mod:`fgpu.sched.amounts`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

from fgpu.model.types import Allocation, Request
from fgpu.sched.accounting import counted_gpu_milli
from fgpu.sched.amounts import Vec, add, allocation_resources, request_resources
from fgpu.sched.config import OutsideUse
from fgpu.sched.fairshare import fair_share
from fgpu.sched.placer import Placer, Unschedulable
from fgpu.sched.queueorder import user_allocation
from fgpu.sched.reasons import gpus as gpu_text
from fgpu.sched.reasons import limit_text
from fgpu.sched.workload import Hold, QueueTree, Resources, Wait, Workload


class Ledger:
    """Allocation, demand and fair share per queue for one round, kept up to date as the
    round places and preempts.

    Built from every workload: running ones count as allocated to their queue (a squeezed
    one's compute not at all; a terminating victim as demand, its capacity counted for its
    preemptor through the hold), pending ones as demand; use ``outside`` the cluster state
    counts as allocated. A valid hold with victims moves its preemptor's request from demand
    to allocation.

    Args:
        queues: the queue tree.
        capacity: what fair share divides (the cluster's plus outside capacity).
        workloads: every pending and running workload.
        holds: the previous round's holds.
        by_id: ``workloads`` by id.
        node_index: node name -> index (holds on nodes not there are dropped).
        largest_gpu_memory: MiB of the largest GPU (memory-only shares count against it).
        outside: use outside the cluster state, or None.

    Attributes:
        pending: the pending workloads of known queues.
        unknown: a :class:`Wait` for each pending workload of an unknown queue.
        holds: the holds still valid (their workload pending, their node there).
        allocated, nonpreempt, fair, guarantee: per queue, now.
        allocated_before: per queue, before this round's placements.
        share: the fair share result (shares, demand, warnings).
    """

    def __init__(
        self,
        queues: QueueTree,
        capacity: Resources,
        workloads: Sequence[Workload],
        holds: Mapping[str, Hold],
        by_id: Mapping[str, Workload],
        node_index: Mapping[str, int],
        largest_gpu_memory: int,
        outside: OutsideUse | None,
    ) -> None:
        self.queues = queues
        self.largest_gpu_memory = largest_gpu_memory
        self._resources: dict[Request, Vec] = {}
        allocated: dict[str, Vec] = defaultdict(lambda: [0, 0, 0])
        nonpreempt: dict[str, int] = defaultdict(int)
        demand: dict[str, Vec] = defaultdict(lambda: [0, 0, 0])
        self.pending: list[Workload] = []
        self.unknown: list[Wait] = []
        known = queues.specs
        for w in workloads:
            if w.queue not in known:
                if w.allocation is None:
                    self.unknown.append(Wait(w.id, f"unknown queue {w.queue!r}"))
                continue
            running = w.allocation
            if running is not None:
                if w.terminating:
                    demand[w.queue] = add(demand[w.queue], self.resources(w.request))
                    continue
                # a squeezed one's compute is lent: neither allocation nor demand
                gpu = counted_gpu_milli(running.gpu_milli, w.squeezed)
                acc = allocated[w.queue]  # in place: this loop sees every running workload
                acc[0] += gpu
                acc[1] += running.cpu_milli
                acc[2] += running.memory_mib
                if not w.is_preemptible:
                    nonpreempt[w.queue] += gpu
            else:
                self.pending.append(w)
                demand[w.queue] = add(demand[w.queue], self.resources(w.request))
        if outside is not None:
            for q, held_outside in outside.allocated.items():
                if q in queues:
                    allocated[q] = add(allocated[q], list(held_outside.as_tuple()))
            for q, milli in outside.nonpreemptible_milli.items():
                nonpreempt[q] += milli
        self.holds: dict[str, Hold] = {}
        for h in holds.values():
            held = by_id.get(h.workload)
            if held is None or held.allocation is not None or h.node not in node_index:
                continue
            self.holds[h.workload] = h
            if h.victims:  # capacity moves to the preemptor's queue
                req = self.resources(held.request)
                allocated[held.queue] = add(allocated[held.queue], req)
                demand[held.queue] = add(demand[held.queue], req, -1)
        # rule 2, inside a queue: what each user holds there; held capacity counts too
        self.user_used = user_allocation(
            workloads,
            [
                (by_id[h.workload], self.resources(by_id[h.workload].request)[0])
                for h in self.holds.values()
                if h.victims
            ],
        )
        self.share = fair_share(
            queues,
            capacity,
            {q: Resources(*vec) for q, vec in allocated.items()},
            {q: Resources(*vec) for q, vec in demand.items()},
        )
        self.fair: dict[str, Vec] = {q: list(r.as_tuple()) for q, r in self.share.share.items()}
        self.guarantee: dict[str, Vec] = {
            q: [
                min(a, b)
                for a, b in zip(
                    queues[q].quota.as_tuple(), self.share.demand[q].as_tuple(), strict=True
                )
            ]
            for q in queues.specs
        }
        self.allocated = allocated
        self.nonpreempt = nonpreempt
        self.allocated_before = {q: Resources(*vec) for q, vec in allocated.items()}
        self._subtree: dict[str, Vec] = defaultdict(lambda: [0, 0, 0])
        for q, vec in allocated.items():
            for a in self.ancestors(q):
                self._subtree[a] = add(self._subtree[a], vec)

    def resources(self, request: Request) -> Vec:
        """What ``request`` counts against quotas (:func:`request_resources`), cached."""
        cached = self._resources.get(request)
        if cached is None:
            cached = self._resources[request] = request_resources(request, self.largest_gpu_memory)
        return cached

    def ancestors(self, q: str) -> list[str]:
        """``q`` and its parents up to the top."""
        out = [q]
        parent = self.queues[q].parent
        while parent is not None:
            out.append(parent)
            parent = self.queues[parent].parent
        return out

    def charge(self, q: str, res: Vec, sign: int = 1, who: Workload | None = None) -> None:
        """Count ``res`` to (``sign`` 1) or off (-1) queue ``q`` and its ancestors, and,
        with ``who``, its GPU compute to or off ``who``'s user in that queue (rule 2's order
        between users, :mod:`fgpu.sched.queueorder`)."""
        if who is not None:
            key = (who.queue, who.user)
            self.user_used[key] = self.user_used.get(key, 0) + sign * res[0]
        self.allocated[q] = add(self.allocated[q], res, sign)
        for a in self.ancestors(q):
            self._subtree[a] = add(self._subtree[a], res, sign)

    def placed(self, w: Workload, allocation: Allocation) -> None:
        """Charge a placement of ``w`` (and its non-preemptible milli-GPU)."""
        held = allocation_resources(allocation)
        self.charge(w.queue, held, who=w)
        if not w.is_preemptible:
            self.nonpreempt[w.queue] += held[0]

    def ratio(self, q: str) -> float:
        """The order key of rule 2: ``max over resources of allocated / fair share``
        (infinite without a fair share, or with use where the share is 0)."""
        best = 0.0
        any_share = False
        for a, f in zip(self.allocated[q], self.fair[q], strict=True):
            if f > 0:
                any_share = True
                best = max(best, a / f)
            elif a > 0:
                return math.inf
        return best if any_share else math.inf

    def admit(self, w: Workload, res: Vec) -> str | None:
        """Rule 3: why placing ``res`` for ``w`` is not allowed (a limit of its queue or an
        ancestor, or the non-preemptible quota rule), or None."""
        queues = self.queues
        for a in self.ancestors(w.queue):
            limit = queues[a].limit
            if limit is None:
                continue
            after = add(self._subtree[a], res)
            for dim, x, lim in zip(("gpu", "cpu", "memory"), after, limit.as_tuple(), strict=True):
                if x > lim:
                    return f"queue {a} would exceed its limit ({limit_text(dim, x, lim)})"
        if not w.is_preemptible:
            quota = queues[w.queue].quota.gpu_milli
            if self.nonpreempt[w.queue] + res[0] > quota:
                return (
                    f"non-preemptible work must stay within the quota of queue {w.queue} "
                    f"(quota {gpu_text(quota)} GPUs, in use {gpu_text(self.nonpreempt[w.queue])}, "
                    f"needs {gpu_text(res[0])})"
                )
        return None

    def within_quota(
        self,
        placer: Placer,
        w: Workload,
        result: Allocation,
        exclude: np.ndarray | None,
        allowed: np.ndarray | None,
    ) -> Allocation | Wait:
        """Rule 3 for what a non-preemptible placement really takes: a memory-only share
        takes more of a smaller GPU than :meth:`admit` counted, so a node whose GPU would
        take too much is left out (its placement released) and the next one tried. Returns
        the allocation (``result`` or another) that keeps the quota, or a :class:`Wait`
        saying so when every node that fits takes too much."""
        q = w.queue
        quota = self.queues[q].quota.gpu_milli
        tried: np.ndarray | None = None
        takes_milli = 0
        found: Allocation | Unschedulable = result
        while isinstance(found, Allocation):
            takes_milli = allocation_resources(found)[0]
            if self.nonpreempt[q] + takes_milli <= quota:
                return found
            placer.release(found)
            if tried is None:
                tried = (
                    exclude.copy()
                    if exclude is not None
                    else np.zeros(placer.state.num_nodes, dtype=bool)
                )
            tried[found.node] = True
            found = placer.place(w.request, exclude=tried, allowed=allowed)
        return Wait(
            w.id,
            f"non-preemptible work must stay within the quota of queue {q} "
            f"(quota {gpu_text(quota)} GPUs, in use {gpu_text(self.nonpreempt[q])}; the GPU "
            f"free for it now would take {gpu_text(takes_milli)})",
        )


__all__ = ["Ledger"]
