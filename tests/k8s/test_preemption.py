"""Preemption through the Eviction API: PodDisruptionBudgets respected, the freed
capacity held for the preemptor on the GPU it can use."""

from __future__ import annotations

import pytest

from fgpu.k8s import wire
from fgpu.k8s.scheduler import K8sScheduler
from fgpu.sched.decide import SchedulerConfig
from tests.k8s.kube import add_node, assignment, bound, create, events, gpu_uuid, pod

pytestmark = pytest.mark.k8s

AT_ONCE = SchedulerConfig(preempt_delay_s=0.0)
"""Preemption at once: these tests are about whom preemption picks, not when (issue 28's
wait before evicting, 300 s by default, has its own scenarios in tests/scenario)."""


def round_(s: K8sScheduler) -> None:
    s.sync()
    s.run_once()


def test_a_high_priority_pod_evicts_a_low_one_and_gets_its_gpu(make_cluster) -> None:
    cluster = make_cluster(kubelet=False, graceful_delete=True)
    if cluster.real:
        pytest.skip("needs the stand-in's slow pod termination")
    add_node(cluster, "node-a", gpus=2)
    create(cluster, pod("low-0", "0.6", priority="low"))
    create(cluster, pod("normal-1", "0.6", priority="normal"))
    s = K8sScheduler(cluster.scheduler_api, env_without_isolation=True, config=AT_ONCE)
    round_(s)
    gpus = {p["metadata"]["name"]: assignment(p).uuids[0] for p in bound(cluster)}
    assert len(gpus) == 2
    create(cluster, pod("urgent", "0.6", priority="normal"))  # same priority: no victim
    create(cluster, pod("vip", "0.6", priority="90"))
    round_(s)
    victim = cluster.api.get_pod(cluster.namespace, "low-0")
    assert victim["metadata"].get("deletionTimestamp")  # evicted, still stopping
    vip = cluster.api.get_pod(cluster.namespace, "vip")
    assert not vip["spec"].get("nodeName")
    lost = {
        (m.labels["queue"], m.labels["reason"]): m.value
        for metric in s.metrics.events.gpu_seconds_lost.collect()
        for m in metric.samples
        if m.name.endswith("_total")
    }
    assert list(lost) == [("default", "preempt")]  # the victim's run, 0.6 GPU since its start
    assert lost["default", "preempt"] > 0.0
    hold = vip["metadata"]["annotations"][wire.HOLD]
    assert f'"victims":["{cluster.namespace}/low-0"]' in hold.replace(" ", "")
    # a new leader inherits the hold from the pod; the victim finally goes
    cluster.api.delete_pod(cluster.namespace, "low-0", grace_s=0)
    heir = K8sScheduler(cluster.scheduler_api, env_without_isolation=True, config=AT_ONCE)
    round_(heir)
    vip = cluster.api.get_pod(cluster.namespace, "vip")
    assert assignment(vip).uuids == (gpus["low-0"],)
    assert not cluster.api.get_pod(cluster.namespace, "urgent")["spec"].get("nodeName")
    assert [e["involvedObject"]["name"] for e in events(cluster, "Preempted")] == ["low-0"]


def test_a_disruption_budget_blocks_the_eviction_and_the_hold(make_cluster) -> None:
    cluster = make_cluster(kubelet=True)
    if cluster.real:
        pytest.skip("needs the stand-in's kubelet to make pods Running and Ready")
    add_node(cluster, "node-a", gpus=1)
    create(cluster, pod("guarded", "0.6", priority="low", labels={"app": "guarded"}))
    cluster.api._call(
        cluster.api.policy.create_namespaced_pod_disruption_budget,
        cluster.namespace,
        {
            "metadata": {"name": "keep-one"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    s = K8sScheduler(cluster.scheduler_api, env_without_isolation=True, config=AT_ONCE)
    round_(s)
    create(cluster, pod("vip", "0.6", priority="90"))
    round_(s)
    assert cluster.api.get_pod(cluster.namespace, "guarded")["status"]["phase"] == "Running"
    blocked = events(cluster, "PreemptionBlocked")
    assert len(blocked) == 1
    assert "disruption budget" in blocked[0]["message"]
    round_(s)  # the guarded pod is protected for a while: no new eviction attempt
    assert len(events(cluster, "PreemptionBlocked")) == 1
    vip = cluster.api.get_pod(cluster.namespace, "vip")
    assert not vip["spec"].get("nodeName")
    assert wire.HOLD not in vip["metadata"].get("annotations", {})
    assert gpu_uuid("node-a", 0) in {assignment(p).uuids[0] for p in bound(cluster)}


def test_a_queue_below_its_quota_reclaims_from_one_above_it(make_cluster) -> None:
    cluster = make_cluster()
    add_node(cluster, "node-a", gpus=2)
    for name, parent in (("org", None), ("team-a", "org"), ("team-b", "org")):
        spec: dict = {"quota": 2 if name == "org" else 1}
        if parent:
            spec["parent"] = parent
        cluster.api.create_queue(
            {
                "apiVersion": "fgpu.io/v1alpha1",
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": spec,
            }
        )
    create(cluster, pod("b-0", "1", queue="team-b"))
    create(cluster, pod("b-1", "1", queue="team-b"))
    s = K8sScheduler(cluster.scheduler_api, env_without_isolation=True, config=AT_ONCE)
    round_(s)
    assert len(bound(cluster)) == 2
    create(cluster, pod("a-0", "1", queue="team-a"))
    round_(s)  # b is above its fair share: one of its pods is evicted for a
    preempted = events(cluster, "Preempted")
    assert len(preempted) == 1
    assert f"reclaim by {cluster.namespace}/a-0" in preempted[0]["message"]
    round_(s)
    a0 = cluster.api.get_pod(cluster.namespace, "a-0")
    assert assignment(a0).queue == "team-a"
    assert sorted(p["metadata"]["name"] for p in bound(cluster)) == sorted(
        ["a-0", next(n for n in ("b-0", "b-1") if n != preempted[0]["involvedObject"]["name"])]
    )
