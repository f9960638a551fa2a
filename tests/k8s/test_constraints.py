"""Node selectors, required node affinity and taints of fgpu pods, honoured in placement and
in preemption (a preemptor frees capacity only where it may run)."""

from __future__ import annotations

from typing import Any

import pytest

from fgpu.k8s.kube import MERGE_PATCH
from fgpu.k8s.scheduler import K8sScheduler
from fgpu.sched.decide import SchedulerConfig
from tests.k8s.conftest import Cluster
from tests.k8s.kube import add_node, assignment, bound, create, events, pod

pytestmark = pytest.mark.k8s

AT_ONCE = SchedulerConfig(preempt_delay_s=0.0)
"""Preemption at once: these tests are about whom preemption picks, not when (issue 28's
wait before evicting, 300 s by default, has its own scenarios in tests/scenario)."""


def label(cluster: Cluster, node: str, **labels: str) -> None:
    cluster.api.patch_node(node, {"metadata": {"labels": labels}})


def taint(cluster: Cluster, node: str, *taints: dict[str, str]) -> None:
    cluster.api._call(
        cluster.api.core.patch_node,
        node,
        {"spec": {"taints": list(taints)}},
        _content_type=MERGE_PATCH,
    )


def with_spec(body: dict[str, Any], **spec: Any) -> dict[str, Any]:
    body["spec"].update(spec)
    return body


def round_(s: K8sScheduler) -> None:
    s.sync()
    s.run_once()


def nodes_of(cluster: Cluster) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in bound(cluster)}


def message(cluster: Cluster, name: str) -> str:
    got = cluster.api.get_pod(cluster.namespace, name)
    cond = [c for c in got["status"]["conditions"] if c["type"] == "PodScheduled"]
    return str(cond[0]["message"])


def test_selector_affinity_and_taints_decide_the_node(cluster) -> None:
    for name in ("node-a", "node-b", "node-c"):
        add_node(cluster, name, gpus=2)
    label(cluster, "node-a", pool="train", zone="1")
    label(cluster, "node-b", pool="serve", zone="2")
    label(cluster, "node-c", pool="serve", zone="3")
    taint(cluster, "node-c", {"key": "dedicated", "value": "inference", "effect": "NoSchedule"})
    create(cluster, with_spec(pod("by-selector", "0.5"), nodeSelector={"pool": "train"}))
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "Gt", "values": ["1"]}]}
                ]
            }
        }
    }
    # zone > 1 is node-b or node-c; node-c's taint is not tolerated
    create(cluster, with_spec(pod("by-affinity", "0.5"), affinity=affinity))
    toleration = {"key": "dedicated", "operator": "Equal", "value": "inference"}
    create(
        cluster,
        with_spec(
            pod("tolerant", "0.5"),
            nodeSelector={"zone": "3"},
            tolerations=[toleration],
        ),
    )
    # untolerated everywhere it may go: waits, and says why per node
    create(cluster, with_spec(pod("intolerant", "0.5"), nodeSelector={"zone": "3"}))
    s = K8sScheduler(
        cluster.scheduler_api, env_without_isolation=True, config=AT_ONCE, policy="best-fit"
    )
    round_(s)
    assert nodes_of(cluster) == {
        "by-selector": "node-a",
        "by-affinity": "node-b",
        "tolerant": "node-c",
    }
    assert message(cluster, "intolerant") == (
        "0/3 nodes fit: 3 excluded by the workload's node constraints (2 did not match the "
        "pod's node selector or affinity, 1 has the untolerated taint "
        "dedicated=inference:NoSchedule)"
    )


def test_pods_without_constraints_stay_off_tainted_nodes(cluster) -> None:
    add_node(cluster, "node-a", gpus=1)
    add_node(cluster, "node-b", gpus=1)
    taint(cluster, "node-b", {"key": "maintenance", "effect": "NoExecute"})
    for i in range(2):
        create(cluster, pod(f"whole-{i}", "1"))
    s = K8sScheduler(cluster.scheduler_api, env_without_isolation=True, config=AT_ONCE)
    round_(s)
    assert list(nodes_of(cluster).values()) == ["node-a"]
    waiting = next(n for n in ("whole-0", "whole-1") if n not in nodes_of(cluster))
    assert "1 has the untolerated taint maintenance:NoExecute" in message(cluster, waiting)
    # a PreferNoSchedule taint is a preference, not a filter: taking the taint's effect down
    # to it lets the waiting pod in
    taint(cluster, "node-b", {"key": "maintenance", "effect": "PreferNoSchedule"})
    round_(s)
    assert sorted(nodes_of(cluster).values()) == ["node-a", "node-b"]


def test_preemption_frees_capacity_only_where_the_preemptor_may_run(make_cluster) -> None:
    cluster = make_cluster(kubelet=False, graceful_delete=True)
    if cluster.real:
        pytest.skip("needs the stand-in's slow pod termination")
    add_node(cluster, "node-a", gpus=1)
    add_node(cluster, "node-b", gpus=1)
    label(cluster, "node-a", pool="batch")
    label(cluster, "node-b", pool="vip")
    # the pod on node-a is the better victim by the other rules (the lowest priority)
    create(
        cluster, with_spec(pod("lowest", "1", priority="very-low"), nodeSelector={"pool": "batch"})
    )
    s = K8sScheduler(
        cluster.scheduler_api, env_without_isolation=True, config=AT_ONCE, policy="best-fit"
    )
    round_(s)
    create(cluster, pod("low", "1", priority="low"))
    round_(s)
    assert nodes_of(cluster) == {"lowest": "node-a", "low": "node-b"}
    create(cluster, with_spec(pod("vip", "1", priority="90"), nodeSelector={"pool": "vip"}))
    round_(s)
    assert [e["involvedObject"]["name"] for e in events(cluster, "Preempted")] == ["low"]
    vip = cluster.api.get_pod(cluster.namespace, "vip")
    assert '"node":"node-b"' in vip["metadata"]["annotations"]["fgpu.io/hold"].replace(" ", "")
    cluster.api.delete_pod(cluster.namespace, "low", grace_s=0)
    round_(s)
    vip = cluster.api.get_pod(cluster.namespace, "vip")
    assert vip["spec"]["nodeName"] == "node-b"
    assert assignment(vip).node == "node-b"
