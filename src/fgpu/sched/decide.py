"""Scheduling decisions: queues, fair share, ordering, placement, preemption, reclaim.

:meth:`Scheduler.decide` takes a snapshot (cluster state, queue tree, every pending and
running workload, the holds of the previous round) and returns actions; it never changes
its inputs. The single-machine service, the Kubernetes adapter and the replay simulator
execute the actions (DESIGN.md section 2, STYLE.md 1).

Rules (DESIGN.md section 5), in the order a round applies them:

1. **Holds first.** Capacity freed by preemption is held for its preemptor: while the
   victims are still exiting the preemptor waits and nobody else may use that capacity;
   once they are gone it is placed there before anything else. A *reservation* (rule 6)
   keeps a whole node for one workload: others are not placed on it.
2. **Order.** Queues furthest below their fair share go first: the key is the dominant ratio
   ``max over resources of allocated / fair share`` (a queue with no fair share goes last),
   then queue priority (higher first), then name. After every placement the queue's ratio is
   updated. Inside a queue: effective priority (higher first), then suspended work before
   new work (rule 11), then submission time, then id. The round runs this order twice: first
   over non-preemptible work only, then over the rest (rule 12).
3. **Admission.** A placement must keep the queue and its ancestors within their limits, and
   non-preemptible work (by default priority >= 100) of a queue within the queue's GPU quota,
   counted in milli-GPU over every GPU it holds.
4. **Preemption** (same queue): victims are running, preemptible, strictly lower-priority
   workloads of the preemptor's queue that have run at least ``min_runtime_s``.
5. **Reclaim** (across queues): the preemptor's queue must stay within its fair share after
   the move (``allocated + request <= fair share`` in every resource); victims come from
   other queues that are above their fair share, are preemptible and past
   ``min_runtime_s``, and a victim queue never drops below its guarantee
   ``min(quota, demand)`` (so in-quota work is not reclaimed, whatever the queue priorities).
   Victim sets for 4 and 5 are looked for only on nodes the preemptor may use (its
   ``nodes``, rule 7), so preemption never frees capacity where it cannot run.
   Victim sets for 4 and 5: per node, release candidates lowest priority first, then most
   recently started, until the preemptor fits on that node (the filter checks the same GPU
   for a share and the same node for several GPUs); then put back every victim that is not
   needed. Among nodes the set with the lowest highest-victim-priority, then the fewest
   evictions (victims that rule 9 cannot suspend), then the fewest victims, then the least
   GPU freed, then the node rank wins.
6. **Aging and reservation** (both off by default). With ``aging_interval_s`` a pending
   workload's effective priority for ordering rises by ``aging_step`` per interval waited, up
   to ``aging_max`` (it never gains preemption power). With ``reservation_after_s`` a
   workload of at least ``reservation_min_gpus`` GPUs that has waited that long and still
   does not fit reserves the node with the most free GPU compute that could hold it when
   empty; other work is not placed there, so the node drains into it and it starts once the
   running work there ends. Small workloads can therefore not overtake it forever.

7. **Squeeze before evict** (:mod:`fgpu.sched.squeeze`; on unless ``squeeze`` is off for
   the scheduler or the queue): before rule 4 evicts, a single-GPU fractional preemptor
   whose memory fits next to lower-priority work of its queue takes their compute instead;
   they are squeezed (:class:`Squeeze`), keep running with their memory, and get their
   compute back (:class:`Unsqueeze`) at the start of a later round, after holds, when it
   fits again. Squeezed workloads count CPU and memory but not compute in their queue's
   allocation, and their compute is not demand either.

8. **Node constraints.** A workload with ``nodes`` (allowed node names) is placed,
   preempts and reserves only there; the nodes left out are counted first in its reason.

9. **Suspend, the third way to free a GPU** (``suspend``, on by default): every victim
   chosen by rules 4 and 5 is suspended (:class:`Suspend`) rather than evicted
   (:class:`Preempt`) when the shell says it can be checkpointed (``Workload.suspendable``:
   its processes run CUDA on a driver with the checkpoint API) and its node's suspend budget
   (``Node.suspend_host_memory_mib``, the state's ``suspend_free``) still holds its host
   memory (:func:`suspend_host_mib`: its GPU memory, copied to host, plus its host memory,
   kept by its frozen processes), counting the victims suspended earlier in the round, in
   victim order; otherwise it is evicted as before. Rule 4/5's choice among nodes prefers
   the node with fewer evictions among equal victim priorities, so suspending frees only
   what an eviction would have freed (the same minimal victim set), never more. A suspended
   victim is terminating until the shell has copied it out (the preemptor's hold waits for
   it as for an exit); then it holds no allocation, only its charge on the budget.
10. **Wait before evicting.** A preemptor below ``preempt_wait_below`` (default 100, so
    ``high`` and ``critical`` preempt at once) looks for victims (rules 4 and 5) only once
    it has waited its queue's ``QueueSpec.preempt_delay_s`` (default the scheduler's
    ``preempt_delay_s``: 0, at once, unless the shell sets it; :data:`PREEMPT_DELAY_S`,
    300 s, is the recommended delay) since it was submitted. Until then it keeps its
    place in the order, so capacity that frees meanwhile goes to it before lower-ranked work;
    its reason ends with how long it has waited and from when it may preempt. Squeezing
    (rule 7) keeps the victims' memory and progress and does not wait.
11. **Restore.** A suspended workload (``Workload.suspended_on``) is pending for the order
    (its demand counts for its queue) and goes before new work of its priority in its
    queue; it is only ever restored (:class:`Restore`) on the node it is suspended on (GPUs
    of the same model; exactly its ``Workload.suspended_gpus`` when the shell names them),
    where it fits now, outside reservations and holds, within its
    queue's limits. It never preempts, squeezes or reserves, and no timeout drops it: it
    waits, saying so, until its node has room or it is cancelled. The shell frees its budget
    charge once the restore is done.
12. **Non-preemptible work first.** Non-preemptible pending work of every queue is placed
    (and looks for victims) before any preemptible work, in the order of rule 2, with a
    budget of ``max_preemptors_per_round`` victim searches of its own (the preemptible pass
    has another), so critical work never waits behind the victim searches of lower-priority
    preemptors of other queues, and a round's cost stays bounded.

**What the shells do** (the interface of rules 9 and 11). On :class:`Suspend` the shell
charges ``host_memory_mib`` to the node's budget at once (``ClusterState.hold_suspended``),
keeps the victim running-but-terminating while it locks and checkpoints it (device memory to
host, GPU memory freed) and freezes its processes, then releases its allocation and marks it
``suspended_on=<node>``, ``suspended_host_mib=<charge>``; a shell whose checkpoint fails
evicts it instead (and frees the charge). On :class:`Restore` it takes the allocation, copies
the memory back, thaws the processes, and frees the charge (``free_suspended``). A suspended
workload that is cancelled is simply ended (its charge freed).

Every pending workload that is not placed gets a :class:`Wait` with a reason.

**Use outside the cluster state** (:class:`OutsideUse`, optional): resources queues hold on
capacity the core does not place on (the single-machine service's MIG instances). They count
as their queues' allocation (fair share, order, limits, the non-preemptible quota rule) and
their capacity is added to what fair share divides; they are never victims.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fgpu.model.types import Allocation, InvalidRequestError, Request
from fgpu.sched.accounting import counted_gpu_milli
from fgpu.sched.fairshare import fair_share
from fgpu.sched.placer import Placer, Unschedulable, name_order_rank
from fgpu.sched.policy import PlacementPolicy
from fgpu.sched.reasons import WaitReasons, limit_text
from fgpu.sched.reasons import gpus as gpu_text
from fgpu.sched.squeeze import SqueezeBook, can_squeeze
from fgpu.sched.state import ClusterState, GpuNeed, IntArray, withhold
from fgpu.sched.workload import (
    Action,
    Hold,
    Holds,
    Place,
    Preempt,
    QueueTree,
    Resources,
    Restore,
    Squeeze,
    Suspend,
    Wait,
    Workload,
)

Vec = list[int]

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
            ``fgpu sim replay --preempt-delay``; shells pass it from their own flags.
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


def request_resources(request: Request, largest_gpu_memory: int) -> Vec:
    """[gpu_milli, cpu_milli, memory_mib] a request counts against quotas.

    A share given as memory only is counted as its share of the largest GPU in the cluster
    (the least it can take), ``ceil(memory * 1000 / largest)``.
    """
    if request.gpu_count and request.gpu_milli is None:
        mem = request.gpu_memory_mib or 0
        per_gpu = max(1, -(-mem * 1000 // max(largest_gpu_memory, 1)))
        gpu = request.gpu_count * per_gpu
    else:
        gpu = request.total_gpu_milli
    return [gpu, request.cpu_milli, request.memory_mib]


def allocation_resources(allocation: Allocation) -> Vec:
    """[gpu_milli, cpu_milli, memory_mib] an allocation holds."""
    return [sum(allocation.gpu_milli), allocation.cpu_milli, allocation.memory_mib]


def held_rest(allocation: Allocation) -> Vec:
    """[cpu_milli, memory_mib] an allocation holds."""
    return [allocation.cpu_milli, allocation.memory_mib]


def suspend_host_mib(workload: Workload) -> int:
    """Host memory (MiB) ``workload`` holds once suspended: its GPU memory (copied to host)
    plus its host memory (its frozen processes keep it); see :class:`Suspend`."""
    a = workload.allocation
    assert a is not None
    return sum(a.gpu_memory_mib) + a.memory_mib


def _add(a: Vec, b: Vec, sign: int = 1) -> Vec:
    return [x + sign * y for x, y in zip(a, b, strict=True)]


def _withhold_leftover(
    work: ClusterState, victims: Sequence[Allocation], taken: Allocation
) -> None:
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


class _NodeView:
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
class _Victims:
    node: int
    victims: list[Workload]
    key: tuple[int, int, int, int, int]


class Scheduler:
    """The decision core.

    Args:
        policy: placement policy (see :mod:`fgpu.plugins`). Placement-tracking hooks
            (``on_allocate``) are the shell's to call when it commits a placement.
        config: rules' knobs.
        rank: int64[N] tie-break rank of nodes (default: by name). Must match the states
            given to :meth:`decide`.
    """

    def __init__(
        self,
        policy: PlacementPolicy,
        config: SchedulerConfig | None = None,
        rank: IntArray | None = None,
    ) -> None:
        self.policy = policy
        self.config = config or SchedulerConfig()
        self.rank = rank

    # ------------------------------------------------------------------ helpers
    def effective_priority(self, workload: Workload, now: float) -> int:
        """Priority for ordering: base plus aging (if on)."""
        cfg = self.config
        if cfg.aging_interval_s is None or cfg.aging_interval_s <= 0:
            return workload.priority
        waited = max(0.0, now - workload.submitted_at)
        bonus = min(cfg.aging_max, int(waited // cfg.aging_interval_s) * cfg.aging_step)
        return workload.priority + bonus

    # ------------------------------------------------------------------- decide
    def decide(
        self,
        now: float,
        state: ClusterState,
        queues: QueueTree,
        workloads: Sequence[Workload],
        holds: Holds | None = None,
        outside: OutsideUse | None = None,
    ) -> Decision:
        """One scheduling round.

        Args:
            now: the current time in seconds.
            state: the cluster with every running workload's allocation applied
                (terminating victims included). Not modified.
            queues: the queue tree.
            workloads: every pending and running workload.
            holds: the holds returned by the previous round.
            outside: use outside ``state`` (module docstring); None for none.

        Returns:
            The :class:`Decision`.
        """
        cfg = self.config
        holds = dict(holds or {})
        victimized: set[str] = set()
        work = state.copy()
        rank = self.rank if self.rank is not None else name_order_rank(work.node_names)
        placer = Placer(work, self.policy, rank)
        largest_mem = int(work.gpu_memory_capacity.max(initial=0))
        extra = outside.capacity if outside is not None else Resources()
        capacity = Resources(
            int(work.gpu_milli_capacity.sum()) + extra.gpu_milli,
            int(work.cpu_capacity.sum()) + extra.cpu_milli,
            int(work.memory_capacity.sum()) + extra.memory_mib,
        )
        by_id = {w.id: w for w in workloads}
        book = SqueezeBook(work, workloads, by_id)
        actions: list[Action] = []
        decided: set[str] = set()

        # ---- accounting: allocated per leaf (terminating victims count for their
        # preemptor's queue through its hold) and pending demand.
        allocated: dict[str, Vec] = defaultdict(lambda: [0, 0, 0])
        nonpreempt: dict[str, int] = defaultdict(int)
        pending_demand: dict[str, Vec] = defaultdict(lambda: [0, 0, 0])
        pending: list[Workload] = []
        known = queues.specs
        for w in workloads:
            if w.queue not in known:
                if w.allocation is None:
                    actions.append(Wait(w.id, f"unknown queue {w.queue!r}"))
                    decided.add(w.id)
                continue
            running = w.allocation
            if running is not None:
                if w.terminating:
                    pending_demand[w.queue] = _add(
                        pending_demand[w.queue], request_resources(w.request, largest_mem)
                    )
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
                pending.append(w)
                pending_demand[w.queue] = _add(
                    pending_demand[w.queue], request_resources(w.request, largest_mem)
                )
        if outside is not None:
            for q, held_outside in outside.allocated.items():
                if q in queues:
                    allocated[q] = _add(allocated[q], list(held_outside.as_tuple()))
            for q, milli in outside.nonpreemptible_milli.items():
                nonpreempt[q] += milli
        valid_holds: dict[str, Hold] = {}
        for h in holds.values():
            held = by_id.get(h.workload)
            if held is None or held.allocation is not None or h.node not in work.node_index:
                continue
            w = held
            valid_holds[h.workload] = h
            if h.victims:  # capacity moves to the preemptor's queue
                req = request_resources(w.request, largest_mem)
                allocated[w.queue] = _add(allocated[w.queue], req)
                pending_demand[w.queue] = _add(pending_demand[w.queue], req, -1)
        fs = fair_share(
            queues,
            capacity,
            {q: Resources(*vec) for q, vec in allocated.items()},
            {q: Resources(*vec) for q, vec in pending_demand.items()},
        )
        fair = {q: list(r.as_tuple()) for q, r in fs.share.items()}
        guarantee = {
            q: [
                min(a, b)
                for a, b in zip(queues[q].quota.as_tuple(), fs.demand[q].as_tuple(), strict=True)
            ]
            for q in queues.specs
        }
        allocated_before = {q: Resources(*vec) for q, vec in allocated.items()}

        def ancestors(q: str) -> list[str]:
            out = [q]
            parent = queues[q].parent
            while parent is not None:
                out.append(parent)
                parent = queues[parent].parent
            return out

        subtree_alloc: dict[str, Vec] = defaultdict(lambda: [0, 0, 0])
        for q, vec in allocated.items():
            for a in ancestors(q):
                subtree_alloc[a] = _add(subtree_alloc[a], vec)

        def charge(q: str, res: Vec, sign: int = 1) -> None:
            allocated[q] = _add(allocated[q], res, sign)
            for a in ancestors(q):
                subtree_alloc[a] = _add(subtree_alloc[a], res, sign)

        def ratio(q: str) -> float:
            best = 0.0
            any_share = False
            for a, f in zip(allocated[q], fair[q], strict=True):
                if f > 0:
                    any_share = True
                    best = max(best, a / f)
                elif a > 0:
                    return math.inf
            return best if any_share else math.inf

        # ---- rule 1: holds
        reserved = np.zeros(work.num_nodes, dtype=np.bool_)
        reserved_for: dict[int, str] = {}
        new_holds: dict[str, Hold] = {}
        for h in valid_holds.values():
            w = by_id[h.workload]
            node = work.node_index[h.node]
            if not h.victims:
                reserved[node] = True
                reserved_for[node] = w.id
                new_holds[w.id] = h
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
                charge(w.queue, request_resources(w.request, largest_mem), -1)
                continue
            decided.add(w.id)
            if alive:
                _withhold_leftover(work, [book.held(by_id[vid]) for vid in alive], allocation)
                new_holds[w.id] = h
                actions.append(
                    Wait(
                        w.id,
                        f"waiting for {len(alive)} preempted workload(s) to exit: "
                        + ", ".join(alive),
                    )
                )
            else:
                book.placed(w, allocation)
                actions.append(Place(w.id, allocation, "placed on capacity held for it"))
                if not w.is_preemptible:
                    nonpreempt[w.queue] += allocation_resources(allocation)[0]

        # rule 7: squeezed workloads get their compute back where it fits (after holds)
        actions.extend(book.settle())

        def squeeze_on(q: str) -> bool:
            chosen = queues[q].squeeze
            return cfg.squeeze if chosen is None else chosen

        def counted(v: Workload) -> Vec:
            held = book.held(v)
            return [counted_gpu_milli(held.gpu_milli, book.is_squeezed(v)), *held_rest(held)]

        # victims at all: preemptible, not terminating, past min_runtime_s, per queue;
        # gathered at the first victim search (most rounds need none)
        candidates: dict[str, list[Workload]] = defaultdict(list)
        gathered = False

        def victim_candidates() -> dict[str, list[Workload]]:
            nonlocal gathered
            if not gathered:
                gathered = True
                for w in workloads:
                    if (
                        w.allocation is not None
                        and not w.terminating
                        and w.is_preemptible
                        and w.queue in known
                        and not (
                            cfg.min_runtime_s > 0
                            and w.started_at is not None
                            and now - w.started_at < cfg.min_runtime_s
                        )
                    ):
                        candidates[w.queue].append(w)
            return candidates

        # ---- rule 2: order, in two passes (rule 12): non-preemptible work of every queue
        # first, then the rest
        first: dict[str, list[Workload]] = defaultdict(list)
        rest: dict[str, list[Workload]] = defaultdict(list)
        for w in pending:
            if w.id not in decided:
                (first if not w.is_preemptible else rest)[w.queue].append(w)
        no_fit: dict[tuple[Request, bool, frozenset[str] | None], str] = {}
        resources_of: dict[Request, Vec] = {}
        no_victims: set[tuple[Request, str, int, frozenset[str] | None]] = set()
        # (index in actions, workload, GPU milli, node fit, hold) of those that found no place
        unexplained: list[tuple[int, Workload, int, str, Hold | None]] = []
        could_fit: dict[tuple[Request, frozenset[str] | None], bool] = {}  # on empty nodes

        def admit(w: Workload, res: Vec) -> str | None:
            for a in ancestors(w.queue):
                limit = queues[a].limit
                if limit is None:
                    continue
                after = _add(subtree_alloc[a], res)
                for dim, x, lim in zip(
                    ("gpu", "cpu", "memory"), after, limit.as_tuple(), strict=True
                ):
                    if x > lim:
                        return f"queue {a} would exceed its limit ({limit_text(dim, x, lim)})"
            if not w.is_preemptible:
                quota = queues[w.queue].quota.gpu_milli
                if nonpreempt[w.queue] + res[0] > quota:
                    return (
                        f"non-preemptible work must stay within the quota of queue {w.queue} "
                        f"(quota {gpu_text(quota)} GPUs, in use {gpu_text(nonpreempt[w.queue])}, "
                        f"needs {gpu_text(res[0])})"
                    )
            return None

        def delay_of(q: str) -> float:
            chosen = queues[q].preempt_delay_s
            return cfg.preempt_delay_s if chosen is None else chosen

        # index in actions -> what a waiting preemptor's reason ends with (rule 10)
        wait_notes: dict[int, str] = {}
        for per_queue in (first, rest):
            # rule 11: a suspended workload goes before new work of its priority
            for items in per_queue.values():
                items.sort(
                    key=lambda w: (
                        -self.effective_priority(w, now),
                        w.suspended_on is None,
                        w.submitted_at,
                        w.id,
                    )
                )
            cursor = dict.fromkeys(per_queue, 0)
            heap = [(ratio(q), -queues[q].priority, q) for q in per_queue]
            heapq.heapify(heap)
            # rule 12: each pass has its own budget of victim searches
            search_cap = cfg.max_preemptors_per_round
            searches = 0
            while heap:
                _, neg_prio, q = heapq.heappop(heap)
                items = per_queue[q]
                if cursor[q] >= len(items):
                    continue
                w = items[cursor[q]]
                cursor[q] += 1
                cached = resources_of.get(w.request)
                if cached is None:
                    cached = resources_of[w.request] = request_resources(w.request, largest_mem)
                res = cached
                reason = admit(w, res)
                if reason is not None:
                    actions.append(Wait(w.id, reason))
                    heapq.heappush(heap, (ratio(q), neg_prio, q))
                    continue
                if w.suspended_on is not None:  # rule 11: only a restore, only on its node
                    actions.append(self._restore(work, placer, w, reserved))
                    if isinstance(actions[-1], Restore):
                        charge(q, allocation_resources(actions[-1].allocation))
                    heapq.heappush(heap, (ratio(q), neg_prio, q))
                    continue
                own_reservation = w.id in new_holds and new_holds[w.id].is_reservation
                exclude: np.ndarray | None = reserved if reserved.any() else None
                if own_reservation:
                    exclude = reserved.copy()
                    exclude[work.node_index[new_holds[w.id].node]] = False
                allowed = work.node_mask(w.nodes) if w.nodes is not None else None
                # a shape that found no node in this round finds none later in it either: the
                # working state only fills up
                key = (w.request, exclude is not None, w.nodes)
                result: Allocation | Unschedulable
                if key in no_fit and not own_reservation:
                    result = Unschedulable(no_fit[key])
                else:
                    result = placer.place(w.request, explain=True, exclude=exclude, allowed=allowed)
                if isinstance(result, Allocation) and not w.is_preemptible:
                    # a memory-only share takes more of a smaller GPU than admit() counted:
                    # the quota rule holds for what the placement really takes, so a node
                    # whose GPU would take too much is left out and the next one tried
                    quota = queues[q].quota.gpu_milli
                    tried: np.ndarray | None = None
                    takes_milli = 0
                    while isinstance(result, Allocation):
                        takes_milli = allocation_resources(result)[0]
                        if nonpreempt[q] + takes_milli <= quota:
                            break
                        placer.release(result)
                        if tried is None:
                            tried = (
                                exclude.copy()
                                if exclude is not None
                                else np.zeros(len(reserved), dtype=bool)
                            )
                        tried[result.node] = True
                        result = placer.place(w.request, exclude=tried, allowed=allowed)
                    if not isinstance(result, Allocation) and tried is not None:
                        actions.append(
                            Wait(
                                w.id,
                                f"non-preemptible work must stay within the quota of queue {q} "
                                f"(quota {gpu_text(quota)} GPUs, in use "
                                f"{gpu_text(nonpreempt[q])}; the GPU free for it now would "
                                f"take {gpu_text(takes_milli)})",
                            )
                        )
                        heapq.heappush(heap, (ratio(q), neg_prio, q))
                        continue
                if isinstance(result, Allocation):
                    actions.append(Place(w.id, result))
                    charge(q, allocation_resources(result))
                    if not w.is_preemptible:
                        nonpreempt[q] += allocation_resources(result)[0]
                    new_holds.pop(w.id, None)
                    if own_reservation:
                        reserved[result.node] = False
                    heapq.heappush(heap, (ratio(q), neg_prio, q))
                    continue
                if not own_reservation:
                    no_fit[key] = result.reason
                # rule 7: squeeze before evict
                skey = (w.request, f"{w.queue}/squeeze", w.priority, w.nodes)
                if (
                    squeeze_on(q)
                    and can_squeeze(w)
                    and skey not in no_victims
                    and searches < search_cap
                ):
                    searches += 1
                    plan = book.find(
                        w,
                        victim_candidates().get(q, ()),
                        self.policy,
                        rank,
                        exclude if exclude is not None else reserved,
                        victimized,
                    )
                    if plan is None:
                        no_victims.add(skey)
                    else:
                        for sv in plan.squeezed:
                            assert sv.allocation is not None
                            charge(sv.queue, [sv.allocation.gpu_milli[0], 0, 0], -1)
                        squeezed_alloc, squeezes = book.apply(w, plan)
                        actions.extend(squeezes)
                        actions.append(
                            Place(
                                w.id,
                                squeezed_alloc,
                                "squeezed "
                                + ", ".join(sv.id for sv in plan.squeezed + plan.compressed),
                            )
                        )
                        charge(q, allocation_resources(squeezed_alloc))
                        if not w.is_preemptible:
                            nonpreempt[q] += allocation_resources(squeezed_alloc)[0]
                        new_holds.pop(w.id, None)
                        heapq.heappush(heap, (ratio(q), neg_prio, q))
                        continue
                # rules 4 and 5: preemption, then reclaim; rule 10: not before the delay
                found: tuple[_Victims, str] | None = None
                delay = delay_of(q) if w.priority < cfg.preempt_wait_below else 0.0
                waited = now - w.submitted_at
                if delay > 0 and waited < delay:
                    wait_notes[len(actions)] = (
                        f"; waiting for capacity to free before it preempts (waited "
                        f"{max(waited, 0.0):.0f} s of {delay:.0f} s; may preempt from "
                        f"t={w.submitted_at + delay:.0f} s)"
                    )
                elif searches < search_cap:
                    for kind in ("preemption", "reclaim"):
                        skey = (w.request, f"{w.queue}/{kind}", w.priority, w.nodes)
                        if skey in no_victims:
                            continue
                        searches += 1
                        victims = self._find_victims(
                            now,
                            work,
                            placer,
                            w,
                            kind,
                            by_id,
                            allocated,
                            fair,
                            guarantee,
                            res,
                            rank,
                            reserved,
                            victim_candidates(),
                            victimized,
                            book,
                        )
                        if victims is None:
                            no_victims.add(skey)
                            continue
                        found = (victims, kind)
                        break
                if found is not None:
                    chosen, kind = found
                    node = chosen.node
                    for victim in chosen.victims:
                        victimized.add(victim.id)
                        charge(victim.queue, counted(victim), -1)
                        work.release(book.held(victim))
                        why = (
                            f"{kind} by {w.id} (queue {w.queue}, priority {w.priority}) "
                            f"on {work.node_names[node]}"
                        )
                        host = suspend_host_mib(victim)
                        if cfg.suspend and victim.suspendable and work.suspend_free[node] >= host:
                            work.hold_suspended(node, host)  # rule 9
                            actions.append(
                                Suspend(
                                    victim.id,
                                    w.id,
                                    kind,
                                    f"suspended to host memory ({host} MiB) for " + why,
                                    host,
                                )
                            )
                        else:
                            actions.append(Preempt(victim.id, w.id, kind, why))
                    need = work.gpu_need(w.request)
                    _, gpus_ok = work.feasible(w.request, need)
                    gpus = self.policy.select_gpus(work, w.request, need, node, gpus_ok)
                    taken = work.allocate(w.request, node, gpus)
                    _withhold_leftover(work, [book.held(v) for v in chosen.victims], taken)
                    charge(q, res)
                    new_holds[w.id] = Hold(
                        w.id, work.node_names[node], gpus, tuple(x.id for x in chosen.victims), now
                    )
                    actions.append(
                        Wait(
                            w.id, f"waiting for {len(chosen.victims)} preempted workload(s) to exit"
                        )
                    )
                    heapq.heappush(heap, (ratio(q), neg_prio, q))
                    continue
                # rule 6: reservation against starvation
                if (
                    cfg.reservation_after_s is not None
                    and w.request.gpu_count >= cfg.reservation_min_gpus
                    and now - w.submitted_at >= cfg.reservation_after_s
                    and w.id not in new_holds
                ):
                    spot = self._reservation_node(work, w.request, reserved, allowed)
                    if spot is not None:
                        reserved[spot] = True
                        new_holds[w.id] = Hold(w.id, work.node_names[spot], (), (), now)
                        actions.append(
                            Wait(
                                w.id,
                                f"reserved node {work.node_names[spot]}; waiting for it to drain "
                                f"({result.reason})",
                            )
                        )
                        heapq.heappush(heap, (ratio(q), neg_prio, q))
                        continue
                if own_reservation:
                    actions.append(
                        Wait(w.id, f"reserved node {new_holds[w.id].node}; waiting for it to drain")
                    )
                else:
                    # the rule that holds it is named once the round is decided (below), unless
                    # no allowed node could take it even empty: then the node fit is the reason
                    ever_key = (w.request, w.nodes)
                    ever = could_fit.get(ever_key)
                    if ever is None:
                        none_reserved = np.zeros_like(reserved)
                        spot = self._reservation_node(work, w.request, none_reserved, allowed)
                        ever = could_fit[ever_key] = spot is not None
                    if ever:
                        holder = _holder(work, w.request, exclude, new_holds)
                        unexplained.append((len(actions), w, res[0], result.reason, holder))
                    actions.append(Wait(w.id, result.reason))
                heapq.heappush(heap, (ratio(q), neg_prio, q))

        if unexplained:  # with the round's allocations (fgpu.sched.reasons)
            lowest = {
                vq: min(v.priority for v in items)
                for vq, items in victim_candidates().items()
                if items
            }
            explain = WaitReasons(fair, lowest, allocated, cfg.reclaim_within_fair_share)
            for i, waiting, milli, fit, holder in unexplained:
                why = explain.explain(waiting, milli, fit, holder)
                if why is not fit:
                    actions[i] = Wait(waiting.id, why)
        for i, note in wait_notes.items():
            waiting_action = actions[i]
            assert isinstance(waiting_action, Wait)
            actions[i] = Wait(waiting_action.workload, waiting_action.reason + note)
        if victimized:  # after the reasons: they index actions
            # a squeezed workload evicted later in the round: the eviction is the news, not
            # the change of who squeezes it (settle, or a compress by a preemptor); newly
            # squeezed ones are never victims in their round (book.lent)
            actions = [
                a for a in actions if not (isinstance(a, Squeeze) and a.workload in victimized)
            ]

        return Decision(
            actions=actions,
            holds=new_holds,
            fair_share=fs.share,
            allocated=allocated_before,
            warnings=fs.warnings,
        )

    # ------------------------------------------------------------------ restore
    @staticmethod
    def _restore(
        work: ClusterState, placer: Placer, w: Workload, reserved: np.ndarray
    ) -> Restore | Wait:
        """Rule 11: restore suspended ``w`` on the node it is suspended on when it fits there
        now (not on a node reserved or held for other work), else keep it waiting."""
        name = w.suspended_on
        assert name is not None
        where = f"suspended on {name} (host {w.suspended_host_mib} MiB)"
        if name not in work.node_index:
            return Wait(w.id, f"{where}; that node is gone, so it cannot be restored")
        if w.nodes is not None and name not in w.nodes:
            return Wait(w.id, f"{where}; its node constraints no longer allow that node")
        if w.suspended_gpus:  # only where its memory was checkpointed from
            node = work.node_index[name]
            gpus = ", ".join(str(g) for g in w.suspended_gpus)
            if reserved[node]:
                return Wait(w.id, f"{where}; its node is reserved or held for other work")
            try:
                found = work.allocate(w.request, node, w.suspended_gpus)
            except InvalidRequestError as exc:
                return Wait(w.id, f"{where}; restores when its GPUs {gpus} have room ({exc})")
            placer.policy.on_allocate(work, found)
            return Restore(w.id, found, f"restored on {name} (GPUs {gpus}): they have room again")
        result = placer.place(
            w.request,
            explain=True,
            exclude=reserved if reserved.any() else None,
            allowed=work.node_mask(frozenset((name,))),
        )
        if isinstance(result, Allocation):
            return Restore(w.id, result, f"restored on {name}: its GPUs have room again")
        return Wait(w.id, f"{where}; restores when that node has room ({result.reason})")

    # ------------------------------------------------------------------ victims
    def _find_victims(
        self,
        now: float,
        work: ClusterState,
        placer: Placer,
        preemptor: Workload,
        kind: str,
        by_id: dict[str, Workload],
        allocated: dict[str, Vec],
        fair: dict[str, Vec],
        guarantee: dict[str, Vec],
        res: Vec,
        rank: IntArray,
        reserved: np.ndarray,
        candidates: dict[str, list[Workload]],
        victimized: set[str],
        book: SqueezeBook,
    ) -> _Victims | None:
        """Smallest victim set on one node that lets ``preemptor`` run there (rules 4-5).

        ``candidates`` holds, per queue, the running workloads that may be victims at all
        (preemptible, not terminating, past ``min_runtime_s``).
        """
        cfg = self.config
        q = preemptor.queue
        if kind == "reclaim":
            if cfg.reclaim_within_fair_share:
                after = _add(allocated[q], res)
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
        best: _Victims | None = None
        request = preemptor.request
        need = work.gpu_need(request)
        model_ok = work.model_mask(request.gpu_models) if request.gpu_count else None
        allowed = work.node_mask(preemptor.nodes) if preemptor.nodes is not None else None
        for node, on_node in by_node.items():
            if model_ok is not None and not model_ok[node]:
                continue
            if allowed is not None and not allowed[node]:
                continue
            view = _NodeView(work, node, request, need)
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
                    taken[v.queue] = _add(taken[v.queue], allocation_resources(book.held(v)))
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
                best = _Victims(node, chosen, key)
        return best

    @staticmethod
    def _reservation_node(
        work: ClusterState,
        request: Request,
        reserved: np.ndarray,
        allowed: np.ndarray | None = None,
    ) -> int | None:
        """The node to reserve: could hold ``request`` when empty, most free GPU first; only
        among ``allowed`` nodes when given."""
        need = work.gpu_need(request)
        big_enough = (
            (work.cpu_capacity >= request.cpu_milli)
            & (work.memory_capacity >= request.memory_mib)
            & (
                (
                    (work.gpu_milli_capacity >= need.milli)
                    & (work.gpu_memory_capacity >= need.memory)
                ).sum(axis=1)
                >= request.gpu_count
            )
            & ~reserved
        )
        if request.gpu_models:
            big_enough &= work.model_mask(request.gpu_models)
        if allowed is not None:
            big_enough &= allowed
        candidates = np.flatnonzero(big_enough)
        if candidates.size == 0:
            return None
        free = work.gpu_free_total[candidates]
        return int(candidates[np.argmax(free)])


def _holder(
    work: ClusterState,
    request: Request,
    exclude: np.ndarray | None,
    holds: Mapping[str, Hold],
) -> Hold | None:
    """The reservation that keeps ``request`` off free capacity that would fit it (a node
    left out of this placement), or None."""
    if exclude is None:
        return None
    ok, _ = work.feasible(request)
    for i in np.flatnonzero(ok & exclude):
        name = work.node_names[int(i)]
        for hold in holds.values():
            if hold.node == name:
                return hold
    return None
