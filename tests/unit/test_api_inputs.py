"""The library API refuses wrong inputs with errors that name the argument, and the FGD
score stays warning-free at any magnitude."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fgpu.model.types import InvalidRequestError, Request
from fgpu.plugins import create_policy
from fgpu.plugins.fgd import Fgd
from fgpu.sched import ClusterState, Placer, TargetWorkload, TaskType, Unschedulable
from tests.builders import cluster, node, pod

TARGET = TargetWorkload((TaskType(0, 500, 1, "", 1),))


def a_cluster() -> ClusterState:
    return cluster(node("n1").gpus(2, "A100-80GB"), node("n2").gpus(1, "T4"))


@pytest.mark.parametrize(
    ("target", "kind"),
    [([Request(gpu_count=1, gpu_milli=500)], "list"), ("fgd", "str"), (42, "int")],
    ids=["list-of-requests", "str", "int"],
)
@pytest.mark.parametrize("name", ["fgd", "best-fit"])
def test_create_policy_rejects_a_target_that_is_not_a_target_workload(
    name: str, target: object, kind: str
) -> None:
    with pytest.raises(ValueError, match=r"^target: must be a TargetWorkload") as caught:
        create_policy(name, target=target)  # type: ignore[arg-type]
    assert f"(got {kind})" in str(caught.value)
    assert "TargetWorkload.from_requests" in str(caught.value)


def test_create_policy_rejects_an_rng_that_is_not_a_generator() -> None:
    with pytest.raises(ValueError, match=r"^rng: must be a numpy.random.Generator \(got int\)"):
        create_policy("random", rng=7)  # type: ignore[arg-type]


def test_create_policy_accepts_a_target_workload_and_no_target() -> None:
    assert create_policy("fgd", target=TARGET).name == "fgd"
    assert create_policy("best-fit").name == "best-fit"


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        (
            "fgd",
            "must be a PlacementPolicy (got str); build it with "
            "fgpu.plugins.create_policy('fgd', ...)",
        ),
        (None, "must be a PlacementPolicy (got NoneType)"),
        (Fgd, "must be a PlacementPolicy (got ABCMeta)"),
    ],
    ids=["name", "none", "class-not-instance"],
)
def test_placer_rejects_a_policy_that_is_not_a_placement_policy(
    policy: object, reason: str
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Placer(a_cluster(), policy)  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.reason) == ("policy", reason)


def test_placer_rejects_a_state_that_is_not_a_cluster_state() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        Placer([node("n1").gpus(1).build()], create_policy("best-fit"))  # type: ignore[arg-type]
    assert str(caught.value) == "state: must be a ClusterState (got list)"


@pytest.mark.parametrize(
    "request_",
    [{"cpu_milli": 1000}, (1000, 1024, 1, 500), "0.5", None],
    ids=["dict", "tuple", "str", "none"],
)
@pytest.mark.parametrize("method", ["place", "choose"])
def test_placer_rejects_a_request_that_is_not_a_request(method: str, request_: object) -> None:
    state = a_cluster()
    placer = Placer(state, create_policy("best-fit"))
    with pytest.raises(InvalidRequestError) as caught:
        getattr(placer, method)(request_)
    assert caught.value.field == "request"
    assert caught.value.reason == (
        f"must be a Request (got {type(request_).__name__}: {request_!r})"
    )
    assert state.gpu_allocated_milli == 0


def test_placer_on_a_cluster_without_nodes_says_so() -> None:
    placer = Placer(ClusterState([]), create_policy("best-fit"))
    result = placer.place(pod().gpu(0.5).build())
    assert result == Unschedulable("0/0 nodes fit: no nodes in the cluster")


def test_placer_memory_request_larger_than_every_gpu() -> None:
    placer = Placer(a_cluster(), create_policy("best-fit"))
    result = placer.place(pod().gpu_memory("100GiB").build())
    assert result == Unschedulable(
        "0/2 nodes fit: 2 GPU memory too small (no GPU has 102400 MiB of memory)"
    )


def test_placer_matches_model_aliases_in_requests() -> None:
    state = cluster(node("n1").gpus(1, "A100-40GB"), node("n2").gpus(1, "A100-80GB"))
    placer = Placer(state, create_policy("best-fit"))
    on_40 = placer.place(Request(gpu_count=1, gpu_milli=500, gpu_models=frozenset({"A100"})))
    on_80 = placer.place(Request(gpu_count=1, gpu_milli=500, gpu_models={"a100-80gb"}))  # type: ignore[arg-type]
    assert (getattr(on_40, "node_name", on_40), getattr(on_80, "node_name", on_80)) == (
        "n1",
        "n2",
    )


def test_fgd_score_of_huge_fragmentation_changes_warns_nothing() -> None:
    policy = create_policy("fgd", target=TARGET)
    assert isinstance(policy, Fgd)
    measure = policy.measure(a_cluster())
    weight = measure.total_weight * 1000
    delta = np.array([-(10**12), -800 * weight, -5 * weight, 0, 5 * weight, 800 * weight, 10**12])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = policy._to_score(delta.astype(np.int64), measure)
    assert scores.tolist() == [0, 0, 0, 50, 99, 100, 100]
    with np.errstate(over="ignore"):  # the unclipped formula gives the same integers
        unclipped = np.floor(100.0 / (1.0 + np.exp(-delta / float(weight)))).astype(np.int64)
    assert scores.tolist() == unclipped.tolist()
