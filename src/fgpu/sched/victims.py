"""Preemption's victims and the capacity held for their preemptor (rules 1, 4, 5 and 9 of
:mod:`fgpu.sched.decide`): who may be a victim, the smallest victim set on one node, each
victim suspended or evicted, the preemptor's hold, and the holds of earlier rounds."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fgpu.model.types import Allocation, Request
from fgpu.sched.accounting import counted_gpu_milli
from fgpu.sched.amounts import Vec, add, allocation_resources, held_rest, suspend_host_mib
from fgpu.sched.config import SchedulerConfig
from fgpu.sched.ledger import Ledger
from fgpu.sched.policy import PlacementPolicy
from fgpu.sched.squeeze import SqueezeBook
from fgpu.sched.state import ClusterState, GpuNeed, IntArray, withhold
from fgpu.sched.workload import Action, Hold, Place, Preempt, Suspend, Wait, Workload


class Candidates:
    """Victims at all, per queue: running, preemptible, not terminating, of a known queue,
    past ``min_runtime_s``; gathered at the first victim search (most rounds need none)."""

    def __init__(
        self,
        workloads: Sequence[Workload],
        known: Mapping[str, object],
        config: SchedulerConfig,
        now: float,
    ) -> None:
        self._workloads = workloads
        self._known = known
        self._min_runtime_s = config.min_runtime_s
        self._now = now
        self._by_queue: dict[str, list[Workload]] | None = None

    def get(self) -> dict[str, list[Workload]]:
        """Queue -> its workloads that may be victims."""
        if self._by_queue is None:
            found: dict[str, list[Workload]] = defaultdict(list)
            least = self._min_runtime_s
            for w in self._workloads:
                if (
                    w.allocation is not None
                    and not w.terminating
                    and w.is_preemptible
                    and w.queue in self._known
                    and not (
                        least > 0 and w.started_at is not None and self._now - w.started_at < least
                    )
                ):
                    found[w.queue].append(w)
            self._by_queue = found
        return self._by_queue


def counted(book: SqueezeBook, v: Workload) -> Vec:
    """What victim ``v`` counts in its queue's allocation (a squeezed one no compute)."""
    held = book.held(v)
    return [counted_gpu_milli(held.gpu_milli, book.is_squeezed(v)), *held_rest(held)]


def withhold_leftover(work: ClusterState, victims: Sequence[Allocation], taken: Allocation) -> None:
    """Victims still exiting free more than their preemptor takes; withhold the rest.

    After the victims are released on the working copy and the preemptor is allocated, the
    difference (per resource, per GPU) is not free in reality until the victims have gone,
    so no other workload of this round may use it.
    """
    node = taken.node
    g = work.max_gpus
    cpu = sum(v.cpu_milli for v in victims) - taken.cpu_milli
    mem = sum(v.memory_mib for v in victims) - taken.memory_mib
    milli = np.zeros(g, dtype=np.int64)
    memory = np.zeros(g, dtype=np.int64)
    for a, sign in [(v, 1) for v in victims] + [(taken, -1)]:
        for gpu, m, mm in zip(a.gpus, a.gpu_milli, a.gpu_memory_mib, strict=True):
            milli[gpu] += sign * m
            memory[gpu] += sign * mm
    withhold(
        work,
        node,
        max(cpu, 0),
        max(mem, 0),
        np.maximum(milli, 0),
        np.maximum(memory, 0),
    )


class NodeView:
    """Free resources of one node as plain numbers, to try victim sets without touching
    the working state."""

    __slots__ = (
        "cpu",
        "gpu_count",
        "memory",
        "milli",
        "need_memory",
        "need_milli",
        "request",
        "vram",
    )

    def __init__(self, work: ClusterState, node: int, request: Request, need: GpuNeed) -> None:
        self.request = request
        self.cpu = int(work.cpu_free[node])
        self.memory = int(work.memory_free[node])
        self.milli = work.gpu_free_milli[node].tolist()
        self.vram = work.gpu_free_memory[node].tolist()
        self.need_milli = need.milli[node].tolist()
        self.need_memory = need.memory[node].tolist()
        self.gpu_count = request.gpu_count

    def add(self, allocation: Allocation | None, sign: int) -> None:
        """Give back (+1) or take again (-1) what ``allocation`` holds."""
        assert allocation is not None
        self.cpu += sign * allocation.cpu_milli
        self.memory += sign * allocation.memory_mib
        for g, m, mm in zip(
            allocation.gpus, allocation.gpu_milli, allocation.gpu_memory_mib, strict=True
        ):
            self.milli[g] += sign * m
            self.vram[g] += sign * mm

    def fits(self) -> bool:
        """The filter's checks for this node (model already checked)."""
        r = self.request
        if self.cpu < r.cpu_milli or self.memory < r.memory_mib:
            return False
        if self.gpu_count == 0:
            return True
        ok = sum(
            1
            for m, mm, nm, nmm in zip(
                self.milli, self.vram, self.need_milli, self.need_memory, strict=True
            )
            if m >= nm and mm >= nmm
        )
        return ok >= self.gpu_count


@dataclass(slots=True)
class Victims:
    """A victim set on one node and its rank among sets (lower wins)."""

    node: int
    victims: list[Workload]
    key: tuple[int, int, int, int, int]


def find_victims(
    config: SchedulerConfig,
    work: ClusterState,
    preemptor: Workload,
    kind: str,
    ledger: Ledger,
    res: Vec,
    rank: IntArray,
    reserved: np.ndarray,
    candidates: dict[str, list[Workload]],
    victimized: set[str],
    book: SqueezeBook,
) -> Victims | None:
    """Smallest victim set on one node that lets ``preemptor`` run there (rules 4-5, with
    rule 9's count of evictions in the key); None when no node has one.

    ``candidates`` holds, per queue, the running workloads that may be victims at all
    (preemptible, not terminating, past ``min_runtime_s``); ``res`` is what the preemptor
    counts against quotas; ``reserved`` marks nodes reserved for other work.
    """
    cfg = config
    allocated, fair, guarantee = ledger.allocated, ledger.fair, ledger.guarantee
    q = preemptor.queue
    if kind == "reclaim":
        if cfg.reclaim_within_fair_share:
            after = add(allocated[q], res)
            if any(a > f for a, f in zip(after, fair[q], strict=True)):
                return None
        elif allocated[q][0] >= fair[q][0]:
            return None
    taken: dict[str, Vec] = defaultdict(lambda: [0, 0, 0])
    if kind == "preemption":
        pool = [v for v in candidates.get(q, ()) if v.priority < preemptor.priority]
    else:
        pool = [
            v
            for vq, items in candidates.items()
            if vq != q and vq in fair and allocated[vq][0] > fair[vq][0]
            for v in items
        ]
    by_node: dict[int, list[Workload]] = defaultdict(list)
    for v in pool:
        assert v.allocation is not None
        if v.id not in victimized and v.id not in book.lent and not reserved[v.allocation.node]:
            by_node[v.allocation.node].append(v)
    best: Victims | None = None
    request = preemptor.request
    need = work.gpu_need(request)
    model_ok = work.model_mask(request.gpu_models) if request.gpu_count else None
    allowed = work.node_mask(preemptor.nodes) if preemptor.nodes is not None else None
    for node, on_node in by_node.items():
        if model_ok is not None and not model_ok[node]:
            continue
        if allowed is not None and not allowed[node]:
            continue
        view = NodeView(work, node, request, need)
        # squeezed ones first among equals: they make the least progress
        on_node.sort(
            key=lambda v: (v.priority, not book.is_squeezed(v), -(v.started_at or 0.0), v.id)
        )
        released: list[Workload] = []
        fits = False
        for v in on_node:
            view.add(book.held(v), 1)
            released.append(v)
            if view.fits():
                fits = True
                break
        if not fits:
            continue
        # put back every victim that is not needed, most protected first
        for v in reversed(released[:-1]):
            view.add(book.held(v), -1)
            if view.fits():
                released.remove(v)
            else:
                view.add(book.held(v), 1)
        chosen = released
        if kind == "reclaim":  # victim queues keep their guarantee
            taken.clear()
            for v in chosen:
                taken[v.queue] = add(taken[v.queue], allocation_resources(book.held(v)))
            if any(allocated[vq][0] - t[0] < guarantee[vq][0] for vq, t in taken.items()):
                continue
        freed = sum(sum(book.held(v).gpu_milli) for v in chosen)
        # rule 9: victims that cannot be suspended (not suspendable, or the node's budget
        # is spent) are evicted; fewer evictions win among equal priorities
        budget = int(work.suspend_free[node]) if cfg.suspend else -1
        evicted = 0
        for v in chosen:
            host = suspend_host_mib(v)
            if v.suspendable and host <= budget:
                budget -= host
            else:
                evicted += 1
        key = (
            max(v.priority for v in chosen),
            evicted,
            len(chosen),
            freed,
            int(rank[node]),
        )
        if best is None or key < best.key:
            best = Victims(node, chosen, key)
    return best


def take_victims(
    config: SchedulerConfig,
    work: ClusterState,
    policy: PlacementPolicy,
    preemptor: Workload,
    found: Victims,
    kind: str,
    ledger: Ledger,
    book: SqueezeBook,
    victimized: set[str],
    now: float,
) -> tuple[list[Action], Hold]:
    """Stop the chosen victims for ``preemptor`` and hold their capacity for it.

    Each victim is suspended (rule 9: suspendable, and the node's suspend budget holds
    :func:`suspend_host_mib`, counting those suspended before it) or evicted; its capacity
    is released on the working state and its queue uncharged. The preemptor is allocated
    there at once (so nobody else takes it), what the victims free beyond that is withheld
    until they are gone, and its queue is charged.

    Returns:
        The victims' :class:`Suspend`/:class:`Preempt` actions and the preemptor's
        :class:`Wait`, in that order, and its :class:`Hold`.
    """
    w = preemptor
    node = found.node
    actions: list[Action] = []
    for victim in found.victims:
        victimized.add(victim.id)
        ledger.charge(victim.queue, counted(book, victim), -1, victim)
        work.release(book.held(victim))
        why = (
            f"{kind} by {w.id} (queue {w.queue}, priority {w.priority}) on {work.node_names[node]}"
        )
        host = suspend_host_mib(victim)
        if config.suspend and victim.suspendable and work.suspend_free[node] >= host:
            work.hold_suspended(node, host)  # rule 9
            actions.append(
                Suspend(
                    victim.id, w.id, kind, f"suspended to host memory ({host} MiB) for " + why, host
                )
            )
        else:
            actions.append(Preempt(victim.id, w.id, kind, why))
    need = work.gpu_need(w.request)
    _, gpus_ok = work.feasible(w.request, need)
    gpus = policy.select_gpus(work, w.request, need, node, gpus_ok)
    taken = work.allocate(w.request, node, gpus)
    withhold_leftover(work, [book.held(v) for v in found.victims], taken)
    ledger.charge(w.queue, ledger.resources(w.request), who=w)
    hold = Hold(w.id, work.node_names[node], gpus, tuple(x.id for x in found.victims), now)
    actions.append(Wait(w.id, f"waiting for {len(found.victims)} preempted workload(s) to exit"))
    return actions, hold


def apply_holds(
    work: ClusterState,
    ledger: Ledger,
    by_id: Mapping[str, Workload],
    book: SqueezeBook,
) -> tuple[list[Action], set[str], np.ndarray, dict[str, Hold]]:
    """Rule 1: the previous round's valid holds (``ledger.holds``) first.

    A reservation marks its node reserved and is kept. Capacity freed by preemption is
    taken for its preemptor on the working state: while victims are still terminating it
    waits (the rest of what they free withheld), once they are gone it is placed there. A
    hold whose capacity no longer fits is void (its queue uncharged).

    Returns:
        The actions, the ids they decide, bool[N] reserved nodes, and the holds kept.
    """
    actions: list[Action] = []
    decided: set[str] = set()
    reserved = np.zeros(work.num_nodes, dtype=np.bool_)
    kept: dict[str, Hold] = {}
    for h in ledger.holds.values():
        w = by_id[h.workload]
        node = work.node_index[h.node]
        if not h.victims:
            reserved[node] = True
            kept[w.id] = h
            continue
        # a victim is still on its way out while it is terminating: one that was
        # suspended and already restored (or evicted and placed again) is not
        alive = [
            v
            for v in h.victims
            if v in by_id and by_id[v].allocation is not None and by_id[v].terminating
        ]
        for v in alive:  # their capacity is promised to the preemptor
            work.release(book.held(by_id[v]))
        try:
            allocation = work.allocate(w.request, node, h.gpus)
        except ValueError:
            for vid in alive:  # put the victims back; the hold is void
                work.occupy(book.held(by_id[vid]))
            ledger.charge(w.queue, ledger.resources(w.request), -1)
            continue
        decided.add(w.id)
        if alive:
            withhold_leftover(work, [book.held(by_id[vid]) for vid in alive], allocation)
            kept[w.id] = h
            actions.append(
                Wait(
                    w.id,
                    f"waiting for {len(alive)} preempted workload(s) to exit: " + ", ".join(alive),
                )
            )
        else:
            book.placed(w, allocation)
            actions.append(Place(w.id, allocation, "placed on capacity held for it"))
            if not w.is_preemptible:
                ledger.nonpreempt[w.queue] += allocation_resources(allocation)[0]
    return actions, decided, reserved, kept


__all__ = [
    "Candidates",
    "NodeView",
    "Victims",
    "apply_holds",
    "counted",
    "find_victims",
    "take_victims",
    "withhold_leftover",
]
