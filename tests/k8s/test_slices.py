"""The node's ResourceSlice: owned by its Node (gone with it), and read back to see whether
the API server kept ``allowMultipleAllocations`` (dropped before Kubernetes 1.36)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fgpu.k8s.dra.slices import SHARING_DROPPED, SlicePublisher, resource_slice, slice_name
from fgpu.k8s.resourceapi import ResourceApi
from tests.k8s.conftest import Cluster
from tests.k8s.kube import wait_until
from tests.k8s.test_agent import bare_node
from tests.k8s.test_dra_driver import NODE
from tests.k8s.test_dra_driver import inventory as driver_inventory

pytestmark = pytest.mark.k8s


def node_events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    out = cluster.api._call(cluster.api.core.list_namespaced_event, "default")
    return [e for e in out["items"] if e.get("reason") == reason]


def publish_where_sharing_is_dropped(
    cluster: Cluster, api: Any = None
) -> tuple[SlicePublisher, dict[str, Any]]:
    """Publish two GPUs on a server without ``DRAConsumableCapacity`` (1.34, 1.35)."""
    bare_node(cluster, NODE)
    slices = SlicePublisher(ResourceApi(api or cluster.api), NODE)
    return slices, slices.publish(driver_inventory(2))


def test_a_slice_is_owned_by_its_node_and_goes_with_it(cluster) -> None:
    bare_node(cluster, NODE)
    uid = cluster.api.get_node(NODE)["metadata"]["uid"]
    old = resource_slice(NODE, driver_inventory(2), 1)  # as an older agent wrote it
    ResourceApi(cluster.api).create_slice(old)
    slices = SlicePublisher(ResourceApi(cluster.api), NODE)
    made = slices.publish(driver_inventory(2))
    assert made["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid, "controller": True}
    ]
    assert made["spec"]["pool"]["generation"] == 1  # the same devices: the same generation
    assert slices.publish(driver_inventory(2)) == made  # nothing to write
    cluster.api.core.delete_node(NODE)
    wait_until(  # the garbage collector deletes it in its own time
        lambda: ResourceApi(cluster.api).list_slices(f"spec.nodeName={NODE}").items == [],
        "the garbage collector to delete the deleted Node's slice",
    )


def test_a_server_that_drops_allow_multiple_allocations_is_told_once_on_the_node(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(consumable_capacity=False)
    if cluster.real:
        pytest.skip("a stand-in that stores slices as Kubernetes 1.34 does")
    slices, stored = publish_where_sharing_is_dropped(cluster)
    sent = resource_slice(NODE, driver_inventory(2), 1)["spec"]["devices"]
    assert all(d["allowMultipleAllocations"] for d in sent)
    assert all("allowMultipleAllocations" not in d for d in stored["spec"]["devices"])
    assert slices.sharing_dropped == [d["name"] for d in sent]
    (event,) = node_events(cluster, SHARING_DROPPED)
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "Node"
    assert event["involvedObject"]["name"] == NODE
    assert event["message"].startswith(
        f"the API server dropped allowMultipleAllocations from 2 device(s) of ResourceSlice "
        f"{slice_name(NODE)} (Kubernetes before 1.36, or the DRAConsumableCapacity feature "
        "gate off)"
    )
    assert "docs/kubernetes.md" in event["message"]
    assert slices.publish(driver_inventory(2)) == stored  # unchanged: nothing written
    grown = slices.publish(driver_inventory(3))  # a new generation, still dropped: said once
    assert grown["spec"]["pool"]["generation"] == 2
    assert len(node_events(cluster, SHARING_DROPPED)) == 1


def test_a_server_that_keeps_allow_multiple_allocations_says_nothing(cluster) -> None:
    slices, stored = publish_where_sharing_is_dropped(cluster)
    assert all(d["allowMultipleAllocations"] for d in stored["spec"]["devices"])
    assert slices.sharing_dropped == []
    assert node_events(cluster, SHARING_DROPPED) == []
