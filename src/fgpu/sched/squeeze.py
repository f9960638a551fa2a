"""Squeeze before evict (DESIGN.md section 5): a preemptor shares a GPU with lower work.

Where preemption inside a queue would evict (strictly lower priority, preemptible, past
``min_runtime_s``), the decision core first tries to *squeeze*: if the preemptor's GPU
memory fits on a GPU next to the lower-priority work (and the node's CPU and host memory
fit), it is placed there and takes the compute of some of that work. Those workloads are
squeezed, not evicted: they keep their processes, GPU memory and progress; the node's
governor pauses them (or holds them to the compress floor) while the preemptor is busy and
they run when it idles. They get their compute back when it fits again.

**Invariants** (checked by :func:`check_squeeze_invariants`, in the hypothesis state
machine after every step and in the replay's debug mode):

1. per GPU, the compute granted to workloads that are not squeezed sums to at most 1000
   milli (the cluster state counts no compute of a squeezed workload);
2. per GPU, the memory granted to all running workloads, squeezed or not, sums to at most
   the GPU's memory: memory is never overcommitted;
3. a squeezed workload knows it: ``Workload.squeezed`` is set and ``squeezed_by`` names the
   workloads that took its compute (the shells store and show both).

**Which work may be squeezed.** Running, not terminating, single-GPU workloads of the
preemptor's queue with strictly lower priority, preemptible and past ``min_runtime_s``,
that are fractional (below 1000 milli) or whole-GPU work that declares its memory
(``-g 1 --gpu-memory 40GiB`` holds 40 GiB, not the whole GPU's memory, so a fractional
preemptor may share that GPU's compute with it; a whole GPU without a declared memory holds
all of the GPU's memory, so nothing could join it). A preemptor squeezes only with a
single-GPU fractional request: pausing one rank of a multi-GPU job alone stalls its peers
(``shared/governor-notes.md``, pitfall 7).

**Where** (the cost of a squeeze, lowest first): per GPU, the compute still left to
workloads squeezed earlier is taken first (they are paused already), then new workloads are
squeezed lowest priority first, most recently started first, and every one that is not
needed is put back. GPUs compare by the highest priority squeezed, then how many are newly
squeezed, then how many squeezed ones lose their remainder, then how much compute is
squeezed beyond the need (it idles while the preemptor is busy); among equal ones the
placement policy picks the node as for any placement (fragmentation as today).

**Compute left over.** Squeezing whole workloads frees more compute than the preemptor
needs; the rest stays with the squeezed workloads of that GPU (highest priority first), so
a squeezed GPU is always full and only a further squeeze (strictly higher priority than
the work squeezed there) can join it.

**Release.** At the start of every round, after holds, each squeezed workload whose whole
compute fits on its GPU again gets it back (:class:`Unsqueeze`), highest priority first,
then earliest started, before any pending work is placed. The others keep the remainder.

**Decisions on the open questions** (tested in ``tests/scenario/test_squeeze.py``):

- *Quotas and fair share.* A squeezed workload counts its CPU and host memory in its
  queue's allocation but not its compute (lent to the preemptor, which counts it), so a
  queue's allocated GPU is the compute it is granted and the queues' allocations never
  add up to more than the cluster. Its compute is not demand either: counted as demand it
  would raise its queue's fair share and so make the queue reclaim other queues' work for
  compute its own squeezed work only waits for (measured: 3.6 times the reclaims of
  eviction only on the benchmark day).
- *Several preemptors.* Each squeeze adds its preemptor to ``squeezed_by``; a workload is
  released only when its whole compute fits, i.e. when enough of them have ended. When all
  the workloads it names have ended but its compute still does not fit, it is attributed
  to the higher-priority workloads that hold that GPU's compute (those placed earlier in
  the same round, on a hold, included).
- *Memory needed by pending work.* A squeezed workload's memory is taken only by eviction
  under the ordinary rules (preemption by strictly higher priority in its queue, reclaim
  across queues); among victims of equal priority squeezed ones go first, since they make
  the least progress. A workload squeezed in a round is not a victim in it (its compute
  is lent to a preemptor placed in it); one already squeezed may be, and then the round
  says only that it is evicted (no :class:`Squeeze` naming new squeezers as well).
  There is no time limit on a squeeze: an always-busy preemptor keeps
  the work paused until it ends.
- *Reclaim across queues* always evicts.

Pure (no clock, no I/O). The working state given to :class:`SqueezeBook` is a what-if copy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from fgpu.model.types import Allocation
from fgpu.model.units import MILLI_PER_GPU
from fgpu.sched.policy import PlacementPolicy
from fgpu.sched.state import ClusterState, IntArray
from fgpu.sched.workload import Action, Squeeze, Unsqueeze, Workload

GpuKey = tuple[int, int]


def can_be_squeezed(w: Workload) -> bool:
    """A running, not terminating, single-GPU workload that is fractional or whole with a
    declared memory (module docstring)."""
    a = w.allocation
    return (
        a is not None
        and not w.terminating
        and len(a.gpus) == 1
        and (a.gpu_milli[0] < MILLI_PER_GPU or w.request.gpu_memory_mib is not None)
        and w.request.gpu_count == 1
    )


def can_squeeze(w: Workload) -> bool:
    """Whether ``w``'s request may take compute by squeezing (single-GPU fractional)."""
    r = w.request
    return r.gpu_count == 1 and (r.gpu_milli is None or r.gpu_milli < MILLI_PER_GPU)


def _compute(a: Allocation, milli: int) -> Allocation:
    """Only ``milli`` compute on ``a``'s GPU (nothing else), to move compute in a state."""
    return Allocation(a.node, a.node_name, a.gpus, (milli,) * len(a.gpus), (0,) * len(a.gpus), 0, 0)


def held_allocation(w: Workload, occupancy: int = 0) -> Allocation:
    """What ``w`` holds in a cluster state: its allocation, with ``occupancy`` compute per GPU
    instead of its own when it is squeezed."""
    a = w.allocation
    assert a is not None
    return _occupying(a, occupancy) if w.squeezed else a


def _occupying(a: Allocation, occupancy: int) -> Allocation:
    """``a`` with ``occupancy`` compute per GPU instead of its own (all else kept)."""
    return Allocation(
        a.node,
        a.node_name,
        a.gpus,
        (occupancy,) * len(a.gpus),
        a.gpu_memory_mib,
        a.cpu_milli,
        a.memory_mib,
    )


@dataclass(slots=True)
class SqueezePlan:
    """Where a preemptor would go by squeezing.

    Attributes:
        node, gpu: the GPU.
        squeezed: workloads newly squeezed there.
        compressed: workloads squeezed earlier whose remaining compute it takes.
        key: the cost (lower is better): highest priority touched, newly squeezed,
            compressed, compute squeezed beyond the preemptor's need.
    """

    node: int
    gpu: int
    squeezed: list[Workload]
    compressed: list[Workload]
    key: tuple[int, int, int, int]


class SqueezeBook:
    """The squeezed workloads of one round, on the round's working state.

    Args:
        work: the working copy of the cluster state (squeezed workloads hold no compute).
        workloads: every pending and running workload of the round.
        by_id: the same, by id.
    """

    def __init__(
        self, work: ClusterState, workloads: Sequence[Workload], by_id: Mapping[str, Workload]
    ) -> None:
        self.work = work
        self.by_id = by_id
        self.squeezed: dict[str, Workload] = {}
        """id -> workload (its current view) of every squeezed, not terminating workload."""
        self.by: dict[str, tuple[str, ...]] = {}
        self.occupancy: dict[str, int] = {}
        """id -> compute a squeezed workload holds of its GPU's remainder this round."""
        self.per_gpu: dict[GpuKey, list[str]] = defaultdict(list)
        for w in workloads:
            if w.squeezed and w.allocation is not None and not w.terminating:
                self.squeezed[w.id] = w
                self.by[w.id] = w.squeezed_by
                self.per_gpu[(w.allocation.node, w.allocation.gpus[0])].append(w.id)
        self.restored: set[str] = set()
        self.lent: set[str] = set()
        """ids newly squeezed this round (their compute is lent to a preemptor placed in
        it): never victims in the same round, since the preemptor's place needs it."""
        self._placed: dict[GpuKey, list[Workload]] = defaultdict(list)
        self._running: dict[GpuKey, list[Workload]] | None = None
        self._workloads = workloads

    # ---------------------------------------------------------------- helpers
    def held(self, w: Workload) -> Allocation:
        """What ``w`` holds in the working state now (see :func:`held_allocation`)."""
        a = w.allocation
        assert a is not None
        if not self.is_squeezed(w):
            return a
        return _occupying(a, self.occupancy.get(w.id, 0))

    def is_squeezed(self, w: Workload) -> bool:
        """Squeezed now: before this round and not released in it, or squeezed in it."""
        if w.id in self.squeezed:
            return True
        return w.squeezed and w.id not in self.restored

    def _alive(self, wid: str) -> bool:
        w = self.by_id.get(wid)
        return w is not None and w.allocation is not None

    def placed(self, w: Workload, allocation: Allocation) -> None:
        """Note that pending ``w`` was placed this round (before :meth:`settle`: on a
        hold), so that it counts among the holders of its GPUs' compute."""
        for g in allocation.gpus:
            self._placed[(allocation.node, g)].append(w)

    def _holders(self, key: GpuKey, w: Workload) -> tuple[str, ...]:
        """Running (or placed this round), not squeezed workloads of higher priority on
        ``key``'s GPU."""
        if self._running is None:
            self._running = defaultdict(list)
            for x in self._workloads:
                if x.allocation is not None:
                    for g in x.allocation.gpus:
                        self._running[(x.allocation.node, g)].append(x)
        return tuple(
            sorted(
                x.id
                for x in (*self._running.get(key, ()), *self._placed.get(key, ()))
                if x.priority > w.priority and not self.is_squeezed(x)
            )
        )

    def _spread(self, key: GpuKey) -> None:
        """Give the free compute of ``key``'s GPU to its squeezed workloads, in order."""
        node, gpu = key
        ids = sorted(
            self.per_gpu.get(key, ()),
            key=lambda i: (
                -self.squeezed[i].priority,
                self.squeezed[i].started_at or 0.0,
                i,
            ),
        )
        for wid in ids:
            w = self.squeezed[wid]
            assert w.allocation is not None
            free = int(self.work.gpu_free_milli[node, gpu])
            want = w.allocation.gpu_milli[0] - self.occupancy.get(wid, 0)
            give = min(free, want)
            if give > 0:
                self.work.resume_compute(_compute(w.allocation, give))
                self.occupancy[wid] = self.occupancy.get(wid, 0) + give

    # ---------------------------------------------------------------- release
    def settle(self) -> list[Action]:
        """Release what fits again and keep the rest squeezed (module docstring, Release).

        Returns :class:`Unsqueeze` for every workload that gets its compute back and
        :class:`Squeeze` for every one whose squeezers changed (some ended).
        """
        actions: list[Action] = []
        for key in sorted(self.per_gpu):
            node, gpu = key
            ids = sorted(
                self.per_gpu[key],
                key=lambda i: (-self.squeezed[i].priority, self.squeezed[i].started_at or 0.0, i),
            )
            for wid in ids:
                w = self.squeezed[wid]
                assert w.allocation is not None
                milli = w.allocation.gpu_milli[0]
                free = int(self.work.gpu_free_milli[node, gpu])
                if free >= milli:
                    self.work.resume_compute(w.allocation)
                    del self.squeezed[wid]
                    self.restored.add(wid)
                    self.per_gpu[key].remove(wid)
                    gone = ", ".join(w.squeezed_by) or "its squeezers"
                    verb = "needs" if len(w.squeezed_by) == 1 else "need"
                    actions.append(Unsqueeze(wid, f"compute returned ({gone} no longer {verb} it)"))
                    continue
                if free > 0:
                    self.work.resume_compute(_compute(w.allocation, free))
                self.occupancy[wid] = free
                alive = tuple(b for b in w.squeezed_by if self._alive(b))
                if not alive:
                    alive = self._holders(key, w)
                if alive != w.squeezed_by:
                    self.by[wid] = alive
                    actions.append(
                        Squeeze(
                            wid,
                            alive,
                            "still squeezed by "
                            + (", ".join(alive) or "nobody")
                            + f" ({milli} milli do not fit yet; {free} left to it)",
                        )
                    )
        return actions

    # ---------------------------------------------------------------- search
    def find(
        self,
        preemptor: Workload,
        candidates: Iterable[Workload],
        policy: PlacementPolicy,
        rank: IntArray,
        reserved: np.ndarray,
        victimized: set[str],
    ) -> SqueezePlan | None:
        """The cheapest GPU where ``preemptor`` fits by squeezing (module docstring, Where).

        Args:
            preemptor: a pending single-GPU fractional workload (:func:`can_squeeze`).
            candidates: running workloads that may be victims at all (preemptible, past
                ``min_runtime_s``); those of the preemptor's queue with strictly lower
                priority that :func:`can_be_squeezed` are used.
            policy: the placement policy, to choose among equally cheap nodes.
            rank: int64[N] node tie-break rank.
            reserved: bool[N] nodes reserved for other work.
            victimized: ids already chosen as victims this round.
        """
        work = self.work
        request = preemptor.request
        groups: dict[GpuKey, list[Workload]] = defaultdict(list)
        for v in candidates:
            if (
                v.queue == preemptor.queue
                and v.priority < preemptor.priority
                and v.id not in victimized
                and can_be_squeezed(v)
            ):
                assert v.allocation is not None
                current = self.squeezed.get(v.id, v)
                groups[(v.allocation.node, v.allocation.gpus[0])].append(current)
        if not groups:
            return None
        need = work.gpu_need(request)
        model_ok = work.model_mask(request.gpu_models)
        allowed = work.node_mask(preemptor.nodes) if preemptor.nodes is not None else None
        plans: list[SqueezePlan] = []
        for (node, gpu), group in groups.items():
            if reserved[node] or not model_ok[node] or (allowed is not None and not allowed[node]):
                continue
            if (
                work.cpu_free[node] < request.cpu_milli
                or work.memory_free[node] < request.memory_mib
                or work.gpu_free_memory[node, gpu] < need.memory[node, gpu]
            ):
                continue
            milli = int(need.milli[node, gpu])
            deficit = milli - int(work.gpu_free_milli[node, gpu])
            if milli > MILLI_PER_GPU or deficit <= 0:
                continue
            compressed: list[Workload] = []
            earlier = sorted(
                (v for v in group if v.id in self.squeezed and self.occupancy.get(v.id, 0) > 0),
                key=lambda v: (v.priority, -(v.started_at or 0.0), v.id),
            )
            for v in earlier:
                if deficit <= 0:
                    break
                compressed.append(v)
                deficit -= self.occupancy[v.id]
            fresh = sorted(
                (v for v in group if v.id not in self.squeezed),
                key=lambda v: (v.priority, not v.squeezed, -(v.started_at or 0.0), v.id),
            )
            chosen: list[Workload] = []
            for v in fresh:
                if deficit <= 0:
                    break
                assert v.allocation is not None
                chosen.append(v)
                deficit -= v.allocation.gpu_milli[0]
            if deficit > 0:
                continue
            for v in reversed(chosen[:-1]):  # put back what is not needed
                assert v.allocation is not None
                if deficit + v.allocation.gpu_milli[0] <= 0:
                    chosen.remove(v)
                    deficit += v.allocation.gpu_milli[0]
            touched = chosen + compressed
            # -deficit: compute squeezed beyond the need, left idle while the preemptor is busy
            key = (max(v.priority for v in touched), len(chosen), len(compressed), -deficit)
            plans.append(SqueezePlan(node, gpu, chosen, compressed, key))
        if not plans:
            return None
        best = min(p.key for p in plans)
        tied = [p for p in plans if p.key == best]
        if len(tied) == 1:
            return tied[0]
        # one GPU per node (the lowest index), then the policy picks the node on a what-if
        # state where each tied GPU's squeezed compute is given back
        per_node: dict[int, SqueezePlan] = {}
        for p in sorted(tied, key=lambda p: (p.node, p.gpu)):
            per_node.setdefault(p.node, p)
        trial = work.copy()
        gpus = np.zeros(work.gpu_free_milli.shape, dtype=np.bool_)
        for p in per_node.values():
            for v in p.squeezed:
                assert v.allocation is not None
                trial.suspend_compute(v.allocation)
            for v in p.compressed:
                assert v.allocation is not None
                trial.suspend_compute(_compute(v.allocation, self.occupancy[v.id]))
            gpus[p.node, p.gpu] = True
        nodes = np.array(sorted(per_node), dtype=np.int64)
        chosen_node = policy.select_node(trial, request, need, nodes, gpus, rank)
        return per_node[int(chosen_node)]

    def apply(self, preemptor: Workload, plan: SqueezePlan) -> tuple[Allocation, list[Action]]:
        """Squeeze as ``plan`` says and place ``preemptor`` on the working state.

        Returns the preemptor's allocation and the :class:`Squeeze` actions (to be carried
        out before its :class:`Place`).
        """
        work = self.work
        key = (plan.node, plan.gpu)
        actions: list[Action] = []
        for v in plan.compressed:
            assert v.allocation is not None
            work.suspend_compute(_compute(v.allocation, self.occupancy[v.id]))
            self.occupancy[v.id] = 0
            self.by[v.id] = (*self.by.get(v.id, ()), preemptor.id)
        for v in plan.squeezed:
            assert v.allocation is not None
            work.suspend_compute(v.allocation)
            self.squeezed[v.id] = Workload(
                v.id,
                v.queue,
                v.request,
                v.priority,
                v.submitted_at,
                v.preemptible,
                v.allocation,
                v.started_at,
                False,
                v.nodes,
                True,
                (preemptor.id,),
                user=v.user,
            )
            self.by[v.id] = (preemptor.id,)
            self.occupancy[v.id] = 0
            self.lent.add(v.id)
            self.per_gpu[key].append(v.id)
        allocation = work.allocate(preemptor.request, plan.node, (plan.gpu,))
        self._spread(key)
        where = f"GPU {plan.gpu} of {work.node_names[plan.node]}"
        for v in [*plan.squeezed, *plan.compressed]:
            actions.append(
                Squeeze(
                    v.id,
                    self.by[v.id],
                    f"squeezed by {preemptor.id} (priority {preemptor.priority}) on {where}: "
                    "keeps its memory and progress, paused while it is busy",
                )
            )
        return allocation, actions


def check_squeeze_invariants(nodes_state: ClusterState, workloads: Sequence[Workload]) -> None:
    """Assert the module's invariants over running ``workloads`` on an empty copy of
    ``nodes_state``'s nodes (the shells' ledger, independent of any state they keep).

    Raises:
        AssertionError: naming the GPU and the broken invariant.
    """
    compute: dict[GpuKey, int] = defaultdict(int)
    memory: dict[GpuKey, int] = defaultdict(int)
    index = nodes_state.node_index
    for w in workloads:
        a = w.allocation
        if a is None:
            if w.squeezed:
                raise AssertionError(f"{w.id} is squeezed but not running")
            continue
        if w.squeezed and not can_be_squeezed(w) and not w.terminating:
            raise AssertionError(f"{w.id} is squeezed but cannot be (shape {a.gpu_milli})")
        node = index[a.node_name]
        for g, m, mm in zip(a.gpus, a.gpu_milli, a.gpu_memory_mib, strict=True):
            if not w.squeezed:
                compute[(node, g)] += m
            memory[(node, g)] += mm
    for key, total in compute.items():
        if total > MILLI_PER_GPU:
            raise AssertionError(f"GPU {key}: {total} milli granted to workloads not squeezed")
    for key, total in memory.items():
        cap = int(nodes_state.gpu_memory_capacity[key])
        if total > cap:
            raise AssertionError(f"GPU {key}: {total} MiB granted, above its {cap} MiB")


def execute_squeeze(state: ClusterState, w: Workload, action: Squeeze | Unsqueeze) -> Workload:
    """Carry out a :class:`Squeeze` or :class:`Unsqueeze` on a shell's live state.

    A first squeeze gives the workload's compute back to ``state`` (it keeps CPU and
    memory); a later one only changes ``squeezed_by``; an unsqueeze takes the compute again.

    Returns:
        The workload as it is now.

    Raises:
        InvalidRequestError: an unsqueeze whose compute is not free on ``state``.
        ValueError: the workload is not running.
    """
    if w.allocation is None:
        raise ValueError(f"{type(action).__name__} of {w.id}, which is not running")
    if isinstance(action, Squeeze):
        if not w.squeezed:
            state.suspend_compute(w.allocation)
        return replace(w, squeezed=True, squeezed_by=action.by)
    if w.squeezed:
        state.resume_compute(w.allocation)
    return replace(w, squeezed=False, squeezed_by=())
