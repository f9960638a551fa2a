"""The real-cluster mode's own parts (:mod:`tests.k8s.realcluster`,
:mod:`tests.k8s.realupkeep`), checked over HTTP against the stand-in: the calls are the
ones they make to a kube-apiserver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fgpu.k8s.kube import KubeApi, KubeError, api_client
from fgpu.k8s.webhook_app import create_app
from fgpu_standin import Options, StandIn
from tests.k8s.conftest import DEPLOY, Served, fgpu_admission
from tests.k8s.realcluster import env_path_grant, install, token_api, webhook_mode
from tests.k8s.realupkeep import NODE_LEASES, NodeKeeper, Sweep, is_ready, rest

pytestmark = pytest.mark.k8s

LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASES}/leases"


@pytest.fixture
def admin() -> Iterator[KubeApi]:
    with StandIn(Options()) as standin:
        yield KubeApi(api_client(host=standin.url))


def node(admin: KubeApi, name: str, **spec: object) -> dict:
    made: dict = rest(admin, "POST", "/api/v1/nodes", {"metadata": {"name": name}, "spec": spec})
    return made


def test_a_kept_node_is_ready_untainted_and_its_lease_renewed(admin) -> None:
    not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    other = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    made = node(admin, "n1", taints=[not_ready, other])
    assert not is_ready(made)
    keeper = NodeKeeper(admin)
    keeper.keep("n1")
    got = rest(admin, "GET", "/api/v1/nodes/n1")
    assert is_ready(got)
    assert got["spec"]["taints"] == [other]  # only the lifecycle controller's taint lifted
    first = rest(admin, "GET", f"{LEASE}/n1")
    assert first["spec"]["holderIdentity"] == "n1"
    assert first["metadata"]["ownerReferences"][0]["uid"] == made["metadata"]["uid"]
    (beat,) = [c for c in got["status"]["conditions"] if c["type"] == "Ready"]
    keeper.beat()
    renewed = rest(admin, "GET", f"{LEASE}/n1")
    assert renewed["spec"]["renewTime"] > first["spec"]["renewTime"]
    again = rest(admin, "GET", "/api/v1/nodes/n1")
    (ready,) = [c for c in again["status"]["conditions"] if c["type"] == "Ready"]
    assert ready["lastTransitionTime"] == beat["lastTransitionTime"]  # no transition
    assert keeper.errors == []


def test_the_keeper_forgets_a_deleted_node(admin) -> None:
    node(admin, "n1")
    keeper = NodeKeeper(admin)
    keeper.keep("n1")
    rest(admin, "DELETE", "/api/v1/nodes/n1")
    keeper.beat()
    assert keeper.kept == {}
    assert keeper.errors == []


def test_the_sweep_deletes_what_the_test_added_and_nothing_else(admin) -> None:
    node(admin, "old")
    rest(admin, "POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
        "metadata": {"name": "old"}, "value": 1
    })  # fmt: skip
    sweep = Sweep(admin).note()
    node(admin, "new")
    NodeKeeper(admin).keep("new")
    rest(admin, "POST", "/api/v1/namespaces", {"metadata": {"name": "team-a"}})
    for namespace, name in (("team-a", "on-new"), ("default", "mine")):
        rest(
            admin,
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            {
                "metadata": {"name": name},
                "spec": {"nodeName": "new", "containers": [{"name": "c", "image": "x"}]},
            },
        )
    rest(admin, "POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
        "metadata": {"name": "new"}, "value": 2
    })  # fmt: skip
    rest(admin, "POST", "/api/v1/persistentvolumes", {
        "metadata": {"name": "pv"}, "spec": {"capacity": {"storage": "1Gi"}}
    })  # fmt: skip
    rest(admin, "POST", "/apis/fgpu.io/v1alpha1/queues", {
        "apiVersion": "fgpu.io/v1alpha1", "kind": "Queue", "metadata": {"name": "q"}, "spec": {}
    })  # fmt: skip
    gone = sweep.clean(["default"])
    assert sweep.problems == []
    assert sorted(gone) == [
        "Lease/new",
        "Namespace/team-a",
        "Node/new",
        "PersistentVolume/pv",
        "Pod/mine",
        "Pod/on-new",
        "PriorityClass/new",
        "Queue/q",
    ]
    assert [n["metadata"]["name"] for n in rest(admin, "GET", "/api/v1/nodes")["items"]] == ["old"]
    classes = rest(admin, "GET", "/apis/scheduling.k8s.io/v1/priorityclasses")["items"]
    assert [c["metadata"]["name"] for c in classes] == ["old"]
    assert rest(admin, "GET", "/api/v1/pods")["items"] == []
    assert sweep.clean() == []  # nothing left to do


def test_install_creates_then_replaces_and_names_what_it_wrote(admin) -> None:
    files = ["priorityclasses.yaml", "deviceclass.yaml"]
    first = install(admin, DEPLOY / "base", files)
    assert "DeviceClass/gpu.fgpu.io" in first
    assert "PriorityClass/fgpu-normal" in first
    assert install(admin, DEPLOY / "base", files) == first  # again: replaced, not refused


def test_a_refusal_comes_back_with_its_status_and_reason(admin) -> None:
    with pytest.raises(KubeError) as err:
        rest(admin, "GET", "/api/v1/nodes/missing")
    assert (err.value.status, err.value.reason) == (404, "NotFound")


def test_a_component_client_carries_its_token_and_no_other_credential(tmp_path: Path) -> None:
    from kubernetes import client

    source = client.Configuration()
    source.host = "https://127.0.0.1:6443"
    source.ssl_ca_cert = str(tmp_path / "ca.crt")
    source.cert_file = str(tmp_path / "admin.crt")  # the kubeconfig user's certificate
    source.key_file = str(tmp_path / "admin.key")
    made = token_api(KubeApi(client.ApiClient(source)), "t0ken").client.configuration
    assert (made.host, made.ssl_ca_cert) == (source.host, source.ssl_ca_cert)
    assert (made.cert_file, made.key_file) == (None, None)
    assert made.auth_settings()["BearerToken"]["value"] == "Bearer t0ken"


@pytest.mark.parametrize(
    ("app", "expected"),
    [
        (None, "none"),
        ({"env_without_isolation": True}, "env"),
        ({}, "dra"),
    ],
    ids=["no-webhook", "env", "dra"],
)
def test_the_webhook_mode_is_read_from_a_dry_run_pod(app, expected) -> None:
    if app is None:
        with StandIn(Options()) as standin:
            assert webhook_mode(KubeApi(api_client(host=standin.url)), "default") == expected
        return
    with (
        Served(create_app(**app)) as webhook,
        StandIn(Options(admission=fgpu_admission(webhook.url))) as standin,
    ):
        api = KubeApi(api_client(host=standin.url))
        assert webhook_mode(api, "default") == expected


def test_the_environment_path_grant_is_read_from_its_component() -> None:
    role, binding = env_path_grant(DEPLOY / "components" / "env-without-isolation")
    assert role["kind"] == "ClusterRole"
    assert [r["resources"] for r in role["rules"]] == [["configmaps"]]
    assert sorted(role["rules"][0]["verbs"]) == ["create", "delete", "get"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fgpu-scheduler", "namespace": "fgpu-system"}
    ]
