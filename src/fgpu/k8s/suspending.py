"""Suspend and restore for ``fgpu k8s scheduler`` (issue 28; rules 9 and 11 of
:mod:`fgpu.sched.decide`): the scheduler's side of :mod:`fgpu.k8s.suspend`.

A pod goes through these phases, read from its annotations (:func:`suspend_phase`) and from
what this scheduler asked and the watch does not show yet:

- **suspending**: the core said :class:`~fgpu.sched.workload.Suspend`; the scheduler wrote
  ``fgpu.io/suspend: "true"`` on the victim (and removed a stale ``fgpu.io/suspended``
  error) and posts an event ``Suspending``. Until the node agent says it is done the pod
  holds its share, as a victim on its way out does (``terminating``), and its host memory is
  charged to its node's suspend budget.
- **suspended**: the agent wrote ``fgpu.io/suspended`` with the pids and the device-to-host
  copy time. The pod stays bound to its node with its ResourceClaim, but holds no share in
  the scheduler's view: the core sees it pending, suspended on that node
  (``Workload.suspended_on``), charging its host memory (its GPU memory plus its host
  memory request, :func:`fgpu.sched.decide.suspend_host_mib`) to the node's budget, and
  restorable only on the GPUs its claim names (``Workload.suspended_gpus``: the driver
  restores onto the GPUs it checkpointed from, and a bound pod cannot change its claim). It
  waits without a ``PodScheduled`` condition (it is bound); a changed reason is an event
  ``WaitingToRestore``.
- **restoring**: the core said :class:`~fgpu.sched.workload.Restore` on those GPUs; the
  scheduler removed ``fgpu.io/suspend`` (event ``Restoring``). The pod holds its share
  again at once (so nothing else is placed on its GPUs) and its budget charge until the
  agent removes ``fgpu.io/suspended`` (writing ``fgpu.io/restored`` with the copy time). An
  agent whose restore fails (its GPU lacks room) keeps it suspended and tries again.
- **failed**: the agent wrote ``fgpu.io/suspended: {"error": ...}`` (no CUDA process, the
  driver refused), or has not answered within :data:`SUSPEND_TIMEOUT_S`: the scheduler
  evicts the pod as it would have without suspend.

The node's budget is what its agent publishes in its inventory
(``suspend.host_memory_mib``, :class:`fgpu.k8s.wire.Inventory`): 0 where the agent cannot
suspend pods (its driver has no checkpoint API, below CUDA 12.8 / driver r570), and the core
then evicts victims there as before. Pods on a node with a budget are ``suspendable``.

``fgpu_gpu_seconds_lost_total{queue, reason}`` counts the copy times the agent reports
(``suspend``, ``restore``: GPUs held times seconds), besides the evictions' lost runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fgpu.k8s import wire
from fgpu.k8s.kube import KubeApi, KubeError
from fgpu.k8s.metrics import SchedulerMetrics
from fgpu.k8s.writes import post_event
from fgpu.model.types import Allocation, Request
from fgpu.sched.decide import Decision, suspend_host_mib
from fgpu.sched.workload import Preempt, Restore, Suspend, Workload

if TYPE_CHECKING:
    from fgpu.k8s.round import Round

log = logging.getLogger("fgpu.k8s.scheduler")

SUSPEND_TIMEOUT_S = 120.0
"""A victim whose node agent has not reported its suspend this long after the scheduler
saw it asked (the agent stopped, or cannot reach the API) is evicted instead, so that its
preemptor does not wait for ever (seconds; a suspend takes the agent's report interval,
10 s by default, plus the device-to-host copy: seconds for tens of GiB)."""

SUSPENDING = "suspending"
SUSPENDED = "suspended"
RESTORING = "restoring"
FAILED = "failed"


def suspend_error(note: str | None) -> str | None:
    """The error of a failed suspend in an ``fgpu.io/suspended`` note, else None (no note,
    or a suspend done). An unreadable note is an error (the pod is evicted, not trusted)."""
    if note is None:
        return None
    try:
        data = json.loads(note)
    except ValueError:
        return f"unreadable {wire.SUSPENDED} annotation {note[:80]!r}"
    if not isinstance(data, dict):
        return f"unreadable {wire.SUSPENDED} annotation {note[:80]!r}"
    if "error" in data:
        return str(data["error"])
    return None


def copy_seconds(note: str | None) -> float:
    """The ``copy_s`` of an ``fgpu.io/suspended`` or ``fgpu.io/restored`` note (0 when
    absent or unreadable)."""
    try:
        data = json.loads(note or "null")
        return max(0.0, float(data["copy_s"]))
    except (ValueError, KeyError, TypeError):
        return 0.0


def suspend_phase(notes: Mapping[str, str], asked: bool | None = None) -> str:
    """A bound pod's suspend phase (module docstring): ``""`` (running as usual),
    :data:`SUSPENDING`, :data:`SUSPENDED`, :data:`RESTORING` or :data:`FAILED`.

    Args:
        notes: the pod's annotations.
        asked: what this scheduler last asked and the annotations do not show yet (True:
            suspend, False: restore), or None.
    """
    shown = notes.get(wire.SUSPEND) == "true"
    note = notes.get(wire.SUSPENDED)
    if asked is not None and asked != shown:  # the watch is behind this scheduler's write
        return SUSPENDING if asked else RESTORING
    if shown:
        if note is None:
            return SUSPENDING
        return FAILED if suspend_error(note) is not None else SUSPENDED
    if note is not None and suspend_error(note) is None:
        return RESTORING
    return ""


def suspended_view(w: Workload, phase: str, *, suspendable: bool) -> tuple[Workload, int]:
    """The core's view of running workload ``w`` of a pod in ``phase``, and the host memory
    (MiB) it charges to its node's suspend budget (0: none).

    A suspended pod's view asks for its GPUs only: its CPU and memory requests stay held on
    its node while it is suspended (the kubelet keeps counting them; the caller counts them
    as another pod's), so its restore needs room on its GPUs only.

    ``suspendable``: its node's agent can suspend pods (a budget above 0)."""
    if not phase:
        return (replace(w, suspendable=True) if suspendable else w), 0
    host = suspend_host_mib(w)
    if phase == SUSPENDED:
        assert w.allocation is not None
        return (
            replace(
                w,
                request=replace(w.request, cpu_milli=0, memory_mib=0),
                allocation=None,
                started_at=None,
                terminating=False,
                squeezed=False,
                squeezed_by=(),
                suspended_on=w.allocation.node_name,
                suspended_host_mib=host,
                suspended_gpus=w.allocation.gpus,
            ),
            host,
        )
    if phase == SUSPENDING:
        return replace(w, terminating=True), host
    if phase == FAILED:
        return replace(w, terminating=True), 0
    return w, host  # restoring: its share again, its charge until the agent is done


def note_suspend(
    rnd: Round,
    key: str,
    meta: Mapping[str, Any],
    w: Workload,
    n: int,
    asked: bool | None,
    counted: Mapping[str, tuple[str, str]],
) -> tuple[Workload | None, bool]:
    """Running workload ``w`` of bound pod ``key`` (metadata ``meta``) on node index ``n``,
    as its suspend phase makes it: its charge on the node's suspend budget, a failed or
    pending suspend, the CPU and memory a suspended pod keeps holding, and the copy times
    not yet ``counted`` are noted in ``rnd``.

    Args:
        asked: what this scheduler asked and the cache does not show yet (see
            :func:`suspend_phase`).
        counted: ``"suspend:<key>"`` / ``"restore:<key>"`` -> (uid, note) already counted.

    Returns:
        ``(view, suspendish)``: the core's view (None for a suspended pod being deleted:
        its charge counts until it is gone, but it is never restored), and whether the pod
        is in any phase but plain running (or has a restore copy time to count).
    """
    notes = meta.get("annotations") or {}
    uid = meta.get("uid", "")
    phase = suspend_phase(notes, asked)
    deleting = bool(meta.get("deletionTimestamp"))
    if deleting and phase == FAILED:
        phase = ""  # on its way out already
    view, charge = suspended_view(
        w, phase, suspendable=rnd.infos[n].node.suspend_host_memory_mib > 0
    )
    alloc = w.allocation
    held = sum(alloc.gpu_milli) if alloc is not None else 0
    suspendish = bool(phase)
    if charge:
        rnd.suspend_charges[n] = rnd.suspend_charges.get(n, 0) + charge
    if phase == SUSPENDING and not deleting:
        rnd.suspending.add(key)
    if phase == FAILED:
        rnd.suspend_failed[key] = suspend_error(notes.get(wire.SUSPENDED)) or "unknown"
    elif phase == SUSPENDED:
        rnd.suspended[key] = view
        if alloc is not None and (alloc.cpu_milli or alloc.memory_mib):
            # its CPU and memory stay held on the node while it is suspended
            kept = Allocation(n, alloc.node_name, (), (), (), alloc.cpu_milli, alloc.memory_mib)
            request = Request(alloc.cpu_milli, alloc.memory_mib)
            rnd.others.append(Workload(f"{key} (suspended)", "", request, allocation=kept))
        note = notes.get(wire.SUSPENDED, "")
        if counted.get(f"suspend:{key}") != (uid, note):
            rnd.copies[key] = ("suspend", note, w.queue, held)
    restored = notes.get(wire.RESTORED)
    if restored and not phase and counted.get(f"restore:{key}") != (uid, restored):
        rnd.copies[key] = ("restore", restored, w.queue, held)
        suspendish = True
    if deleting and phase == SUSPENDED:
        del rnd.suspended[key]
        return None, suspendish
    return view, suspendish


class SuspendActions:
    """Part of :class:`fgpu.k8s.scheduler.K8sScheduler`: acting on the core's Suspend and
    Restore (the attributes below are set by its constructor)."""

    api: KubeApi
    metrics: SchedulerMetrics
    _suspend_asked: dict[str, tuple[str, bool]]  # id -> (uid, True: suspend / False: restore)
    _suspend_kind: dict[str, tuple[str, str]]  # id -> (uid, preemption or reclaim)
    _copies_counted: dict[str, tuple[str, str]]  # id -> (uid, the note counted)
    _suspending_since: dict[str, tuple[str, float]]  # id -> (uid, clock when first seen)
    clock: Callable[[], float]
    _evicting: dict[str, str]
    _reasons: dict[str, str]

    def is_leader(self) -> bool:  # pragma: no cover - RoundActions has the real one
        raise NotImplementedError

    def _preempt(self, rnd: Round, action: Preempt, decision: Decision) -> None:  # pragma: no cover
        raise NotImplementedError

    def _ask(self, pod: Any, notes: Mapping[str, str | None]) -> str | None:
        """Write ``notes`` on ``pod``; None when done, else why not."""
        meta = pod["metadata"]
        try:
            self.api.patch_pod(
                meta.get("namespace", "default"),
                meta["name"],
                {"metadata": {"annotations": dict(notes)}},
            )
        except KubeError as exc:
            return exc.message or exc.reason or str(exc.status)
        return None

    def _suspend(self, rnd: Round, action: Suspend, decision: Decision) -> None:
        """Ask the victim's node agent to suspend it (or evict it where that write fails)."""
        pod = rnd.pods.get(action.victim)
        if pod is None or not self.is_leader():
            return
        uid = pod["metadata"].get("uid", "")
        why = self._ask(pod, {wire.SUSPEND: "true", wire.SUSPENDED: None, wire.RESTORED: None})
        if why is not None:
            log.info("suspend of %s not asked (%s); evicting it", action.victim, why)
            reason = f"{action.reason} (not suspended: {why})"
            self._preempt(
                rnd, Preempt(action.victim, action.preemptor, action.kind, reason), decision
            )
            return
        self._suspend_asked[action.victim] = (uid, True)
        self._suspend_kind[action.victim] = (uid, action.kind)
        self._suspending_since[action.victim] = (uid, self.clock())
        post_event(self.api, pod, "Normal", "Suspending", action.reason)

    def _restore(self, rnd: Round, action: Restore) -> None:
        """Ask the pod's node agent to restore it (only on the GPUs it was suspended from:
        its claim names them)."""
        pod = rnd.pods.get(action.workload)
        if pod is None or not self.is_leader():
            return
        w = rnd.suspended.get(action.workload)
        if w is None or w.suspended_gpus != action.allocation.gpus:
            log.warning(
                "restore of %s on GPUs %s not done: it was suspended from GPUs %s",
                action.workload,
                action.allocation.gpus,
                w.suspended_gpus if w is not None else "(not suspended)",
            )
            return
        why = self._ask(pod, {wire.SUSPEND: None})
        if why is not None:
            log.info("restore of %s not asked (%s); again next round", action.workload, why)
            return
        self._suspend_asked[action.workload] = (pod["metadata"].get("uid", ""), False)
        post_event(self.api, pod, "Normal", "Restoring", action.reason)

    def _suspend_upkeep(self, rnd: Round, decision: Decision) -> None:
        """Evict the pods whose suspend failed or was not done within
        :data:`SUSPEND_TIMEOUT_S`; count the copy times the agents reported."""
        now = self.clock()
        failed = dict(rnd.suspend_failed)
        for key in list(
            self._suspending_since.keys() - rnd.suspending - self._suspend_asked.keys()
        ):
            del self._suspending_since[key]  # suspended, failed, or gone
        for key in rnd.suspending:
            uid = rnd.pods[key]["metadata"].get("uid", "")
            seen = self._suspending_since.get(key)
            if seen is None or seen[0] != uid:
                self._suspending_since[key] = seen = (uid, now)
            if now - seen[1] > SUSPEND_TIMEOUT_S:
                failed[key] = (
                    f"its node agent did not report it suspended within {SUSPEND_TIMEOUT_S:.0f} s"
                )
        for key, error in failed.items():
            pod = rnd.pods[key]
            uid = pod["metadata"].get("uid", "")
            if self._evicting.get(key) == uid or not self.is_leader():
                continue
            kind = self._suspend_kind.get(key, (uid, "preemption"))
            reason = f"its suspend to host memory failed ({error}); evicted instead"
            self._preempt(rnd, Preempt(key, "", kind[1], reason), decision)  # counted once
        for key, (what, note, queue, milli) in rnd.copies.items():
            uid = rnd.pods[key]["metadata"].get("uid", "")
            if self._copies_counted.get(f"{what}:{key}") == (uid, note):
                continue
            self._copies_counted[f"{what}:{key}"] = (uid, note)
            self.metrics.events.lost(queue, what, milli / 1000.0 * copy_seconds(note))

    def _forget_suspends(self, pods: Mapping[str, Any]) -> None:
        """Drop what was asked once the cache shows it (or the pod is gone)."""
        for key, (uid, asked) in list(self._suspend_asked.items()):
            pod = pods.get(key)
            if pod is None or pod["metadata"].get("uid") != uid:
                del self._suspend_asked[key]
                continue
            if (wire.annotations_of(pod).get(wire.SUSPEND) == "true") == asked:
                del self._suspend_asked[key]
        for key, (uid, _) in list(self._suspend_kind.items()):
            pod = pods.get(key)
            if pod is None or pod["metadata"].get("uid") != uid:
                del self._suspend_kind[key]
        for name, (uid, _) in list(self._copies_counted.items()):
            pod = pods.get(name.split(":", 1)[1])
            if pod is None or pod["metadata"].get("uid") != uid:
                del self._copies_counted[name]


__all__ = [
    "FAILED",
    "RESTORING",
    "SUSPENDED",
    "SUSPENDING",
    "SUSPEND_TIMEOUT_S",
    "SuspendActions",
    "copy_seconds",
    "note_suspend",
    "suspend_error",
    "suspend_phase",
    "suspended_view",
]
