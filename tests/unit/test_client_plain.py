"""The workload listing without pydantic (:mod:`fgpu.client.plain`, ``fgpu ls``): the same
fields as the wire models, the same values for every answer, pydantic's rule (its
conversions and its errors) for answers that are not plainly typed; and the table rendered
from either reads the same."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from rich.console import Console

from fgpu import wire
from fgpu.cli import render
from fgpu.client.plain import (
    WIRE_NAMES,
    PlainNodeView,
    PlainWorkloadDetail,
    plain_list,
    plain_of,
    plain_workloads,
)
from fgpu.wire import (
    EnforcementLayer,
    EventView,
    GpuGrant,
    GpuHolder,
    GpuView,
    MigInstanceView,
    NodeView,
    WorkloadDetail,
    WorkloadView,
)
from tests.builders import workload_view

PAIRS: list[tuple[type[Any], type[BaseModel]]] = [
    (plain, getattr(wire, name)) for plain, name in WIRE_NAMES.items()
]
WIRE = {plain: wire for plain, wire in PAIRS}


def as_wire(kind: Any) -> Any:
    """A plain class's annotation with the wire model in place of each plain class."""
    if kind in WIRE:
        return WIRE[kind]
    args = typing.get_args(kind)
    if not args:
        return kind
    origin = typing.get_origin(kind)
    if origin is list:
        return list[as_wire(args[0])]  # type: ignore[misc]
    return typing.Union[tuple(as_wire(a) for a in args)]  # noqa: UP007


@pytest.mark.parametrize(("plain", "wire"), PAIRS, ids=lambda k: k.__name__)
def test_the_fields_are_the_wire_models(plain: type[Any], wire: type[BaseModel]) -> None:
    fields = dataclasses.fields(plain)
    hints = typing.get_type_hints(plain)
    assert [f.name for f in fields] == list(wire.model_fields)
    for item in fields:
        model_field = wire.model_fields[item.name]
        assert as_wire(hints[item.name]) == model_field.annotation, item.name
        if model_field.is_required():
            assert item.default is dataclasses.MISSING, item.name
            assert item.default_factory is dataclasses.MISSING, item.name
        elif item.default_factory is not dataclasses.MISSING:
            assert item.default_factory() == model_field.get_default(call_default_factory=True)
        else:
            assert item.default == model_field.default, item.name


VIEWS = [
    workload_view(),
    workload_view(phase="pending", gpus=[], reason="waits for capacity"),
    workload_view(squeezed=True, squeezed_by=["a1", "b2"], gpu_state="paused-by-priority"),
    workload_view(
        phase="failed",
        finished_at=12.5,
        exit_code=137,
        stopping=False,
        request={
            **workload_view().request.model_dump(),
            "isolation": "mig",
            "mig_profile": "3g.40gb",
            "gpu_models": ["A100-80GB"],
        },
        gpus=[
            GpuGrant(
                node="vm/mig",
                index=1,
                uuid="GPU-1",
                compute_milli=428,
                memory_mib=40192,
                mig_profile="3g.40gb",
                mig_start=4,
                mig_uuid="MIG-a",
            )
        ],
    ),
    workload_view(name="ünï\x1bcode", command=["sh", "-c", "x"], submitted_at=7, restarts=2),
]


def test_answers_read_as_pydantic_reads_them() -> None:
    answer = json.loads(json.dumps([v.model_dump(mode="json") for v in VIEWS]))
    plain = plain_workloads(answer)
    assert [dataclasses.asdict(p) for p in plain] == [v.model_dump() for v in VIEWS]
    assert type(plain[-1].submitted_at) is float  # 7 on the wire, 7.0 as pydantic gives it
    # fields the server leaves out take the models' defaults
    bare = {k: v for k, v in answer[0].items() if k not in ("stopping", "squeezed_by")}
    assert (
        dataclasses.asdict(plain_workloads([bare])[0])
        == WorkloadView.model_validate(bare).model_dump()
    )
    extra = {**answer[0], "added_later": 1}  # a newer server's field is ignored, as pydantic does
    assert plain_workloads([extra]) == plain_workloads([answer[0]])


@pytest.mark.parametrize(
    "change",
    [
        {"owner_uid": "5"},
        {"submitted_at": "12.5"},
        {"preemptible": 1},
        {"priority": 50.0},
        {"command": ("x",)},
    ],
    ids=["text-int", "text-float", "int-bool", "float-int", "tuple-list"],
)
def test_values_of_another_type_get_pydantics_conversion(change: dict[str, Any]) -> None:
    data = {**VIEWS[0].model_dump(mode="json"), **change}
    expected = WorkloadView.model_validate(data).model_dump()
    assert dataclasses.asdict(plain_workloads([data])[0]) == expected


@pytest.mark.parametrize(
    "answer",
    [
        {"not": "a list"},
        [{"id": "x"}],
        [{**workload_view().model_dump(mode="json"), "owner_uid": "root"}],
        [{**workload_view().model_dump(mode="json"), "gpus": [{"node": "vm"}]}],
    ],
    ids=["object", "missing-fields", "bad-int", "bad-grant"],
)
def test_bad_answers_get_pydantics_error(answer: Any) -> None:
    with pytest.raises(ValidationError) as expected:
        pydantic_list(answer)
    with pytest.raises(ValidationError) as caught:
        plain_workloads(answer)
    assert str(caught.value) == str(expected.value)


def pydantic_list(answer: Any) -> list[WorkloadView]:
    from pydantic import TypeAdapter

    return TypeAdapter(list[WorkloadView]).validate_python(answer)


@pytest.mark.parametrize("width", [80, 200])
def test_the_table_reads_the_same_from_either(width: int) -> None:
    plain = plain_workloads([v.model_dump(mode="json") for v in VIEWS])
    shown = []
    for views in (VIEWS, plain):
        console = Console(width=width, record=True)
        console.print(render.workloads_table(views, now=100.0))
        shown.append(console.export_text())
    assert shown[0] == shown[1]
    assert "3g.40gb" in shown[0]


DETAIL = WorkloadDetail(
    **workload_view(squeezed=True, squeezed_by=["a1"]).model_dump(),
    events=[
        EventView(id=1, workload_id="237094bf", time=5, kind="placed", reason="r", message="m"),
        EventView(id=2, workload_id=None, time=6.5, kind="squeezed", reason="", message="x"),
    ],
    enforcement=["interposer: 20 GiB cap"],
)
NODES = [
    NodeView(
        name="vm",
        backend="simulated",
        cpu_milli=2000,
        memory_mib=4096,
        gpus=[
            GpuView(
                index=0,
                uuid="GPU-0",
                model="A100-40GB",
                memory_mib=40960,
                allocated_milli=500,
                allocated_memory_mib=20480,
                holders=[
                    GpuHolder(
                        workload_id="237094bf",
                        name="job",
                        compute_milli=500,
                        memory_mib=20480,
                        mode="fair",
                        state="frozen-by-share",
                        busy=True,
                        achieved_milli=480,
                        enforcement="interposer",
                        squeezed_by=["a1"],
                    )
                ],
                utilization_pct=40,
                enforcement=[EnforcementLayer(name="freezer", active=True, why="cgroup-v2")],
            ),
            GpuView(
                index=1,
                uuid="GPU-1",
                model="A100-80GB",
                memory_mib=81920,
                allocated_milli=0,
                allocated_memory_mib=0,
                holders=[],
                mig_enabled=True,
                mig_instances=[
                    MigInstanceView(
                        profile="3g.40gb", start=4, uuid="MIG-a", compute_milli=428, memory_mib=1
                    )
                ],
            ),
        ],
        host_limits=[EnforcementLayer(name="cpu-limit", active=False, why="no cgroup")],
    )
]


def test_a_detail_and_nodes_read_as_pydantic_reads_them() -> None:
    answer = json.loads(DETAIL.model_dump_json())
    detail = plain_of(PlainWorkloadDetail, answer)
    assert dataclasses.asdict(detail) == DETAIL.model_dump()
    assert type(detail.events[0].time) is float
    nodes = plain_list(PlainNodeView, [n.model_dump(mode="json") for n in NODES])
    assert [dataclasses.asdict(n) for n in nodes] == [n.model_dump() for n in NODES]
    # not plainly typed: pydantic's conversion, then the plain form
    converted = plain_of(PlainWorkloadDetail, {**answer, "restarts": "2"})
    assert converted.restarts == 2
    with pytest.raises(ValidationError):
        plain_of(PlainWorkloadDetail, {**answer, "events": [{"id": "x"}]})


def test_json_output_is_the_same_from_either() -> None:
    detail = plain_of(PlainWorkloadDetail, json.loads(DETAIL.model_dump_json()))
    assert render.to_json(detail) == render.to_json(DETAIL)
    nodes = plain_list(PlainNodeView, [n.model_dump(mode="json") for n in NODES])
    assert render.to_json(render.top_rows(nodes)) == render.to_json(render.top_rows(NODES))
    assert render.to_json(nodes) == render.to_json(NODES)


@pytest.mark.parametrize("width", [80, 200])
def test_describe_top_and_nodes_read_the_same_from_either(width: int) -> None:
    detail = plain_of(PlainWorkloadDetail, json.loads(DETAIL.model_dump_json()))
    nodes = plain_list(PlainNodeView, [n.model_dump(mode="json") for n in NODES])
    shown = []
    for d, n in ((DETAIL, NODES), (detail, nodes)):
        console = Console(width=width, record=True)
        console.print(render.detail_view(d))
        console.print(render.top_table(n))
        console.print(render.nodes_view(n))
        shown.append(console.export_text())
    assert shown[0] == shown[1]
    assert "squeezed by a1" in shown[0]
    assert "3g.40gb@4" in shown[0]
