"""GPU catalog: the models, their figures, aliases and unknown names."""

from __future__ import annotations

import pytest

from fgpu.model.catalog import (
    ALIASES,
    GPU_CATALOG,
    GpuModel,
    UnknownGpuModelError,
    canonical_name,
    gpu_model,
    models_named,
)

KNOWN = (
    "A10, A100-40GB, A100-80GB, A30, G2, G3, H100-80GB, H200-141GB, L40S, P100, T4, "
    "V100-16GB, V100-32GB (aliases: A100, H100, H200, V100, V100M16, V100M32)"
)

# name, memory MiB, SMs, MIG capable, assumed (trace-anonymised)
MODELS: list[tuple[str, int, int, bool, bool]] = [
    ("T4", 16384, 40, False, False),
    ("P100", 16384, 56, False, False),
    ("V100-16GB", 16384, 80, False, False),
    ("V100-32GB", 32768, 80, False, False),
    ("A10", 24576, 72, False, False),
    ("A30", 24576, 56, True, False),
    ("A100-40GB", 40960, 108, True, False),
    ("A100-80GB", 81920, 108, True, False),
    ("L40S", 49152, 142, False, False),
    ("H100-80GB", 81920, 132, True, False),
    ("H200-141GB", 144384, 132, True, False),
    ("G2", 32768, 80, False, True),
    ("G3", 81920, 108, False, True),
]


@pytest.mark.parametrize(
    ("name", "memory_mib", "sm_count", "mig_capable", "assumed"),
    MODELS,
    ids=[m[0] for m in MODELS],
)
def test_catalog_model(
    name: str, memory_mib: int, sm_count: int, mig_capable: bool, assumed: bool
) -> None:
    assert GPU_CATALOG[name] == GpuModel(name, memory_mib, sm_count, mig_capable, assumed)
    assert gpu_model(name) is GPU_CATALOG[name]


def test_catalog_holds_exactly_the_required_models() -> None:
    assert sorted(GPU_CATALOG) == sorted(m[0] for m in MODELS)
    assert all(key == model.name for key, model in GPU_CATALOG.items())


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("V100M16", "V100-16GB"),
        ("V100M32", "V100-32GB"),
        ("V100", "V100-16GB"),
        ("A100", "A100-40GB"),
        ("H100", "H100-80GB"),
        ("H200", "H200-141GB"),
        ("v100m32", "V100-32GB"),
        ("h100", "H100-80GB"),
        ("a100-80gb", "A100-80GB"),
        ("l40s", "L40S"),
        ("g2", "G2"),
        (" T4 ", "T4"),
        ("A10", "A10"),
    ],
    ids=[
        "trace-v100m16",
        "trace-v100m32",
        "short-v100",
        "short-a100",
        "short-h100",
        "short-h200",
        "alias-lower-case",
        "short-lower-case",
        "canonical-lower-case",
        "l40s-lower-case",
        "trace-g2-lower-case",
        "padded",
        "a10-is-not-a100",
    ],
)
def test_canonical_name(name: str, expected: str) -> None:
    assert canonical_name(name) == expected
    assert gpu_model(name).name == expected


def test_every_alias_points_into_the_catalog() -> None:
    assert all(target in GPU_CATALOG for target in ALIASES.values())


@pytest.mark.parametrize(
    "name",
    ["X100", "", "V100M64", "A100-40", "RTX4090"],
    ids=["made-up", "empty", "unknown-trace-name", "partial", "consumer-card"],
)
def test_unknown_name_lists_known_models(name: str) -> None:
    with pytest.raises(UnknownGpuModelError) as caught:
        canonical_name(name)
    assert caught.value.name == name
    assert str(caught.value) == f"gpu_model: unknown GPU model {name!r}; known models: {KNOWN}"


def test_unknown_model_is_a_key_error_for_gpu_model() -> None:
    with pytest.raises(KeyError):
        gpu_model("X100")


@pytest.mark.parametrize(
    ("name", "models"),
    [
        ("A100", ("A100-40GB", "A100-80GB")),
        ("a100", ("A100-40GB", "A100-80GB")),
        (" V100 ", ("V100-16GB", "V100-32GB")),
        ("H100", ("H100-80GB",)),
        ("A100-80GB", ("A100-80GB",)),
        ("V100M32", ("V100-32GB",)),
        ("T4", ("T4",)),
    ],
)
def test_a_requested_family_means_each_of_its_models(name: str, models: tuple[str, ...]) -> None:
    assert models_named(name) == models


def test_an_unknown_requested_model_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(UnknownGpuModelError, match="unknown GPU model 'A1000'; known models"):
        models_named("A1000")
