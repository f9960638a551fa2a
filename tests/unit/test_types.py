"""Domain types: request and node validation, request properties."""

from __future__ import annotations

from typing import Any

import pytest

from fgpu.model.types import InvalidRequestError, Node, Request


@pytest.mark.parametrize(
    ("kwargs", "field", "reason"),
    [
        ({"cpu_milli": -1}, "cpu_milli", "must not be negative"),
        ({"memory_mib": -1}, "memory_mib", "must not be negative"),
        ({"gpu_count": -1}, "gpu_count", "must not be negative"),
        ({"gpu_count": 0, "gpu_milli": 500}, "gpu_count", "GPU share or memory given with 0 GPUs"),
        (
            {"gpu_count": 0, "gpu_memory_mib": 1024},
            "gpu_count",
            "GPU share or memory given with 0 GPUs",
        ),
        ({"gpu_count": 1}, "gpu_milli", "a GPU request needs a share or a memory quota"),
        ({"gpu_count": 1, "gpu_milli": 0}, "gpu_milli", "must be in 1..1000 milli-GPU"),
        ({"gpu_count": 1, "gpu_milli": -5}, "gpu_milli", "must be in 1..1000 milli-GPU"),
        ({"gpu_count": 2, "gpu_milli": 1001}, "gpu_milli", "must be in 1..1000 milli-GPU"),
        ({"gpu_count": 1, "gpu_memory_mib": 0}, "gpu_memory_mib", "must be positive"),
        ({"gpu_count": 1, "gpu_memory_mib": -1}, "gpu_memory_mib", "must be positive"),
    ],
    ids=[
        "negative-cpu",
        "negative-memory",
        "negative-gpu-count",
        "share-without-gpus",
        "gpu-memory-without-gpus",
        "gpus-without-share-or-memory",
        "zero-share",
        "negative-share",
        "share-above-1000",
        "zero-gpu-memory",
        "negative-gpu-memory",
    ],
)
def test_request_rejects(kwargs: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Request(**kwargs)
    assert (caught.value.field, caught.value.reason) == (field, reason)
    assert str(caught.value) == f"{field}: {reason}"
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("request_", "cpu_only", "whole", "total"),
    [
        (Request(), True, False, 0),
        (Request(cpu_milli=4000, memory_mib=8192, gpu_count=0, gpu_milli=0), True, False, 0),
        (Request(gpu_count=1, gpu_milli=500), False, False, 500),
        (Request(gpu_count=1, gpu_milli=1), False, False, 1),
        (Request(gpu_count=1, gpu_milli=1000), False, True, 1000),
        (Request(gpu_count=8, gpu_milli=1000), False, True, 8000),
        (Request(gpu_count=2, gpu_milli=300), False, False, 600),
        (Request(gpu_count=1, gpu_memory_mib=5120), False, False, 0),
        (Request(gpu_count=1, gpu_milli=500, gpu_memory_mib=5120), False, False, 500),
    ],
    ids=[
        "empty",
        "cpu-only-zero-share",
        "half",
        "smallest-share",
        "one-whole",
        "eight-whole",
        "fraction-on-two",
        "memory-only",
        "share-and-memory",
    ],
)
def test_request_properties(request_: Request, cpu_only: bool, whole: bool, total: int) -> None:
    assert (request_.is_cpu_only, request_.is_whole_gpu, request_.total_gpu_milli) == (
        cpu_only,
        whole,
        total,
    )


def test_request_defaults() -> None:
    assert Request() == Request(0, 0, 0, None, None, frozenset())


def test_request_is_frozen_and_hashable() -> None:
    request = Request(gpu_count=1, gpu_milli=500, gpu_models=frozenset({"T4"}))
    with pytest.raises(AttributeError):
        request.gpu_milli = 600  # type: ignore[misc]
    assert hash(request) == hash(Request(gpu_count=1, gpu_milli=500, gpu_models=frozenset({"T4"})))


def node_kwargs(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "n1",
        "cpu_milli": 96000,
        "memory_mib": 393216,
        "gpu_count": 8,
        "gpu_model": "G2",
        "gpu_memory_mib": 32768,
    }
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"name": ""}, "name", "a node needs a name"),
        ({"cpu_milli": -1}, "cpu_milli", "must not be negative"),
        ({"memory_mib": -1}, "memory_mib", "must not be negative"),
        ({"gpu_count": -1}, "gpu_count", "must not be negative"),
        ({"gpu_memory_mib": -1}, "gpu_memory_mib", "must not be negative"),
        ({"gpu_model": None}, "gpu_model", "a node with GPUs needs a model and memory"),
        ({"gpu_memory_mib": 0}, "gpu_model", "a node with GPUs needs a model and memory"),
    ],
    ids=[
        "empty-name",
        "negative-cpu",
        "negative-memory",
        "negative-gpu-count",
        "negative-gpu-memory",
        "gpus-without-model",
        "gpus-without-memory",
    ],
)
def test_node_rejects(overrides: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Node(**node_kwargs(**overrides))
    assert (caught.value.field, caught.value.reason) == (field, reason)
    assert str(caught.value) == f"{field}: {reason}"


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"gpu_count": 0, "gpu_model": None, "gpu_memory_mib": 0},
        {"cpu_milli": 0, "memory_mib": 0},
    ],
    ids=["gpu-node", "cpu-only-node", "zero-cpu-and-memory"],
)
def test_node_accepts(overrides: dict[str, Any]) -> None:
    kwargs = node_kwargs(**overrides)
    node = Node(**kwargs)
    assert [getattr(node, key) for key in kwargs] == list(kwargs.values())
