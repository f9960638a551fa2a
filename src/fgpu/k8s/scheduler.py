"""``fgpu k8s scheduler``: the decision core as a Kubernetes secondary scheduler.

Each round (after a change, debounced, or on a slow tick) turns the cache
(:class:`fgpu.k8s.cache.ClusterCache`) into the core's inputs, calls
:meth:`fgpu.sched.decide.Scheduler.decide`, and acts:

- **Place**: allocate the pod's ResourceClaim (device class ``gpu.fgpu.io``: the GPUs the
  core chose, the share as the driver's opaque configuration, the node selector) and
  reserve it for the pod (:mod:`fgpu.k8s.claims`), then bind through the Binding
  subresource carrying ``fgpu.io/assignment`` and ``fgpu.io/gpu-uuids``: the API server
  writes them with ``spec.nodeName`` in one write. The kubelet then has the node's DRA
  driver prepare exactly that claim. Only with ``env_without_isolation`` (clusters before
  Kubernetes 1.34; trusted single-tenant use) is the pod's environment ConfigMap written
  instead of a claim: that path hands GPUs out by environment variables, which do not
  isolate anything.
  The placement is *assumed* in memory at once, so the next round does not hand out the
  same GPU before the watch brings the bound pod back.
- **Preempt**: ask for the victim's eviction (PodDisruptionBudgets apply). A refused
  eviction voids the preemptor's hold and makes the victim non-preemptible for
  ``protect_s``, so the next round looks for other victims.
- **Wait**: ``PodScheduled=False`` (reason ``Unschedulable``) with the core's reason, and a
  ``FailedScheduling`` event, both only when the reason changed.

Pods that ask for a MIG instance (``fgpu.io/mig-profile``) are placed by the MIG pass after
the core's round (:mod:`fgpu.k8s.mig`), bound the same way (ConfigMap, then Binding).

The ledger is the cluster itself: a bound pod holds what its allocated claim says (or,
without a claim, its ``fgpu.io/assignment``) until it is deleted or finishes; its GPUs are
found by UUID, so an agent restart that renumbers GPUs does not move anybody. Holds
(capacity freed by preemption) are kept on the preemptor as ``fgpu.io/hold`` so that a new
leader inherits them. Only the holder of the
Lease acts (:class:`fgpu.k8s.leader.LeaseElector`).
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fgpu.k8s import claims, tenancy, wire
from fgpu.k8s.cache import ClusterCache, Snapshot
from fgpu.k8s.constraints import ConstraintCache, NodeFacts, node_facts
from fgpu.k8s.kube import KubeApi, KubeError
from fgpu.k8s.leader import LeaseElector
from fgpu.k8s.mig import MigDecision, MigPass
from fgpu.k8s.objects import (
    NodeInfo,
    PodRequestError,
    container_requests,
    created_at,
    node_info,
    pod_ask,
    queue_tree,
)
from fgpu.k8s.resourceapi import ResourceApi
from fgpu.k8s.writes import annotate, env_data, mark_unschedulable, post_event, write_env
from fgpu.model.types import Allocation, InvalidRequestError, Request
from fgpu.plugins import DEFAULT_POLICY, create_policy
from fgpu.sched.decide import Decision, Scheduler, SchedulerConfig
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.rounds import FALLBACK_TARGET, state_with, target_for, target_key
from fgpu.sched.state import CONSTRAINED, ClusterState, check_invariants
from fgpu.sched.workload import Hold, Place, Preempt, Wait, Workload

log = logging.getLogger("fgpu.k8s.scheduler")

Obj = dict[str, Any]
_TERMINAL = ("Succeeded", "Failed")
SETTLE_EVERY_S = 60.0
"""How often the loop runs :meth:`K8sScheduler.settle_memory` (seconds)."""


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


class K8sScheduler:
    """The fgpu secondary scheduler.

    Args:
        api: the Kubernetes API.
        policy: placement policy name (the ``fgd`` family, the default ``fgd-pattern``
            included, learns its target from recent pods).
        config: decision-core knobs.
        elector: leader election (None: act always; only for a single replica and tests).
        clock: wall-clock seconds (pod times are wall-clock).
        protect_s: how long a victim whose eviction a disruption budget refused is kept
            out of victim sets.
        workers: parallel API calls when binding a round's placements.
        env_without_isolation: hand GPUs out through a per-pod environment ConfigMap
            instead of ResourceClaims, for clusters before Kubernetes 1.34. It DOES NOT
            ISOLATE: any pod on the node can name any GPU in its environment. Trusted
            single-tenant use only.
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        policy: str = DEFAULT_POLICY,
        config: SchedulerConfig | None = None,
        elector: LeaseElector | None = None,
        clock: Callable[[], float] = time.time,
        protect_s: float = 60.0,
        workers: int = 8,
        env_without_isolation: bool = False,
    ) -> None:
        create_policy(policy, target=FALLBACK_TARGET)  # a bad name fails here
        self.api = api
        self.policy_name = policy
        self.config = config or SchedulerConfig()
        self.elector = elector
        self.clock = clock
        self.protect_s = protect_s
        self.env_without_isolation = env_without_isolation
        self.resources = ResourceApi(api)
        self._claim_of: dict[str, Obj] = {}  # workload id -> its fgpu claim (last round)
        self.cache = ClusterCache(api, on_change=self._changed)
        self.mig = MigPass(clock)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fgpu-bind")
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._assumed: dict[str, tuple[str, wire.Assignment]] = {}  # id -> (uid, assignment)
        self._evicting: dict[str, str] = {}  # id -> uid
        self._protected: dict[str, float] = {}  # id -> until (clock)
        self._reasons: dict[str, str] = {}
        self._holds: dict[str, Hold] | None = None
        self._target_key: tuple[Request, ...] | None = None
        self._snap_claims: Mapping[str, Obj] = {}
        self._requests_memo: dict[str, tuple[str, tuple[int, int]]] = {}
        self._claim_memo: dict[str, tuple[tuple[Any, ...], NodeInfo, wire.Assignment | str]] = {}
        self._scheduler = self._make(FALLBACK_TARGET)
        self._target: TargetWorkload = FALLBACK_TARGET
        self._node_memo: dict[str, tuple[Any, NodeInfo | None, Obj]] = {}
        self._running_memo: dict[str, tuple[Any, NodeInfo, Workload]] = {}
        self._base: ClusterState | None = None
        self._base_nodes: tuple[NodeInfo, ...] = ()
        self._base_held: dict[str, tuple[Workload, Allocation]] = {}
        self._leading = False
        self._fast: dict[int, tuple[Obj, Workload, str, str, NodeInfo]] = {}
        self._facts_memo: dict[str, tuple[Obj, NodeFacts]] = {}
        self._granted: dict[str, tuple[str, wire.Assignment]] = {}  # id -> (uid, assignment)
        self._said: dict[str, str] = {}  # id -> the last warning logged about it
        self._queue_problems: list[str] = []
        self._env_missed: dict[str, str] = {}  # id -> uid whose environment had no grant
        self._constraints = ConstraintCache()
        self.last: Decision | None = None
        self.bound = 0
        self._settled = time.monotonic()

    def _make(self, target: Any) -> Scheduler:
        import numpy as np

        policy = create_policy(self.policy_name, target=target, rng=np.random.default_rng(0))
        return Scheduler(policy, self.config)

    def _changed(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------------- lifecycle
    def sync(self) -> None:
        """Rebuild the cache from the cluster (what a start does). Raises KubeError."""
        self.cache.sync()

    def settle_memory(self) -> float:
        """Collect garbage, then move every object alive to the collector's permanent
        generation (:func:`gc.freeze`), so that later full collections skip the cache's
        tens of thousands of long-lived objects. Without it a full collection at 1,000 nodes
        and 4,500 pods pauses a round for ~150 ms on a 2-core machine
        (bench/k8s.py). Objects frozen and later dropped are still freed by reference
        counting. Called after the first sync and every :data:`SETTLE_EVERY_S` by the
        loop.

        Returns:
            Seconds it took.
        """
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        self._settled = time.monotonic()
        return time.perf_counter() - started

    def start(self, tick_s: float = 5.0, debounce_s: float = 0.05) -> None:
        """List, then run watches, leader election and rounds in background threads."""
        self.sync()
        self.settle_memory()
        self.cache.start()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, args=(tick_s, debounce_s), name="fgpu-scheduler", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop acting (and give the Lease up)."""
        self._stop.set()
        self._wake.set()
        self.cache.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.elector is not None:
            self.elector.release()

    def _loop(self, tick_s: float, debounce_s: float) -> None:
        renew_every = (self.elector.lease_s / 3) if self.elector else tick_s
        next_renew = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if self.elector is not None and now >= next_renew:
                self.elector.step()
                next_renew = now + renew_every
            self._wake.wait(timeout=min(tick_s, renew_every))
            if self._stop.is_set():
                break
            self._stop.wait(debounce_s)  # a burst becomes one round
            self._wake.clear()
            try:
                self.run_once()
            except Exception:  # keep scheduling; the error is a bug to fix, not to hide
                log.exception("scheduling round failed")
            if time.monotonic() - self._settled >= SETTLE_EVERY_S:
                self.settle_memory()

    def is_leader(self) -> bool:
        """Whether this replica may act now."""
        return self.elector is None or self.elector.is_leader()

    # ----------------------------------------------------------------------- round
    def build(self, snap: Snapshot) -> Round:
        """The core's inputs from a snapshot and this replica's assumed placements and
        evictions. Parsed nodes and running pods are remembered while unchanged (and
        forgotten once gone), so a round parses only what changed."""
        infos: list[NodeInfo] = []
        facts: list[NodeFacts] = []
        unavailable = 0
        self._snap_claims = snap.claims or {}
        for obj in snap.nodes:
            info = self._node(obj)
            if info is not None:
                infos.append(info)
                facts.append(self._facts(obj))
            elif wire.INVENTORY in ((obj.get("metadata") or {}).get("annotations") or {}):
                unavailable += 1  # an fgpu node, cordoned or not Ready (or unreadable)
        infos.sort(key=lambda i: i.node.name)
        self._constraints.nodes(sorted(facts, key=lambda f: f.name))
        rnd = Round(infos, unavailable=unavailable)
        index = {info.node.name: i for i, info in enumerate(infos)}
        gpu_at: dict[int, dict[str, int]] = {}  # node -> uuid -> GPU index, made when needed
        now = self.clock()
        fast = self._fast
        self._fast = {}
        special = self._evicting.keys() | self._protected.keys()
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
                )
                if (
                    n is not None
                    and memo is not None
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
                        alloc = state.allocate(w.request, w.allocation.node, w.allocation.gpus)
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
                alloc = state.allocate(w.request, w.allocation.node, w.allocation.gpus)
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
        started = created_at(
            {
                "metadata": {
                    "creationTimestamp": (pod.get("status") or {}).get("startTime")
                    or meta.get("creationTimestamp")
                }
            }
        )
        rnd.workloads.append(
            Workload(
                id=key,
                queue=a.queue,
                request=request,
                priority=a.priority,
                submitted_at=created_at(pod),
                preemptible=False if protected else a.preemptible,
                allocation=Allocation(n, node, gpus, milli, memory, a.cpu_milli, a.memory_mib),
                started_at=started,
                terminating=terminating,
            )
        )

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

    def plan(self) -> tuple[Round, Decision]:
        """Build a round from the cache and decide, without acting."""
        snap = self.cache.snapshot()
        rnd = self.build(snap)
        mig = self.mig.view(snap.nodes, rnd)  # takes the pending MIG pods out
        state = self._state(rnd)
        capacity = int(state.gpu_milli_capacity.sum()) + mig.capacity_milli
        queues = queue_tree(snap.queues, capacity)
        tree = queues.tree
        rnd.left_out = queues.left_out
        if queues.problems != self._queue_problems:  # said once, again when they change
            self._queue_problems = queues.problems
            for p in queues.problems:
                log.warning("%s", p)
        if self.policy_name.startswith("fgd"):
            requests = target_key(rnd.workloads)
            if requests != self._target_key:
                self._target_key = requests
                target = target_for(requests)
                if target != self._target:  # a new policy only when the target moved
                    self._target = target
                    self._scheduler = self._make(target)
        decision = self._scheduler.decide(
            self.clock(), state, tree, rnd.workloads, self._holds_from(rnd), mig.outside()
        )
        rnd.mig = self.mig.decide(rnd, mig, state, tree, decision)
        return rnd, decision

    def run_once(self) -> Decision | None:
        """One round: decide and act (nothing when this replica is not the leader)."""
        with self._lock:
            if not self.is_leader():
                self._leading = False
                return None
            if not self._leading:  # a new term: take holds and reasons from the cluster
                self._leading = True
                self._holds = None
                self._reasons.clear()
            self._forget_settled()
            rnd, decision = self.plan()
            self.last = decision
            places: list[Place] = []
            for action in decision.actions:
                if isinstance(action, Place):
                    places.append(action)
                elif isinstance(action, Preempt):
                    self._preempt(rnd, action, decision)
                elif isinstance(action, Wait):
                    reason = action.reason
                    note = rnd.notes.get(action.workload)
                    if note and CONSTRAINED in reason:
                        reason = reason.replace(CONSTRAINED, f"{CONSTRAINED} ({note})", 1)
                    self._wait(rnd, action.workload, reason)
            for key, reason in rnd.refused.items():
                self._wait(rnd, key, reason)
            for namespace in sorted(rnd.templates):
                self._ensure_template(namespace)
            if places and self.is_leader():
                results = list(self._pool.map(lambda a: self._place(rnd, a), places))
                self.bound += sum(results)
            if rnd.mig is not None:
                self._act_mig(rnd, rnd.mig)
            self._save_holds(rnd, decision.holds)
            return decision

    def _forget_settled(self) -> None:
        """Drop assumptions the cache now shows (bound, or the pod gone)."""
        snap = {wire.pod_key(p): p for p in self.cache.snapshot().pods}
        for key, (uid, _) in list(self._assumed.items()):
            pod = snap.get(key)
            if pod is None or pod["metadata"].get("uid") != uid or pod["spec"].get("nodeName"):
                del self._assumed[key]
        for key, uid in list(self._evicting.items()):
            pod = snap.get(key)
            if pod is None or pod["metadata"].get("uid") != uid:
                del self._evicting[key]
        now = self.clock()
        for key, until in list(self._protected.items()):
            if until <= now:
                del self._protected[key]

    # -------------------------------------------------------------------- actions
    def _place(self, rnd: Round, action: Place) -> bool:
        pod = rnd.pods[action.workload]
        alloc = action.allocation
        info = rnd.infos[alloc.node]
        uuids = [info.uuids[g] for g in alloc.gpus]
        ask = pod_ask(pod)
        assignment = wire.Assignment(
            node=alloc.node_name,
            uuids=tuple(uuids),
            gpus=alloc.gpus,
            gpu_milli=alloc.gpu_milli,
            gpu_memory_mib=alloc.gpu_memory_mib,
            cpu_milli=alloc.cpu_milli,
            memory_mib=alloc.memory_mib,
            queue=ask.queue,
            priority=ask.priority,
            preemptible=ask.preemptible,
        )
        return self._bind(rnd, action.workload, pod, assignment)

    def _bind(
        self, rnd: Round, key: str, pod: Obj, assignment: wire.Assignment, what: str = "GPUs"
    ) -> bool:
        """Allocate the pod's claim and reserve it for the pod (or, with
        ``env_without_isolation``, write its environment ConfigMap), then bind it with its
        assignment, and assume the placement until the watch shows it."""
        meta = pod["metadata"]
        ns, name, uid = meta.get("namespace", "default"), meta["name"], meta["uid"]
        uuids = list(assignment.uuids)
        try:
            if self.env_without_isolation:
                cm_name = (meta.get("annotations") or {})[wire.ENV_CONFIGMAP]
                data = env_data(
                    key,
                    uuids,
                    assignment.gpu_milli[0] if assignment.gpu_milli else 0,
                    assignment.gpu_memory_mib[0] if assignment.gpu_memory_mib else 0,
                )
                write_env(self.api, ns, cm_name, uid, name, data)
            elif uuids:
                claim = rnd.claims[key]
                if not self.is_leader():
                    return False
                written = claims.allocate(self.resources, claim, pod, assignment)
                self.cache.apply("resourceclaims", "MODIFIED", written)
            if not self.is_leader():
                return False
            self.api.bind(
                ns,
                name,
                uid,
                assignment.node,
                {wire.ASSIGNMENT: assignment.to_json(), wire.GPU_UUIDS: ",".join(uuids)},
            )
        except (KubeError, ValueError) as exc:
            self._complain(key, f"binding {key} to {assignment.node} failed: {exc}")
            return False
        self._assumed[key] = (uid, assignment)
        self._granted[key] = (uid, assignment)
        post_event(
            self.api,
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {key} to {assignment.node}"
            + (f" ({what} {', '.join(uuids)})" if uuids else ""),
        )
        return True

    def _ensure_template(self, namespace: str) -> None:
        """Create fgpu's ResourceClaimTemplate in a namespace whose pods name it."""
        try:
            self.resources.create_claim_template(namespace, claims.template_body())
            log.info("created ResourceClaimTemplate %s/%s", namespace, claims.TEMPLATE)
        except KubeError as exc:
            if exc.reason != "AlreadyExists":
                log.warning("ResourceClaimTemplate in %s not created: %s", namespace, exc)

    def _act_mig(self, rnd: Round, mig: MigDecision) -> None:
        """Carry out the MIG pass: layout requests on nodes, binds, reasons."""
        waits = dict(mig.waits)
        for write in mig.writes:
            if not self.is_leader():
                return
            try:
                node = self.api.patch_node(
                    write.node,
                    {
                        "metadata": {
                            "resourceVersion": write.resource_version,
                            "annotations": {wire.MIG_REQUEST: write.request.to_json()},
                        }
                    },
                )
            except KubeError as exc:  # e.g. 409: the node changed; the next round sees it
                log.info("MIG layout request on %s not written: %s", write.node, exc)
                for key in write.pods:
                    waits[key] = (
                        f"no free MIG instance; asking node {write.node} for a new MIG layout "
                        f"failed ({exc.message or exc.reason}); trying again"
                    )
                continue
            self.cache.apply("nodes", "MODIFIED", node)  # the next round sees it pending
            log.info("MIG layout request on %s: %s", write.node, write.request.to_json())
        if mig.binds and self.is_leader():
            done = list(
                self._pool.map(
                    lambda b: self._bind(rnd, b.key, rnd.pods[b.key], b.assignment, "MIG instance"),
                    mig.binds,
                )
            )
            self.bound += sum(done)
        for key, reason in waits.items():
            self._wait(rnd, key, reason)

    def _preempt(self, rnd: Round, action: Preempt, decision: Decision) -> None:
        victim = rnd.pods.get(action.victim)
        if victim is None:
            return
        meta = victim["metadata"]
        try:
            self.api.evict(meta.get("namespace", "default"), meta["name"], meta["uid"])
        except KubeError as exc:
            if exc.status == 404:
                return
            log.info("eviction of %s refused: %s", action.victim, exc)
            self._protected[action.victim] = self.clock() + self.protect_s
            decision.holds.pop(action.preemptor, None)
            preemptor = rnd.pods.get(action.preemptor)
            if preemptor is not None:
                post_event(
                    self.api,
                    preemptor,
                    "Warning",
                    "PreemptionBlocked",
                    f"could not evict {action.victim}: {exc.message}",
                )
            return
        self._evicting[action.victim] = meta["uid"]
        post_event(self.api, victim, "Normal", "Preempted", action.reason)

    def _wait(self, rnd: Round, key: str, reason: str) -> None:
        if rnd.unavailable and " nodes fit: " in reason:
            n = rnd.unavailable
            reason += (
                f" (and {n} fgpu node{'s' if n > 1 else ''} cordoned, not Ready or with an "
                "unreadable inventory)"
            )
        if reason.startswith("unknown queue ") and rnd.left_out:
            for name, why in rnd.left_out.items():
                if reason == f"unknown queue {name!r}":
                    reason = f"queue {name!r} is left out: {why}"
                    break
        if self._reasons.get(key) == reason:
            return
        pod = rnd.pods.get(key)
        if pod is None:
            return
        current = next(
            (
                c
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled"
            ),
            None,
        )
        self._reasons[key] = reason
        if (
            current is not None
            and current.get("status") == "False"
            and current.get("message") == reason
        ):
            return  # written before (by this replica or another): nothing new to say
        if not mark_unschedulable(self.api, pod, reason):
            return
        post_event(self.api, pod, "Warning", "FailedScheduling", reason)

    def _save_holds(self, rnd: Round, holds: dict[str, Hold]) -> None:
        old = self._holds or {}
        for key, hold in holds.items():
            if old.get(key) != hold and key in rnd.pods:
                text = json.dumps(
                    {
                        "node": hold.node,
                        "gpus": list(hold.gpus),
                        "victims": list(hold.victims),
                        "since": hold.since,
                    }
                )
                annotate(self.api, rnd.pods[key], {wire.HOLD: text})
        for key in old:
            if key not in holds and key in rnd.pods and not rnd.pods[key]["spec"].get("nodeName"):
                annotate(self.api, rnd.pods[key], {wire.HOLD: None})
        self._holds = dict(holds)
