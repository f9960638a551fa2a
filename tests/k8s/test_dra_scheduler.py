"""Scenarios of the DRA path: the scheduler allocates ResourceClaims, the node's DRA driver
prepares them for the kubelet stand-in over gRPC, and each container gets only its own GPU.

Pods are made as the webhook makes them (:func:`fgpu.k8s.webhook.mutate`): a claim from the
namespace's ResourceClaimTemplate, which the stand-in's claim controller turns into a
ResourceClaim owned by the pod."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fgpu.k8s import claims, wire
from fgpu.k8s.dra import cdi
from fgpu.k8s.dra.driver import DraDriver
from fgpu.k8s.dra.share import DRIVER, device_name, share_of
from fgpu.k8s.kube import MERGE_PATCH
from fgpu.k8s.resourceapi import ResourceApi
from fgpu.k8s.scheduler import K8sScheduler
from fgpu.k8s.webhook import mutate
from fgpu_standin.kubelet import KubeletStandIn
from fgpu_standin.patch import json_patch
from tests.k8s.conftest import Cluster
from tests.k8s.kube import MODEL_MEMORY, add_node, bound, claims_made, gpu_uuid, pod, wait_until

pytestmark = pytest.mark.k8s


def claim_pod(name: str, gpu: str = "0.5", **annotations: str) -> dict[str, Any]:
    """An fgpu pod as the webhook admits it on the DRA path."""
    body = pod(name, gpu, **annotations)
    return json_patch(body, mutate(body))


def make(cluster: Cluster, body: dict[str, Any]) -> dict[str, Any]:
    """Create a pod admitted on the DRA path (a real cluster's own webhook, where it has
    one, admits it again: the DRA path's patch is idempotent, the environment path's is
    not, so a cluster whose webhook takes that path skips)."""
    cluster.require_webhook("dra", "none")
    out: dict[str, Any] = cluster.api._call(
        cluster.api.core.create_namespaced_pod, cluster.namespace, body
    )
    return out


def claim_of(cluster: Cluster, p: dict[str, Any]) -> dict[str, Any]:
    (status,) = p["status"]["resourceClaimStatuses"]
    return ResourceApi(cluster.api).get_claim(cluster.namespace, status["resourceClaimName"])


def round_(scheduler: K8sScheduler, cluster: Cluster) -> None:
    scheduler.sync()
    scheduler.run_once()  # creates the namespace's ResourceClaimTemplate
    wait_until(lambda: claims_made(cluster.api), "the claim controller to make the claims")
    scheduler.sync()
    scheduler.run_once()


def ledger(scheduler: K8sScheduler) -> dict[str, tuple[Any, ...]]:
    rnd, _ = scheduler.plan()
    return {
        w.id: (w.allocation.node_name, w.allocation.gpus, w.allocation.gpu_milli)
        for w in rnd.workloads
        if w.allocation is not None
    }


def inventory_of(node: str, gpus: int = 8) -> wire.Inventory:
    return wire.Inventory(
        tuple(
            wire.InventoryGpu(i, gpu_uuid(node, i), "A100-80GB", MODEL_MEMORY["A100-80GB"])
            for i in range(gpus)
        ),
        "simulated",
    )


@pytest.fixture
def host() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="fgpu-drs-"))  # short: Unix socket paths
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_sixteen_half_gpu_pods_get_claims_two_per_gpu_and_only_their_own_gpu(cluster, host) -> None:
    add_node(cluster, "node-a", gpus=8)
    layout = cdi.Layout(cdi_dir=host / "cdi", lib_dir=host / "lib", hint_dir=host / "hint")
    driver = DraDriver(
        ResourceApi(cluster.agent_api("node-a")),
        "node-a",
        lambda: inventory_of("node-a"),
        layout,
        registry_dir=host / "reg",
        plugin_dir=host / "plug",
        segment_dir=host / "seg",
    )
    driver.start()
    kubelet = KubeletStandIn(
        cluster.kubelet_api("node-a"),
        "node-a",
        host / "reg",
        [layout.cdi_dir],
        {"NVIDIA_VISIBLE_DEVICES": "all"},
    )
    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: make(cluster, claim_pod(f"half-{i:02d}")), range(16)))
        round_(K8sScheduler(cluster.scheduler_api), cluster)
        placed = bound(cluster)
        assert len(placed) == 16
        per_gpu: Counter[str] = Counter()
        for p in placed:
            claim = claim_of(cluster, p)
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["pool"]) == (DRIVER, "node-a")
            share = share_of(claim)
            assert share is not None
            assert (share.compute_milli, share.memory_mib) == (500, 40960)
            assert claim["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]
            assert claim["status"]["reservedFor"] == [
                {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
            ]
            per_gpu[result["device"]] += 1
        assert per_gpu == {device_name(gpu_uuid("node-a", i)): 2 for i in range(8)}

        kubelet.sync()
        assert kubelet.waiting == {}
        for p in placed:
            key = f"{cluster.namespace}/{p['metadata']['name']}"
            main = kubelet.containers[key]["main"]
            claim = claim_of(cluster, p)
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            spec = cdi.read_spec(cdi.spec_path(layout, claim["metadata"]["uid"]))
            env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
            gpu = next(
                u
                for u in (gpu_uuid("node-a", i) for i in range(8))
                if device_name(u) == result["device"]
            )
            assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == gpu
            assert main.env["NVIDIA_VISIBLE_DEVICES"] == gpu  # the claim's, not the image's
            index = int(gpu.rsplit("-", 1)[1])
            assert [n for n in main.device_nodes if n[-1].isdigit()] == [f"/dev/nvidia{index}"]
    finally:
        driver.stop()


def test_a_pod_of_a_restricted_namespace_runs_with_its_gpu(cluster, host) -> None:
    from tests.k8s.test_dra_webhook import restricted_pod, restricted_violations

    add_node(cluster, "node-a", gpus=1)
    layout = cdi.Layout(cdi_dir=host / "cdi", lib_dir=host / "lib", hint_dir=host / "hint")
    driver = DraDriver(
        ResourceApi(cluster.agent_api("node-a")),
        "node-a",
        lambda: inventory_of("node-a", 1),
        layout,
        registry_dir=host / "reg",
        plugin_dir=host / "plug",
        segment_dir=host / "seg",
    )
    driver.start()
    try:
        body = restricted_pod("locked")
        admitted = json_patch(body, mutate(body))
        assert restricted_violations(admitted) == []
        make(cluster, admitted)
        round_(K8sScheduler(cluster.scheduler_api), cluster)
        kubelet = KubeletStandIn(
            cluster.kubelet_api("node-a"), "node-a", host / "reg", [layout.cdi_dir]
        )
        kubelet.sync()
        got = cluster.api.get_pod(cluster.namespace, "locked")
        assert got["status"]["phase"] == "Running"
        main = kubelet.containers[f"{cluster.namespace}/locked"]["main"]
        assert main.env["CUDA_VISIBLE_DEVICES"] == gpu_uuid("node-a", 0)
        assert str(layout.hint_dir) in {m["containerPath"] for m in main.mounts}
    finally:
        driver.stop()


def test_a_pod_without_an_fgpu_claim_waits_saying_why(cluster) -> None:
    add_node(cluster, "node-a", gpus=2)
    make(cluster, pod("bare", "0.5"))  # not through the webhook: no claim
    scheduler = K8sScheduler(cluster.scheduler_api)
    round_(scheduler, cluster)
    got = cluster.api.get_pod(cluster.namespace, "bare")
    assert not got["spec"].get("nodeName")
    (cond,) = [c for c in got["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert cond["message"].startswith(
        f"no spec.resourceClaims entry {claims.POD_CLAIM!r} of ResourceClaimTemplate"
    )


def test_the_scheduler_makes_the_namespace_template_when_pods_name_it(cluster) -> None:
    add_node(cluster, "node-a", gpus=1)
    make(cluster, claim_pod("first"))
    scheduler = K8sScheduler(cluster.scheduler_api)
    scheduler.sync()
    scheduler.run_once()
    made = ResourceApi(cluster.api).get_claim_template(cluster.namespace, claims.TEMPLATE)
    request = made["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == DRIVER
    wait_until(lambda: claims_made(cluster.api), "the claim controller to make the claim")
    scheduler.sync()
    scheduler.run_once()
    assert [p["metadata"]["name"] for p in bound(cluster)] == ["first"]


def test_a_restarted_scheduler_reads_the_same_ledger_from_the_claims(cluster) -> None:
    add_node(cluster, "node-a", gpus=4)
    for i in range(6):
        make(cluster, claim_pod(f"p-{i}", "0.3"))
    first = K8sScheduler(cluster.scheduler_api)
    round_(first, cluster)
    assert len(bound(cluster)) == 6
    before = ledger(first)
    for p in bound(cluster):  # the annotation is gone (an admin without the webhook)
        cluster.api.core.patch_namespaced_pod(
            p["metadata"]["name"],
            cluster.namespace,
            {"metadata": {"annotations": {wire.ASSIGNMENT: None}}},
            _content_type=MERGE_PATCH,
        )
    second = K8sScheduler(cluster.scheduler_api)
    second.sync()
    assert ledger(second) == before
    rnd, _ = second.plan()
    second.check_state(rnd)


def test_deleted_pods_free_their_shares_also_while_the_scheduler_was_down(cluster) -> None:
    add_node(cluster, "node-a", gpus=2)
    for i in range(2):
        make(cluster, claim_pod(f"whole-{i}", "1"))
    first = K8sScheduler(cluster.scheduler_api)
    round_(first, cluster)
    assert len(bound(cluster)) == 2
    gone = claim_of(cluster, cluster.api.get_pod(cluster.namespace, "whole-0"))
    make(cluster, claim_pod("late", "1"))
    round_(first, cluster)
    assert not cluster.api.get_pod(cluster.namespace, "late")["spec"].get("nodeName")
    del first  # the scheduler is down; a pod is deleted meanwhile
    cluster.api.delete_pod(cluster.namespace, "whole-0", grace_s=0)
    resources = ResourceApi(cluster.api)
    wait_until(  # deallocated by the claim controller, then collected with its pod
        lambda: (
            gone["metadata"]["name"]
            not in {c["metadata"]["name"] for c in resources.list_claims(cluster.namespace).items}
        ),
        "the pod's claim to go",
    )
    second = K8sScheduler(cluster.scheduler_api)
    round_(second, cluster)
    late = cluster.api.get_pod(cluster.namespace, "late")
    assert late["spec"]["nodeName"] == "node-a"
    (result,) = claim_of(cluster, late)["status"]["allocation"]["devices"]["results"]
    assert result["device"] == device_name(gpu_uuid("node-a", 0))
