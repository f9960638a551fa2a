"""Acting on a round's decision for ``fgpu k8s scheduler`` (:class:`RoundActions`, a base of
:class:`fgpu.k8s.scheduler.K8sScheduler`): binding placements (claim, then Binding),
evictions for preemption, ``PodScheduled=False`` with the reason for waiting pods, the MIG
pass's bindings, and the holds kept on the preemptors. Writes check that this replica still
leads.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor

from fgpu.k8s import claims, wire
from fgpu.k8s.cache import ClusterCache
from fgpu.k8s.kube import KubeError
from fgpu.k8s.leader import LeaseElector
from fgpu.k8s.metrics import SchedulerMetrics
from fgpu.k8s.mig import MigDecision
from fgpu.k8s.objects import created_at, pod_ask
from fgpu.k8s.refusals import REFUSED, Refusals, WriteRefused, writing
from fgpu.k8s.resourceapi import ResourceApi
from fgpu.k8s.round import Obj, Round, RoundBuilder
from fgpu.k8s.suspending import SuspendActions
from fgpu.k8s.writes import annotate, env_data, mark_unschedulable, post_event, write_env
from fgpu.sched.decide import Decision
from fgpu.sched.workload import Hold, Place, Preempt, Squeeze, Unsqueeze

log = logging.getLogger("fgpu.k8s.scheduler")

TEMPLATE_RECHECK_S = 60.0
"""Seconds before a namespace's ResourceClaimTemplate, once seen, is read again while pods
there wait for it."""


class RoundActions(SuspendActions, RoundBuilder):
    """Part of :class:`fgpu.k8s.scheduler.K8sScheduler`: acting on a decision (the
    attributes below are set by its constructor)."""

    elector: LeaseElector | None
    resources: ResourceApi
    cache: ClusterCache
    protect_s: float
    bound: int
    metrics: SchedulerMetrics
    refusals: Refusals
    _templates: dict[str, float]
    _pool: ThreadPoolExecutor

    def is_leader(self) -> bool:
        """Whether this replica may act now."""
        return self.elector is None or self.elector.is_leader()

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
        bound = self._bind(rnd, action.workload, pod, assignment)
        if bound:
            self.metrics.events.started(ask.queue, ask.priority, self.clock() - created_at(pod))
        return bound

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
                writing(
                    "create",
                    "configmaps",
                    lambda: write_env(self.api, ns, cm_name, uid, name, data),
                )
            elif uuids:
                claim = rnd.claims[key]
                if not self.is_leader():
                    return False
                written = claims.allocate(self.resources, claim, pod, assignment)
                self.cache.apply("resourceclaims", "MODIFIED", written)
            if not self.is_leader():
                return False
            notes = {wire.ASSIGNMENT: assignment.to_json(), wire.GPU_UUIDS: ",".join(uuids)}
            writing(
                "create",
                "pods/binding",
                lambda: self.api.bind(ns, name, uid, assignment.node, notes),
            )
        except WriteRefused as exc:
            self._complain(key, f"binding {key} to {assignment.node} failed: {exc}")
            if exc.status in REFUSED:
                self._reasons[key] = self.refusals.refused(key, pod, exc)
            else:
                self.refusals.counter.labels(resource=exc.resource, code=str(exc.status)).inc()
            return False
        except (KubeError, ValueError) as exc:
            self._complain(key, f"binding {key} to {assignment.node} failed: {exc}")
            return False
        self.refusals.settled(key)
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
        """Make fgpu's ResourceClaimTemplate in a namespace whose pods name it: read it
        first, create it only when missing (once; read again after
        :data:`TEMPLATE_RECHECK_S` while pods there still wait for it, in case it was
        deleted)."""
        now = self.clock()
        if now - self._templates.get(namespace, -TEMPLATE_RECHECK_S) < TEMPLATE_RECHECK_S:
            return
        try:
            self.resources.get_claim_template(namespace, claims.TEMPLATE)
            self._templates[namespace] = now
            return
        except KubeError as exc:
            if exc.status != 404:
                log.warning("ResourceClaimTemplate in %s not read: %s", namespace, exc)
                return
        try:
            self.resources.create_claim_template(namespace, claims.template_body())
            log.info("created ResourceClaimTemplate %s/%s", namespace, claims.TEMPLATE)
        except KubeError as exc:
            if exc.reason != "AlreadyExists":
                log.warning("ResourceClaimTemplate in %s not created: %s", namespace, exc)
                return
        self._templates[namespace] = now

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

    def _squeeze(self, rnd: Round, action: Squeeze | Unsqueeze) -> None:
        """Record a squeeze (or its release) on the pod: the :data:`wire.SQUEEZED_BY`
        annotation, which the next rounds read, and an event. The pod keeps running; its
        node's governor pauses it while a higher-priority pod on its GPU is busy."""
        pod = rnd.pods.get(action.workload)
        if pod is None or not self.is_leader():
            return
        if isinstance(action, Squeeze):
            annotate(self.api, pod, {wire.SQUEEZED_BY: ",".join(action.by)})
            post_event(self.api, pod, "Normal", "Squeezed", action.reason)
        else:
            annotate(self.api, pod, {wire.SQUEEZED_BY: None})
            post_event(self.api, pod, "Normal", "Released", action.reason)

    def _preempt(self, rnd: Round, action: Preempt, decision: Decision) -> None:
        victim = rnd.pods.get(action.victim)
        if victim is None or not self.is_leader():
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
        lost = next((w for w in rnd.workloads if w.id == action.victim), None)
        if lost is not None and lost.allocation is not None and lost.started_at is not None:
            gpus = sum(lost.allocation.gpu_milli) / 1000.0
            self.metrics.events.lost(
                lost.queue, action.kind, gpus * max(0.0, self.clock() - lost.started_at)
            )

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
        if pod is None or not self.is_leader():
            return
        if key in rnd.suspended:  # bound: no PodScheduled=False, an event when it changes
            self._reasons[key] = reason
            post_event(self.api, pod, "Normal", "WaitingToRestore", reason)
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


__all__ = ["RoundActions"]
