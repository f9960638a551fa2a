"""Each policy on small hand-built clusters, with the exact placement worked out by hand.

Node names give the tie-break order (the Placer's default rank is by name).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fgpu.model.types import Allocation, Request
from fgpu.plugins import PUBLISHED_POLICIES, UnknownPolicyError, create_policy, policy_names
from fgpu.sched.frag import TargetWorkload, TaskType
from fgpu.sched.placer import Placer, Unschedulable
from fgpu.sched.state import ClusterState, check_invariants
from tests.builders import NodeBuilder, cluster, node, pod

SHARE_500 = TargetWorkload((TaskType(0, 500, 1, "", 1),))


def placer(
    state: ClusterState, policy: str, target: TargetWorkload = SHARE_500, seed: int = 0
) -> Placer:
    return Placer(state, create_policy(policy, target=target, rng=np.random.default_rng(seed)))


def put(p: Placer, request: Request, node_: int, gpus: list[int]) -> None:
    """Pre-place work at a given spot (so policies that track placements see it)."""
    allocation = p.state.allocate(request, node_, gpus)
    p.policy.on_allocate(p.state, allocation)


def where(result: object) -> tuple[str, tuple[int, ...]]:
    assert isinstance(result, Allocation), result
    return result.node_name, result.gpus


def gpu_nodes(count: int, gpus: int, cores: float = 64) -> list[NodeBuilder]:
    return [node(f"n{i + 1}").gpus(gpus).cpu(cores) for i in range(count)]


# ------------------------------------------------------------------ best-fit, dotprod
def cpu_contrast(policy: str) -> tuple[str, tuple[int, ...]]:
    # n1: 10 cores and 2 idle GPUs left; n2: 20 cores and no idle GPU left.
    p = placer(cluster(*gpu_nodes(2, 2, cores=32)), policy)
    put(p, pod().cpu(22).build(), 0, [])
    put(p, pod().gpu(2).cpu(12).build(), 1, [0, 1])
    return where(p.place(pod().cpu(2).build()))


def test_best_fit_cpu_only_pod_goes_where_least_is_left() -> None:
    # n1: 0.5*8/32 + 0.5*2000/2000 = 0.625 -> 37; n2: 0.5*18/32 + 0 = 0.281 -> 71
    assert cpu_contrast("best-fit") == ("n2", ())


def test_dotprod_cpu_only_pod_goes_to_the_smallest_dot_product() -> None:
    # n1: (10/32)(2/32) = 0.0195 -> 99; n2: (20/32)(2/32) = 0.039 -> 98
    assert cpu_contrast("dotprod") == ("n1", ())


def test_best_fit_shares_fill_the_fullest_gpu() -> None:
    p = placer(cluster(*gpu_nodes(3, 2)), "best-fit")
    put(p, pod().gpu(0.5).build(), 0, [0])
    put(p, pod().gpu(1).build(), 2, [0])
    put(p, pod().gpu(0.5).build(), 2, [1])
    assert where(p.place(pod().gpu(0.5).cpu(1).build())) == ("n3", (1,))
    # n3 is full now; n1 leaves 1200 milli, n2 1700; on n1 the fuller GPU 0 wins
    assert where(p.place(pod().gpu(0.3).cpu(1).build())) == ("n1", (0,))
    check_invariants(p.state)


# --------------------------------------------------------------------- gpu-clustering
def test_gpu_clustering_tiers() -> None:
    p = placer(cluster(*gpu_nodes(3, 4)), "gpu-clustering")
    put(p, pod().gpu(0.5).build(), 0, [0])  # n1 hosts shares
    put(p, pod().gpu(1).build(), 1, [0])  # n2 hosts one-GPU pods
    # share: n1 same-only 75 + 25*500//4000 = 78; n2 other-only 6; n3 empty 25
    assert where(p.place(pod().gpu(0.3).build())) == ("n1", (0,))
    # one GPU: n1 other-only 5; n2 same-only 75 + 6 = 81; n3 25
    assert where(p.place(pod().gpu(1).build())) == ("n2", (1,))
    # two GPUs: n1 other-only 5, n2 other-only 12, n3 empty 25
    assert where(p.place(pod().gpu(2).build())) == ("n3", (0, 1))
    # CPU-only pods score 0 everywhere: the rank decides
    assert where(p.place(pod().cpu(1).build())) == ("n1", ())


def test_gpu_clustering_forgets_released_pods() -> None:
    p = placer(cluster(*gpu_nodes(2, 4)), "gpu-clustering")
    first = p.place(pod().gpu(1).build())
    assert where(first) == ("n1", (0,))
    assert isinstance(first, Allocation)
    p.release(first)
    assert p.policy.hosted.sum() == 0  # type: ignore[attr-defined]


# ------------------------------------------------------------------------ gpu-packing
def test_gpu_packing_prefers_shared_gpus_then_used_nodes() -> None:
    p = placer(cluster(*gpu_nodes(3, 4)), "gpu-packing")
    put(p, pod().gpu(0.3).build(), 0, [0])  # n1 GPU 0 has 700 free
    put(p, pod().gpu(0.6).build(), 1, [0])  # n2 GPU 0 has 400 free
    # 0.4: n1 100 - 70//10 = 93, n2 100 - 40//10 = 96, n3 empty 33 - 4 = 29
    assert where(p.place(pod().gpu(0.4).build())) == ("n2", (0,))
    # 0.5: n1 93; n2 would need a free GPU: 50 - 1 = 49; n3 29
    assert where(p.place(pod().gpu(0.5).build())) == ("n1", (0,))
    # whole GPU: n1 and n2 both 49 (used nodes, one free GPU), n3 29: rank picks n1
    assert where(p.place(pod().gpu(1).build())) == ("n1", (1,))


# -------------------------------------------------------------------------------- fgd
def test_fgd_avoids_stranding_a_gpu_where_best_fit_does_not() -> None:
    def run(policy: str) -> tuple[str, tuple[int, ...]]:
        p = placer(cluster(*gpu_nodes(2, 1)), policy)
        put(p, pod().gpu(0.4).build(), 0, [0])
        return where(p.place(pod().gpu(0.2).build()))

    # n1: 600 -> 400 strands 400 for the 500-milli task type: -400 -> score 40; n2: 50
    assert run("fgd") == ("n2", (0,))
    assert run("best-fit") == ("n1", (0,))


def test_fgd_chooses_the_gpu_on_the_node() -> None:
    p = placer(cluster(*gpu_nodes(1, 2)), "fgd")
    put(p, pod().gpu(0.4).build(), 0, [0])
    # GPU 0 would drop to 400 (fragment 400, score 40); GPU 1 to 800 (no fragment, 50)
    assert where(p.place(pod().gpu(0.2).build())) == ("n1", (1,))


def test_fgd_cpu_only_pod_keeps_cpu_for_the_target_workload() -> None:
    target = TargetWorkload((TaskType(8000, 500, 1, "", 1),))
    p = placer(cluster(*gpu_nodes(2, 1, cores=16)), "fgd", target)
    put(p, pod().cpu(6).build(), 1, [])
    # n1 keeps 12 cores (task fits, 50); n2 would keep 6 < 8: idle GPU is fragment (26)
    assert where(p.place(pod().cpu(4).build())) == ("n1", ())


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("fgd", ("n1", (0,))), ("fgd-exact", ("n2", (0,)))],
    ids=["integer-bins-tie-to-rank", "exact-smallest-increase"],
)
def test_fgd_integer_scores_tie_where_exact_scores_do_not(
    policy: str, expected: tuple[str, tuple[int, ...]]
) -> None:
    p = placer(cluster(*gpu_nodes(2, 2)), policy)
    put(p, pod().gpu(0.47).build(), 0, [0])
    put(p, pod().gpu(0.48).build(), 0, [1])  # n1 free [530, 520]
    put(p, pod().gpu(0.5).build(), 1, [0])
    put(p, pod().gpu(0.5).build(), 1, [1])  # n2 free [500, 500]
    # increases: n1 GPU0 40, GPU1 30; n2 10 on either GPU; all score 49 as integers
    assert where(p.place(pod().gpu(0.49).build())) == expected


def test_fgd_needs_a_target_workload() -> None:
    with pytest.raises(ValueError, match="policy fgd: needs a target workload"):
        create_policy("fgd")


def test_fgd_cache_follows_changes_on_a_copy() -> None:
    state = cluster(*gpu_nodes(2, 1))
    policy = create_policy("fgd", target=SHARE_500)
    original = Placer(state, policy)
    what_if = Placer(state.copy(), policy)
    assert where(what_if.place(pod().gpu(0.2).build())) == ("n1", (0,))
    # the copy changed n1; the original did not, and must not see a stale score
    put(original, pod().gpu(0.4).build(), 1, [0])
    assert where(original.place(pod().gpu(0.2).build())) == ("n1", (0,))


# ----------------------------------------------------------------- binpack and spread
@pytest.mark.parametrize(
    ("policy", "expected"),
    [("binpack", ("n1", (0,))), ("spread", ("n2", (0,)))],
    ids=["binpack-most-allocated", "spread-least-allocated"],
)
def test_binpack_and_spread(policy: str, expected: tuple[str, tuple[int, ...]]) -> None:
    p = placer(cluster(*gpu_nodes(2, 2)), policy)
    put(p, pod().gpu(0.5).build(), 0, [0])
    assert where(p.place(pod().gpu(0.25).build())) == expected


def test_spread_takes_the_emptiest_gpu() -> None:
    p = placer(cluster(*gpu_nodes(1, 2)), "spread")
    put(p, pod().gpu(0.5).build(), 0, [0])
    assert where(p.place(pod().gpu(0.25).build())) == ("n1", (1,))


# --------------------------------------------------------------------------- random
def test_random_uses_only_feasible_nodes_and_repeats_with_its_seed() -> None:
    def picks(seed: int) -> list[str]:
        p = placer(cluster(*gpu_nodes(4, 1)), "random", seed=seed)
        put(p, pod().gpu(0.9).build(), 3, [0])
        out = []
        for _ in range(300):
            result = p.place(pod().gpu(0.5).build())
            name, _gpus = where(result)
            out.append(name)
            assert isinstance(result, Allocation)
            p.release(result)
        return out

    first = picks(7)
    assert first == picks(7)
    counts = Counter(first)
    assert set(counts) == {"n1", "n2", "n3"}  # n4 has only 100 milli free
    assert all(70 <= c <= 130 for c in counts.values()), counts


# ------------------------------------------------------------------ placer and registry
@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_reports_unschedulable_with_a_reason(policy: str) -> None:
    p = placer(cluster(node("n1").gpus(1, "T4").cpu(8)), policy)
    result = p.place(pod().gpu(2).build())
    assert result == Unschedulable("0/1 nodes fit: 1 have fewer than 2 GPUs")


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_places_whole_gpus_on_the_lowest_free_indices(policy: str) -> None:
    p = placer(cluster(node("n1").gpus(4)), policy)
    put(p, pod().gpu(0.5).build(), 0, [1])
    assert where(p.place(pod().gpu(2).build())) == ("n1", (0, 2))


def test_registry_lists_published_first_and_rejects_unknown_names() -> None:
    assert policy_names()[:6] == list(PUBLISHED_POLICIES)
    assert set(policy_names()[6:]) == {
        "binpack",
        "fgd-exact",
        "fgd-pattern",
        "fgd-pattern-lookahead",
        "spread",
    }
    with pytest.raises(UnknownPolicyError) as caught:
        create_policy("tetris")
    assert str(caught.value) == (
        "policy: unknown policy 'tetris'; valid: random, dotprod, gpu-clustering, "
        "gpu-packing, best-fit, fgd, binpack, fgd-exact, fgd-pattern, fgd-pattern-lookahead, "
        "spread"
    )
