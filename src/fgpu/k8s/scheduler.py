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
- **Suspend** and **Restore**: ``fgpu.io/suspend`` written on the victim (its node agent
  checkpoints its CUDA processes to host memory and freezes it; it stays bound, holding its
  node's suspend budget but no share), and removed to restore it on the GPUs its claim
  names (:mod:`fgpu.k8s.suspending`). Where the node's agent cannot suspend (no checkpoint
  API in its driver: its published budget is 0) victims are evicted as above.
- **Wait**: ``PodScheduled=False`` (reason ``Unschedulable``) with the core's reason, and a
  ``FailedScheduling`` event, both only when the reason changed (a suspended pod, which is
  bound, gets an event ``WaitingToRestore`` only).

Pods that ask for a MIG instance (``fgpu.io/mig-profile``) are placed by the MIG pass after
the core's round (:mod:`fgpu.k8s.mig`), bound the same way (ConfigMap, then Binding).

The ledger is the cluster itself: a bound pod holds what its allocated claim says (or,
without a claim, its ``fgpu.io/assignment``) until it is deleted or finishes; its GPUs are
found by UUID, so an agent restart that renumbers GPUs does not move anybody. Holds
(capacity freed by preemption) are kept on the preemptor as ``fgpu.io/hold`` so that a new
leader inherits them. Only the holder of the
Lease acts (:class:`fgpu.k8s.leader.LeaseElector`).

Parts: round building (:mod:`fgpu.k8s.round`), acting on a decision
(:mod:`fgpu.k8s.acting`); this module holds the loop and the round's order of work.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fgpu.k8s import parity, wire
from fgpu.k8s.acting import RoundActions
from fgpu.k8s.cache import RESOURCES, ClusterCache
from fgpu.k8s.constraints import ConstraintCache, NodeFacts
from fgpu.k8s.kube import KubeApi, KubeError, pool_size
from fgpu.k8s.leader import LeaseElector
from fgpu.k8s.metrics import SchedulerMetrics
from fgpu.k8s.mig import MigPass
from fgpu.k8s.objects import NodeInfo, queue_tree
from fgpu.k8s.refusals import Refusals
from fgpu.k8s.resourceapi import ResourceApi
from fgpu.k8s.round import Obj, Round
from fgpu.model.types import Allocation, Request
from fgpu.plugins import DEFAULT_POLICY, create_policy
from fgpu.sched.decide import Decision, Scheduler, SchedulerConfig
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.rounds import FALLBACK_TARGET, target_for, target_key
from fgpu.sched.state import CONSTRAINED, ClusterState
from fgpu.sched.workload import (
    Hold,
    Place,
    Preempt,
    Restore,
    Squeeze,
    Suspend,
    Unsqueeze,
    Wait,
    Workload,
)

log = logging.getLogger("fgpu.k8s.scheduler")

SETTLE_EVERY_S = 60.0
"""How often the loop runs :meth:`K8sScheduler.settle_memory` (seconds)."""
STALL_S = 300.0
"""A scheduling loop that has not begun a pass for this long fails :meth:`K8sScheduler.live`
(seconds; a pass begins at least every tick, 5 s, plus the round before it: a round at a
thousand nodes takes about a second, bench/k8s.py)."""


def connections_needed(workers: int) -> int:
    """API connections a scheduler with ``workers`` bind workers uses at once: one per
    worker, one per open watch (:data:`fgpu.k8s.cache.RESOURCES`), one for the Lease's
    renewal thread and one for the round's own calls (status, events, evictions)."""
    return workers + len(RESOURCES) + 2


class K8sScheduler(RoundActions):
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
        have, need = pool_size(api), connections_needed(workers)
        if have < need:
            log.warning(
                "the API client keeps %d connections open, fewer than the %d this scheduler "
                "uses at once (%d bind workers, %d watches, the lease and the round): "
                "make it with api_client(pool_size=%d)",
                have,
                need,
                workers,
                len(RESOURCES),
                need,
            )
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease_thread: threading.Thread | None = None
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
        self._suspend_asked: dict[str, tuple[str, bool]] = {}  # fgpu.k8s.suspending
        self._suspend_kind: dict[str, tuple[str, str]] = {}
        self._copies_counted: dict[str, tuple[str, str]] = {}
        self._suspendish: set[str] = set()
        self._suspending_since: dict[str, tuple[str, float]] = {}
        self._constraints = ConstraintCache()
        self._volumes = parity.VolumeLookup(api)
        self._load_counter = parity.LoadCounter()
        self.last: Decision | None = None
        self.bound = 0
        self.metrics = SchedulerMetrics()
        self.refusals = Refusals(api, self.metrics.registry, self.clock)
        self._templates: dict[str, float] = {}  # namespace -> when its template was seen
        self._settled = time.monotonic()
        self._synced = threading.Event()
        self._sync_error = ""
        self._beat = time.monotonic()  # when the loop last began a pass

    def _make(self, target: Any) -> Scheduler:
        import numpy as np

        policy = create_policy(self.policy_name, target=target, rng=np.random.default_rng(0))
        return Scheduler(policy, self.config)

    def _changed(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------------- lifecycle
    def sync(self) -> None:
        """Rebuild the cache from the cluster (what a start does). Raises KubeError."""
        try:
            self.cache.sync()
        except KubeError as exc:
            self._sync_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise
        self._synced.set()

    def sync_until_done(self, stop: threading.Event, retry_s: float = 5.0) -> bool:
        """List the cluster (:meth:`sync`), again every ``retry_s`` while that fails (an API
        server not reachable yet), as client-go's informers wait for their first sync; each
        failure is logged. Not :meth:`ready` meanwhile.

        Returns:
            True once synced; False when ``stop`` was set first.
        """
        while not stop.is_set():
            try:
                self.sync()
                return True
            except KubeError as exc:
                log.warning("listing the cluster failed (%s); again in %.0f s", exc, retry_s)
                stop.wait(retry_s)
        return False

    def live(self) -> tuple[bool, str]:
        """The liveness probe: False only when the scheduling loop died or has not begun a
        pass for :data:`STALL_S` (a stuck round; a restart hands the Lease over), or the
        Lease's renewal thread died. Live while the first list is still being retried."""
        thread = self._thread
        if thread is None:
            return True, "starting: listing the cluster"
        if not thread.is_alive():
            return (True, "stopped") if self._stop.is_set() else (False, "the loop ended")
        lease = self._lease_thread
        if lease is not None and not lease.is_alive() and not self._stop.is_set():
            return False, "the lease renewal thread ended"
        quiet = time.monotonic() - self._beat
        if quiet > STALL_S:
            return False, f"no scheduling pass began for {quiet:.0f} s (limit {STALL_S:.0f})"
        return True, f"a pass began {quiet:.0f} s ago"

    def ready(self) -> tuple[bool, str]:
        """The readiness probe: True once the cache listed every resource, and while every
        watch works (a failed one is listed again: not ready until that succeeds) and the
        Lease can be read (tried every few seconds, it finds an API server gone sooner than
        a watch, which waits for its read timeout).

        A standby replica is ready too: its cache is as current as the leader's, so it can
        take over within a Lease; no Service sends the scheduler traffic, and only the
        leader's series show the fleet (:class:`~fgpu.k8s.metrics.SchedulerMetrics`)."""
        if not self._synced.is_set():
            why = f": {self._sync_error}" if self._sync_error else ""
            return False, f"the first list of the cluster has not succeeded yet{why}"
        problems = [f"watch of {r} failing: {e}" for r, e in sorted(self.cache.failing().items())]
        if self.elector is not None and self.elector.last_error:  # found every retry_s
            problems.append(f"the Lease cannot be read: {self.elector.last_error}")
        if problems:
            return False, "; ".join(problems)
        role = "leader" if self.is_leader() else "standby"
        return True, f"caches synced; {role}"

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
        """List (unless :meth:`sync_until_done` did), then run watches, leader election
        and rounds in background threads."""
        if not self._synced.is_set():
            self.sync()
        self.settle_memory()
        self.cache.start()
        self._stop.clear()
        if self.elector is not None:  # renewal apart from rounds (fgpu.k8s.leader)
            self._lease_thread = threading.Thread(
                target=self.elector.run,
                args=(self._stop, self._wake.set),  # a new leader decides at once
                name="fgpu-lease",
                daemon=True,
            )
            self._lease_thread.start()
        self._thread = threading.Thread(
            target=self._loop, args=(tick_s, debounce_s), name="fgpu-scheduler", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop acting (and give the Lease up).

        Raises:
            KubeError: the Lease could not be given up (it runs out after its duration).
        """
        self._stop.set()
        self._wake.set()
        self.cache.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._lease_thread is not None:
            self._lease_thread.join(timeout=30)
        if self.elector is not None:
            self.elector.release()

    def _loop(self, tick_s: float, debounce_s: float) -> None:
        while not self._stop.is_set():
            self._beat = time.monotonic()
            self._wake.wait(timeout=tick_s)
            if self._stop.is_set():
                break
            self._beat = time.monotonic()
            self._stop.wait(debounce_s)  # a burst becomes one round
            self._wake.clear()
            try:
                with self.metrics.events.round_seconds.time():
                    self.run_once()
            except Exception:  # keep scheduling; the error is a bug to fix, not to hide
                log.exception("scheduling round failed")
            if time.monotonic() - self._settled >= SETTLE_EVERY_S:
                self.settle_memory()

    def plan(self) -> tuple[Round, Decision]:
        """Build a round from the cache and decide, without acting."""
        snap = self.cache.snapshot()
        rnd = self.build(snap)
        mig = self.mig.view(snap.nodes, rnd)  # takes the pending MIG pods out
        state = self._state(rnd)
        state.suspend_free[:] = state.suspend_capacity  # the budgets less what pods hold
        for n, charge in rnd.suspend_charges.items():
            state.suspend_free[n] = max(0, int(state.suspend_capacity[n]) - charge)
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
        self.metrics.observe_round(rnd, decision, tree, self._target, state)
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
                    self.metrics.events.preempted(action.kind)
                elif isinstance(action, Suspend):
                    self._suspend(rnd, action, decision)
                    self.metrics.events.preempted(action.kind)
                elif isinstance(action, Restore):
                    self._restore(rnd, action)
                elif isinstance(action, Squeeze | Unsqueeze):
                    self._squeeze(rnd, action)
                elif isinstance(action, Wait):
                    reason = action.reason
                    note = rnd.notes.get(action.workload)
                    if note and CONSTRAINED in reason:
                        reason = reason.replace(CONSTRAINED, f"{CONSTRAINED} ({note})", 1)
                    pod = rnd.pods.get(action.workload)
                    if pod is not None and "insufficient " in reason:
                        sizing = parity.requests_note(pod)
                        reason += f" ({sizing})" if sizing else ""
                    self._wait(rnd, action.workload, reason)
            for key, reason in rnd.refused.items():
                self._wait(rnd, key, reason)
            self._suspend_upkeep(rnd, decision)
            for namespace in sorted(rnd.templates):
                self._ensure_template(namespace)
            if places and rnd.load is not None:  # the round's placements against each other
                tally, admitted = parity.RoundTally(rnd.load), []
                for place in places:
                    why = tally.admit(rnd.pods[place.workload], place.allocation.node_name)
                    if why is None:
                        admitted.append(place)
                    else:
                        self._wait(rnd, place.workload, why)
                places = admitted
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
        self.refusals.keep(snap.keys())
        for key, (uid, _) in list(self._assumed.items()):
            pod = snap.get(key)
            if pod is None or pod["metadata"].get("uid") != uid or pod["spec"].get("nodeName"):
                del self._assumed[key]
        for key, uid in list(self._evicting.items()):
            pod = snap.get(key)
            if pod is None or pod["metadata"].get("uid") != uid:
                del self._evicting[key]
        self._forget_suspends(snap)
        now = self.clock()
        for key, until in list(self._protected.items()):
            if until <= now:
                del self._protected[key]


__all__ = ["K8sScheduler", "Round"]
