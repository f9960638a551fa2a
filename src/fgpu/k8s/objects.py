"""Kubernetes objects as the decision core's inputs: pods as requests, nodes as
:class:`fgpu.model.types.Node`, ``Queue`` objects as :class:`fgpu.sched.workload.QueueSpec`.

The rules for what a pod may ask are the CLI's and the API's
(:func:`fgpu.rules.requests.parse_resources`); only the field names differ, and errors
name the annotation (or container field) instead of the flag.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from pydantic import ValidationError

from fgpu.k8s import wire
from fgpu.mig.catalog import MIG_TABLES
from fgpu.model.types import MAX_GPUS, InvalidRequestError, Node, Request
from fgpu.rules.errors import BadRequest
from fgpu.rules.requests import (
    MAX_PRIORITY,
    MIG_COMBINED,
    MIG_NO_MODEL,
    ResourceAsk,
    mig_profile_name,
    parse_resources,
    queue_config,
)
from fgpu.sched.workload import (
    PRIORITY_CLASSES,
    RESOURCES,
    QueueSpec,
    QueueTree,
    Resources,
    parse_priority,
)
from fgpu.wire import QueueBody

Obj = Mapping[str, Any]

QUEUE_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""What a ``Queue`` object may be named (a DNS subdomain, as for any Kubernetes object), so
what ``fgpu.io/queue`` may say."""

_FIELD_TO_ANNOTATION = {
    "gpu": wire.GPU,
    "gpu_fraction": wire.GPU,
    "gpu_milli": wire.GPU,
    "gpu_count": wire.GPU_COUNT,
    "gpu_memory": wire.GPU_MEMORY,
    "gpu_memory_mib": wire.GPU_MEMORY,
    "gpu_model": wire.GPU_MODEL,
    "gpu_models": wire.GPU_MODEL,
    "mig_profile": wire.MIG_PROFILE,
    "priority": wire.PRIORITY,
    "cpu": "spec.containers[].resources.requests.cpu",
    "cpu_milli": "spec.containers[].resources.requests.cpu",
    "memory": "spec.containers[].resources.requests.memory",
    "memory_mib": "spec.containers[].resources.requests.memory",
}


class PodRequestError(ValueError):
    """A pod whose fgpu request breaks a rule: ``field`` is the annotation or pod field,
    ``reason`` the same text the CLI and API give."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True, slots=True)
class PodAsk:
    """What an fgpu pod asks for, checked.

    Attributes:
        request: the core's request (CPU and host memory from the containers' requests).
        priority: numeric priority.
        queue: leaf queue name.
        preemptible: None (default rule), True or False.
        mig_profile: for a MIG pod (``fgpu.io/mig-profile``), the profile in lower case;
            its ``request`` then holds only the containers' CPU and memory (the instance is
            placed by the MIG pass, :mod:`fgpu.k8s.mig`, not by the decision core).
    """

    request: Request
    priority: int
    queue: str
    preemptible: bool | None
    mig_profile: str | None = None


def _shown(value: object) -> str:
    """A value for a message: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(str(value))} characters)"


def _ceil(value: Decimal) -> int:
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def quantity(text: object, field: str) -> Decimal:
    """A Kubernetes quantity (``500m``, ``2``, ``1Gi``, ``1G``, ``1e3``) as a number.

    Raises:
        PodRequestError: not a quantity.
    """
    from kubernetes.utils import parse_quantity

    try:
        value: Decimal = parse_quantity(text)
    except (ValueError, TypeError, InvalidOperation):
        raise PodRequestError(field, f"not a Kubernetes quantity: {_shown(text)}") from None
    return value


def container_requests(pod: Obj) -> tuple[int, int]:
    """``(cpu_milli, memory_mib)`` a pod requests, as the kube-scheduler counts it (the
    effective request, Kubernetes documentation "Effective Pod requests and limits"):

    - while running: the sum over its containers and its restartable init containers
      (sidecars, ``restartPolicy: Always``), which keep running;
    - while initialising: for each init container in order, its request plus those of the
      sidecars listed before it (a sidecar counts with itself);
    - the larger of the two, plus the pod's ``spec.overhead`` (set from its RuntimeClass).

    A container without a request but with a limit requests its limit.

    Raises:
        PodRequestError: a value that is not a quantity.
    """
    spec = pod.get("spec") or {}

    def of(container: Obj) -> tuple[int, int]:
        res = container.get("resources") or {}
        req = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        cpu = req.get("cpu")
        mem = req.get("memory")
        cpu_m = (
            _ceil(quantity(cpu, "spec.containers[].resources.requests.cpu") * 1000) if cpu else 0
        )
        mem_mib = (
            _ceil(quantity(mem, "spec.containers[].resources.requests.memory") / (1 << 20))
            if mem
            else 0
        )
        return cpu_m, mem_mib

    total = [0, 0]
    for c in spec.get("containers") or []:
        cpu, mem = of(c)
        total[0] += cpu
        total[1] += mem
    sidecars = [0, 0]  # of the restartable init containers met so far
    init = [0, 0]
    for c in spec.get("initContainers") or []:
        cpu, mem = of(c)
        if c.get("restartPolicy") == "Always":
            sidecars[0] += cpu
            sidecars[1] += mem
            total[0] += cpu
            total[1] += mem
            at = sidecars
        else:
            at = [cpu + sidecars[0], mem + sidecars[1]]
        init = [max(init[0], at[0]), max(init[1], at[1])]
    overhead = spec.get("overhead") or {}
    extra = of({"resources": {"requests": overhead}}) if overhead else (0, 0)
    return max(total[0], init[0]) + extra[0], max(total[1], init[1]) + extra[1]


def pod_ask(pod: Obj) -> PodAsk:
    """Read and check what a pod asks for (annotations and container requests).

    Raises:
        PodRequestError: naming the annotation or field and the reason, with the CLI's and
            API's wording.
    """
    notes = wire.annotations_of(pod)
    if wire.MIG_PROFILE in notes:
        return _mig_ask(pod, notes)
    gpu = notes.get(wire.GPU)
    count = notes.get(wire.GPU_COUNT)
    fraction: str | None = None
    if count is not None:
        text = count.strip()
        if not (text.isascii() and text.isdigit()) or not text.strip("0"):
            raise PodRequestError(
                wire.GPU_COUNT, f"must be a positive whole number (got {_shown(count)})"
            )
        if len(text.lstrip("0")) > 6 or int(text) > MAX_GPUS:  # int() of any length is slow
            raise PodRequestError(
                wire.GPU_COUNT,
                f"{_shown(count)} is above the largest supported value {MAX_GPUS} "
                "(GPUs of one pod, all on one node)",
            )
        if gpu is not None:
            try:
                below_one = Decimal(gpu.strip()) < 1
            except InvalidOperation:
                below_one = True  # let the shared parser word the error
            if not below_one:
                raise PodRequestError(
                    wire.GPU,
                    f"with {wire.GPU_COUNT}, give the share of each GPU, a fraction below 1 "
                    f"(got {_shown(gpu)})",
                )
            fraction = gpu
        gpu = text
    cpu_milli, memory_mib = container_requests(pod)
    priority_text = _priority_text(pod, notes)
    ask = ResourceAsk(
        gpu=gpu,
        gpu_fraction=fraction,
        gpu_memory=notes.get(wire.GPU_MEMORY),
        gpu_model=(notes[wire.GPU_MODEL],) if wire.GPU_MODEL in notes else (),
        mig_profile=notes.get(wire.MIG_PROFILE),
        priority=priority_text,
    )
    try:
        request, priority = parse_resources(ask)
        request = Request(
            cpu_milli,
            memory_mib,
            request.gpu_count,
            request.gpu_milli,
            request.gpu_memory_mib,
            request.gpu_models,
        )
    except (BadRequest, InvalidRequestError) as exc:
        field = _annotation_for(exc.field, notes)
        raise PodRequestError(field, _echoed(notes.get(field), exc.reason)) from None
    return _finish(notes, request, priority)


def _echoed(value: str | None, reason: str) -> str:
    """``reason`` led by the value the user wrote (``'-0.5': a GPU request must be
    positive``), unless the reason already quotes it or there is no such annotation."""
    if value is None:
        return reason
    shown = _shown(value)
    text = value.strip()
    if shown in reason or (text and (repr(text) in reason or reason.startswith(f"{text} "))):
        return reason
    return f"{shown}: {reason}"


def _annotation_for(field: str, notes: Mapping[str, str]) -> str:
    """The annotation (or pod field) a parser's field name stands for in this pod: a GPU
    count comes from ``fgpu.io/gpu`` unless the pod gave ``fgpu.io/gpu-count``."""
    if field in ("gpu_count", "gpu") and wire.GPU_COUNT not in notes:
        return wire.GPU
    if field == "priority" and wire.PRIORITY not in notes:
        return "spec.priority"
    return _FIELD_TO_ANNOTATION.get(field, field)


def _priority_text(pod: Obj, notes: Mapping[str, str]) -> str:
    """``fgpu.io/priority``, else the PriorityClass's value, else ``normal``.

    Kubernetes priorities range over about -2e9..1e9 (the system classes are 2e9 and
    2e9+1000); fgpu's over 0..:data:`MAX_PRIORITY`. A PriorityClass value below 0 counts as
    0, one above the ceiling as the ceiling (the system classes are non-preemptible either
    way). ``fgpu.io/priority``, when given, wins over the class.
    """
    text = notes.get(wire.PRIORITY)
    if text is not None:
        return text
    spec = pod.get("spec") or {}
    if spec.get("priorityClassName"):
        try:
            value = int(spec.get("priority") or 0)
        except (TypeError, ValueError):
            value = 0
        return str(max(0, min(value, MAX_PRIORITY)))
    return "normal"


def _mig_ask(pod: Obj, notes: Mapping[str, str]) -> PodAsk:
    """:func:`pod_ask` for a pod with ``fgpu.io/mig-profile``: the CLI's rules for
    ``--mig-profile`` (not with ``-g``/``--gpu-memory``/``--gpu-model``), and the profile
    must be one of some model in fgpu's catalog (whether a node has that model is the
    scheduler's question: nodes may join later). The containers' CPU and memory requests
    are kept: on Kubernetes they are the pod's, counted on its node."""
    if any(k in notes for k in (wire.GPU, wire.GPU_COUNT, wire.GPU_MEMORY)):
        raise PodRequestError(wire.MIG_PROFILE, MIG_COMBINED)
    if wire.GPU_MODEL in notes:
        raise PodRequestError(wire.GPU_MODEL, MIG_NO_MODEL)
    try:
        profile = mig_profile_name(notes[wire.MIG_PROFILE])
    except BadRequest as exc:
        raise PodRequestError(wire.MIG_PROFILE, exc.reason) from None
    if not any(t.find(profile) is not None for t in MIG_TABLES.values()):
        valid = "; ".join(f"{m}: {', '.join(t.names())}" for m, t in MIG_TABLES.items())
        raise PodRequestError(
            wire.MIG_PROFILE,
            f"{profile[:40]!r} is not a MIG profile of any GPU model fgpu knows; valid: {valid}",
        )
    cpu_milli, memory_mib = container_requests(pod)
    try:
        priority = parse_priority(_priority_text(pod, notes))
        request = Request(cpu_milli, memory_mib)
    except InvalidRequestError as exc:
        raise PodRequestError(_annotation_for(exc.field, notes), exc.reason) from None
    return _finish(notes, request, priority, profile)


def _finish(
    notes: Mapping[str, str], request: Request, priority: int, mig_profile: str | None = None
) -> PodAsk:
    """The checks every fgpu pod gets: ``fgpu.io/preemptible``, the priority's ceiling and
    ``fgpu.io/queue``."""
    preemptible: bool | None = None
    if wire.PREEMPTIBLE in notes:
        text = notes[wire.PREEMPTIBLE].strip().lower()
        if text not in ("true", "false"):
            raise PodRequestError(wire.PREEMPTIBLE, f"must be true or false (got {_shown(text)})")
        preemptible = text == "true"
    if wire.PRIORITY in notes and priority > MAX_PRIORITY:
        raise PodRequestError(
            wire.PRIORITY, f"{priority} is above {MAX_PRIORITY}; classes go up to critical (125)"
        )
    queue = notes.get(wire.QUEUE, wire.DEFAULT_QUEUE).strip()
    if not queue:
        raise PodRequestError(wire.QUEUE, "must name a queue")
    if len(queue) > 253 or not QUEUE_OBJECT_NAME.fullmatch(queue):
        raise PodRequestError(
            wire.QUEUE,
            f"{queue[:80]!r} cannot name a Queue object (lowercase letters, digits, '-' and "
            "'.', starting and ending with a letter or digit, at most 253 characters)",
        )
    return PodAsk(request, priority, queue, preemptible, mig_profile)


def created_at(obj: Obj) -> float:
    """``metadata.creationTimestamp`` in seconds since the epoch (0 when absent)."""
    text = (obj.get("metadata") or {}).get("creationTimestamp")
    if not text:
        return 0.0
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


# ------------------------------------------------------------------------ nodes
@dataclass(frozen=True, slots=True)
class NodeInfo:
    """An fgpu node: the core's :class:`Node` and the UUIDs of its GPUs by index."""

    node: Node
    uuids: tuple[str, ...]


def node_info(obj: Obj) -> NodeInfo | None:
    """The fgpu view of a Node object, or None when fgpu may not place there (no agent
    inventory, cordoned, or not Ready).

    GPUs of one model only: a node whose agent reports several models is given the model
    of most of its GPUs (the core gives each node one model), the others are left out.
    GPUs in MIG mode are left out too: only MIG pods get their instances (:mod:`fgpu.k8s.mig`).

    Raises:
        WireError: an inventory annotation that is not the agent's JSON.
    """
    meta = obj.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(wire.INVENTORY)
    if text is None:
        return None
    spec = obj.get("spec") or {}
    if spec.get("unschedulable"):
        return None
    status = obj.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            return None
    inventory = wire.Inventory.from_json(text)
    alloc = status.get("allocatable") or {}
    cpu = _ceil(quantity(alloc.get("cpu", "0"), "status.allocatable.cpu") * 1000)
    memory = _ceil(quantity(alloc.get("memory", "0"), "status.allocatable.memory") / (1 << 20))
    by_model: dict[str, list[wire.InventoryGpu]] = {}
    for g in sorted(inventory.gpus, key=lambda g: g.index):
        if g.mig is None:
            by_model.setdefault(g.model, []).append(g)
    if not by_model:
        return NodeInfo(Node(meta["name"], cpu, memory, 0, None, 0), ())
    model, gpus = max(by_model.items(), key=lambda kv: (len(kv[1]), kv[0]))
    node = Node(
        meta["name"],
        cpu,
        memory,
        len(gpus),
        model,
        min(g.memory_mib for g in gpus),
        suspend_host_memory_mib=inventory.suspend_host_memory_mib,
    )
    return NodeInfo(node, tuple(g.uuid for g in gpus))


# ----------------------------------------------------------------------- queues
def queue_namespaces(spec: Obj) -> list[str] | None:
    """A Queue's ``spec.namespaces``: None when absent (every namespace), else the list of
    namespace names (``*`` in it: every namespace).

    Raises:
        PodRequestError: naming ``spec.namespaces`` and echoing a value that is not a list
            of names (a string is not read letter by letter).
    """
    allowed = spec.get("namespaces")
    if allowed is None:
        return None
    if not isinstance(allowed, list) or not all(isinstance(n, str) and n for n in allowed):
        raise PodRequestError(
            "spec.namespaces",
            f"{json.dumps(allowed)} is not a list of namespace names; write a list, e.g. "
            'namespaces: ["team-a"] (["*"]: every namespace)',
        )
    return allowed


def queue_spec(obj: Obj) -> QueueSpec:
    """A ``Queue`` object (``fgpu.io/v1alpha1``) as the core's :class:`QueueSpec`.

    ``spec``: ``quota`` and ``limit`` in GPUs (fractions allowed), ``overQuotaWeight``,
    ``priority`` (number or class name), ``parent``, ``squeeze`` (true, false, or absent
    for the scheduler's setting). Checked as ``fgpu queue create`` checks; ``namespaces``
    as :func:`queue_namespaces` checks.

    Raises:
        PodRequestError: naming ``spec.FIELD`` and the reason.
    """
    name = (obj.get("metadata") or {}).get("name", "")
    spec = obj.get("spec") or {}
    queue_namespaces(spec)
    priority = spec.get("priority", 0)
    if isinstance(priority, str) and priority in PRIORITY_CLASSES:
        priority = PRIORITY_CLASSES[priority]
    try:
        body = QueueBody(
            name=name,
            parent=spec.get("parent"),
            quota=spec.get("quota", 0),
            limit=spec.get("limit"),
            over_quota_weight=spec.get("overQuotaWeight", 1.0),
            priority=priority,
            squeeze=spec.get("squeeze"),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        where = {"over_quota_weight": "overQuotaWeight"}.get(where, where)
        raise PodRequestError(f"spec.{where}", first["msg"]) from None
    try:
        return queue_config(body).to_spec()
    except BadRequest as exc:
        raise PodRequestError(f"spec.{exc.field}", exc.reason) from None
    except InvalidRequestError as exc:
        raise PodRequestError(f"spec.{exc.field}", exc.reason) from None


@dataclass(frozen=True, slots=True)
class Queues:
    """The queue tree built from ``Queue`` objects.

    Attributes:
        tree: the valid queues (with ``default``).
        problems: one line per queue left out, for the log.
        left_out: queue name -> why it is left out (for the reasons of its pods).
    """

    tree: QueueTree
    problems: list[str]
    left_out: dict[str, str]


def queue_tree(objects: Sequence[Obj], capacity_milli: int) -> Queues:
    """The queue tree from ``Queue`` objects, with a ``default`` queue owning the whole
    cluster added when none is defined (as ``fgpu serve`` keeps one).

    A bad object does not take the others down: a queue whose spec is invalid, whose parent
    is missing or left out (a child created before its parent is ordinary), that is in a
    parent cycle, or whose siblings' quotas add up to more than their parent's, is left out
    with its descendants, and the rest is used.
    """
    left_out: dict[str, str] = {}
    specs: dict[str, QueueSpec] = {}
    for obj in objects:
        name = str((obj.get("metadata") or {}).get("name", ""))
        try:
            specs[name] = queue_spec(obj)
        except PodRequestError as exc:
            left_out[name] = str(exc)
    if wire.DEFAULT_QUEUE not in specs:
        specs[wire.DEFAULT_QUEUE] = QueueSpec(
            wire.DEFAULT_QUEUE, quota=Resources(gpu_milli=capacity_milli)
        )

    def drop(name: str, why: str) -> None:
        specs.pop(name, None)
        left_out.setdefault(name, why)

    changed = True
    while changed:  # each pass drops what the last one orphaned
        changed = False
        for name, spec in list(specs.items()):
            parent = spec.parent
            if parent is None:
                continue
            if parent not in specs:
                drop(
                    name,
                    f"its parent queue {parent!r} "
                    + ("is left out" if parent in left_out else "does not exist"),
                )
                changed = True
                continue
            seen = [name]
            while parent is not None and parent in specs and parent not in seen:
                seen.append(parent)
                parent = specs[parent].parent
            if parent == name:
                drop(name, "its parents form a cycle: " + " -> ".join([*seen, name]))
                changed = True
        if changed:
            continue  # orphans first: quotas are checked on a tree whose parents all exist
        children: dict[str, list[str]] = {}
        for name, spec in specs.items():
            if spec.parent is not None:
                children.setdefault(spec.parent, []).append(name)
        for parent, kids in children.items():
            quota = specs[parent].quota.as_tuple()
            for dim, cap in enumerate(quota):
                total = sum(specs[k].quota.as_tuple()[dim] for k in kids)
                if cap and total > cap:
                    for k in kids:
                        drop(
                            k,
                            f"the quotas of {parent}'s children add up to {total}, above its "
                            f"{cap} ({RESOURCES[dim]})",
                        )
                    changed = True
                    break
    problems = [f"queue {name}: left out: {why}" for name, why in sorted(left_out.items())]
    try:
        return Queues(QueueTree(specs.values()), problems, left_out)
    except InvalidRequestError as exc:  # not expected after the checks above
        problems.append(f"queues: {exc}")
        default = QueueSpec(wire.DEFAULT_QUEUE, quota=Resources(gpu_milli=capacity_milli))
        return Queues(QueueTree([default]), problems, left_out)
