"""fgpu checks what the kube-scheduler checks beyond resources and node constraints, with its
reasons, so that the kubelet or the volume binder never reject a pod fgpu placed.

Kubernetes semantics named in each test (Kubernetes documentation, "Scheduling Framework"
plugins and "Effective Pod requests and limits"):

- NodeResourcesFit: at most ``status.allocatable.pods`` unfinished pods on a node, any
  scheduler's (reason ``Too many pods``); the kubelet refuses more (``OutOfpods``).
- NodePorts: a ``hostPort`` is taken per protocol and host IP (``0.0.0.0`` overlaps all);
  restartable init containers' ports count (reason ``node(s) didn't have free ports for the
  requested pod ports``).
- VolumeBinding: a bound PersistentVolume's ``nodeAffinity.required`` must select the node
  (reason ``node(s) had volume node affinity conflict``); a missing claim:
  ``persistentvolumeclaim "NAME" not found``.
- Effective request: max(sum of containers and sidecars, each init container plus the
  sidecars before it) plus the pod's overhead from its RuntimeClass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from fgpu.k8s.kube import MERGE_PATCH, KubeError
from fgpu.k8s.objects import container_requests
from fgpu.k8s.parity import PORTS_TAKEN, TOO_MANY_PODS, VOLUME_CONFLICT
from fgpu.k8s.scheduler import K8sScheduler
from tests.k8s.conftest import Cluster
from tests.k8s.kube import add_node, create, pod
from tests.k8s.test_constraints import message, nodes_of, round_, with_spec

pytestmark = pytest.mark.k8s


def other_pod(cluster: Cluster, name: str, node: str, phase: str = "Running", **spec: Any) -> None:
    """A pod of another scheduler, already on ``node``."""
    body = {
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}], **spec},
    }
    cluster.api.core.create_namespaced_pod(cluster.namespace, body)
    cluster.api.core.patch_namespaced_pod_status(
        name, cluster.namespace, {"status": {"phase": phase}}, _content_type=MERGE_PATCH
    )


def set_allocatable_pods(cluster: Cluster, node: str, pods: int) -> None:
    cluster.api.core.patch_node_status(
        node, {"status": {"allocatable": {"pods": str(pods)}}}, _content_type=MERGE_PATCH
    )


def port(host_port: int, protocol: str = "TCP") -> list[dict[str, Any]]:
    return [{"containerPort": host_port, "hostPort": host_port, "protocol": protocol}]


def with_ports(body: dict[str, Any], ports: list[dict[str, Any]]) -> dict[str, Any]:
    body["spec"]["containers"][0]["ports"] = ports
    return body


def test_allocatable_pods_count_every_unfinished_pod_on_the_node(cluster) -> None:
    add_node(cluster, "node-a", gpus=2)
    set_allocatable_pods(cluster, "node-a", 3)
    other_pod(cluster, "daemon", "node-a")
    other_pod(cluster, "done", "node-a", phase="Succeeded")  # finished: not counted
    for i in range(3):
        create(cluster, pod(f"p-{i}", "0.25"))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(scheduler)
    # room for two more: the round's third placement is refused against the other two
    mine = {f"p-{i}" for i in range(3)}
    assert len(mine & set(nodes_of(cluster))) == 2
    (waiting,) = mine - set(nodes_of(cluster))
    assert message(cluster, waiting) == f"0/1 nodes fit: node-a: {TOO_MANY_PODS} (taken this round)"
    round_(scheduler)
    assert message(cluster, waiting) == (
        f"0/1 nodes fit: 1 excluded by the workload's node constraints (1 {TOO_MANY_PODS})"
    )


def test_host_ports_conflict_by_protocol_and_ip(cluster) -> None:
    add_node(cluster, "node-a", gpus=2)
    add_node(cluster, "node-b", gpus=2)
    other_pod(
        cluster, "ingress", "node-a", containers=[{"name": "c", "image": "x", "ports": port(8080)}]
    )
    create(cluster, with_ports(pod("web-1", "0.25"), port(8080)))
    create(cluster, with_ports(pod("web-2", "0.25"), port(8080)))
    create(cluster, with_ports(pod("dns", "0.25"), port(8080, "UDP")))  # another protocol
    sidecar = with_spec(
        pod("sidecar", "0.25"),
        initContainers=[
            {"name": "proxy", "image": "x", "restartPolicy": "Always", "ports": port(8080)}
        ],
    )
    create(cluster, sidecar)
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(scheduler)
    round_(scheduler)
    placed = nodes_of(cluster)
    del placed["ingress"]
    assert placed["dns"] in ("node-a", "node-b")
    taken_8080 = [n for n in ("web-1", "web-2", "sidecar") if n in placed]
    assert len(taken_8080) == 1  # node-b's 8080, the only one left
    assert placed[taken_8080[0]] == "node-b"
    for name in {"web-1", "web-2", "sidecar"} - set(taken_8080):
        assert message(cluster, name) == (
            f"0/2 nodes fit: 2 excluded by the workload's node constraints (2 {PORTS_TAKEN})"
        )


def test_pv_node_affinity_decides_the_node_and_a_missing_claim_waits(cluster) -> None:
    add_node(cluster, "node-a", gpus=2)
    add_node(cluster, "node-b", gpus=2)
    core = cluster.api.core

    def volume(name: str, node: str) -> None:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        core.create_persistent_volume(
            {
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "local": {"path": "/mnt/data"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
                },
            }
        )

    def claim(name: str, volume_name: str | None) -> None:
        spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        }
        if volume_name:
            spec["volumeName"] = volume_name
        core.create_namespaced_persistent_volume_claim(
            cluster.namespace, {"metadata": {"name": name}, "spec": spec}
        )

    volume("pv-b", "node-b")
    volume("pv-c", "node-c")  # a node fgpu does not have
    claim("on-b", "pv-b")
    claim("on-c", "pv-c")
    claim("unbound", None)

    def uses(name: str, claim_name: str) -> dict[str, Any]:
        vol = {"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}
        return with_spec(pod(name, "0.25"), volumes=[vol])

    for name, claim_name in (
        ("local", "on-b"),
        ("far", "on-c"),
        ("pending", "unbound"),
        ("lost", "nope"),
    ):
        create(cluster, uses(name, claim_name))
    round_(K8sScheduler(cluster.scheduler_api, env_without_isolation=True))
    assert nodes_of(cluster) == {"local": "node-b"}
    assert message(cluster, "far") == (
        f"0/2 nodes fit: 2 excluded by the workload's node constraints (2 {VOLUME_CONFLICT})"
    )
    assert message(cluster, "lost") == 'persistentvolumeclaim "nope" not found'
    assert message(cluster, "pending").startswith(
        'persistentvolumeclaim "unbound" is not bound to a volume yet; fgpu does not bind'
    )


@contextlib.contextmanager
def runtime_class(cluster: Cluster, name: str, overhead: dict[str, str]) -> Iterator[None]:
    """A RuntimeClass (cluster-scoped) with a fixed pod overhead while the test runs; the
    RuntimeClass admission plugin copies the overhead into the pods that name it."""
    classes = kubernetes.client.NodeV1Api(cluster.api.client)
    body = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name},
        "handler": name,
        "overhead": {"podFixed": overhead},
    }
    cluster.api._call(classes.create_runtime_class, body)
    try:
        yield
    finally:
        with contextlib.suppress(KubeError):
            cluster.api._call(classes.delete_runtime_class, name)


def test_overhead_and_sidecars_count_and_are_named_when_cpu_runs_out(cluster) -> None:
    add_node(cluster, "node-a", gpus=2, cpu="2")
    with runtime_class(cluster, "kata", {"cpu": "250m"}):
        _overhead_and_sidecars(cluster)


def _overhead_and_sidecars(cluster: Cluster) -> None:
    def sized(name: str) -> dict[str, Any]:
        body = pod(name, "0.25")
        body["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
        return with_spec(
            body,
            runtimeClassName="kata",  # its overhead (cpu 250m) is set by admission
            initContainers=[
                {
                    "name": "log",
                    "image": "x",
                    "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "500m"}},
                }
            ],
        )

    first = create(cluster, sized("first"))
    assert first["spec"]["overhead"] == {"cpu": "250m"}
    create(cluster, sized("second"))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(scheduler)
    assert list(nodes_of(cluster)) in (["first"], ["second"])
    (waiting,) = {"first", "second"} - set(nodes_of(cluster))
    said = message(cluster, waiting)
    assert "insufficient CPU (need 1750m)" in said
    assert said.endswith(
        "(requests include the pod overhead (cpu 250m) of its RuntimeClass and restartable "
        "init (sidecar) containers log)"
    )


def _c(cpu: str, **extra: Any) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}, **extra}


@pytest.mark.parametrize(
    ("spec", "cpu_milli"),
    [
        ({"containers": [_c("1")]}, 1000),
        ({"containers": [_c("1")], "initContainers": [_c("2")]}, 2000),
        ({"containers": [_c("1")], "initContainers": [_c("500m", restartPolicy="Always")]}, 1500),
        (
            {
                "containers": [_c("1")],
                "initContainers": [_c("500m", restartPolicy="Always"), _c("2")],
            },
            2500,
        ),
        (
            {
                "containers": [_c("1")],
                "initContainers": [_c("2"), _c("500m", restartPolicy="Always")],
            },
            2000,
        ),
        ({"containers": [_c("1")], "overhead": {"cpu": "100m"}}, 1100),
    ],
    ids=[
        "containers",
        "init-larger",
        "sidecar-adds",
        "init-after-sidecar",
        "init-before-sidecar",
        "overhead",
    ],
)
def test_effective_cpu_request(spec: dict[str, Any], cpu_milli: int) -> None:
    assert container_requests({"spec": spec})[0] == cpu_milli
