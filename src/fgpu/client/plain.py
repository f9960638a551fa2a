"""The answers the everyday commands read (``ls``, ``submit``, ``describe``, ``logs``,
``cancel``, ``top``), read without pydantic: loading pydantic and building the wire models
takes longer than the rest of such a command.

Each ``Plain*`` class has the fields of the wire model of the same name in :mod:`fgpu.wire`
(:data:`WIRE_NAMES`), in their order, with their types and defaults
(``tests/unit/test_client_plain.py`` compares them). :func:`plain_of` (and
:func:`plain_workloads`) take an answer
as it is when every value already has its field's JSON type, which is what pydantic would
return unchanged; anything else (a missing field, ``"1"`` for a number) goes to pydantic,
whose conversions and errors therefore stay the rule.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from types import NoneType, UnionType
from typing import Any, TypeVar


@dataclass(frozen=True)
class PlainResourceRequest:
    """:class:`fgpu.wire.ResourceRequest`: a request in integer units."""

    gpu_count: int
    gpu_milli: int | None
    gpu_memory_mib: int | None
    gpu_models: list[str]
    cpu_milli: int
    memory_mib: int
    isolation: str = "share"
    mig_profile: str | None = None


@dataclass(frozen=True)
class PlainGpuGrant:
    """:class:`fgpu.wire.GpuGrant`: one GPU (or MIG instance) a workload holds."""

    node: str
    index: int
    uuid: str
    compute_milli: int
    memory_mib: int
    mig_profile: str | None = None
    mig_start: int | None = None
    mig_uuid: str | None = None


@dataclass(frozen=True)
class PlainArrayTaskView:
    """:class:`fgpu.wire.ArrayTaskView`: the array a workload is a task of."""

    id: str
    name: str
    index: int
    size: int
    throttle: int | None = None


@dataclass(frozen=True)
class PlainWorkloadView:
    """:class:`fgpu.wire.WorkloadView`: a workload as listed."""

    id: str
    name: str
    owner_uid: int
    phase: str
    queue: str
    priority: int
    preemptible: bool
    request: PlainResourceRequest
    gpus: list[PlainGpuGrant]
    command: list[str]
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    exit_code: int | None
    reason: str
    restarts: int
    stopping: bool = False
    squeezed: bool = False
    squeezed_by: list[str] = field(default_factory=list)
    gpu_state: str | None = None
    suspended_host_mib: int | None = None
    time_limit_s: float | None = None
    dependency: list[str] = field(default_factory=list)
    array: PlainArrayTaskView | None = None
    cancelled_tasks: list[str] = field(default_factory=list)
    state: str | None = None
    state_text: str = ""
    preempted_by: str | None = None


@dataclass(frozen=True)
class PlainEventView:
    """:class:`fgpu.wire.EventView`: something that happened, with its reason."""

    id: int
    workload_id: str | None
    time: float
    kind: str
    reason: str
    message: str
    count: int = 1
    last_time: float | None = None


@dataclass(frozen=True, kw_only=True)
class PlainWorkloadDetail(PlainWorkloadView):
    """:class:`fgpu.wire.WorkloadDetail`: the workload plus its events."""

    events: list[PlainEventView]
    enforcement: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PlainGpuHolder:
    """:class:`fgpu.wire.GpuHolder`: a workload's share of one GPU."""

    workload_id: str
    name: str
    compute_milli: int
    memory_mib: int
    mode: str | None = None
    state: str | None = None
    owner_uid: int | None = None
    busy: bool | None = None
    achieved_milli: int | None = None
    enforcement: str | None = None
    used_memory_mib: int | None = None
    squeezed_by: list[str] | None = None


@dataclass(frozen=True)
class PlainMigInstanceView:
    """:class:`fgpu.wire.MigInstanceView`: one MIG instance and the workload on it."""

    profile: str
    start: int
    uuid: str
    compute_milli: int
    memory_mib: int
    workload_id: str | None = None
    name: str | None = None
    in_use_outside: bool = False


@dataclass(frozen=True)
class PlainEnforcementLayer:
    """:class:`fgpu.wire.EnforcementLayer`: one enforcement mechanism and why."""

    name: str
    active: bool
    why: str


@dataclass(frozen=True)
class PlainGpuView:
    """:class:`fgpu.wire.GpuView`: one GPU and what it holds."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    allocated_milli: int
    allocated_memory_mib: int
    holders: list[PlainGpuHolder]
    used_memory_mib: int | None = None
    utilization_pct: int | None = None
    mig_enabled: bool = False
    mig_instances: list[PlainMigInstanceView] = field(default_factory=list)
    enforcement: list[PlainEnforcementLayer] = field(default_factory=list)


@dataclass(frozen=True)
class PlainNodeView:
    """:class:`fgpu.wire.NodeView`: a node and its GPUs."""

    name: str
    backend: str
    cpu_milli: int
    memory_mib: int
    gpus: list[PlainGpuView]
    host_limits: list[PlainEnforcementLayer] = field(default_factory=list)


WIRE_NAMES: dict[type, str] = {
    PlainResourceRequest: "ResourceRequest",
    PlainGpuGrant: "GpuGrant",
    PlainArrayTaskView: "ArrayTaskView",
    PlainWorkloadView: "WorkloadView",
    PlainEventView: "EventView",
    PlainWorkloadDetail: "WorkloadDetail",
    PlainGpuHolder: "GpuHolder",
    PlainMigInstanceView: "MigInstanceView",
    PlainEnforcementLayer: "EnforcementLayer",
    PlainGpuView: "GpuView",
    PlainNodeView: "NodeView",
}
"""Each plain class and the name of its wire model in :mod:`fgpu.wire`."""

T = TypeVar("T")


class _NotPlain(Exception):
    """A value without its field's JSON type: pydantic decides."""


def plain_workloads(data: Any) -> list[PlainWorkloadView]:
    """The answer of ``GET /v1/workloads`` as :class:`PlainWorkloadView` objects.

    Raises:
        ValueError: the answer is not a list of workloads (pydantic's message).
    """
    return plain_list(PlainWorkloadView, data)


def plain_of(kind: type[T], data: Any) -> T:
    """One answer (a JSON object) as the plain class ``kind``: as it is when every value
    has its field's JSON type, else through the wire model (pydantic's conversions).

    Raises:
        ValueError: the answer is not such an object (pydantic's message).
    """
    try:
        return _build(kind, data)
    except _NotPlain:
        pass
    import fgpu.wire as wire

    model = getattr(wire, WIRE_NAMES[kind])
    view = model.model_validate(data)  # raises ValidationError (a ValueError)
    return _build(kind, view.model_dump())


def plain_list(kind: type[T], data: Any) -> list[T]:
    """:func:`plain_of` for an answer that is a JSON array of such objects.

    Raises:
        ValueError: the answer is not such an array (pydantic's message).
    """
    try:
        if type(data) is not list:
            raise _NotPlain
        return [_build(kind, item) for item in data]
    except _NotPlain:
        pass
    from pydantic import TypeAdapter

    import fgpu.wire as wire

    model = getattr(wire, WIRE_NAMES[kind])
    views: list[Any] = TypeAdapter(list[model]).validate_python(data)  # type: ignore[valid-type]
    return [_build(kind, view.model_dump()) for view in views]


_HINTS: dict[type, dict[str, Any]] = {}


def _build(kind: type[T], data: Any) -> T:
    """``kind`` (one of the dataclasses above) from a JSON object whose values all have
    their fields' types; extra keys are ignored, as pydantic ignores them."""
    if type(data) is not dict:
        raise _NotPlain
    hints = _HINTS.get(kind)
    if hints is None:
        hints = _HINTS[kind] = typing.get_type_hints(kind)
    values: dict[str, Any] = {}
    for item in dataclasses.fields(kind):  # type: ignore[arg-type]
        if item.name in data:
            values[item.name] = _value(hints[item.name], data[item.name])
        elif item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
            raise _NotPlain
    return kind(**values)


def _value(kind: Any, value: Any) -> Any:
    """``value`` as a ``kind`` field holds it, when it is already that JSON type."""
    if isinstance(kind, UnionType):  # X | None
        if value is None and NoneType in kind.__args__:
            return None
        (kind,) = [k for k in kind.__args__ if k is not NoneType]
    if kind is float and type(value) in (int, float):
        return float(value)  # pydantic's float of an int
    if kind in (int, str, bool) and type(value) is kind:
        return value
    if typing.get_origin(kind) is list and type(value) is list:
        (item,) = typing.get_args(kind)
        return [_value(item, element) for element in value]
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _build(kind, value)
    raise _NotPlain
