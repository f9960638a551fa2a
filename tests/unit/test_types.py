"""Domain types: request and node validation, request properties."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from fgpu.model.types import (
    MAX_CPU_MILLI,
    MAX_GPUS,
    MAX_MEMORY_MIB,
    InvalidRequestError,
    Node,
    Request,
)


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


# ----------------------------------------------------------------------------- types, bounds
NOT_INTEGERS = [
    pytest.param(True, "True", id="bool"),
    pytest.param(1.5, "1.5", id="float"),
    pytest.param(2.0, "2.0", id="whole-float"),
    pytest.param(float("nan"), "nan", id="nan"),
    pytest.param("4", "'4'", id="str"),
    pytest.param(None, "None", id="none"),
]


@pytest.mark.parametrize("field", ["cpu_milli", "memory_mib", "gpu_count"])
@pytest.mark.parametrize(("value", "shown"), NOT_INTEGERS)
def test_request_amounts_must_be_integers(field: str, value: object, shown: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Request(**{field: value})
    assert str(caught.value) == f"{field}: must be an integer (got {shown})"


@pytest.mark.parametrize("field", ["gpu_milli", "gpu_memory_mib"])
@pytest.mark.parametrize(("value", "shown"), NOT_INTEGERS[:-1])  # None is allowed there
def test_request_gpu_amounts_must_be_integers(field: str, value: object, shown: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Request(gpu_count=1, **{field: value})
    assert str(caught.value) == f"{field}: must be an integer (got {shown})"


@pytest.mark.parametrize("field", ["cpu_milli", "memory_mib", "gpu_count", "gpu_memory_mib"])
@pytest.mark.parametrize(("value", "shown"), NOT_INTEGERS)
def test_node_amounts_must_be_integers(field: str, value: object, shown: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Node(**node_kwargs(**{field: value}))
    assert str(caught.value) == f"{field}: must be an integer (got {shown})"


ABOVE_BOUNDS = [
    ("cpu_milli", 10**27, 10**9),
    ("cpu_milli", MAX_CPU_MILLI + 1, 10**9),
    ("memory_mib", MAX_MEMORY_MIB + 1, 2**40),
    ("gpu_count", 99999999999999999999, 64),
    ("gpu_count", MAX_GPUS + 1, 64),
]


@pytest.mark.parametrize(("field", "value", "bound"), ABOVE_BOUNDS)
def test_request_rejects_values_above_the_bounds(field: str, value: int, bound: int) -> None:
    kwargs: dict[str, Any] = {field: value}
    if field == "gpu_count":
        kwargs["gpu_milli"] = 1000
    with pytest.raises(InvalidRequestError) as caught:
        Request(**kwargs)
    assert str(caught.value) == f"{field}: {value} is above the largest supported value {bound}"


def test_request_rejects_gpu_memory_above_the_bound() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Request(gpu_count=1, gpu_memory_mib=2**40 + 1)
    assert str(caught.value) == (
        f"gpu_memory_mib: {2**40 + 1} is above the largest supported value {2**40}"
    )


@pytest.mark.parametrize(
    ("field", "value", "bound"),
    [*ABOVE_BOUNDS, ("gpu_count", 100_000_000_000, 64), ("gpu_memory_mib", 2**40 + 1, 2**40)],
)
def test_node_rejects_values_above_the_bounds(field: str, value: int, bound: int) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Node(**node_kwargs(**{field: value}))
    assert str(caught.value) == f"{field}: {value} is above the largest supported value {bound}"


def test_bounds_themselves_are_accepted() -> None:
    request = Request(MAX_CPU_MILLI, MAX_MEMORY_MIB, MAX_GPUS, 1000)
    assert (request.cpu_milli, request.memory_mib, request.gpu_count) == (10**9, 2**40, 64)
    node = Node("n", MAX_CPU_MILLI, MAX_MEMORY_MIB, MAX_GPUS, "T4", MAX_MEMORY_MIB)
    assert node.gpu_count == 64


def test_numpy_integers_are_stored_as_plain_ints() -> None:
    request = Request(np.int64(4000), np.int32(1024), np.int64(1), np.int16(500), np.int64(10))
    fields = (request.cpu_milli, request.memory_mib, request.gpu_count, request.gpu_milli)
    assert [type(v) for v in (*fields, request.gpu_memory_mib)] == [int] * 5
    assert request == Request(4000, 1024, 1, 500, 10)
    node = Node("n", np.int64(1000), np.int64(2048), np.int64(2), "T4", np.int64(16384))
    assert type(node.gpu_count) is int
    assert node == Node("n", 1000, 2048, 2, "T4", 16384)


def test_node_name_must_be_a_string() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Node(**node_kwargs(name=7))
    assert str(caught.value) == "name: must be a string (got 7)"


# ----------------------------------------------------------------------------- GPU models
@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ({"A100"}, {"A100-40GB"}),  # the short alias is the 40 GB board
        (frozenset({"a100-80gb"}), {"A100-80GB"}),
        ({"V100M16", "V100-16GB"}, {"V100-16GB"}),  # alias and name collapse
        ({"t4", "MI300X"}, {"T4", "MI300X"}),  # unknown names are kept as given
        (set(), set()),
    ],
    ids=["alias", "lower-case", "alias-and-name", "unknown-kept", "empty"],
)
def test_request_gpu_models_are_canonicalized(given: set[str], stored: set[str]) -> None:
    request = Request(gpu_count=1, gpu_milli=500, gpu_models=given)  # type: ignore[arg-type]
    assert request.gpu_models == frozenset(stored)
    assert type(request.gpu_models) is frozenset
    hash(request)


@pytest.mark.parametrize(
    ("models", "reason"),
    [
        (
            "A100",
            "must be a set of GPU model names, not one string (got 'A100'; write "
            "frozenset({'A100'}))",
        ),
        (["A100"], "must be a set of GPU model names (got ['A100'])"),
        (None, "must be a set of GPU model names (got None)"),
        ({""}, "empty GPU model name"),
        ({"  "}, "empty GPU model name"),
        ({7}, "a GPU model name must be a string (got 7)"),
        ({"T4|A10"}, "GPU model name 'T4|A10' must not contain '|'"),
    ],
    ids=["plain-str", "list", "none", "empty-name", "blank-name", "not-str", "separator"],
)
def test_request_gpu_models_rejects(models: object, reason: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Request(gpu_count=1, gpu_milli=500, gpu_models=models)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.reason) == ("gpu_models", reason)


@pytest.mark.parametrize(
    ("overrides", "model"),
    [
        ({"gpu_model": "a100-80gb"}, "A100-80GB"),
        ({"gpu_model": "A100"}, "A100-40GB"),
        ({"gpu_model": "V100M32"}, "V100-32GB"),
        ({"gpu_model": "MI300X"}, "MI300X"),
        ({"gpu_count": 0, "gpu_model": "", "gpu_memory_mib": 0}, None),
        ({"gpu_count": 0, "gpu_model": "t4", "gpu_memory_mib": 0}, "T4"),
    ],
    ids=["lower-case", "alias", "trace-alias", "unknown-kept", "cpu-only-empty", "cpu-only-t4"],
)
def test_node_gpu_model_is_canonicalized(overrides: dict[str, Any], model: str | None) -> None:
    assert Node(**node_kwargs(**overrides)).gpu_model == model


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("", "empty GPU model name on a node with 8 GPU(s)"),
        ("   ", "empty GPU model name on a node with 8 GPU(s)"),
        (80, "a GPU model name must be a string (got 80)"),
        ("G2|G3", "GPU model name 'G2|G3' must not contain '|'"),
    ],
    ids=["empty", "blank", "not-str", "separator"],
)
def test_node_gpu_model_rejects(model: object, reason: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Node(**node_kwargs(gpu_model=model))
    assert (caught.value.field, caught.value.reason) == ("gpu_model", reason)


def test_invalid_request_error_survives_pickling() -> None:
    # Errors raised in worker processes travel back by pickle.
    error = pickle.loads(pickle.dumps(InvalidRequestError("cpu_milli", "must not be negative")))
    assert (error.field, error.reason, str(error)) == (
        "cpu_milli",
        "must not be negative",
        "cpu_milli: must not be negative",
    )
