"""fgd-pattern on small hand-built clusters, with the exact placement worked out by hand.

The mix below has unique dual prices (see tests/unit/test_pattern_price.py): y190 = 0.2,
y300 = 0.3, y810 = 0.8. Node names give the tie-break order (the Placer's default rank).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from fgpu.cli.k8s import scheduler
from fgpu.cli.sim import sim_replay
from fgpu.k8s.scheduler import K8sScheduler
from fgpu.model.types import Allocation, InvalidRequestError, Request
from fgpu.plugins import DEFAULT_POLICY, create_policy, policy_names
from fgpu.plugins.fgd_pattern import FgdPattern, cpu_per_gpu
from fgpu.sched.frag import TargetWorkload, TaskType
from fgpu.sched.placer import Placer
from fgpu.sched.state import ClusterState, check_invariants
from fgpu.server.core import ServiceCore
from fgpu.server.main import serve
from fgpu.server.service import Service
from tests.builders import cluster, node, pod

MIX = TargetWorkload(
    (TaskType(0, 810, 1, "", 10), TaskType(0, 190, 1, "", 20), TaskType(0, 300, 1, "", 5))
)


def placer(state: ClusterState, policy: str, target: TargetWorkload = MIX) -> Placer:
    return Placer(state, create_policy(policy, target=target, rng=np.random.default_rng(0)))


def where(result: object) -> tuple[str, tuple[int, ...]]:
    assert isinstance(result, Allocation), result
    return result.node_name, result.gpus


def share(milli: int, cores: float = 0) -> Request:
    return pod().gpu(milli / 1000).cpu(cores).build()


def test_registered_and_in_the_list() -> None:
    assert "fgd-pattern" in policy_names()
    policy = create_policy("fgd-pattern", target=MIX)
    assert isinstance(policy, FgdPattern)
    assert policy.scale == 0.7
    assert policy.prices.prices == pytest.approx([0.2, 0.3, 0.8])


@pytest.mark.parametrize("policy", ["fgd", "fgd-pattern"])
def test_a_300_goes_where_it_breaks_no_pattern(policy: str) -> None:
    # n1 empty; n2 holds a 600 (400 free). A 300:
    # - loss on n1: K[1000] - 0.3 - K[700] = 1 - 0.3 - 0.7 = 0 (700 holds 300 + 190 + 190);
    #   on n2: K[400] - 0.3 - K[100] = 0.4 - 0.3 - 0 = 0.1 (400 would hold two 190s).
    # - FGD (weights 10, 20, 5 of 35): n1 strands 700 for the 810s: -7000 / 35 = -200 -> 45;
    #   n2: 400 -> 100: fragment 4000 -> 3500, +14.3 -> 50. FGD fills n2, fgd-pattern n1.
    p = placer(cluster(node("n1").gpus(1), node("n2").gpus(1)), policy)
    p.state.allocate(share(600), 1, [0])
    expected = {"fgd": ("n2", (0,)), "fgd-pattern": ("n1", (0,))}[policy]
    assert where(p.place(share(300))) == expected
    check_invariants(p.state)


def test_equal_loss_and_score_prefer_the_partly_used_gpu() -> None:
    # n1 empty; n2 holds a 600 (400 free). A 190: loss 0 on both (1000 -> 810 + 190;
    # 400 -> 190 + 190 + 10), FGD 50 on both (n1: delta 0; n2: 4000 -> 3150, +24 -> 50).
    # FGD's tie goes to the rank (n1); fgd-pattern takes the partly used GPU.
    for policy, expected in (("fgd", "n1"), ("fgd-pattern", "n2")):
        p = placer(cluster(node("n1").gpus(1), node("n2").gpus(1)), policy)
        p.state.allocate(share(600), 1, [0])
        assert where(p.place(share(190))) == (expected, (0,)), policy


def test_gpu_choice_on_one_node_follows_the_loss() -> None:
    # One node, GPU 0 empty, GPU 1 with 400 free: a 300 loses 0 on GPU 0 and 0.1 on GPU 1
    # (as across nodes above), so it takes GPU 0 although GPU 1 is the fuller one.
    p = placer(cluster(node("n1").gpus(2)), "fgd-pattern")
    p.state.allocate(share(600), 0, [1])
    assert where(p.place(share(300))) == ("n1", (0,))
    assert p.state.gpu_free_milli[0, :2].tolist() == [700, 400]


def test_a_100_avoids_the_gap_beside_an_810() -> None:
    # A 100 (not in the mix: y(100) = K[100] = 0). Losses:
    # - n1, the 190 gap beside an 810: K[190] - K[90] = 0.2 - 0 = 0.2 (bin 10);
    # - n2, 900 free: K[900] (300 + 190 x 3 = 0.9) - K[800] (190 x 4 = 0.8) = 0.1 (bin 5);
    # - n3, empty: K[1000] - K[900] = 1 - 0.9 = 0.1 (bin 5).
    # Between n2 and n3 FGD decides: n2 would strand 800 for the 810s (-8000 / 35 -> 44),
    # n3 keeps 900, where everything fits (50).
    p = placer(cluster(node("n1").gpus(1), node("n2").gpus(1), node("n3").gpus(1)), "fgd-pattern")
    p.state.allocate(share(810), 0, [0])
    p.state.allocate(share(100), 1, [0])
    prices = p.policy.prices  # type: ignore[attr-defined]
    assert prices.loss(np.array([190, 900, 1000]), 100) == pytest.approx([0.2, 0.1, 0.1])
    assert where(p.place(share(100))) == ("n3", (0,))


def test_cpu_deficit_breaks_fgd_ties_towards_the_node_that_strands_no_gpu() -> None:
    # Mix: a 500 share with 8 cores: 16 cores per GPU; scale 0.7 asks 11.2 cores per idle
    # GPU. A CPU-only pod of 4 cores: FGD scores 50 on both nodes (the 500 type fits before
    # and after on both). n1 (16 cores, 2 GPUs) would keep 12 cores for 2000 idle milli:
    # lacks 22.4 - 12 = 10 whole cores; n2 (64 cores) lacks none. fgd and scale 0 follow
    # the rank (n1).
    target = TargetWorkload((TaskType(8000, 500, 1, "", 1),))
    assert cpu_per_gpu(target) == 16_000

    def run(policy: FgdPattern | str) -> tuple[str, tuple[int, ...]]:
        state = cluster(node("n1").gpus(2).cpu(16), node("n2").gpus(2).cpu(64))
        made = policy if isinstance(policy, FgdPattern) else create_policy(policy, target=target)
        return where(Placer(state, made).place(pod().cpu(4).build()))

    assert run("fgd-pattern") == ("n2", ())
    assert run("fgd") == ("n1", ())
    assert run(FgdPattern(target=target, cpu_deficit_scale=0.0)) == ("n1", ())
    deficit = FgdPattern(target=target).deficit_cores(
        np.array([2000, 2000]), np.array([12_000, 60_000])
    )
    assert deficit.tolist() == [10, 0]


def test_whole_gpus_take_the_lowest_free_gpus_on_the_best_node() -> None:
    target = TargetWorkload((TaskType(8000, 1000, 2, "", 3), TaskType(4000, 500, 1, "", 1)))
    p = placer(cluster(node("n1").gpus(4), node("n2").gpus(2)), "fgd-pattern", target)
    p.state.allocate(share(500), 0, [1])
    # Weights 3 (two whole GPUs) and 1 (a half). n1 takes GPUs 0 and 2 (lowest free):
    # before, the 2-GPU type fits and only GPU 1's 500 is fragment (3 x 500 = 1500); after,
    # one free GPU is left, the 2-GPU type no longer fits: 3 x 1500 = 4500; -3000 / 4 ->
    # floor(100 * sigmoid(-0.75)) = 32. n2 is left with nothing to strand: 0 -> 0, 50.
    assert where(p.place(pod().gpus(2).cpu(8).build())) == ("n2", (0, 1))


@pytest.mark.parametrize(
    "scale",
    [-0.1, 2.5, float("nan"), "0.7", True],
    ids=["negative", "past-max", "nan", "text", "bool"],
)
def test_bad_scale_is_refused_with_the_field(scale: object) -> None:
    with pytest.raises(InvalidRequestError) as info:
        FgdPattern(target=MIX, cpu_deficit_scale=scale)  # type: ignore[arg-type]
    assert info.value.field == "cpu_deficit_scale"
    assert repr(scale) in str(info.value)


def test_needs_a_target() -> None:
    with pytest.raises(ValueError, match="fgd-pattern: needs a target workload"):
        create_policy("fgd-pattern")


# ------------------------------------------------------------------ lookahead
def test_lookahead_keeps_whole_gpus_for_the_810s_on_a_small_cluster() -> None:
    # n1, n2 empty; n3 holds a 400 (600 free). A 500: the key prefers an empty GPU (loss
    # 1 - K[500] - K[500] = 0) to n3 (K[600] - 0.5 - K[100] = 0.1), so fgd-pattern opens
    # n1. Sampled futures of 20 pods from the mix (mostly 190s and 810s, seeded) overflow
    # three GPUs; with the 500 on n1 only one 810 still fits (on n2), with it on n3 two do:
    # fewer GPUs of future pods fail, and the lookahead takes n3.
    def run(policy: str) -> tuple[str, tuple[int, ...]]:
        state = cluster(node("n1").gpus(1), node("n2").gpus(1), node("n3").gpus(1))
        state.allocate(share(400), 2, [0])
        return where(placer(state, policy).place(share(500)))

    assert run("fgd-pattern") == ("n1", (0,))
    assert run("fgd-pattern-lookahead") == ("n3", (0,))


def test_lookahead_places_other_requests_as_fgd_pattern() -> None:
    # Whole GPUs and CPU-only pods skip the rollout: same choices, same GPUs.
    target = TargetWorkload((TaskType(8000, 1000, 2, "", 3), TaskType(4000, 500, 1, "", 1)))
    outcomes = []
    for policy in ("fgd-pattern", "fgd-pattern-lookahead"):
        p = placer(cluster(node("n1").gpus(4), node("n2").gpus(2).cpu(16)), policy, target)
        p.state.allocate(share(500), 0, [1])
        outcomes.append(
            [where(p.place(r)) for r in (pod().gpus(2).cpu(8).build(), pod().cpu(4).build())]
        )
    assert outcomes[0] == outcomes[1]


def test_every_entry_point_defaults_to_the_default_policy() -> None:
    assert DEFAULT_POLICY == "fgd-pattern"
    assert DEFAULT_POLICY in policy_names()
    # Service's mixins pass their keyword arguments on: its policy is ServiceCore's
    assert issubclass(Service, ServiceCore)
    for entry in (sim_replay, scheduler, serve, ServiceCore.__init__, Service.create, K8sScheduler):
        assert inspect.signature(entry).parameters["policy"].default == DEFAULT_POLICY, entry
