"""Writes the API server refuses, told where a user looks: on the pod.

When the scheduler cannot write what a placement needs (the claim's allocation, the
Binding, the environment ConfigMap), the pod stays pending and the scheduler tries again
every round. A refusal that repeats (RBAC missing a permission, Kubernetes 1.36's
``resourceclaims/binding`` rule, a policy) would otherwise show only in the scheduler's
log. :class:`Refusals` makes it visible:

- one Warning Event ``FailedBinding`` on the pod per cause (the written resource, the
  status code and the server's message), its ``count`` and ``lastTimestamp`` raised as
  repeats happen, at most every :data:`SERIES_PATCH_S` (as Kubernetes event series
  coalesce repeats rather than posting new events), with the fix where it is known: a
  missing permission of this component names the manifest that grants it;
- the pod's ``PodScheduled`` condition ``False``, reason ``SchedulerError`` (the
  kube-scheduler's reason for an error after a node was chosen), the same message, so
  ``kubectl describe pod`` shows it and an older reason is replaced;
- the counter ``fgpu_k8s_refused_writes_total{resource, code}`` (every refused write,
  ``resource`` as ``resourceclaims/status``, ``pods/binding``...).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from fgpu.k8s.kube import KubeApi, KubeError
from fgpu.k8s.writes import COMPONENT, now_rfc3339

log = logging.getLogger("fgpu.k8s.scheduler")

Obj = Mapping[str, Any]

SERIES_PATCH_S = 30.0
"""Least seconds between two updates of a refusal event's ``count``."""
REASON = "FailedBinding"
"""The refusal event's reason."""
CONDITION_REASON = "SchedulerError"
"""The ``PodScheduled=False`` reason while a write is refused."""
MANIFEST = "deploy/base/rbac.yaml"
REFUSED = frozenset({400, 401, 403, 422})
"""Status codes that refuse a write for good (an authorization or validation refusal);
others (404, 409, 429, 5xx) pass with the state that caused them and are only counted."""

_NEEDS = re.compile(r'requires resource="([^"]+)", verb="([^"]+)"')
_CANNOT = re.compile(r'cannot (\S+) resource "([^"]+)"')


class WriteRefused(KubeError):
    """A :class:`~fgpu.k8s.kube.KubeError` of a known write: ``verb`` on ``resource``
    (``update`` on ``resourceclaims/status``...)."""

    def __init__(self, exc: KubeError, verb: str, resource: str) -> None:
        super().__init__(exc.status, exc.reason, exc.message)
        self.verb = verb
        self.resource = resource


def writing(verb: str, resource: str, call: Callable[[], Any]) -> Any:
    """``call()``; a :class:`~fgpu.k8s.kube.KubeError` it raises comes out as
    :class:`WriteRefused` naming the write (an inner one already named stays)."""
    try:
        return call()
    except WriteRefused:
        raise
    except KubeError as exc:
        raise WriteRefused(exc, verb, resource) from exc


def fix_for(message: str, component: str = COMPONENT) -> str:
    """The fix for a refusal whose message names a permission this component lacks
    (the RBAC authorizer's ``cannot VERB resource "R"``, or 1.36's ``requires
    resource="R", verb="V"``); ``""`` when the message names none."""
    found = _NEEDS.search(message)
    if found:
        resource, verb = found.group(1), found.group(2)
    elif found := _CANNOT.search(message):
        verb, resource = found.group(1), found.group(2)
    else:
        return ""
    return f"{component} may not {verb} {resource}: apply {MANIFEST} of this version"


@dataclass
class _Told:
    event: str  # the Event's name
    namespace: str
    count: int
    patched_at: float


class Refusals:
    """Tells refused writes on their pods (module docstring).

    Args:
        api: the Kubernetes API.
        registry: where the counter is registered (the scheduler's metrics).
        clock: seconds (the scheduler's clock).
    """

    def __init__(
        self, api: KubeApi, registry: CollectorRegistry, clock: Callable[[], float]
    ) -> None:
        self.api = api
        self.clock = clock
        self.counter = Counter(
            "fgpu_k8s_refused_writes",
            "Writes of the fgpu scheduler the API server refused, by resource and code.",
            ["resource", "code"],
            registry=registry,
        )
        self._told: dict[tuple[str, str], _Told] = {}  # (pod key, cause) -> its event

    def message(self, pod: Obj, exc: WriteRefused) -> str:
        """The event's and the condition's message."""
        meta = pod["metadata"]
        text = (
            f"the API server refused to {exc.verb} {exc.resource} for pod "
            f"{meta.get('namespace', 'default')}/{meta['name']} ({exc.status} {exc.reason}): "
            f"{exc.message}"
        )
        fix = fix_for(exc.message)
        return f"{text}; fix: {fix}" if fix else text

    def refused(self, key: str, pod: Obj, exc: WriteRefused) -> str:
        """Count a refusal; the first of its cause for this pod posts the event and sets the
        condition, later ones raise the event's count.

        Returns:
            The message (what the condition says).
        """
        self.counter.labels(resource=exc.resource, code=str(exc.status)).inc()
        text = self.message(pod, exc)
        cause = hashlib.sha256(f"{exc.resource}\0{exc.status}\0{exc.message}".encode())
        told = self._told.get((key, cause.hexdigest()))
        now = self.clock()
        if told is not None:
            told.count += 1
            if now - told.patched_at >= SERIES_PATCH_S:
                self._raise_count(told)
                told.patched_at = now
            return text
        meta = pod["metadata"]
        ns = meta.get("namespace", "default")
        name = f"{meta['name'][:200]}.fgpu-refused-{cause.hexdigest()[:12]}"  # <= 253
        self._told[(key, cause.hexdigest())] = _Told(name, ns, 1, now)
        log.warning("%s", text)
        self._post(pod, name, text)
        self._condition(pod, text)
        return text

    def keep(self, keys: Iterable[str]) -> None:
        """Forget the refusals of pods not among ``keys`` (gone)."""
        alive = set(keys)
        for told in [k for k in self._told if k[0] not in alive]:
            del self._told[told]

    def settled(self, key: str) -> None:
        """The pod was bound or went: forget its refusals."""
        for told in [k for k in self._told if k[0] == key]:
            del self._told[told]

    def _post(self, pod: Obj, name: str, text: str) -> None:
        meta = pod["metadata"]
        ns = meta.get("namespace", "default")
        now = now_rfc3339()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": ns,
                "uid": meta.get("uid"),
            },
            "reason": REASON,
            "message": text[:1024],
            "type": "Warning",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.api.create_event(ns, body)
        except KubeError as exc:
            if exc.status == 409:  # told before this scheduler started: one more
                self._raise_count(_Told(name, ns, 1, self.clock()), add=True)
                return
            log.info("event on %s: %s", meta["name"], exc)

    def _raise_count(self, told: _Told, add: bool = False) -> None:
        """Raise the event's ``count`` (``add``: an event left by an earlier run, whose count
        this run does not know: only its ``lastTimestamp``)."""
        patch: dict[str, Any] = {"lastTimestamp": now_rfc3339()}
        if not add:
            patch["count"] = told.count
        try:
            self.api.patch_event(told.namespace, told.event, patch)
        except KubeError as exc:
            log.info("event %s/%s: %s", told.namespace, told.event, exc)

    def _condition(self, pod: Obj, text: str) -> None:
        meta = pod["metadata"]
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": CONDITION_REASON,
            "message": text,
            "lastTransitionTime": now_rfc3339(),
        }
        try:
            self.api.patch_pod_status(
                meta.get("namespace", "default"),
                meta["name"],
                {"status": {"conditions": [condition]}},
            )
        except KubeError as exc:
            log.info("condition on %s: %s", meta["name"], exc)


__all__ = [
    "CONDITION_REASON",
    "REASON",
    "REFUSED",
    "SERIES_PATCH_S",
    "Refusals",
    "WriteRefused",
    "fix_for",
    "writing",
]
