"""The API semantics the fgpu components rely on, checked through the official client.
They hold for the stand-in and for a real API server alike."""

from __future__ import annotations

import threading

import pytest

from fgpu.k8s.kube import KubeError
from tests.k8s.kube import create, pod, wait_until

pytestmark = pytest.mark.k8s


def lease(name: str, holder: str) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
    }


def test_a_stale_resource_version_is_a_conflict(cluster) -> None:
    made = cluster.api.create_lease(cluster.namespace, lease("l", "a"))
    first = dict(made, spec={**made["spec"], "holderIdentity": "b"})
    cluster.api.replace_lease(cluster.namespace, "l", first)
    second = dict(made, spec={**made["spec"], "holderIdentity": "c"})  # read before b wrote
    with pytest.raises(KubeError) as err:
        cluster.api.replace_lease(cluster.namespace, "l", second)
    assert err.value.status == 409
    assert cluster.api.get_lease(cluster.namespace, "l")["spec"]["holderIdentity"] == "b"
    with pytest.raises(KubeError) as again:
        cluster.api.create_lease(cluster.namespace, lease("l", "d"))
    assert again.value.reason == "AlreadyExists"


def test_uids_are_new_for_a_pod_created_again_under_the_same_name(cluster) -> None:
    first = create(cluster, pod("same", "0.5"))
    cluster.api.delete_pod(cluster.namespace, "same", grace_s=0)
    second = create(cluster, pod("same", "0.5"))
    assert first["metadata"]["uid"] != second["metadata"]["uid"]
    with pytest.raises(KubeError) as err:  # a binding meant for the first pod
        cluster.api.bind(cluster.namespace, "same", first["metadata"]["uid"], "n", {})
    assert err.value.status == 409


def test_label_and_field_selectors(cluster) -> None:
    create(cluster, pod("a", "0.5", labels={"team": "x", "tier": "1"}))
    create(cluster, pod("b", "0.5", labels={"team": "y"}))
    listed = cluster.api._call(
        cluster.api.core.list_namespaced_pod,
        cluster.namespace,
        label_selector="team in (x,z),tier",
    )
    assert [p["metadata"]["name"] for p in listed["items"]] == ["a"]
    unbound = cluster.api.list_pods("spec.nodeName=,spec.schedulerName=fgpu", cluster.namespace)
    assert sorted(p["metadata"]["name"] for p in unbound.items) == ["a", "b"]
    named = cluster.api.list_pods("metadata.name!=a", cluster.namespace)
    assert [p["metadata"]["name"] for p in named.items] == ["b"]


def test_a_watch_resumes_from_a_version_and_sees_changes_in_order(cluster) -> None:
    start = cluster.api.list_pods(namespace=cluster.namespace).resource_version
    create(cluster, pod("w", "0.5"))
    cluster.api.patch_pod(cluster.namespace, "w", {"metadata": {"annotations": {"k": "v"}}})
    cluster.api.delete_pod(cluster.namespace, "w", grace_s=0)
    seen: list[tuple[str, str]] = []

    def watch() -> None:
        for kind, obj in cluster.api.watch("pods", start, timeout_s=2):
            if obj["metadata"].get("namespace") == cluster.namespace:
                seen.append((kind, obj["metadata"]["name"]))
            if kind == "DELETED":
                return

    t = threading.Thread(target=watch)
    t.start()
    t.join(timeout=30)
    assert seen[0] == ("ADDED", "w")
    assert seen[-1] == ("DELETED", "w")
    assert ("MODIFIED", "w") in seen


def test_a_watch_from_a_compacted_version_is_gone(make_cluster) -> None:
    cluster = make_cluster()
    if cluster.real:
        pytest.skip("compaction on a real cluster is not under the test's control")
    cluster.standin.api.store.events = type(cluster.standin.api.store.events)(maxlen=5)
    start = cluster.api.list_pods().resource_version
    for i in range(8):
        create(cluster, pod(f"c-{i}", "0.5"))
    with pytest.raises(KubeError) as err:
        list(cluster.api.watch("pods", start, timeout_s=1))
    assert err.value.status == 410


def test_configmaps_go_with_their_owner_pod(cluster) -> None:
    owner = create(cluster, pod("owner", "0.5"))
    cluster.api.create_config_map(
        cluster.namespace,
        {
            "metadata": {
                "name": "env",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": "owner",
                        "uid": owner["metadata"]["uid"],
                    }
                ],
            },
            "data": {"A": "1"},
        },
    )
    cluster.api.delete_pod(cluster.namespace, "owner", grace_s=0)

    def collected() -> bool:
        try:
            cluster.api.get_config_map(cluster.namespace, "env")
        except KubeError as exc:
            if exc.status == 404:
                return True
            raise
        return False

    wait_until(collected, "the garbage collector to delete the owned ConfigMap")
