"""The FGD fragmentation measure: worked example, target workload rule, fast == reference."""

from __future__ import annotations

import numpy as np
import pytest

from fgpu.model.types import InvalidRequestError
from fgpu.sched.frag import (
    FragmentationMeasure,
    TargetWorkload,
    TaskType,
    reference_node_fragment,
)
from tests.builders import pod

# A worked example, by hand (fgd-protocol.md definitions). Node: 4 GPUs with free milli
# [1000, 600, 300, 0], 8 free cores, model A100-80GB. idle = 1900.
WORKED_TARGET = TargetWorkload(
    (
        TaskType(1000, 0, 0, "", 2),  # CPU only: f = idle = 1900
        TaskType(2000, 500, 1, "", 5),  # fits: GPUs below 500 -> 300 + 0 = 300
        TaskType(4000, 1000, 1, "", 2),  # fits (GPU 0): GPUs below 1000 -> 600 + 300 = 900
        TaskType(4000, 1000, 2, "", 1),  # needs 2 free GPUs, has 1: f = idle = 1900
        TaskType(1000, 200, 1, "T4", 1),  # model not allowed: f = idle = 1900
        TaskType(16000, 500, 1, "", 1),  # CPU does not fit: f = idle = 1900
    )
)
WORKED_FREE = [1000, 600, 300, 0]
# 2*1900 + 5*300 + 2*900 + 1900 + 1900 + 1900 = 12800 over W = 12 -> 1066.67 milli-GPU
WORKED_WEIGHTED = 12800


def test_worked_example_reference() -> None:
    assert WORKED_TARGET.total_count == 12
    got = reference_node_fragment(WORKED_FREE, 8000, "A100-80GB", WORKED_TARGET)
    assert got == WORKED_WEIGHTED


def test_worked_example_vectorized() -> None:
    measure = FragmentationMeasure(("A100-80GB", "T4"), WORKED_TARGET)
    free = np.array([WORKED_FREE], dtype=np.int64)
    got = measure.node_fragment(free, np.array([8000]), np.array([0]))
    assert got.tolist() == [WORKED_WEIGHTED]
    assert measure.fragment_milli(got) == pytest.approx([12800 / 12])


def test_node_without_gpus_has_no_fragment() -> None:
    measure = FragmentationMeasure(("A100-80GB",), WORKED_TARGET)
    got = measure.node_fragment(np.zeros((1, 4), dtype=np.int64), np.array([0]), np.array([-1]))
    assert got.tolist() == [0]


def test_fractional_trials_match_recomputation() -> None:
    rng = np.random.default_rng(3)
    measure = FragmentationMeasure(("A100-80GB", "T4"), WORKED_TARGET)
    free = rng.integers(0, 11, size=(50, 4)) * 100
    cpu = rng.integers(0, 20, size=50) * 1000
    model = rng.integers(-1, 2, size=50)
    share = np.full(50, 300, dtype=np.int64)
    before, after = measure.fractional_trials(free, cpu, model, share, 2000)
    for d in range(50):
        name = None if model[d] < 0 else ("A100-80GB", "T4")[model[d]]
        assert before[d] == reference_node_fragment(
            free[d].tolist(), int(cpu[d]), name, WORKED_TARGET
        )
        for g in range(4):
            if free[d, g] < 300:
                continue
            trial = free[d].copy()
            trial[g] -= 300
            expected = reference_node_fragment(
                trial.tolist(), int(cpu[d]) - 2000, name, WORKED_TARGET
            )
            assert after[d, g] == expected, (d, g)


def test_target_workload_rule() -> None:
    # counts: A x4, B x3, C x2, D x1 (10 pods). Coverage 0.7: A (4 < 7) -> B (7, stop).
    pods = (
        [pod().gpu(0.5).cpu(1).build()] * 4
        + [pod().gpu(1).cpu(2).build()] * 3
        + [pod().cpu(3).build()] * 2
        + [pod().gpu(0.25).cpu(1).models("T4").build()]
    )
    target = TargetWorkload.from_requests(pods, coverage=0.7)
    assert target.types == (
        TaskType(1000, 500, 1, "", 4),
        TaskType(2000, 1000, 1, "", 3),
    )
    everything = TargetWorkload.from_requests(pods, coverage=1.0)
    assert [t.count for t in everything.types] == [4, 3, 2, 1]
    assert everything.types[-1] == TaskType(1000, 250, 1, "T4", 1)


def test_target_workload_equal_counts_sort_by_key_descending() -> None:
    pods = [pod().gpu(0.2).cpu(1).build(), pod().gpu(0.3).cpu(1).build(), pod().cpu(5).build()]
    target = TargetWorkload.from_requests(pods, coverage=1.0)
    assert [(t.cpu_milli, t.gpu_milli) for t in target.types] == [
        (5000, 0),
        (1000, 300),
        (1000, 200),
    ]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: TargetWorkload.from_requests([]), "requests: cannot build a target workload"),
        (lambda: TargetWorkload.from_requests([pod().cpu(1).build()], 0), "coverage: must be in"),
        (lambda: TargetWorkload(()), "types: a target workload needs at least one"),
        (lambda: TaskType(0, 500, 1, "", 0), "count: a task type needs a positive pod count"),
        (lambda: TaskType(0, 500, 0, ""), "gpu_milli: 0 only for CPU-only task types"),
        (
            lambda: TargetWorkload.from_requests([pod().gpu_memory("5GiB").build()]),
            "gpu_milli: target task types need explicit shares",
        ),
    ],
    ids=["empty", "coverage", "no-types", "zero-count", "share-without-gpus", "memory-only"],
)
def test_bad_target_input(call: object, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        call()  # type: ignore[operator]


def test_default_trace_target_workload(trace_dir) -> None:  # type: ignore[no-untyped-def]
    from fgpu.sim.trace import load_pods

    pods = load_pods(trace_dir / "openb_pod_list_default.csv")
    target = TargetWorkload.from_requests(pods.requests)
    assert len(target.types) == 35
    assert target.total_count / len(pods.requests) == pytest.approx(0.953, abs=0.0005)
    assert target.types[0] == TaskType(3152, 810, 1, "", 1047)
