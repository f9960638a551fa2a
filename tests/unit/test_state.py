"""Cluster state: filter, per-GPU needs, allocate/release, copies, reasons."""

from __future__ import annotations

import re

import numpy as np
import pytest

from fgpu.model.types import InvalidRequestError, Node, Request
from fgpu.sched.state import ClusterState, any_per_node, check_invariants, count_per_node
from tests.builders import cluster, node, pod


def small() -> ClusterState:
    return cluster(
        node("a100").gpus(2, "A100-80GB").cpu(16).memory("64GiB"),
        node("t4").gpus(1, "T4").cpu(8).memory("32GiB"),
        node("cpu").cpu(32).memory("128GiB"),
    )


def test_arrays_are_padded_to_the_largest_node() -> None:
    s = small()
    assert s.max_gpus == 8  # the largest node (2 GPUs) rounded up to whole 8-GPU words
    assert s.gpu_free_milli[:, :3].tolist() == [[1000, 1000, 0], [1000, 0, 0], [0, 0, 0]]
    assert (s.gpu_free_milli[:, 2:] == 0).all()
    assert s.gpu_free_memory[:, :2].tolist() == [[81920, 81920], [16384, 0], [0, 0]]
    assert s.gpu_free_total.tolist() == [2000, 1000, 0]
    assert s.model_names == ("A100-80GB", "T4")
    assert s.node_model.tolist() == [0, 1, -1]
    assert s.gpu_capacity_milli == 3000


@pytest.mark.parametrize(
    ("request_", "nodes"),
    [
        (pod().cpu(4).build(), [True, True, True]),
        (pod().cpu(20).build(), [False, False, True]),
        (pod().memory("40GiB").build(), [True, False, True]),
        (pod().gpu(0.5).build(), [True, True, False]),
        (pod().gpu(2).build(), [True, False, False]),
        (pod().gpus(2, 0.3).build(), [True, False, False]),
        (pod().gpu(0.5).models("T4").build(), [False, True, False]),
        (pod().gpu_memory("20GiB").build(), [True, False, False]),
        (pod().gpu(0.5).cpu(10).build(), [True, False, False]),
    ],
    ids=[
        "cpu",
        "cpu-big",
        "host-memory",
        "share",
        "two-whole",
        "two-shares",
        "model",
        "gpu-memory-only",
        "share-and-cpu",
    ],
)
def test_filter(request_: Request, nodes: list[bool]) -> None:
    ok, _ = small().feasible(request_)
    assert ok.tolist() == nodes


def test_gpu_need_rules() -> None:
    s = small()
    share = s.gpu_need(pod().gpu(0.5).build())
    assert share.milli[0, :2].tolist() == [500, 500]
    assert share.memory[:2, :2].tolist() == [[40960, 40960], [8192, 0]]
    mem = s.gpu_need(pod().gpu_memory("8GiB").build())
    # 8 GiB of 80 GiB is 100 milli; of a 16 GiB T4 it is 500 milli
    assert mem.milli[0, :2].tolist() == [100, 100]
    assert mem.milli[1, 0] == 500
    assert mem.memory[1, 0] == 8192
    too_big = s.gpu_need(pod().gpu_memory("20GiB").build())
    assert too_big.milli[1, 0] == 1001  # cannot fit a 16 GiB GPU at all


def test_whole_gpu_needs_a_fully_free_gpu() -> None:
    s = small()
    s.allocate(pod().gpu(0.1).build(), 0, [0])
    ok, gpus = s.feasible(pod().gpu(1).build())
    assert ok.tolist() == [True, True, False]
    assert gpus is not None
    assert gpus[0, :2].tolist() == [False, True]
    ok, _ = s.feasible(pod().gpu(2).build())
    assert ok.tolist() == [False, False, False]


def test_allocate_and_release_round_trip() -> None:
    s = small()
    before = s.version.copy()
    alloc = s.allocate(pod().gpu(0.25).cpu(2).memory("1GiB").build(), 0, [1])
    assert alloc.gpus == (1,)
    assert alloc.gpu_milli == (250,)
    assert alloc.gpu_memory_mib == (20480,)
    assert s.gpu_free_milli[0, :2].tolist() == [1000, 750]
    assert s.gpu_free_total[0] == 1750
    assert s.cpu_free[0] == 14000
    assert s.memory_free[0] == 63 * 1024
    assert s.version[0] != before[0]
    assert s.version[1] == before[1]
    s.release(alloc)
    assert s.gpu_free_milli[0, :2].tolist() == [1000, 1000]
    assert s.cpu_free[0] == 16000
    check_invariants(s)


@pytest.mark.parametrize(
    ("request_", "node_", "gpus", "message"),
    [
        (pod().gpu(0.5).build(), 0, [], "gpus: need 1 distinct GPUs, got []"),
        (pod().gpus(2, 0.5).build(), 0, [1, 1], "gpus: need 2 distinct GPUs, got [1, 1]"),
        (pod().gpu(0.5).build(), 1, [1], "gpus: node has no GPU 1"),
        (pod().cpu(100).build(), 0, [], "cpu_milli: node a100 lacks CPU"),
        (pod().memory("1TiB").build(), 0, [], "memory_mib: node a100 lacks memory"),
    ],
    ids=["no-gpu-given", "same-gpu-twice", "missing-gpu", "cpu", "memory"],
)
def test_allocate_rejects_and_changes_nothing(
    request_: Request, node_: int, gpus: list[int], message: str
) -> None:
    s = small()
    snapshot = (s.cpu_free.copy(), s.gpu_free_milli.copy(), s.version.copy())
    with pytest.raises(InvalidRequestError, match="^" + re.escape(message)):
        s.allocate(request_, node_, gpus)
    assert (s.cpu_free == snapshot[0]).all()
    assert (s.gpu_free_milli == snapshot[1]).all()
    assert (s.version == snapshot[2]).all()


def test_allocate_rejects_an_overfull_gpu() -> None:
    s = small()
    s.allocate(pod().gpu(0.7).build(), 0, [0])
    with pytest.raises(InvalidRequestError, match="GPU 0 of a100 lacks 500 milli / 40960 MiB"):
        s.allocate(pod().gpu(0.5).build(), 0, [0])
    assert s.gpu_free_milli[0, 0] == 300


def test_double_release_is_refused() -> None:
    s = small()
    alloc = s.allocate(pod().gpu(0.5).cpu(1).build(), 0, [0])
    s.release(alloc)
    with pytest.raises(InvalidRequestError, match="double release"):
        s.release(alloc)
    check_invariants(s)


def test_copy_is_independent_and_versions_never_collide() -> None:
    s = small()
    c = s.copy()
    a = c.allocate(pod().gpu(0.5).build(), 0, [0])
    assert s.gpu_free_milli[0, 0] == 1000
    assert c.gpu_free_milli[0, 0] == 500
    s.allocate(pod().gpu(0.2).build(), 0, [0])
    assert s.version[0] != c.version[0]
    c.release(a)
    assert c.gpu_free_milli[0, 0] == 1000


def test_duplicate_node_names_are_rejected() -> None:
    n = Node("x", 1000, 1024, 0, None, 0)
    with pytest.raises(InvalidRequestError, match="name: duplicate node name 'x'"):
        ClusterState([n, n])


def test_explain_counts_nodes_per_failing_check() -> None:
    s = small()
    s.allocate(pod().gpu(0.9).build(), 0, [0])
    s.allocate(pod().gpu(0.9).build(), 0, [1])
    reason = s.explain(pod().gpu(0.5).cpu(12).build())
    assert reason == (
        "0/3 nodes fit: 1 have fewer than 1 GPUs, 1 insufficient CPU (need 12000m)"
        ", 1 insufficient GPU (need 1 x GPU share of 500 milli and 40960 MiB free)"
    )


def test_explain_on_a_cluster_without_nodes() -> None:
    empty = ClusterState([])
    assert empty.explain(pod().gpu(0.5).build()) == "0/0 nodes fit: no nodes in the cluster"
    assert empty.explain(pod().cpu(1).build()) == "0/0 nodes fit: no nodes in the cluster"


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (
            pod().gpu_memory("100GiB").build(),
            "0/3 nodes fit: 1 have fewer than 1 GPUs, "
            "2 GPU memory too small (no GPU has 102400 MiB of memory)",
        ),
        (
            pod().gpu(0.5).gpu_memory("100GiB").build(),
            "0/3 nodes fit: 1 have fewer than 1 GPUs, "
            "2 GPU memory too small (no GPU has 102400 MiB of memory)",
        ),
        (
            pod().gpu_memory("20GiB").build(),  # the A100 could, the T4 never
            "1/3 nodes fit: 1 have fewer than 1 GPUs, "
            "1 GPU memory too small (no GPU has 20480 MiB of memory)",
        ),
    ],
    ids=["memory-only", "share-and-memory", "one-model-too-small"],
)
def test_explain_names_gpu_memory_no_gpu_has(request_: Request, reason: str) -> None:
    assert small().explain(request_) == reason
    assert "1001" not in reason


def test_explain_memory_only_request_on_busy_gpus_names_the_share() -> None:
    s = small()
    s.allocate(pod().gpu(0.9).build(), 0, [0])
    s.allocate(pod().gpu(0.9).build(), 0, [1])
    assert s.explain(pod().gpu_memory("20GiB").build()) == (
        "0/3 nodes fit: 1 have fewer than 1 GPUs, "
        "1 GPU memory too small (no GPU has 20480 MiB of memory), "
        "1 insufficient GPU (need 1 x GPU share of 250 milli and 20480 MiB free)"
    )


def test_invariants_catch_an_overdrawn_gpu() -> None:
    s = small()
    s.gpu_free_milli[0, 0] = -1
    with pytest.raises(AssertionError, match="gpu_free_milli negative at"):
        check_invariants(s)
    s.gpu_free_milli[0, 0] = 1000
    s.gpu_free_milli[1, 1] = 5
    with pytest.raises(AssertionError, match="above capacity"):
        check_invariants(s)


def test_model_mask_for_cpu_only_nodes_is_false() -> None:
    s = small()
    assert s.model_mask(frozenset({"T4"})).tolist() == [False, True, False]
    assert s.model_mask(frozenset()).tolist() == [True, True, True]
    assert np.array_equal(s.model_mask(frozenset({"T4"})), s.model_mask(frozenset({"T4"})))


@pytest.mark.parametrize("width", [8, 16, 24])
def test_word_counts_match_numpy(width: int) -> None:
    rng = np.random.default_rng(width)
    mask = rng.random((200, width)) < 0.4
    assert count_per_node(mask).tolist() == mask.sum(axis=1).tolist()
    assert any_per_node(mask).tolist() == mask.any(axis=1).tolist()
    full = np.ones((3, width), dtype=np.bool_)
    assert count_per_node(full).tolist() == [width] * 3


def test_a_model_mismatch_says_what_was_asked_and_what_the_nodes_have() -> None:
    from fgpu.model.types import Node, Request
    from fgpu.sched.state import ClusterState

    state = ClusterState(
        [Node("a", 1000, 1000, 2, "A100-80GB", 81920), Node("b", 1000, 1000, 2, "H100-80GB", 81920)]
    )
    # "A100" is the catalog's alias of A100-40GB: the reason shows what it became
    asked = Request(gpu_count=1, gpu_milli=500, gpu_models=frozenset({"A100"}))
    assert state.explain(asked) == (
        "0/2 nodes fit: 2 GPU model not allowed (asked A100-40GB; they have A100-80GB, H100-80GB)"
    )
