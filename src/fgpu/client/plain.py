"""The workload listing (``GET /v1/workloads``) read without pydantic, for ``fgpu ls``:
loading pydantic and building the wire models takes longer than the rest of the command.

:class:`PlainWorkloadView`, :class:`PlainResourceRequest` and :class:`PlainGpuGrant` have the
fields of :class:`fgpu.wire.WorkloadView`, :class:`fgpu.wire.ResourceRequest` and
:class:`fgpu.wire.GpuGrant`, in their order, with their types and defaults
(``tests/unit/test_client_plain.py`` compares them). :func:`plain_workloads` takes an answer
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
    state: str | None = None
    state_text: str = ""
    preempted_by: str | None = None


T = TypeVar("T")


class _NotPlain(Exception):
    """A value without its field's JSON type: pydantic decides."""


def plain_workloads(data: Any) -> list[PlainWorkloadView]:
    """The answer of ``GET /v1/workloads`` as :class:`PlainWorkloadView` objects.

    Raises:
        ValueError: the answer is not a list of workloads (pydantic's message).
    """
    try:
        if type(data) is not list:
            raise _NotPlain
        return [_build(PlainWorkloadView, item) for item in data]
    except _NotPlain:
        pass
    from pydantic import TypeAdapter

    from fgpu.wire import WorkloadView

    views = TypeAdapter(list[WorkloadView]).validate_python(data)  # raises ValidationError
    return [_build(PlainWorkloadView, view.model_dump()) for view in views]


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
