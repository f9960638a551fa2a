"""The node agent publishes its GPUs on its Node; the scheduler places on them; an agent
restart changes no running pod."""

from __future__ import annotations

import json

import pytest

from fgpu.agent.backend import SimulatedBackend
from fgpu.k8s import wire
from fgpu.k8s.agent import NodeAgent, PlacedContainer, select_gpus
from fgpu.k8s.scheduler import K8sScheduler
from tests.k8s.kube import MERGE_PATCH, assignment, create, pod

pytestmark = pytest.mark.k8s


class Recorder:
    def __init__(self) -> None:
        self.calls: list[list[PlacedContainer]] = []

    def sync(self, placed) -> None:
        self.calls.append(list(placed))


def bare_node(cluster, name: str) -> None:
    cluster.api.core.create_node({"metadata": {"name": name, "labels": {"fgpu.io/test": "true"}}})
    cluster.api.core.patch_node_status(
        name,
        {
            "status": {
                "allocatable": {"cpu": "32", "memory": "256Gi"},
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        },
        _content_type=MERGE_PATCH,
    )
    cluster.made_node(name)


def test_the_agent_publishes_its_gpus_and_the_scheduler_uses_them(cluster) -> None:
    bare_node(cluster, "gpu-1")
    backend = SimulatedBackend("4xA100-40GB")
    recorder = Recorder()
    agent = NodeAgent(cluster.agent_api("gpu-1"), "gpu-1", backend, enforcer=recorder)
    agent.publish()
    node = cluster.api.get_node("gpu-1")
    labels = node["metadata"]["labels"]
    assert labels[wire.MANAGED_LABEL] == "true"
    assert labels[wire.COUNT_LABEL] == "4"
    assert labels[wire.MODEL_LABEL] == "A100-40GB"
    inventory = wire.Inventory.from_json(node["metadata"]["annotations"][wire.INVENTORY])
    assert [g.uuid for g in inventory.gpus] == [d.uuid for d in backend.gpus()]
    create(cluster, pod("w", "0.5"))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    scheduler.sync()
    scheduler.run_once()
    placed = cluster.api.get_pod(cluster.namespace, "w")
    before = placed["metadata"]["resourceVersion"]
    assert assignment(placed).uuids[0] in {d.uuid for d in backend.gpus()}
    # the agent restarts: it publishes again and reports; the pod is not touched
    again = NodeAgent(
        cluster.agent_api("gpu-1"), "gpu-1", SimulatedBackend("4xA100-40GB"), enforcer=recorder
    )
    again.publish()
    again.report()
    after = cluster.api.get_pod(cluster.namespace, "w")
    assert after["metadata"]["resourceVersion"] == before
    assert [p.workload_id for p in recorder.calls[-1]] == [f"{cluster.namespace}/w"]
    assert recorder.calls[-1][0].assignment == assignment(after)
    assert recorder.calls[-1][0].squeezed_by == ()
    # squeezed (the scheduler's annotation): the enforcer is told by whom
    cluster.api.core.patch_namespaced_pod(
        "w",
        cluster.namespace,
        {"metadata": {"annotations": {wire.SQUEEZED_BY: f"{cluster.namespace}/svc"}}},
        _content_type=MERGE_PATCH,
    )
    again.report()
    assert recorder.calls[-1][0].squeezed_by == (f"{cluster.namespace}/svc",)
    usage = json.loads(cluster.api.get_node("gpu-1")["metadata"]["annotations"][wire.USAGE])
    assert set(usage["memory_mib"]) == {d.uuid for d in backend.gpus()}
    scheduler.sync()
    rnd, _ = scheduler.plan()
    assert [w.allocation is not None for w in rnd.workloads] == [True]


def test_an_agent_that_owns_some_gpus_publishes_only_those(cluster) -> None:
    bare_node(cluster, "shared")
    backend = SimulatedBackend("8xH100-80GB")
    agent = NodeAgent(cluster.agent_api("shared"), "shared", backend, gpus="4-7")
    agent.publish()
    node = cluster.api.get_node("shared")
    inventory = wire.Inventory.from_json(node["metadata"]["annotations"][wire.INVENTORY])
    assert [g.uuid for g in inventory.gpus] == [d.uuid for d in backend.gpus()[4:]]
    assert node["metadata"]["labels"][wire.COUNT_LABEL] == "4"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0-9", "no GPU 8"),
        ("x", "'x' is not an index"),
        ("1-", "'1-' is not an index"),
        ("3-1", "'3-1' is an empty range"),
    ],
)
def test_bad_gpu_selections_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        select_gpus(SimulatedBackend("8xH100-80GB").gpus(), spec)
