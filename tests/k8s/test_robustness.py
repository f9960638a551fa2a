"""What one bad object must not do to the others: a pod edited to an absurd value, a Queue
whose parent does not exist, a bound pod whose ledger annotation was removed by hand."""

from __future__ import annotations

from typing import Any

import pytest

from fgpu.k8s import wire
from fgpu.k8s.objects import PodRequestError, pod_ask, queue_tree
from fgpu.k8s.scheduler import K8sScheduler
from fgpu.sched.workload import QueueSpec
from tests.k8s.conftest import Cluster
from tests.k8s.kube import add_node, assignment, bound, create, pod

pytestmark = pytest.mark.k8s


def round_(s: K8sScheduler) -> None:
    s.sync()
    s.run_once()


def annotate(cluster: Cluster, name: str, notes: dict[str, str | None]) -> None:
    cluster.api.patch_pod(cluster.namespace, name, {"metadata": {"annotations": notes}})


def reason(cluster: Cluster, name: str) -> str:
    got = cluster.api.get_pod(cluster.namespace, name)
    cond = [c for c in got["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
    return str(cond[0]["message"]) if cond else ""


@pytest.mark.parametrize("key", [wire.GPU, wire.GPU_COUNT, wire.PRIORITY, wire.GPU_MEMORY])
def test_a_pod_edited_to_a_five_thousand_digit_number_stops_only_itself(cluster, key) -> None:
    add_node(cluster, "node-a", gpus=2)
    create(cluster, pod("edited", "9"))
    s = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(s)
    annotate(cluster, "edited", {key: "1" * 5000})
    create(cluster, pod("other", "0.25"))
    round_(s)
    assert [p["metadata"]["name"] for p in bound(cluster)] == ["other"]
    text = reason(cluster, "edited")
    assert text.startswith(f"bad request: {key}: ")
    assert any(
        words in text
        for words in ("too long", "positive whole number", "not a usable", "largest supported")
    )
    assert len(text) < 300  # the value is not echoed in full


def test_a_queue_with_a_missing_parent_leaves_the_other_queues_working(cluster) -> None:
    add_node(cluster, "node-a", gpus=2)
    for name, spec in (
        ("team-a", {"quota": 1}),
        ("ml-train", {"quota": 1, "parent": "research"}),  # research does not exist yet
        ("ml-infer", {"quota": 1, "parent": "ml-train"}),  # orphaned by ml-train
    ):
        cluster.api.create_queue(queue_object(name, **spec))
    create(cluster, pod("in-team-a", "1", queue="team-a"))
    create(cluster, pod("in-ml-infer", "1", queue="ml-infer"))
    s = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(s)
    assert [p["metadata"]["name"] for p in bound(cluster)] == ["in-team-a"]
    assert reason(cluster, "in-ml-infer") == (
        "queue 'ml-infer' is left out: its parent queue 'ml-train' is left out"
    )
    cluster.api.create_queue(queue_object("research", quota=1))
    round_(s)
    assert sorted(p["metadata"]["name"] for p in bound(cluster)) == ["in-ml-infer", "in-team-a"]


def queue(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def queue_object(name: str, **spec: Any) -> dict[str, Any]:
    """A Queue as a client posts it: a custom object says its ``apiVersion`` and ``kind``
    (the API server refuses one without, 400)."""
    return {"apiVersion": "fgpu.io/v1alpha1", "kind": "Queue", **queue(name, **spec)}


def test_bad_queues_are_left_out_with_their_descendants_and_a_reason() -> None:
    got = queue_tree(
        [
            queue("lab", quota=2),
            queue("a", quota=2, parent="lab"),
            queue("b", quota=1, parent="lab"),  # 3 > 2: both children left out
            queue("x", parent="y"),
            queue("y", parent="x"),  # a cycle
            queue("neg", quota=-1),
            queue("fine", quota=1),
        ],
        capacity_milli=8000,
    )
    assert sorted(got.tree.specs) == ["default", "fine", "lab"]
    assert (
        got.left_out["a"]
        == "the quotas of lab's children add up to 3000, above its 2000 (gpu_milli)"
    )
    assert got.left_out["b"] == got.left_out["a"]
    assert "cycle" in got.left_out["x"] or "cycle" in got.left_out["y"]
    assert set(got.left_out) == {"a", "b", "x", "y", "neg"}
    assert got.left_out["neg"].startswith("spec.quota")
    assert got.tree["lab"] == QueueSpec("lab", quota=got.tree["lab"].quota)


def test_removing_the_assignment_of_a_bound_pod_does_not_free_its_gpu(cluster) -> None:
    add_node(cluster, "node-a", gpus=1)
    create(cluster, pod("first", "0.5"))
    create(cluster, pod("second", "0.5"))
    s = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(s)
    assert len(bound(cluster)) == 2
    annotate(cluster, "first", {wire.ASSIGNMENT: None})
    annotate(cluster, "second", {wire.ASSIGNMENT: assignment_with(cluster, "second", milli=100)})
    create(cluster, pod("third", "0.5"))
    round_(s)
    round_(s)
    assert sorted(p["metadata"]["name"] for p in bound(cluster)) == ["first", "second"]
    assert "insufficient GPU" in reason(cluster, "third")


def assignment_with(cluster: Cluster, name: str, milli: int) -> str:
    a = assignment(cluster.api.get_pod(cluster.namespace, name))
    text = a.to_json().replace(f'"gpu_milli":[{a.gpu_milli[0]}]', f'"gpu_milli":[{milli}]')
    assert text != a.to_json()
    return text


@pytest.mark.parametrize(("value", "fgpu"), [(-100, 0), (0, 0), (100, 100), (10**9, 1000)])
def test_priority_class_values_outside_fgpus_range_are_clamped(value, fgpu) -> None:
    body = pod("p", "0.5")
    body["spec"]["priorityClassName"] = "some-class"
    body["spec"]["priority"] = value
    assert pod_ask(body).priority == fgpu


@pytest.mark.parametrize(
    ("notes", "field", "words"),
    [
        ({wire.GPU: "65"}, wire.GPU, "above the largest supported value 64"),
        ({wire.GPU: "1" * 50}, wire.GPU, "too long for a number"),
        ({wire.GPU: "0.5", wire.GPU_COUNT: "\u0662"}, wire.GPU_COUNT, "positive whole number"),
        ({wire.GPU: "0.5", wire.PRIORITY: "\u0665\u0660"}, wire.PRIORITY, "unknown priority"),
        ({wire.GPU: "0.5", wire.PRIORITY: "-1"}, wire.PRIORITY, "must not be negative"),
        ({wire.GPU: "0.5", wire.QUEUE: "Team_A"}, wire.QUEUE, "cannot name a Queue object"),
        ({wire.GPU: "0.5", wire.QUEUE: "a" * 254}, wire.QUEUE, "at most 253 characters"),
        ({wire.GPU: "0.5", wire.GPU_MEMORY: "9" * 60 + "Gi"}, wire.GPU_MEMORY, "too long"),
    ],
)
def test_bad_values_name_the_annotation_the_user_wrote(notes, field, words) -> None:
    body = pod("p", None)
    body["metadata"]["annotations"] = notes
    with pytest.raises(PodRequestError) as err:
        pod_ask(body)
    assert err.value.field == field
    assert words in err.value.reason


@pytest.mark.parametrize(
    ("notes", "message"),
    [
        ({wire.GPU: "-0.5"}, "fgpu.io/gpu: '-0.5': a GPU request must be positive"),
        ({wire.GPU: "0"}, "fgpu.io/gpu: '0': a GPU request must be positive"),
        *(
            ({wire.GPU: bad}, f"fgpu.io/gpu: {bad!r}: not a plain decimal number")
            for bad in ("abc", "", "NaN", "inf", "1/2", "50%", "500m", "1e9")
        ),
        ({wire.GPU: "0.0001"}, "fgpu.io/gpu: '0.0001': "),
        ({wire.GPU: "0.5", wire.GPU_MEMORY: "-5Gi"}, "fgpu.io/gpu-memory: '-5Gi': "),
        ({wire.GPU: "0.5", wire.GPU_MEMORY: "0"}, "fgpu.io/gpu-memory: '0': "),
        ({wire.GPU: "0.5", wire.PRIORITY: "-1"}, "fgpu.io/priority: '-1': "),
        (
            {wire.GPU: "0.5", wire.GPU_COUNT: "99999999999999999999999"},
            "fgpu.io/gpu-count: '99999999999999999999999' is above the largest supported value 64",
        ),
        (
            {wire.GPU: "0.5", wire.GPU_COUNT: "65"},
            "fgpu.io/gpu-count: '65' is above the largest supported value 64",
        ),
        ({wire.GPU: "0.5", wire.GPU_COUNT: "0"}, "fgpu.io/gpu-count: must be a positive whole"),
    ],
)
def test_refusals_echo_the_value_the_user_wrote(notes, message) -> None:
    body = pod("p", None)
    body["metadata"]["annotations"] = notes
    with pytest.raises(PodRequestError) as err:
        pod_ask(body)
    assert str(err.value).startswith(message), str(err.value)


def test_a_cordoned_node_is_named_in_the_reason_not_silently_left_out(cluster) -> None:
    add_node(cluster, "node-a", gpus=1)
    add_node(cluster, "node-b", gpus=4)
    cluster.api._call(
        cluster.api.core.patch_node,
        "node-b",
        {"spec": {"unschedulable": True}},
        _content_type="application/merge-patch+json",
    )
    create(cluster, pod("four", "4"))
    round_(K8sScheduler(cluster.scheduler_api, env_without_isolation=True))
    assert reason(cluster, "four") == (
        "0/1 nodes fit: 1 have fewer than 4 GPUs "
        "(and 1 fgpu node cordoned, not Ready or with an unreadable inventory)"
    )


def test_a_restarted_scheduler_reads_a_lost_assignment_back_from_the_pods_environment(
    cluster,
) -> None:
    add_node(cluster, "node-a", gpus=1)
    create(cluster, pod("first", "0.5"))
    create(cluster, pod("second", "0.5"))
    round_(K8sScheduler(cluster.scheduler_api, env_without_isolation=True))
    assert len(bound(cluster)) == 2
    # removed by someone the webhook trusts (or with no webhook in the way), then a new
    # scheduler that never saw the grant
    annotate(cluster, "first", {wire.ASSIGNMENT: None, wire.GPU_UUIDS: None})
    create(cluster, pod("third", "0.5"))
    heir = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(heir)
    round_(heir)
    assert sorted(p["metadata"]["name"] for p in bound(cluster)) == ["first", "second"]
    assert "insufficient GPU" in reason(cluster, "third")
