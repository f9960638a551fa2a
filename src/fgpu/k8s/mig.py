"""MIG instances for Kubernetes pods: the scheduler's MIG pass (``fgpu.io/mig-profile``).

GPUs in MIG mode are published by their node agent with their instances
(:class:`fgpu.k8s.wire.InventoryGpu` ``mig``); they are not part of the decision core's
cluster (:func:`fgpu.k8s.objects.node_info` leaves them out), so fractional pods never land
on them. Pods that ask for a MIG profile are not given to the core either: after the core's
round, :meth:`MigPass.decide` takes them in order (priority, then creation time, then name)
and, as the single-machine service's MIG pool does (:mod:`fgpu.server.mig_pool`):

1. admits each by its queue's rules (:class:`fgpu.sched.budget.QueueBudget`: the queue's and
   its ancestors' GPU limits; non-preemptible work within its queue's quota); an instance
   counts :func:`fgpu.mig.catalog.instance_milli` milli-GPU (3g on an A100: 428);
2. binds it to a **free instance** of its profile: one no bound pod's ``fgpu.io/assignment``
   names and no placement of this round took, on a GPU with no layout request pending, on a
   node the pod's node constraints allow (``Workload.nodes``: node selector, required
   affinity, tolerated taints) with room for the pod's CPU and memory requests. Among
   several, one on a GPU that already has instances held (the most held compute slices
   first), then by node name, GPU index and start: idle GPUs stay idle, and only idle GPUs
   are reconfigured (4);
3. else counts on an instance a **pending layout request** will make (the pod waits, with a
   reason naming the GPU being reconfigured);
4. else asks :func:`fgpu.mig.planner.plan` for a plan over the **idle** MIG GPUs (no
   instance held by any pod, no request pending, not refused by the agent in the last
   ``retry_s``, on nodes the pods may use; pods with other allowed nodes are planned
   separately) with the remaining pods as the demand, and writes each changed GPU's whole
   new layout into its Node's ``fgpu.io/mig-request``
   (:class:`fgpu.k8s.wire.MigLayoutRequest`, a new generation). The node agent applies it
   (:meth:`fgpu.k8s.agent.NodeAgent.reconcile_mig`) and republishes its inventory with
   ``fgpu.io/mig-status`` acknowledging the generation; the next round finds the new
   instances free and binds (2).

GPUs and instances are told apart by node and uuid (simulated agents repeat uuids across
nodes).

A bound MIG pod is held as its assignment says until it is deleted or finishes; its CPU and
memory count on its node for the core (as a pod the core does not schedule). MIG instances
count in the core's fair share, order and limits through
:class:`fgpu.sched.decide.OutsideUse` (1000 milli-GPU of capacity per MIG GPU). MIG pods are
never preempted and never preempt.

No state is kept here: instances come from the nodes' inventories, who holds them from the
pods' assignments (and the scheduler's own binds not yet seen through the watch), pending
layout changes from the Nodes' request and status annotations. A restarted scheduler reads
all of it back.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fgpu.k8s import wire
from fgpu.k8s.objects import PodRequestError, pod_ask
from fgpu.mig.catalog import MIG_TABLES, MigProfileTable, instance_milli
from fgpu.mig.demand import MigRequest
from fgpu.mig.inventory import MigGpu, MigInputError, MigInstanceState
from fgpu.mig.layout import Layout, fill_layout
from fgpu.mig.planner import MigPlan, hand_out, plan
from fgpu.model.units import MILLI_PER_GPU
from fgpu.sched.budget import QueueBudget
from fgpu.sched.decide import Decision, OutsideUse, allocation_resources
from fgpu.sched.state import ClusterState
from fgpu.sched.workload import NON_PREEMPTIBLE_FROM, Place, QueueTree, Resources, Workload

if TYPE_CHECKING:
    from fgpu.k8s.round import Round

log = logging.getLogger("fgpu.k8s.mig")

Obj = dict[str, Any]

RETRY_S = 60.0
"""Seconds a GPU whose layout change the agent refused is left alone before it is planned
again."""


@dataclass(frozen=True, slots=True)
class MigGpuState:
    """A GPU in MIG mode on a node fgpu may place on.

    Attributes:
        node: node name.
        node_index: the node's index in the round (``Round.infos``).
        index: the GPU's index in its node's inventory.
        uuid: ``GPU-...``.
        table: its model's profile table (fgpu's catalog).
        instances: its instances as the agent published them.
        pending: the layout a pending request wants on it, or None.
        failed: why the agent refused the last change of it, while within ``retry_s``.
    """

    node: str
    node_index: int
    index: int
    uuid: str
    table: MigProfileTable
    instances: tuple[wire.InventoryMigInstance, ...]
    pending: tuple[tuple[str, int], ...] | None = None
    failed: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        """``(node, uuid)``: unique in the cluster (simulated uuids repeat across nodes)."""
        return (self.node, self.uuid)


@dataclass(frozen=True, slots=True)
class NodeMig:
    """One node's MIG layout request and the agent's status, as read this round."""

    request: wire.MigLayoutRequest | None
    status: wire.MigLayoutStatus | None
    resource_version: str

    @property
    def outstanding(self) -> bool:
        """A request the agent has not handled yet."""
        done = self.status.generation if self.status is not None else 0
        return self.request is not None and self.request.generation > done

    @property
    def generation(self) -> int:
        """The highest generation seen on the node (request or status)."""
        return max(
            self.request.generation if self.request is not None else 0,
            self.status.generation if self.status is not None else 0,
        )


@dataclass(frozen=True, slots=True)
class MigPending:
    """A pending MIG pod.

    Attributes:
        workload: the pod as the core would see it (queue, priority, creation time, CPU and
            memory requests).
        profile: the profile it asks for.
        preemptible: its ``fgpu.io/preemptible`` (None: the default rule).
    """

    workload: Workload
    profile: str
    preemptible: bool | None

    @property
    def key(self) -> str:
        return self.workload.id


@dataclass(slots=True)
class MigView:
    """The MIG side of the cluster in one round.

    Attributes:
        gpus: MIG GPUs of usable nodes, by node name then index.
        nodes: node name -> its request and status (nodes with MIG GPUs).
        holders: (node, instance uuid) -> the pod holding it.
        gpu_holders: (node, GPU uuid) -> the pods holding one of its instances.

    GPUs and instances are keyed by node and uuid: real uuids are unique anyway, but
    simulated agents give the same uuids on every node.
        held_milli: leaf queue -> milli-GPU its MIG pods hold on usable nodes.
        nonpreemptible_milli: leaf queue -> the part of that held by non-preemptible pods.
        pending: the pending MIG pods (taken out of the round's workloads).
    """

    gpus: list[MigGpuState] = field(default_factory=list)
    nodes: dict[str, NodeMig] = field(default_factory=dict)
    holders: dict[tuple[str, str], str] = field(default_factory=dict)
    gpu_holders: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    held_milli: dict[str, int] = field(default_factory=dict)
    nonpreemptible_milli: dict[str, int] = field(default_factory=dict)
    pending: list[MigPending] = field(default_factory=list)

    @property
    def capacity_milli(self) -> int:
        """1000 per MIG GPU."""
        return MILLI_PER_GPU * len(self.gpus)

    def outside(self) -> OutsideUse | None:
        """What MIG pods hold, for the core's round (None when there is no MIG GPU)."""
        if not self.gpus and not self.held_milli:
            return None
        return OutsideUse(
            Resources(gpu_milli=self.capacity_milli),
            {q: Resources(gpu_milli=m) for q, m in self.held_milli.items()},
            dict(self.nonpreemptible_milli),
        )


@dataclass(frozen=True, slots=True)
class MigBind:
    """Bind a pod to a free instance."""

    key: str
    assignment: wire.Assignment


@dataclass(frozen=True, slots=True)
class LayoutWrite:
    """Write a layout request on a node (``resource_version``: the Node's version it was
    computed from, a precondition of the write); ``pods`` wait for it."""

    node: str
    request: wire.MigLayoutRequest
    resource_version: str
    pods: tuple[str, ...]


@dataclass(slots=True)
class MigDecision:
    """What the MIG pass decided in one round.

    Attributes:
        binds: pods to bind, in order.
        waits: pod -> why it waits.
        writes: layout requests to write on nodes.
    """

    binds: list[MigBind] = field(default_factory=list)
    waits: dict[str, str] = field(default_factory=dict)
    writes: list[LayoutWrite] = field(default_factory=list)


def is_mig_pod(pod: Mapping[str, Any]) -> bool:
    """Whether the pod asks for a MIG instance (``fgpu.io/mig-profile``)."""
    return wire.MIG_PROFILE in ((pod.get("metadata") or {}).get("annotations") or {})


def _placements(layout: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{p}@{s}" for p, s in layout) or "no instances"


class MigPass:
    """The scheduler's MIG pass (module docstring).

    Args:
        clock: wall-clock seconds (request and status times are wall-clock).
        retry_s: how long a GPU whose change the agent refused is left alone.
    """

    def __init__(self, clock: Callable[[], float], retry_s: float = RETRY_S) -> None:
        self.clock = clock
        self.retry_s = retry_s
        self._memo: dict[str, tuple[Obj, tuple[Any, ...], list[wire.InventoryGpu], NodeMig]] = {}

    # ------------------------------------------------------------------ reading
    def _node(self, obj: Obj) -> tuple[list[wire.InventoryGpu], NodeMig]:
        """A node's MIG GPUs and its request and status, remembered while unchanged."""
        meta = obj["metadata"]
        memo = self._memo.get(meta["name"])
        if memo is not None and memo[0] is obj:
            return memo[2], memo[3]  # the very object of the last round
        notes = meta.get("annotations") or {}
        sig = (
            notes.get(wire.INVENTORY),
            notes.get(wire.MIG_REQUEST),
            notes.get(wire.MIG_STATUS),
            meta.get("resourceVersion"),
        )
        if memo is not None and memo[1] == sig:
            self._memo[meta["name"]] = (obj, sig, memo[2], memo[3])
            return memo[2], memo[3]
        gpus: list[wire.InventoryGpu] = []
        if sig[0] is not None and '"mig"' in sig[0]:
            try:
                gpus = [g for g in wire.Inventory.from_json(sig[0]).gpus if g.mig is not None]
            except wire.WireError as exc:
                log.warning("node %s: %s", meta["name"], exc)
        request = status = None
        try:
            if sig[1]:
                request = wire.MigLayoutRequest.from_json(sig[1])
            if sig[2]:
                status = wire.MigLayoutStatus.from_json(sig[2])
        except wire.WireError as exc:
            log.warning("node %s: %s", meta["name"], exc)
        state = NodeMig(request, status, str(meta.get("resourceVersion") or ""))
        self._memo[meta["name"]] = (obj, sig, gpus, state)
        return gpus, state

    def view(self, nodes: Sequence[Obj], rnd: Round) -> MigView:
        """The MIG GPUs, who holds their instances, and the pending MIG pods, which are
        taken out of ``rnd.workloads`` (the core never places them).

        Args:
            nodes: the Node objects of the snapshot.
            rnd: the round built from the same snapshot; ``rnd.mig_held`` lists the MIG
                pods bound (or assumed bound) to its nodes with their assignments.
        """
        view = MigView()
        usable = {info.node.name: n for n, info in enumerate(rnd.infos)}
        now = self.clock()
        names = set()
        for obj in nodes:
            name = obj["metadata"]["name"]
            names.add(name)
            n = usable.get(name)
            if n is None:
                continue
            gpus, state = self._node(obj)
            if not gpus and state.request is None:
                continue
            view.nodes[name] = state
            pending = state.request.gpus if state.request and state.outstanding else {}
            errors = state.status.errors if state.status is not None else {}
            recent = state.status is not None and now - state.status.time < self.retry_s
            for g in gpus:
                table = MIG_TABLES.get(g.model)
                if table is None:
                    continue  # the agent publishes only models it can lay out
                assert g.mig is not None
                view.gpus.append(
                    MigGpuState(
                        name,
                        n,
                        g.index,
                        g.uuid,
                        table,
                        g.mig,
                        pending.get(g.uuid),
                        errors.get(g.uuid) if recent else None,
                    )
                )
        for gone in self._memo.keys() - names:
            del self._memo[gone]
        view.gpus.sort(key=lambda g: (g.node, g.index))

        def hold(key: str, a: wire.Assignment, preemptible: bool) -> None:
            assert a.mig is not None
            view.holders[(a.node, a.uuids[0])] = key
            view.gpu_holders.setdefault((a.node, a.mig.gpu_uuid), []).append(key)
            milli = a.gpu_milli[0]  # what was granted
            view.held_milli[a.queue] = view.held_milli.get(a.queue, 0) + milli
            if not preemptible:
                view.nonpreemptible_milli[a.queue] = (
                    view.nonpreemptible_milli.get(a.queue, 0) + milli
                )

        for key, a in rnd.mig_held:
            hold(key, a, _preemptible(a))
        if any(is_mig_pod(rnd.pods[w.id]) for w in rnd.workloads if w.allocation is None):
            kept: list[Workload] = []
            for w in rnd.workloads:
                pod = rnd.pods[w.id]
                if w.allocation is not None or not is_mig_pod(pod):
                    kept.append(w)
                    continue
                try:
                    ask = pod_ask(pod)
                except PodRequestError:  # build() refused it already
                    continue
                assert ask.mig_profile is not None
                view.pending.append(MigPending(w, ask.mig_profile, ask.preemptible))
            rnd.workloads = kept
        return view

    # ------------------------------------------------------------------ deciding
    def decide(
        self,
        rnd: Round,
        view: MigView,
        state: ClusterState,
        tree: QueueTree,
        decision: Decision,
    ) -> MigDecision:
        """One pass over the pending MIG pods (module docstring), after the core's round.

        Args:
            rnd: the round (its running pods count against their queues).
            view: :meth:`view` of the same round.
            state: the cluster state the core decided on (CPU and memory free per node).
            tree: the queue tree.
            decision: the core's decision (its placements count too).
        """
        out = MigDecision()
        if not view.pending:
            return out
        cpu_free = np.asarray(state.cpu_free, dtype=np.int64).copy()
        mem_free = np.asarray(state.memory_free, dtype=np.int64).copy()
        held: dict[str, int] = dict(view.held_milli)
        nonpreemptible: dict[str, int] = dict(view.nonpreemptible_milli)

        def count(queue: str, milli: int, preemptible: bool) -> None:
            held[queue] = held.get(queue, 0) + milli
            if not preemptible:
                nonpreemptible[queue] = nonpreemptible.get(queue, 0) + milli

        for w in rnd.workloads:
            if w.allocation is not None and not w.terminating:
                count(w.queue, allocation_resources(w.allocation)[0], w.is_preemptible)
        by_id = {w.id: w for w in rnd.workloads}
        for action in decision.actions:
            if isinstance(action, Place):
                alloc = action.allocation
                w = by_id[action.workload]
                count(w.queue, allocation_resources(alloc)[0], w.is_preemptible)
                cpu_free[alloc.node] -= alloc.cpu_milli
                mem_free[alloc.node] -= alloc.memory_mib
        budget = QueueBudget(tree, held, nonpreemptible)
        taken = set(view.holders)
        # instances pending requests will make: (gpu, profile, start), claimed in order
        future = [(g, p, s) for g in view.gpus if g.pending is not None for p, s in g.pending]
        claimed: set[tuple[str, str, str, int]] = set()
        busy = {g.key: self._held_slices(g, taken) for g in view.gpus}
        models = sorted({g.table.model for g in view.gpus})
        left: list[tuple[MigPending, int]] = []
        ordered = sorted(
            view.pending,
            key=lambda c: (-c.workload.priority, c.workload.submitted_at, c.key),
        )
        for c in ordered:
            w = c.workload
            able = [t for t in {g.table for g in view.gpus} if t.find(c.profile) is not None]
            if not able:
                out.waits[c.key] = self._no_model(c.profile, models)
                continue
            least = min(instance_milli(t, t.get(c.profile)) for t in able)
            refused = budget.admit(w.queue, least, w.is_preemptible)
            if refused is not None:
                out.waits[c.key] = refused
                continue
            found = self._free(c, view.gpus, taken, busy, cpu_free, mem_free)
            if found is not None:
                gpu, instance = found
                profile = gpu.table.get(instance.profile)
                milli = instance_milli(gpu.table, profile)
                taken.add((gpu.node, instance.uuid))
                busy[gpu.key] += profile.compute_slices
                cpu_free[gpu.node_index] -= w.request.cpu_milli
                mem_free[gpu.node_index] -= w.request.memory_mib
                budget.charge(w.queue, milli, w.is_preemptible)
                out.binds.append(
                    MigBind(
                        c.key,
                        wire.Assignment(
                            node=gpu.node,
                            uuids=(instance.uuid,),
                            gpus=(gpu.index,),
                            gpu_milli=(milli,),
                            gpu_memory_mib=(profile.memory_mib,),
                            cpu_milli=w.request.cpu_milli,
                            memory_mib=w.request.memory_mib,
                            queue=w.queue,
                            priority=w.priority,
                            preemptible=c.preemptible,
                            mig=wire.MigHeld(gpu.uuid, profile.name, instance.start),
                        ),
                    )
                )
                continue
            coming = next(
                (
                    (g, p, s)
                    for g, p, s in future
                    if p == c.profile and (*g.key, p, s) not in claimed and _allows(c, g)
                ),
                None,
            )
            if coming is not None:
                g, p, s = coming
                claimed.add((*g.key, p, s))
                budget.charge(w.queue, least, w.is_preemptible)
                state_ = view.nodes[g.node]
                assert state_.request is not None
                out.waits[c.key] = (
                    f"waiting for MIG GPU {g.uuid} (GPU {g.index} of node {g.node}) to be "
                    f"reconfigured to {_placements(g.pending or ())} (request generation "
                    f"{state_.request.generation}, not yet applied by the node agent); this "
                    f"pod gets {p}@{s} once the node agent has made it"
                )
                continue
            budget.charge(w.queue, least, w.is_preemptible)
            left.append((c, least))
        if left:
            self._reconfigure(left, view, taken, budget, cpu_free, mem_free, rnd.notes, out)
        return out

    @staticmethod
    def _no_model(profile: str, models: Sequence[str]) -> str:
        elsewhere = sorted(m for m, t in MIG_TABLES.items() if t.find(profile) is not None)
        here = ", ".join(models) if models else "none"
        return (
            f"no node has a MIG GPU with profile {profile} (a profile of "
            f"{', '.join(elsewhere)}; MIG GPU models in the cluster: {here}); the pod waits "
            "for such a node"
        )

    @staticmethod
    def _held_slices(gpu: MigGpuState, taken: set[tuple[str, str]]) -> int:
        return sum(
            p.compute_slices
            for i in gpu.instances
            if (gpu.node, i.uuid) in taken and (p := gpu.table.find(i.profile)) is not None
        )

    @staticmethod
    def _free(
        c: MigPending,
        gpus: Sequence[MigGpuState],
        taken: set[tuple[str, str]],
        busy: Mapping[tuple[str, str], int],
        cpu_free: Any,
        mem_free: Any,
    ) -> tuple[MigGpuState, wire.InventoryMigInstance] | None:
        best: tuple[tuple[int, int, str, int, int], MigGpuState, wire.InventoryMigInstance] | None
        best = None
        req = c.workload.request
        for g in gpus:
            if g.pending is not None:
                continue  # being reconfigured: its instances may go
            if not _allows(c, g):
                continue
            found = g.table.find(c.profile)
            if found is None:
                continue
            if cpu_free[g.node_index] < req.cpu_milli or mem_free[g.node_index] < req.memory_mib:
                continue
            for i in g.instances:
                if i.profile != found.name or not i.uuid or (g.node, i.uuid) in taken:
                    continue
                key = (0 if busy[g.key] else 1, -busy[g.key], g.node, g.index, i.start)
                if best is None or key < best[0]:
                    best = (key, g, i)
        return None if best is None else (best[1], best[2])

    def _reconfigure(
        self,
        left: list[tuple[MigPending, int]],
        view: MigView,
        taken: set[tuple[str, str]],
        budget: QueueBudget,
        cpu_free: Any,
        mem_free: Any,
        notes: Mapping[str, str],
        out: MigDecision,
    ) -> None:
        """Plan on the idle MIG GPUs for the pods left, and ask their agents to make it.

        Pods with the same allowed nodes (their node selector, affinity and tolerations) are
        planned together, groups in the order of their first pod; a GPU one group's plan
        changes is not offered to the next."""
        held_gpus = sorted(
            f"GPU {g.index} of {g.node}" for g in view.gpus if view.gpu_holders.get(g.key)
        )
        failed = [g for g in view.gpus if g.failed is not None]

        def waiting(c: MigPending, why: str) -> str:
            text = f"no free MIG instance of {c.profile}"
            if c.workload.nodes is not None:
                note = notes.get(c.key)
                text += " on the nodes the pod's node selector, affinity and tolerations allow"
                text += f" ({note})" if note else ""
            if held_gpus:
                text += (
                    f"; MIG GPUs with instances held by pods ({', '.join(held_gpus[:8])}"
                    f"{', ...' if len(held_gpus) > 8 else ''}) are not reconfigured"
                )
            if failed:
                text += "; " + "; ".join(
                    f"the node agent of {g.node} could not change GPU {g.index}: {g.failed}"
                    for g in failed[:3]
                )
            return f"{text}; {why}"

        groups: dict[frozenset[str] | None, list[tuple[MigPending, int]]] = {}
        for c, least in left:
            groups.setdefault(c.workload.nodes, []).append((c, least))
        changed: set[tuple[str, str]] = set()
        writes: dict[str, dict[str, tuple[tuple[str, int], ...]]] = {}
        waiters: dict[str, list[str]] = {}
        for group in groups.values():
            self._plan_group(
                group,
                view,
                taken,
                budget,
                cpu_free,
                mem_free,
                changed,
                waiting,
                writes,
                waiters,
                out,
            )
        now = self.clock()
        for node, layouts in sorted(writes.items()):
            state = view.nodes[node]
            merged: dict[str, tuple[tuple[str, int], ...]] = {}
            if state.outstanding and state.request is not None:
                merged.update(state.request.gpus)  # still to do: keep it in the new request
            merged.update(layouts)
            request = wire.MigLayoutRequest(state.generation + 1, merged, now)
            out.writes.append(
                LayoutWrite(node, request, state.resource_version, tuple(waiters[node]))
            )

    def _plan_group(
        self,
        group: list[tuple[MigPending, int]],
        view: MigView,
        taken: set[tuple[str, str]],
        budget: QueueBudget,
        cpu_free: Any,
        mem_free: Any,
        changed: set[tuple[str, str]],
        waiting: Callable[[MigPending, str], str],
        writes: dict[str, dict[str, tuple[tuple[str, int], ...]]],
        waiters: dict[str, list[str]],
        out: MigDecision,
    ) -> None:
        """Plan for pods that may use the same nodes (``group[0]``'s)."""
        first = group[0][0]
        min_cpu = min(c.workload.request.cpu_milli for c, _ in group)
        min_mem = min(c.workload.request.memory_mib for c, _ in group)
        wanted = {c.profile for c, _ in group}
        need: dict[str, int] = {}
        for c, _ in group:
            for t in {g.table for g in view.gpus}:
                if t.find(c.profile) is not None:
                    need[t.model] = need.get(t.model, 0) + 1
        idle: list[MigGpuState] = []
        per_model: dict[str, int] = {}
        for g in view.gpus:
            if view.gpu_holders.get(g.key) or g.pending is not None or g.failed is not None:
                continue
            if g.key in changed or not _allows(first, g):
                continue
            if any((g.node, i.uuid) in taken for i in g.instances):
                continue
            if not any(g.table.find(p) is not None for p in wanted):
                continue
            if cpu_free[g.node_index] < min_cpu or mem_free[g.node_index] < min_mem:
                continue
            model = g.table.model
            if per_model.get(model, 0) >= need.get(model, 0):
                continue  # enough GPUs of this model to serve every pod of the group
            per_model[model] = per_model.get(model, 0) + 1
            idle.append(g)
        demand: list[tuple[MigPending, MigRequest]] = []
        leasts: dict[str, int] = {}
        for c, least in group:
            leasts[c.key] = least
            if any(g.table.find(c.profile) is not None for g in idle):
                demand.append((c, MigRequest(profile=c.profile)))
            else:
                budget.charge(c.workload.queue, least, c.workload.is_preemptible, -1)
                out.waits[c.key] = waiting(c, "no idle MIG GPU with room for it")
        if not demand:
            return
        gpus = [
            MigGpu(
                number,
                g.table.model,
                True,
                tuple(MigInstanceState(i.profile, i.start, False, i.uuid) for i in g.instances),
                table=g.table,
            )
            for number, g in enumerate(idle)
        ]
        try:
            planned: MigPlan | None = plan(gpus, [ask for _, ask in demand])
        except MigInputError as exc:  # an inventory the agent should not publish
            log.error("MIG planner refused the input: %s", exc)
            planned = None
        served = hand_out(planned, demand) if planned is not None else {}
        demand_on: dict[int, list[tuple[MigPending, Any]]] = {}
        for c, _ in demand:
            got = served.get(c)
            if got is not None:
                demand_on.setdefault(got.gpu_index, []).append((c, got))
        filled_after: dict[int, Layout] = {}
        for c, ask in demand:
            a = served.get(c)
            gpu_plan = planned.gpus[a.gpu_index] if planned is not None and a else None
            if a is None or gpu_plan is None or not gpu_plan.changed:
                budget.charge(c.workload.queue, leasts[c.key], c.workload.is_preemptible, -1)
                reason = "no idle MIG GPU has room for it"
                if planned is not None:
                    reason += f" ({self._unserved(planned, ask)})"
                out.waits[c.key] = waiting(c, reason)
                continue
            g = idle[a.gpu_index]
            changed.add(g.key)
            filled = filled_after.get(a.gpu_index)
            if filled is None:
                # the slices the plan leaves free become instances of the profiles this
                # group asks for (most asked first): once the GPU holds a pod it is never
                # changed again, so slices left bare would stay unused until it empties
                counts = Counter(p.profile for _, p in demand_on.get(a.gpu_index, []))
                order = [p for p, _ in counts.most_common()]
                filled = filled_after[a.gpu_index] = fill_layout(g.table, gpu_plan.after, order)
            layout = tuple((p.profile, p.start) for p in filled)
            writes.setdefault(g.node, {})[g.uuid] = layout
            waiters.setdefault(g.node, []).append(c.key)
            out.waits[c.key] = (
                f"waiting for MIG GPU {g.uuid} (GPU {g.index} of node {g.node}) to be "
                f"reconfigured to {_placements(layout)}; this pod gets "
                f"{a.profile}@{a.start} once the node agent has made it"
            )

    @staticmethod
    def _unserved(planned: MigPlan, ask: MigRequest) -> str:
        for u in planned.unserved:
            if u.request == ask.text:
                return u.reason
        return "the pods before it take the room"


def _allows(c: MigPending, gpu: MigGpuState) -> bool:
    """Whether the pod's node constraints allow the GPU's node."""
    return c.workload.nodes is None or gpu.node in c.workload.nodes


def _preemptible(a: wire.Assignment) -> bool:
    return a.preemptible if a.preemptible is not None else a.priority < NON_PREEMPTIBLE_FROM


__all__ = [
    "LayoutWrite",
    "MigBind",
    "MigDecision",
    "MigGpuState",
    "MigPass",
    "MigPending",
    "MigView",
    "NodeMig",
    "is_mig_pod",
]
