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
   updated. Inside a queue (:mod:`fgpu.sched.queueorder`): effective priority (higher
   first), then suspended work before new work (rule 11), then the user with less GPU
   compute allocated in that queue (kept current through the round), then submission time,
   then id. The round runs this order twice: first
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
    300 s, is the recommended delay and the default of ``fgpu serve``, ``fgpu k8s
    scheduler`` and ``fgpu sim replay``) since it was submitted. Until then it keeps its
    place in the order, so capacity that frees meanwhile goes to it before lower-ranked work;
    its reason ends with how long it has waited and in how long it may preempt (relative
    times, so that they read the same on a virtual clock and on the wall clock). Squeezing
    (rule 7) keeps the victims' memory and progress and does not wait.
11. **Restore.** A suspended workload (``Workload.suspended_on``) is pending for the order
    (its demand counts for its queue) and goes before new work of its priority in its
    queue; it is only ever restored (:class:`Restore`) on the node it is suspended on, onto
    the GPUs its memory was checkpointed from (``Workload.suspended_gpus``; any GPUs of that
    node, so of the same model, where the node's driver can restore onto other GPUs,
    ``Node.restore_other_gpus``), where it fits now, outside reservations and holds, within
    its queue's limits. It never preempts, squeezes or reserves, and no timeout drops it: it
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

**Where the rules live.** This module runs a round in the order above; the parts are
:mod:`fgpu.sched.ledger` (accounting, order key, admission: rules 2, 3, 5),
:mod:`fgpu.sched.victims` (holds and victims: rules 1, 4, 5, 9), :mod:`fgpu.sched.squeeze`
(rule 7), :mod:`fgpu.sched.waiting` (reservation, wait before evicting, restore: rules 6,
10, 11), with the knobs and results in :mod:`fgpu.sched.config` and resource vectors in
:mod:`fgpu.sched.amounts` (all of their public names importable from here too).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from fgpu.model.types import Allocation, Request
from fgpu.sched.amounts import (
    Vec,
    allocation_resources,
    held_rest,
    request_resources,
    suspend_host_mib,
)
from fgpu.sched.config import PREEMPT_DELAY_S, Decision, OutsideUse, SchedulerConfig
from fgpu.sched.ledger import Ledger
from fgpu.sched.placer import Placer, Unschedulable, name_order_rank
from fgpu.sched.policy import PlacementPolicy
from fgpu.sched.queueorder import QueueOrder
from fgpu.sched.reasons import WaitReasons
from fgpu.sched.squeeze import SqueezeBook, can_squeeze
from fgpu.sched.state import ClusterState, IntArray
from fgpu.sched.victims import Candidates, Victims, apply_holds, find_victims, take_victims
from fgpu.sched.waiting import preempt_delay_note, reserve_or_wait, restore
from fgpu.sched.workload import (
    Action,
    Hold,
    Holds,
    Place,
    QueueTree,
    Resources,
    Restore,
    Squeeze,
    Wait,
    Workload,
)


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
        victimized: set[str] = set()
        work = state.copy()
        rank = self.rank if self.rank is not None else name_order_rank(work.node_names)
        placer = Placer(work, self.policy, rank)
        extra = outside.capacity if outside is not None else Resources()
        capacity = Resources(
            int(work.gpu_milli_capacity.sum()) + extra.gpu_milli,
            int(work.cpu_capacity.sum()) + extra.cpu_milli,
            int(work.memory_capacity.sum()) + extra.memory_mib,
        )
        by_id = {w.id: w for w in workloads}
        book = SqueezeBook(work, workloads, by_id)
        largest_mem = int(work.gpu_memory_capacity.max(initial=0))
        ledger = Ledger(
            queues, capacity, workloads, holds or {}, by_id, work.node_index, largest_mem, outside
        )
        actions: list[Action] = list(ledger.unknown)
        held_actions, decided, reserved, new_holds = apply_holds(work, ledger, by_id, book)
        decided.update(a.workload for a in ledger.unknown)
        actions.extend(held_actions)
        # rule 7: squeezed workloads get their compute back where it fits (after holds)
        actions.extend(book.settle())
        candidates = Candidates(workloads, queues.specs, cfg, now)

        # ---- rule 2: order, in two passes (rule 12): non-preemptible work of every queue
        # first, then the rest
        first: dict[str, list[Workload]] = defaultdict(list)
        rest: dict[str, list[Workload]] = defaultdict(list)
        for w in ledger.pending:
            if w.id not in decided:
                (first if not w.is_preemptible else rest)[w.queue].append(w)
        no_fit: dict[tuple[Request, bool, frozenset[str] | None], str] = {}
        no_victims: set[tuple[Request, str, int, frozenset[str] | None]] = set()
        # (index in actions, workload, GPU milli, node fit, hold) of those that found no place
        unexplained: list[tuple[int, Workload, int, str, Hold | None]] = []
        could_fit: dict[tuple[Request, frozenset[str] | None], bool] = {}  # on empty nodes
        # index in actions -> what a waiting preemptor's reason ends with (rule 10)
        wait_notes: dict[int, str] = {}
        for per_queue in (first, rest):
            # inside a queue: priority, suspended first (rule 11), the user with less
            # allocated, submission time (fgpu.sched.queueorder)
            order = QueueOrder(
                per_queue,
                lambda w: (-self.effective_priority(w, now), w.suspended_on is None),
                ledger.user_used,
            )
            heap = [(ledger.ratio(q), -queues[q].priority, q) for q in per_queue]
            heapq.heapify(heap)
            # rule 12: each pass has its own budget of victim searches
            search_cap = cfg.max_preemptors_per_round
            searches = 0
            while heap:
                _, neg_prio, q = heapq.heappop(heap)
                if not order.has_next(q):
                    continue
                w = order.pop(q)
                res = ledger.resources(w.request)
                reason = ledger.admit(w, res)
                if reason is not None:
                    actions.append(Wait(w.id, reason))
                    heapq.heappush(heap, (ledger.ratio(q), neg_prio, q))
                    continue
                if w.suspended_on is not None:  # rule 11: only a restore, only on its node
                    actions.append(restore(work, placer, w, reserved))
                    if isinstance(actions[-1], Restore):
                        ledger.charge(q, allocation_resources(actions[-1].allocation), who=w)
                    heapq.heappush(heap, (ledger.ratio(q), neg_prio, q))
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
                    kept = ledger.within_quota(placer, w, result, exclude, allowed)
                    if isinstance(kept, Wait):
                        actions.append(kept)
                        heapq.heappush(heap, (ledger.ratio(q), neg_prio, q))
                        continue
                    result = kept
                if isinstance(result, Allocation):
                    actions.append(Place(w.id, result))
                    ledger.placed(w, result)
                    new_holds.pop(w.id, None)
                    if own_reservation:
                        reserved[result.node] = False
                    heapq.heappush(heap, (ledger.ratio(q), neg_prio, q))
                    continue
                if not own_reservation:
                    no_fit[key] = result.reason
                # rule 7: squeeze before evict
                skey = (w.request, f"{w.queue}/squeeze", w.priority, w.nodes)
                chosen_squeeze = queues[q].squeeze
                if (
                    (cfg.squeeze if chosen_squeeze is None else chosen_squeeze)
                    and can_squeeze(w)
                    and skey not in no_victims
                    and searches < search_cap
                ):
                    searches += 1
                    plan = book.find(
                        w,
                        candidates.get().get(q, ()),
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
                            ledger.charge(sv.queue, [sv.allocation.gpu_milli[0], 0, 0], -1, sv)
                        squeezed_alloc, squeezes = book.apply(w, plan)
                        actions.extend(squeezes)
                        names = ", ".join(sv.id for sv in plan.squeezed + plan.compressed)
                        actions.append(Place(w.id, squeezed_alloc, "squeezed " + names))
                        ledger.placed(w, squeezed_alloc)
                        new_holds.pop(w.id, None)
                        heapq.heappush(heap, (ledger.ratio(q), neg_prio, q))
                        continue
                # rules 4 and 5: preemption, then reclaim; rule 10: not before the delay
                found: tuple[Victims, str] | None = None
                note = preempt_delay_note(cfg, queues, w, now)
                if note is not None:
                    wait_notes[len(actions)] = note
                elif searches < search_cap:
                    for kind in ("preemption", "reclaim"):
                        skey = (w.request, f"{w.queue}/{kind}", w.priority, w.nodes)
                        if skey in no_victims:
                            continue
                        searches += 1
                        victims = find_victims(
                            cfg,
                            work,
                            w,
                            kind,
                            ledger,
                            res,
                            rank,
                            reserved,
                            candidates.get(),
                            victimized,
                            book,
                        )
                        if victims is None:
                            no_victims.add(skey)
                            continue
                        found = (victims, kind)
                        break
                if found is not None:
                    stops, hold = take_victims(
                        cfg, work, self.policy, w, *found, ledger, book, victimized, now
                    )
                    actions.extend(stops)
                    new_holds[w.id] = hold
                    heapq.heappush(heap, (ledger.ratio(q), neg_prio, q))
                    continue
                # rule 6: reservation against starvation, else it waits
                wait, later, holder = reserve_or_wait(
                    cfg,
                    work,
                    w,
                    result.reason,
                    reserved,
                    allowed,
                    exclude,
                    new_holds,
                    could_fit,
                    now,
                )
                if later:  # the rule that holds it is named once the round is decided
                    unexplained.append((len(actions), w, res[0], result.reason, holder))
                actions.append(wait)
                heapq.heappush(heap, (ledger.ratio(q), neg_prio, q))

        if unexplained:  # with the round's allocations (fgpu.sched.reasons)
            lowest = {
                vq: min(v.priority for v in items)
                for vq, items in candidates.get().items()
                if items
            }
            explain = WaitReasons(
                ledger.fair, lowest, ledger.allocated, cfg.reclaim_within_fair_share
            )
            for i, waiting, milli, fit, keeper in unexplained:
                why = explain.explain(waiting, milli, fit, keeper)
                if why is not fit:
                    actions[i] = Wait(waiting.id, why)
        for i, ending in wait_notes.items():
            waiting_action = actions[i]
            assert isinstance(waiting_action, Wait)
            actions[i] = Wait(waiting_action.workload, waiting_action.reason + ending)
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
            fair_share=ledger.share.share,
            allocated=ledger.allocated_before,
            warnings=ledger.share.warnings,
        )


__all__ = [
    "PREEMPT_DELAY_S",
    "Decision",
    "OutsideUse",
    "Scheduler",
    "SchedulerConfig",
    "Vec",
    "allocation_resources",
    "held_rest",
    "request_resources",
    "suspend_host_mib",
]
