"""Who may use which queue and which priority on Kubernetes (DESIGN.md section 5, "Who may
do what": on Kubernetes a queue lists namespaces).

The rules, checked by the validating webhook at admission and again by the scheduler
before it places a pod (a Queue or an annotation may change after admission):

1. **Queue access.** A ``Queue`` with ``spec.namespaces`` admits pods of those namespaces
   only (``*`` in the list: every namespace); without the field, every namespace (as before
   the field existed, and right for one-team clusters). A ``spec.namespaces`` that is not a
   list of names makes the queue broken: no pod may use it (the scheduler leaves it out).
2. **Default queue.** A pod without ``fgpu.io/queue`` gets its namespace's
   ``fgpu.io/default-queue`` annotation (set by whoever manages namespaces), else
   ``default``; the mutating webhook writes it on the pod.
3. **Priority.** The pod's PriorityClass sets its ceiling: ``fgpu.io/priority`` may lower
   the priority fgpu uses, never raise it above the class's value (clamped to fgpu's range
   0..1000), or above ``normal`` (50) for a pod without a class. Kubernetes already
   authorizes PriorityClasses (ResourceQuota ``scopeSelector`` on ``PriorityClass``), so the
   annotation cannot be a way around that.
4. **Non-preemptible work** (priority at or above ``high``, 100, unless
   ``fgpu.io/preemptible: "true"``, or any priority with ``fgpu.io/preemptible: "false"``)
   needs a queue with ``spec.nonPreemptible: true``. Without any Queue object the implicit
   ``default`` queue owns the cluster and allows it (nothing is configured to refuse).

Every refusal is a :class:`fgpu.k8s.objects.PodRequestError` naming the annotation (or
field) and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fgpu.k8s import wire
from fgpu.k8s.objects import PodAsk, PodRequestError, queue_namespaces
from fgpu.rules.requests import MAX_PRIORITY
from fgpu.sched.workload import NON_PREEMPTIBLE_FROM, PRIORITY_CLASSES

Obj = Mapping[str, Any]

DEFAULT_QUEUE_ANNOTATION = "fgpu.io/default-queue"
"""Namespace annotation: the queue of the namespace's pods that name none."""
EVERY_NAMESPACE = "*"


def default_queue(namespace: Obj | None) -> str:
    """The queue a pod of ``namespace`` (its Namespace object, or None) gets when it names
    none: the namespace's :data:`DEFAULT_QUEUE_ANNOTATION`, else ``default``."""
    notes = ((namespace or {}).get("metadata") or {}).get("annotations") or {}
    return str(notes.get(DEFAULT_QUEUE_ANNOTATION) or "").strip() or wire.DEFAULT_QUEUE


def class_ceiling(pod: Obj) -> tuple[int, str]:
    """The highest priority a pod may have in fgpu, and what set it: its PriorityClass's
    value (``spec.priority``, which the API server's Priority admission plugin sets from
    the class, clamped to 0..1000) or, without a class, ``normal``."""
    spec = pod.get("spec") or {}
    name = spec.get("priorityClassName")
    if not name:
        return PRIORITY_CLASSES["normal"], "pods without a PriorityClass get at most normal (50)"
    try:
        value = int(spec.get("priority") or 0)
    except (TypeError, ValueError):
        value = 0
    value = max(0, min(value, MAX_PRIORITY))
    return value, f"its PriorityClass {name} has {value}"


def non_preemptible(ask: PodAsk) -> bool:
    """Whether the pod asks not to be preempted (rule 4 of the module docstring)."""
    if ask.preemptible is not None:
        return not ask.preemptible
    return ask.priority >= NON_PREEMPTIBLE_FROM


def check(pod: Obj, ask: PodAsk, queue: Obj | None, namespace: str | None = None) -> None:
    """Refuse ``pod`` (read as ``ask``) when its namespace may not use its queue, its
    ``fgpu.io/priority`` is above its class, or it is non-preemptible in a queue that does
    not allow that.

    Args:
        pod: the pod object (namespace, ``spec.priorityClassName``, ``spec.priority``).
        ask: :func:`fgpu.k8s.objects.pod_ask` of it.
        queue: the ``Queue`` object the pod names, or None when there is none (a queue
            may be created later: the scheduler says the pod waits for it).
        namespace: the pod's namespace (default: its ``metadata.namespace``; at admission
            the request's namespace, since a pod being created may not carry one yet).

    Raises:
        PodRequestError: naming the annotation and the reason.
    """
    notes = wire.annotations_of(pod)
    if wire.PRIORITY in notes:
        ceiling, why = class_ceiling(pod)
        if ask.priority > ceiling:
            written = str(notes[wire.PRIORITY]).strip()
            shown = written if written == str(ask.priority) else f"{written} ({ask.priority})"
            raise PodRequestError(
                wire.PRIORITY,
                f"{shown} is above what the pod may have: {why}; the annotation may "
                "lower a pod's priority, never raise it (use a higher PriorityClass, which "
                "your cluster administrator grants)",
            )
    if queue is None:
        # no such Queue (yet): the scheduler says the pod waits for it; or, without any
        # Queue object, the implicit default queue, which grants everything
        return
    namespace = namespace or str((pod.get("metadata") or {}).get("namespace") or "default")
    spec = queue.get("spec") or {}
    try:
        allowed = queue_namespaces(spec)
    except PodRequestError as exc:
        raise PodRequestError(
            wire.QUEUE,
            f"queue {ask.queue} is broken, so no pod may use it: its {exc}; ask an "
            "administrator to fix the Queue",
        ) from None
    if allowed is not None and EVERY_NAMESPACE not in allowed and namespace not in allowed:
        shown = ", ".join(str(n) for n in allowed) or "none"
        raise PodRequestError(
            wire.QUEUE,
            f"namespace {namespace} may not use queue {ask.queue} (its spec.namespaces: "
            f"{shown}); name a queue of your namespace, or ask an administrator to add "
            f"{namespace} to the queue",
        )
    if non_preemptible(ask) and not spec.get("nonPreemptible", False):
        field = wire.PREEMPTIBLE if ask.preemptible is False else wire.PRIORITY
        if field == wire.PRIORITY and wire.PRIORITY not in notes:
            field = "spec.priorityClassName"
        raise PodRequestError(
            field,
            f"queue {ask.queue} does not allow non-preemptible work (priority "
            f"{ask.priority}{', fgpu.io/preemptible: false' if ask.preemptible is False else ''}"
            f"; non-preemptible from {NON_PREEMPTIBLE_FROM}); set fgpu.io/preemptible: "
            '"true", use a lower priority, or a queue with spec.nonPreemptible: true',
        )


def refusal(pod: Obj, ask: PodAsk, queues: Mapping[str, Obj]) -> str | None:
    """:func:`check` as a reason the scheduler shows (None: allowed); ``queues`` maps
    names to Queue objects."""
    try:
        check(pod, ask, queues.get(ask.queue))
    except PodRequestError as exc:
        return f"not allowed: {exc}"
    return None
