"""What the API server does besides storing objects, checked through the official client:
built-in admission (ServiceAccount, RuntimeClass), the decoding of custom objects and of
quantities, and the controllers' part (garbage collection, a deleted running pod
``Terminating`` until its kubelet finishes it). The stand-in imitates these
(:mod:`fgpu_standin.builtin`, :mod:`fgpu_standin.quantity`,
:mod:`fgpu_standin.controllers`); where it can, a test holds against a real API server too,
going by codes, reasons and fields rather than wording, and waiting for what a controller
does."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import kubernetes
import pytest

from fgpu.k8s.dra.slices import COMPUTE, mib_quantity
from fgpu.k8s.kube import KubeError
from fgpu.k8s.resourceapi import ResourceApi
from fgpu_standin.quantity import QuantityError, canonical
from tests.k8s.kube import add_node, create, pod, wait_until

pytestmark = pytest.mark.k8s


def refused(call: Any) -> KubeError:
    with pytest.raises(KubeError) as err:
        call()
    return err.value


def gone(read: Any) -> bool:
    """True once ``read()`` answers 404."""
    try:
        read()
    except KubeError as exc:
        if exc.status == 404:
            return True
        raise
    return False


# -- ServiceAccount admission --------------------------------------------------------------------


def test_a_pod_gets_the_default_service_account_and_a_missing_one_is_refused(cluster) -> None:
    made = create(cluster, pod("plain", "0.5"))
    assert made["spec"]["serviceAccountName"] == "default"
    body = pod("named", "0.5")
    body["spec"]["serviceAccountName"] = "nobody"
    err = refused(lambda: create(cluster, body))
    assert (err.status, err.reason) == (403, "Forbidden")
    assert "nobody" in err.message
    cluster.api._call(
        cluster.api.core.create_namespaced_service_account,
        cluster.namespace,
        {"metadata": {"name": "nobody"}},
    )
    assert create(cluster, body)["spec"]["serviceAccountName"] == "nobody"


# -- RuntimeClass admission ----------------------------------------------------------------------


@contextlib.contextmanager
def runtime_class(cluster, body: dict[str, Any]) -> Any:
    classes = kubernetes.client.NodeV1Api(cluster.api.client)
    cluster.api._call(
        classes.create_runtime_class,
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass"} | body,
    )
    try:
        yield
    finally:
        with contextlib.suppress(KubeError):
            cluster.api._call(classes.delete_runtime_class, body["metadata"]["name"])


def test_a_pod_naming_a_missing_runtime_class_is_refused(cluster) -> None:
    name = f"absent-{uuid.uuid4().hex[:6]}"
    body = pod("p", "0.5")
    body["spec"]["runtimeClassName"] = name
    err = refused(lambda: create(cluster, body))
    assert (err.status, err.reason) == (403, "Forbidden")
    assert name in err.message


def test_a_runtime_class_sets_overhead_and_scheduling_and_refuses_another_overhead(
    cluster,
) -> None:
    name = f"sandboxed-{uuid.uuid4().hex[:6]}"
    klass = {
        "metadata": {"name": name},
        "handler": "kata",
        "overhead": {"podFixed": {"cpu": "250m", "memory": "64Mi"}},
        "scheduling": {
            "nodeSelector": {"example.com/sandbox": "yes"},
            "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    with runtime_class(cluster, klass):
        body = pod("fits", "0.5")
        body["spec"]["runtimeClassName"] = name
        made = create(cluster, body)
        assert made["spec"]["overhead"] == {"cpu": "250m", "memory": "64Mi"}
        assert made["spec"]["nodeSelector"]["example.com/sandbox"] == "yes"
        assert {"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"} in made["spec"][
            "tolerations"
        ]
        other = pod("other", "0.5")
        other["spec"]["runtimeClassName"] = name
        other["spec"]["overhead"] = {"cpu": "1"}
        err = refused(lambda: create(cluster, other))
        assert (err.status, err.reason) == (403, "Forbidden")


def test_an_overhead_without_a_runtime_class_overhead_is_refused(cluster) -> None:
    body = pod("p", "0.5")
    body["spec"]["overhead"] = {"cpu": "250m"}
    err = refused(lambda: create(cluster, body))
    assert (err.status, err.reason) == (403, "Forbidden")


# -- custom objects and quantities ---------------------------------------------------------------


def test_a_custom_object_without_kind_or_api_version_is_a_bad_request(cluster) -> None:
    name = f"q-{uuid.uuid4().hex[:6]}"
    err = refused(lambda: cluster.api.create_queue({"metadata": {"name": name}, "spec": {}}))
    assert (err.status, err.reason) == (400, "BadRequest")
    assert "Kind" in err.message
    err = refused(
        lambda: cluster.api.create_queue({"kind": "Queue", "metadata": {"name": name}, "spec": {}})
    )
    assert (err.status, err.reason) == (400, "BadRequest")
    assert "apiVersion" in err.message
    queues = [q["metadata"]["name"] for q in cluster.api.list_queues().items]
    assert name not in queues  # nothing half-written


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        ("81920Mi", "80Gi"),
        ("1.5Gi", "1536Mi"),
        ("0.5Ki", "512"),  # a binary value below 1024 is written as a decimal one
        ("1536", "1536"),
        ("1.5", "1500m"),
        ("2000m", "2"),
        ("1000", "1k"),
        ("1024", "1024"),
        ("100m", "100m"),
        ("0.1m", "100u"),
        ("1e3", "1e3"),
        ("1000e0", "1e3"),
        ("0Mi", "0"),
        ("-1.5", "-1500m"),
        (2, "2"),
        (0.25, "250m"),
    ],
)
def test_canonical_quantities(written, stored) -> None:
    """Kubernetes API reference, "Quantity": no precision lost, no fractional digits, the
    largest suffix of the kind written (1.5 -> 1500m, 1.5Gi -> 1536Mi)."""
    assert canonical(written) == stored


@pytest.mark.parametrize("bad", ["", "Mi", "1.5Xi", "1..5", "one", "1 Gi", True, None])
def test_what_is_not_a_quantity(bad) -> None:
    with pytest.raises(QuantityError):
        canonical(bad)


def test_a_pod_with_a_bad_quantity_is_a_bad_request(cluster) -> None:
    body = pod("p", "0.5")
    body["spec"]["containers"][0]["resources"]["requests"]["memory"] = "lots"
    err = refused(lambda: create(cluster, body, admit=False))
    assert (err.status, err.reason) == (400, "BadRequest")


# -- controllers ---------------------------------------------------------------------------------


def test_a_deleted_nodes_resource_slices_are_collected(cluster) -> None:
    node = f"gc-{uuid.uuid4().hex[:6]}"
    add_node(cluster, node, gpus=1)
    owner = cluster.api.get_node(node)
    api = ResourceApi(cluster.api)
    ref = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner["metadata"]["uid"]}
    made = api.create_slice(
        {
            "metadata": {"name": f"{node}-gpu.fgpu.io", "ownerReferences": [ref]},
            "spec": {
                "driver": "gpu.fgpu.io",
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0"}],
            },
        }
    )
    name = made["metadata"]["name"]
    cluster.api.core.delete_node(node)
    wait_until(
        lambda: not any(s["metadata"]["name"] == name for s in api.list_slices().items),
        "the garbage collector to delete the Node's ResourceSlice",
    )


def test_a_dependent_with_another_owner_left_stays(cluster) -> None:
    first = create(cluster, pod("first", "0.5"))
    second = create(cluster, pod("second", "0.5"))
    refs = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": p["metadata"]["name"],
            "uid": p["metadata"]["uid"],
        }
        for p in (first, second)
    ]
    cluster.api.create_config_map(
        cluster.namespace, {"metadata": {"name": "shared", "ownerReferences": refs}, "data": {}}
    )
    cluster.api.delete_pod(cluster.namespace, "first", grace_s=0)

    def released() -> bool:
        owners = cluster.api.get_config_map(cluster.namespace, "shared")["metadata"].get(
            "ownerReferences"
        )
        return [r["name"] for r in owners or []] == ["second"]

    wait_until(released, "the garbage collector to drop the deleted owner's reference")
    cluster.api.delete_pod(cluster.namespace, "second", grace_s=0)
    wait_until(
        lambda: gone(lambda: cluster.api.get_config_map(cluster.namespace, "shared")),
        "the garbage collector to delete the ConfigMap once its last owner went",
    )


def test_a_deleted_running_pod_is_terminating_until_its_kubelet_finishes_it(make_cluster) -> None:
    cluster = make_cluster(kubelet=True)
    if cluster.real:
        pytest.skip("needs the stand-in's pretended kubelet (fake nodes run no kubelet)")
    add_node(cluster, "n1", gpus=1)
    made = create(cluster, pod("p", "0.5"))
    cluster.api.bind(cluster.namespace, "p", made["metadata"]["uid"], "n1", {})
    assert cluster.api.get_pod(cluster.namespace, "p")["status"]["phase"] == "Running"
    cluster.api.delete_pod(cluster.namespace, "p")
    terminating = cluster.api.get_pod(cluster.namespace, "p")  # at once: not gone yet
    assert terminating["metadata"]["deletionTimestamp"]
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    wait_until(
        lambda: gone(lambda: cluster.api.get_pod(cluster.namespace, "p")),
        "the kubelet to finish the deleted pod",
    )


@pytest.mark.parametrize("mib", [0, 1, 1000, 1024, 20480, 40960, 81920, 1536, 1024 * 1024])
def test_the_driver_writes_memory_as_the_api_server_stores_it(mib) -> None:
    """The DRA driver's slice reads back unchanged (else every pass would bump the pool's
    generation against a real API server)."""
    assert mib_quantity(mib) == canonical(f"{mib}Mi")
    assert canonical("1000") == COMPUTE
