"""Round building for ``fgpu k8s scheduler`` (:class:`RoundBuilder`, a base of
:class:`fgpu.k8s.scheduler.K8sScheduler`): from a snapshot of the cluster cache to the
decision core's inputs (:class:`Round`): fgpu nodes and their GPUs, pending and running fgpu
pods as workloads (what a bound pod holds, from its allocated ResourceClaim or its
``fgpu.io/assignment``), other schedulers' pods as CPU and memory, and the holds. Parsed
nodes and running pods are remembered while unchanged, so a round parses only what changed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fgpu.k8s import claims, parity, tenancy, wire
from fgpu.k8s.cache import Snapshot
from fgpu.k8s.constraints import ConstraintCache, NodeFacts, node_facts
from fgpu.k8s.kube import KubeApi, KubeError
from fgpu.k8s.mig import MigDecision
from fgpu.k8s.objects import (
    NodeInfo,
    PodRequestError,
    container_requests,
    created_at,
    node_info,
    pod_ask,
)
from fgpu.k8s.suspending import note_suspend
from fgpu.model.types import Allocation, InvalidRequestError, Request
from fgpu.sched.rounds import apply_running, state_with
from fgpu.sched.state import ClusterState, check_invariants
from fgpu.sched.workload import Hold, Workload

log = logging.getLogger("fgpu.k8s.scheduler")

Obj = dict[str, Any]
_TERMINAL = ("Succeeded", "Failed")


@dataclass(slots=True)
class Round:
    """The core's inputs built from one snapshot, and what is needed to act on them.

    Attributes:
        infos: fgpu nodes in index order.
        workloads: pending and running fgpu pods as the core sees them.
        others: pods the core does not schedule but whose CPU and memory count on fgpu
            nodes (other schedulers' pods), as CPU-only workloads.
        pods: workload id -> pod object.
        refused: workload id -> why the pod cannot be considered (a bad annotation, not
            admitted by the webhook).
        notes: workload id -> why some nodes are not allowed for the pod (its node
            selector, affinity or taints), added to its reason when it waits.
        left_out: queue name -> why its ``Queue`` object is not used.
        unavailable: fgpu nodes not counted (cordoned, not Ready, or an unreadable
            inventory), named in the reasons of pods that fit nowhere.
        mig_held: MIG pods bound (or assumed bound) to fgpu nodes, with their assignments
            (:mod:`fgpu.k8s.mig`; the core sees only their CPU and memory, in ``others``).
        mig: what the MIG pass decided (set by :meth:`K8sScheduler.plan`).
        claims: workload id -> the pod's fgpu ResourceClaim (pending and bound pods).
        templates: namespaces whose pods wait for fgpu's ResourceClaimTemplate.
        load: pods and host ports on the fgpu nodes (:mod:`fgpu.k8s.parity`).
        suspended: workload id -> the core's view of a pod suspended to host memory
            (:mod:`fgpu.k8s.suspending`).
        suspending: workload ids of pods asked to suspend whose agent has not answered.
        suspend_charges: node index -> host memory (MiB) of its suspend budget held by
            pods suspending, suspended or restoring there.
        suspend_failed: workload id -> why its node agent could not suspend it (it is
            evicted instead).
        copies: workload id -> (``suspend`` or ``restore``, the agent's note with the copy
            time, queue, milli-GPU held) for ``fgpu_gpu_seconds_lost_total``.
    """

    infos: list[NodeInfo]
    workloads: list[Workload] = field(default_factory=list)
    others: list[Workload] = field(default_factory=list)
    pods: dict[str, Obj] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    unavailable: int = 0
    mig_held: list[tuple[str, wire.Assignment]] = field(default_factory=list)
    mig: MigDecision | None = None
    claims: dict[str, Obj] = field(default_factory=dict)
    templates: set[str] = field(default_factory=set)
    load: parity.NodeLoad | None = None
    suspended: dict[str, Workload] = field(default_factory=dict)
    suspending: set[str] = field(default_factory=set)
    suspend_charges: dict[int, int] = field(default_factory=dict)
    suspend_failed: dict[str, str] = field(default_factory=dict)
    copies: dict[str, tuple[str, str, str, int]] = field(default_factory=dict)


class RoundBuilder:
    """Part of :class:`fgpu.k8s.scheduler.K8sScheduler`: building a round (the attributes
    below are set by its constructor)."""

    api: KubeApi
    clock: Callable[[], float]
    env_without_isolation: bool
    _claim_of: dict[str, Obj]
    _assumed: dict[str, tuple[str, wire.Assignment]]
    _evicting: dict[str, str]
    _protected: dict[str, float]
    _reasons: dict[str, str]
    _holds: dict[str, Hold] | None
    _snap_claims: Mapping[str, Obj]
    _requests_memo: dict[str, tuple[str, tuple[int, int]]]
    _claim_memo: dict[str, tuple[tuple[Any, ...], NodeInfo, wire.Assignment | str]]
    _node_memo: dict[str, tuple[Any, NodeInfo | None, Obj]]
    _running_memo: dict[str, tuple[Any, NodeInfo, Workload]]
    _base: ClusterState | None
    _base_nodes: tuple[NodeInfo, ...]
    _base_held: dict[str, tuple[Workload, Allocation]]
    _fast: dict[int, tuple[Obj, Workload, str, str, NodeInfo]]
    _facts_memo: dict[str, tuple[Obj, NodeFacts]]
    _granted: dict[str, tuple[str, wire.Assignment]]
    _said: dict[str, str]
    _env_missed: dict[str, str]
    _constraints: ConstraintCache
    _volumes: parity.VolumeLookup
    _load_counter: parity.LoadCounter
    _suspend_asked: dict[str, tuple[str, bool]]
    _copies_counted: dict[str, tuple[str, str]]
    _suspendish: set[str]

    def build(self, snap: Snapshot) -> Round:
        """The core's inputs from a snapshot and this replica's assumed placements and
        evictions. Parsed nodes and running pods are remembered while unchanged (and
        forgotten once gone), so a round parses only what changed."""
        infos: list[NodeInfo] = []
        facts: list[NodeFacts] = []
        fgpu_nodes: list[Obj] = []
        unavailable = 0
        self._snap_claims = snap.claims or {}
        for obj in snap.nodes:
            info = self._node(obj)
            if info is not None:
                infos.append(info)
                facts.append(self._facts(obj))
                fgpu_nodes.append(obj)
            elif wire.INVENTORY in ((obj.get("metadata") or {}).get("annotations") or {}):
                unavailable += 1  # an fgpu node, cordoned or not Ready (or unreadable)
        infos.sort(key=lambda i: i.node.name)
        facts.sort(key=lambda f: f.name)
        self._constraints.nodes(facts)
        rnd = Round(infos, unavailable=unavailable)
        late = {k: a.node for k, (_, a) in self._assumed.items()}
        rnd.load = load = self._load_counter.count(fgpu_nodes, snap.pods, late)
        full = load.full()
        index = {info.node.name: i for i, info in enumerate(infos)}
        gpu_at: dict[int, dict[str, int]] = {}  # node -> uuid -> GPU index, made when needed
        now = self.clock()
        fast = self._fast
        self._fast = {}
        special = self._evicting.keys() | self._protected.keys() | self._suspendish
        queue_objects = {q["metadata"]["name"]: q for q in snap.queues}
        for pod in snap.pods:
            # an fgpu pod whose object is the very one of the last round, on a node whose
            # view did not change: reuse its workload (the cache replaces objects on change)
            seen = fast.get(id(pod))
            if seen is not None and seen[0] is pod and seen[2] not in special:
                n = index.get(seen[3])
                if n is not None and seen[4] is rnd.infos[n]:
                    rnd.pods[seen[2]] = pod
                    rnd.workloads.append(seen[1])
                    self._fast[id(pod)] = seen
                    continue
            status = pod.get("status") or {}
            if status.get("phase") in _TERMINAL:
                continue
            spec = pod.get("spec") or {}
            meta = pod["metadata"]
            node = spec.get("nodeName")
            key = wire.pod_key(pod)
            if spec.get("schedulerName") != wire.SCHEDULER_NAME:
                if node in index:
                    self._other(rnd, key, pod, index[node])
                continue
            rnd.pods[key] = pod
            uid = meta.get("uid", "")
            text = (meta.get("annotations") or {}).get(wire.ASSIGNMENT)
            assumed = self._assumed.get(key)
            if node is None and assumed is not None and assumed[0] == uid:
                node, text = assumed[1].node, assumed[1].to_json()
            if node:
                terminating = bool(meta.get("deletionTimestamp")) or self._evicting.get(key) == uid
                protected = self._protected.get(key, 0.0) > now
                n = index.get(node)
                memo = self._running_memo.get(key)
                claim_rv = None
                held: Obj | None = None
                if not self.env_without_isolation and spec.get("resourceClaims"):
                    held, _ = claims.pod_claim(pod, self._snap_claims)
                    claim_rv = held["metadata"].get("resourceVersion") if held else None
                sig = (
                    uid,
                    meta.get("resourceVersion"),
                    node,
                    n,
                    text,
                    terminating,
                    protected,
                    claim_rv,
                    self._suspend_asked.get(key),
                )
                if (
                    n is not None
                    and memo is not None
                    and key not in self._suspendish
                    and memo[0] == sig
                    and memo[1] is rnd.infos[n]
                ):
                    rnd.workloads.append(memo[2])  # unchanged pod on an unchanged node
                    self._fast[id(pod)] = (pod, memo[2], key, node, memo[1])
                    continue
                before = len(rnd.workloads)
                self._running(rnd, key, pod, node, text, index, gpu_at, now, held)
                if n is not None and len(rnd.workloads) > before:
                    self._running_memo[key] = (sig, rnd.infos[n], rnd.workloads[-1])
                if n is not None and memo is not None and len(rnd.workloads) > before:
                    self._fast[id(pod)] = (pod, rnd.workloads[-1], key, node, rnd.infos[n])
                continue
            if meta.get("deletionTimestamp"):
                continue
            if spec.get("schedulingGates"):
                continue  # not ready for scheduling; the API server says SchedulingGated
            try:
                ask = pod_ask(pod)
            except PodRequestError as exc:
                rnd.refused[key] = f"bad request: {exc}"
                continue
            except Exception as exc:  # a bug must cost this pod, not every pod's round
                log.exception("reading pod %s failed", key)
                rnd.refused[key] = f"fgpu could not read this pod ({type(exc).__name__}: {exc})"
                continue
            if (why := tenancy.refusal(pod, ask, queue_objects)) is not None:
                rnd.refused[key] = why
                continue
            if self.env_without_isolation:
                if not (meta.get("annotations") or {}).get(wire.ENV_CONFIGMAP):
                    rnd.refused[key] = (
                        "not admitted by the fgpu webhook (no fgpu.io/env-configmap "
                        "annotation); create it again once the webhook runs"
                    )
                    continue
            elif ask.request.gpu_count or ask.mig_profile:
                claim, why = claims.pod_claim(pod, snap.claims or {})
                if claim is None:
                    rnd.refused[key] = why
                    if why.startswith("waiting for its ResourceClaim ") and any(
                        e.get("resourceClaimTemplateName") == claims.TEMPLATE
                        for e in spec.get("resourceClaims") or []
                    ):
                        rnd.templates.add(meta.get("namespace", "default"))
                    continue
                rnd.claims[key] = claim
            allowed = self._constraints.allowed(pod)
            try:  # allocatable pods, host ports, volumes' node affinity
                allowed = parity.narrow(pod, allowed, facts, load, full, self._volumes)
            except LookupError as exc:
                rnd.refused[key] = str(exc)
                continue
            if allowed.note:
                rnd.notes[key] = allowed.note
            rnd.workloads.append(
                Workload(
                    id=key,
                    queue=ask.queue,
                    request=ask.request,
                    priority=ask.priority,
                    submitted_at=created_at(pod),
                    preemptible=ask.preemptible,
                    nodes=allowed.nodes,
                    user=meta.get("namespace", "default"),
                )
            )
        # forget what was remembered of objects that are gone
        for stale in self._running_memo.keys() - rnd.pods.keys():
            del self._running_memo[stale]
        for stale in self._granted.keys() - rnd.pods.keys():
            del self._granted[stale]
        for stale in self._requests_memo.keys() - rnd.pods.keys():
            del self._requests_memo[stale]
        for stale in self._claim_memo.keys() - rnd.pods.keys():
            del self._claim_memo[stale]
        for stale in self._said.keys() - rnd.pods.keys():
            del self._said[stale]
        for stale in self._env_missed.keys() - rnd.pods.keys():
            del self._env_missed[stale]
        for gone in self._reasons.keys() - rnd.pods.keys():
            del self._reasons[gone]
        self._suspendish &= rnd.pods.keys()
        if len(self._node_memo) > len(snap.nodes) or len(self._facts_memo) > len(snap.nodes):
            names = {n["metadata"]["name"] for n in snap.nodes}
            for name in self._node_memo.keys() - names:
                del self._node_memo[name]
            for name in self._facts_memo.keys() - names:
                del self._facts_memo[name]
        return rnd

    def _facts(self, obj: Obj) -> NodeFacts:
        """:func:`node_facts`, remembered while the object is the same one."""
        name = obj["metadata"]["name"]
        memo = self._facts_memo.get(name)
        if memo is not None and memo[0] is obj:
            return memo[1]
        facts = node_facts(obj)
        if memo is not None and memo[1] == facts:
            facts = memo[1]  # keep the object: equal tuples of the same objects compare fast
        self._facts_memo[name] = (obj, facts)
        return facts

    def _node(self, obj: Obj) -> NodeInfo | None:
        """:func:`node_info`, remembered while what it reads is unchanged (agents rewrite
        their usage annotation often; the inventory seldom changes)."""
        meta = obj["metadata"]
        memo = self._node_memo.get(meta["name"])
        if memo is not None and memo[2] is obj:
            return memo[1]
        status = obj.get("status") or {}
        sig = (
            (meta.get("annotations") or {}).get(wire.INVENTORY),
            json.dumps(status.get("allocatable"), sort_keys=True),
            bool((obj.get("spec") or {}).get("unschedulable")),
            tuple(
                c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"
            ),
        )
        if memo is not None and memo[0] == sig:
            self._node_memo[meta["name"]] = (sig, memo[1], obj)
            return memo[1]
        try:
            info = node_info(obj)
        except (wire.WireError, PodRequestError, InvalidRequestError) as exc:
            log.warning("node %s: %s", meta["name"], exc)
            info = None
        self._node_memo[meta["name"]] = (sig, info, obj)
        return info

    def _state(self, rnd: Round) -> ClusterState:
        """The cluster with every running pod applied, kept from round to round: only
        pods that changed are released or applied (a full rebuild when the nodes changed
        or anything does not add up). :meth:`check_state` compares it with a rebuild."""
        held = {w.id: w for w in rnd.others + rnd.workloads if w.allocation is not None}
        nodes = tuple(rnd.infos)
        if self._base is None or self._base_nodes != nodes:
            return self._rebuild(rnd, held, nodes)
        state = self._base
        try:
            for key, (w, alloc) in list(self._base_held.items()):
                if held.get(key) is not w:
                    state.release(alloc)
                    del self._base_held[key]
            for key, w in held.items():
                if key not in self._base_held:
                    assert w.allocation is not None
                    try:
                        alloc = apply_running(state, w)
                    except InvalidRequestError as exc:
                        log.warning("pod %s does not fit its node any more: %s", key, exc)
                        continue
                    self._base_held[key] = (w, alloc)
        except InvalidRequestError:
            log.exception("kept state out of step; rebuilding")
            return self._rebuild(rnd, held, nodes)
        return state

    def _rebuild(
        self, rnd: Round, held: dict[str, Workload], nodes: tuple[NodeInfo, ...]
    ) -> ClusterState:
        state = ClusterState([i.node for i in rnd.infos])
        self._base_held = {}
        for key, w in held.items():
            assert w.allocation is not None
            try:
                alloc = apply_running(state, w)
            except InvalidRequestError as exc:
                log.warning("pod %s does not fit its node any more: %s", key, exc)
                continue
            self._base_held[key] = (w, alloc)
        self._base, self._base_nodes = state, nodes
        return state

    def check_state(self, rnd: Round) -> None:
        """Assert that the kept state equals one built from scratch (tests).

        Raises:
            AssertionError: they differ.
        """
        kept = self._state(rnd)
        fresh = state_with(
            [i.node for i in rnd.infos], rnd.others + rnd.workloads, lambda w, e: None
        )
        check_invariants(kept)
        for name in ("cpu_free", "memory_free", "gpu_free_milli", "gpu_free_memory"):
            assert (getattr(kept, name) == getattr(fresh, name)).all(), name

    def _other(self, rnd: Round, key: str, pod: Obj, node: int) -> None:
        try:
            cpu, memory = container_requests(pod)
        except PodRequestError:
            return
        if cpu or memory:
            name = rnd.infos[node].node.name
            alloc = Allocation(node, name, (), (), (), cpu, memory)
            rnd.others.append(Workload(key, "", Request(cpu, memory), allocation=alloc))

    def _running(
        self,
        rnd: Round,
        key: str,
        pod: Obj,
        node: str,
        text: str | None,
        index: Mapping[str, int],
        gpu_at: dict[int, dict[str, int]],
        now: float,
        claim: Obj | None = None,
    ) -> None:
        if node not in index:
            return  # a node fgpu does not manage (or that is gone): nothing to count
        n = index[node]
        at = gpu_at.get(n)
        if at is None:
            at = gpu_at[n] = {u: g for g, u in enumerate(rnd.infos[n].uuids)}
        meta = pod["metadata"]
        uid = meta.get("uid", "")
        from_claim: wire.Assignment | str | None = None
        if claim is not None:  # the pod's fgpu claim (build found it)
            rnd.claims[key] = claim
            from_claim = self._from_claim(key, uid, pod, claim, node, at, rnd.infos[n])
        read: wire.Assignment | None = None
        problem = ""
        if isinstance(from_claim, wire.Assignment):
            read = from_claim  # the claim is the ledger: no user can edit its status
        else:
            try:
                if text is None:
                    raise wire.WireError(wire.ASSIGNMENT, "missing")
                read = wire.Assignment.from_json(text)
            except wire.WireError as exc:
                problem = str(exc) if from_claim is None else f"{from_claim}; {exc}"
        a = self._granted_to(key, uid, read)
        if a is None:
            a = self._from_env(key, uid, pod, node, at)
            if a is not None:
                self._complain(
                    key,
                    f"pod {key} on {node}: {problem}; counting the GPUs its environment "
                    "ConfigMap gives its containers",
                )
        if a is None:
            # bound by fgpu but its assignment is not readable, was never seen and its
            # environment is gone: count its CPU and memory only, and say so (once)
            self._complain(key, f"pod {key} on {node}: {problem}; counting CPU and memory only")
            self._other(rnd, key, pod, n)
            return
        if a.mig is not None:  # a MIG instance (fgpu.k8s.mig): the core counts its CPU
            rnd.mig_held.append((key, a))
            self._other(rnd, key, pod, n)
            return
        try:
            pairs = sorted(
                (at[u], m, mm)
                for u, m, mm in zip(a.uuids, a.gpu_milli, a.gpu_memory_mib, strict=True)
            )
            gpus = tuple(p[0] for p in pairs)
            milli = tuple(p[1] for p in pairs)
            memory = tuple(p[2] for p in pairs)
            request = Request(
                a.cpu_milli,
                a.memory_mib,
                len(gpus),
                milli[0] if milli else None,
                memory[0] if memory else None,
            )
        except KeyError as exc:
            self._complain(
                key,
                f"pod {key} on {node}: GPU {exc.args[0]} is not in the node's inventory any "
                "more; counting CPU and memory only",
            )
            self._other(rnd, key, pod, n)
            return
        except ValueError as exc:  # an assignment fgpu never wrote (edited by hand)
            self._complain(key, f"pod {key} on {node}: {exc}; counting CPU and memory only")
            self._other(rnd, key, pod, n)
            return
        terminating = bool(meta.get("deletionTimestamp")) or self._evicting.get(key) == uid
        protected = self._protected.get(key, 0.0) > now
        squeezed = (meta.get("annotations") or {}).get(wire.SQUEEZED_BY)
        started = created_at(
            {
                "metadata": {
                    "creationTimestamp": (pod.get("status") or {}).get("startTime")
                    or meta.get("creationTimestamp")
                }
            }
        )
        w = Workload(
            id=key,
            queue=a.queue,
            request=request,
            priority=a.priority,
            submitted_at=created_at(pod),
            preemptible=False if protected else a.preemptible,
            allocation=Allocation(n, node, gpus, milli, memory, a.cpu_milli, a.memory_mib),
            started_at=started,
            terminating=terminating,
            squeezed=squeezed is not None,
            squeezed_by=wire.squeezed_by(squeezed),
            user=meta.get("namespace", "default"),
        )
        view = self._suspend_state(rnd, key, uid, meta, w, n)
        if view is not None:
            rnd.workloads.append(view)

    def _suspend_state(
        self, rnd: Round, key: str, uid: str, meta: Obj, w: Workload, n: int
    ) -> Workload | None:
        """:func:`fgpu.k8s.suspending.note_suspend` with this scheduler's memory; a pod in
        any phase but plain running is read afresh every round (not from the memo)."""
        asked = self._suspend_asked.get(key)
        view, suspendish = note_suspend(
            rnd,
            key,
            meta,
            w,
            n,
            asked[1] if asked and asked[0] == uid else None,
            self._copies_counted,
        )
        if suspendish:
            self._suspendish.add(key)
        else:
            self._suspendish.discard(key)
        return view

    def _from_claim(
        self,
        key: str,
        uid: str,
        pod: Obj,
        claim: Obj,
        node: str,
        at: Mapping[str, int],
        info: NodeInfo,
    ) -> wire.Assignment | str:
        """:func:`claims.assignment_from_claim`, remembered while the claim's version and
        the node's view are the same (an allocation does not change once written)."""
        meta = claim["metadata"]
        sig = (uid, meta.get("uid"), meta.get("resourceVersion"), node)
        memo = self._claim_memo.get(key)
        if memo is not None and memo[0] == sig and memo[1] is info:
            return memo[2]
        try:
            asked = self._requests_of(key, uid, pod)
        except PodRequestError as exc:
            return f"pod: {exc}"
        found = claims.assignment_from_claim(claim, asked, node, at)
        self._claim_memo[key] = (sig, info, found)
        return found

    def _requests_of(self, key: str, uid: str, pod: Obj) -> tuple[int, int]:
        """:func:`container_requests`, remembered per pod uid (a pod's spec does not change).

        Raises:
            PodRequestError: a value that is not a quantity.
        """
        memo = self._requests_memo.get(key)
        if memo is not None and memo[0] == uid:
            return memo[1]
        found = container_requests(pod)
        self._requests_memo[key] = (uid, found)
        return found

    def _granted_to(
        self, key: str, uid: str, read: wire.Assignment | None
    ) -> wire.Assignment | None:
        """What a bound pod holds: what fgpu granted it (its bind, or its assignment as
        first seen), whatever its annotation says now. An assignment removed or changed by
        hand after the bind (the webhook refuses that, but the API allows it without the
        webhook) is reported once and ignored while this scheduler runs."""
        granted = self._granted.get(key)
        if granted is not None and granted[0] == uid:
            if read != granted[1]:
                self._complain(
                    key,
                    f"pod {key}: {wire.ASSIGNMENT} was removed or changed after the bind; "
                    "counting what fgpu granted",
                )
            return granted[1]
        if read is not None:
            self._granted[key] = (uid, read)
        return read

    def _from_env(
        self, key: str, uid: str, pod: Obj, node: str, at: Mapping[str, int]
    ) -> wire.Assignment | None:
        """What a bound pod without a readable assignment holds, from the environment
        ConfigMap fgpu wrote for it before the bind (what its containers were given: GPU
        UUIDs, compute milli, memory MiB), when that ConfigMap is there and owned by this
        pod. Read once per pod (then kept as its grant); None when there is none to read or
        it names MIG instances (their profile is not in it)."""
        if self._env_missed.get(key) == uid:
            return None  # looked before: nothing to read
        self._env_missed[key] = uid
        meta = pod["metadata"]
        name = (meta.get("annotations") or {}).get(wire.ENV_CONFIGMAP)
        if not name:
            return None
        try:
            cm = self.api.get_config_map(meta.get("namespace", "default"), name)
            owners = {r.get("uid") for r in cm["metadata"].get("ownerReferences") or []}
            data = cm.get("data") or {}
            uuids = tuple(u for u in str(data.get("CUDA_VISIBLE_DEVICES", "")).split(",") if u)
            milli = int(data["FGPU_GPU_COMPUTE_MILLI"])
            memory = int(data["FGPU_GPU_MEMORY_MIB"])
            cpu, host_memory = container_requests(pod)
        except (KubeError, KeyError, ValueError, PodRequestError) as exc:
            log.debug("pod %s: no environment to read the grant from: %s", key, exc)
            return None
        if uid not in owners or any(u.startswith("MIG-") for u in uuids):
            return None
        try:
            ask = pod_ask(pod)
            queue, priority, preemptible = ask.queue, ask.priority, ask.preemptible
        except PodRequestError:
            queue, priority, preemptible = wire.DEFAULT_QUEUE, 50, None
        granted = wire.Assignment(
            node=node,
            uuids=uuids,
            gpus=tuple(at.get(u, 0) for u in uuids),
            gpu_milli=(milli,) * len(uuids),
            gpu_memory_mib=(memory,) * len(uuids),
            cpu_milli=cpu,
            memory_mib=host_memory,
            queue=queue,
            priority=priority,
            preemptible=preemptible,
        )
        self._granted[key] = (uid, granted)
        del self._env_missed[key]
        return granted

    def _complain(self, key: str, message: str) -> None:
        """Log a warning about a pod once (again only when it changes)."""
        if self._said.get(key) != message:
            self._said[key] = message
            log.warning("%s", message)

    def _holds_from(self, rnd: Round) -> dict[str, Hold]:
        if self._holds is not None:
            return self._holds
        holds: dict[str, Hold] = {}  # a new leader inherits the holds from the pods
        for key, pod in rnd.pods.items():
            text = (pod["metadata"].get("annotations") or {}).get(wire.HOLD)
            if not text or (pod.get("spec") or {}).get("nodeName"):
                continue
            try:
                data = json.loads(text)
                holds[key] = Hold(
                    key,
                    str(data["node"]),
                    tuple(int(g) for g in data["gpus"]),
                    tuple(str(v) for v in data["victims"]),
                    float(data.get("since", 0.0)),
                )
            except (ValueError, KeyError, TypeError):
                log.warning("pod %s: unreadable %s annotation ignored", key, wire.HOLD)
        self._holds = holds
        return holds


__all__ = ["Obj", "Round", "RoundBuilder"]
