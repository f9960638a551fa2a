"""What ``kubectl`` needs of the API server, on the stand-in: discovery (read through the
official client's discovery calls), server-side field validation, ``Table`` answers,
event field selectors; and kubectl itself against the stand-in (skipped without it).
Also the ``fgpu k8s standin`` options that register webhooks and nodes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from fgpu.k8s import wire
from fgpu_standin.tables import human_duration
from tests.k8s.conftest import Cluster, free_port
from tests.k8s.kube import add_node, create, pod, wait_until

pytestmark = pytest.mark.k8s

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def standin_only(cluster: Cluster) -> str:
    if cluster.standin is None:
        pytest.skip("checks the stand-in's own answers")
    return cluster.standin.url


def test_discovery_through_the_official_client(cluster) -> None:
    from kubernetes import client

    standin_only(cluster)
    api = cluster.api.core.api_client
    core = client.CoreApi(api).get_api_versions()
    assert core.versions == ["v1"]
    groups = {
        g.name: g.preferred_version.version for g in client.ApisApi(api).get_api_versions().groups
    }
    assert groups == {
        "coordination.k8s.io": "v1",
        "node.k8s.io": "v1",
        "policy": "v1",
        "scheduling.k8s.io": "v1",
        "fgpu.io": "v1alpha1",
        "resource.k8s.io": "v1",
    }
    dra = client.ResourceV1Api(api).get_api_resources().resources
    assert {r.name for r in dra} == {
        "deviceclasses",
        "resourceslices",
        "resourceclaims",
        "resourceclaims/status",
        "resourceclaimtemplates",
    }
    resources = {r.name: r for r in client.CoreV1Api(api).get_api_resources().resources}
    assert resources["pods"].namespaced
    assert not resources["nodes"].namespaced
    assert resources["pods"].short_names == ["po"]
    assert resources["pods"].categories == ["all"]
    assert {"pods/binding", "pods/eviction", "pods/status", "nodes/status"} <= set(resources)
    queues = client.CustomObjectsApi(api).get_api_resources("fgpu.io", "v1alpha1").resources
    assert [(r.name, r.kind, r.short_names) for r in queues if "/" not in r.name] == [
        ("queues", "Queue", ["fq"])
    ]
    assert client.VersionApi(api).get_code().git_version == "v1.34.0-fgpu-standin"


def test_openapi_tells_kubectl_the_server_checks_fields(cluster) -> None:
    url = standin_only(cluster)
    root = httpx.get(f"{url}/openapi/v3").json()
    assert set(root["paths"]) == {
        "api/v1",
        "apis/coordination.k8s.io/v1",
        "apis/node.k8s.io/v1",
        "apis/policy/v1",
        "apis/scheduling.k8s.io/v1",
        "apis/fgpu.io/v1alpha1",
        "apis/resource.k8s.io/v1",
    }
    doc = httpx.get(url + root["paths"]["api/v1"]["serverRelativeURL"]).json()
    patch = doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert [p["name"] for p in patch["parameters"]] == ["fieldValidation"]
    assert httpx.get(f"{url}/openapi/v3/apis/nope/v1").status_code == 404


def misspelt() -> dict[str, Any]:
    body = pod("typo", "0.5")
    body["spec"]["containers"][0]["imagee"] = body["spec"]["containers"][0].pop("image")
    return body


def test_strict_field_validation_refuses_an_unknown_field(cluster) -> None:
    url = standin_only(cluster)  # (the official client itself refuses unknown fields)
    pods = f"{url}/api/v1/namespaces/default/pods"
    refused = httpx.post(f"{pods}?fieldValidation=Strict", json=misspelt(), timeout=10)
    assert refused.status_code == 400
    assert refused.json()["message"] == (
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
        'unknown field "spec.containers[0].imagee"'
    )
    assert cluster.api.list_pods(namespace="default").items == []
    assert httpx.post(f"{pods}?fieldValidation=Ignore", json=misspelt()).status_code == 201


def test_warn_field_validation_names_the_field_in_a_warning(cluster) -> None:
    url = standin_only(cluster)
    body = misspelt()
    body["status"] = {"phase": "Pending", "colour": "blue"}
    reply = httpx.post(
        f"{url}/api/v1/namespaces/default/pods?fieldValidation=Warn", json=body, timeout=10
    )
    assert reply.status_code == 201
    assert reply.headers["warning"] == (
        '299 - "unknown field \\"spec.containers[0].imagee\\"", '
        '299 - "unknown field \\"status.colour\\""'
    )


def test_tables_for_kubectl_get(cluster) -> None:
    url = standin_only(cluster)
    add_node(cluster, "n1", gpus=1)
    create(cluster, pod("a", "0.5"))
    made = create(cluster, pod("b", "0.5"))
    cluster.api.bind("default", "b", made["metadata"]["uid"], "n1", {})
    listed = httpx.get(f"{url}/api/v1/namespaces/default/pods", headers={"accept": TABLE}).json()
    assert listed["kind"] == "Table"
    assert [c["name"] for c in listed["columnDefinitions"]] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
        "IP",
        "Node",
        "Nominated Node",
        "Readiness Gates",
    ]
    assert [c["priority"] for c in listed["columnDefinitions"]] == [0] * 5 + [1] * 4
    cells = {r["cells"][0]: r["cells"] for r in listed["rows"]}
    assert cells["a"][1:4] == ["0/1", "Pending", 0]
    assert cells["a"][6] == "<none>"
    assert cells["b"][6] == "n1"
    assert listed["rows"][0]["object"]["metadata"]["name"] == "a"
    one = httpx.get(f"{url}/api/v1/nodes/n1", headers={"accept": TABLE}).json()
    assert one["rows"][0]["cells"][:3] == ["n1", "Ready", "<none>"]
    plain = httpx.get(f"{url}/api/v1/nodes/n1").json()
    assert plain["kind"] == "Node"  # without the Accept header: the object


def test_human_durations_read_as_kubectl_shows_them() -> None:
    assert [human_duration(s) for s in (-5, 0, 59, 119, 125, 600, 3 * 3600 + 60)] == [
        "<invalid>",
        "0s",
        "59s",
        "119s",
        "2m5s",
        "10m",
        "3h1m",
    ]
    assert [human_duration(h * 3600) for h in (30, 50, 24 * 30, 24 * 365 * 3)] == [
        "30h",
        "2d2h",
        "30d",
        "3y",
    ]


def test_events_are_selected_by_the_object_they_are_about(cluster) -> None:
    """What ``kubectl describe`` asks for; holds on a real API server too."""
    a = create(cluster, pod("a", "0.5"))
    create(cluster, pod("b", "0.5"))
    for name, uid in (("a", a["metadata"]["uid"]), ("b", "other")):
        cluster.api.create_event(
            cluster.namespace,
            {
                "metadata": {"generateName": f"{name}."},
                "involvedObject": {
                    "kind": "Pod",
                    "name": name,
                    "namespace": cluster.namespace,
                    "uid": uid,
                },
                "reason": "Test",
                "message": f"about {name}",
                "type": "Normal",
            },
        )
    selector = (
        f"involvedObject.name=a,involvedObject.namespace={cluster.namespace},"
        f"involvedObject.uid={a['metadata']['uid']}"
    )
    found = cluster.api._call(
        cluster.api.core.list_namespaced_event, cluster.namespace, field_selector=selector
    )
    assert [e["message"] for e in found["items"]] == ["about a"]


# -- kubectl itself --------------------------------------------------------------------------


def kubectl(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed")
    return subprocess.run(
        [path, "--server", url, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_kubectl_creates_lists_and_describes_pods_on_the_standin(cluster, tmp_path) -> None:
    url = standin_only(cluster)
    add_node(cluster, "n1", gpus=1)
    spec = tmp_path / "pod.yaml"
    spec.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p1\nspec:\n"
        "  containers:\n    - name: main\n      image: busybox\n"
    )
    made = kubectl(url, "create", "-f", str(spec))
    assert (made.returncode, made.stdout.strip()) == (0, "pod/p1 created"), made.stderr
    typo = kubectl(url, "create", "-f", "-", stdin=spec.read_text().replace("image:", "imagee:"))
    assert typo.returncode == 1
    assert 'strict decoding error: unknown field "spec.containers[0].imagee"' in typo.stderr
    listed = kubectl(url, "get", "pods", "-o", "wide")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == [
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "IP",
        "NODE",
        "NOMINATED",
        "NODE",
        "READINESS",
        "GATES",
    ]
    assert row.split()[:4] == ["p1", "0/1", "Pending", "0"]
    uid = cluster.api.get_pod("default", "p1")["metadata"]["uid"]
    cluster.api.bind("default", "p1", uid, "n1", {wire.GPU_UUIDS: "GPU-x"})
    cluster.api.create_event(
        "default",
        {
            "metadata": {"generateName": "p1."},
            "involvedObject": {"kind": "Pod", "name": "p1", "namespace": "default", "uid": uid},
            "reason": "Scheduled",
            "message": "assigned default/p1 to n1",
            "type": "Normal",
        },
    )
    described = kubectl(url, "describe", "pod", "p1")
    assert described.returncode == 0, described.stderr
    assert "Normal  Scheduled" in described.stdout
    assert "assigned default/p1 to n1" in described.stdout
    nodes = kubectl(url, "get", "nodes")
    assert nodes.stdout.splitlines()[1].split()[:2] == ["n1", "Ready"]
    everything = kubectl(url, "get", "all")
    assert everything.stdout.splitlines()[1].split()[0] == "p1", everything.stderr
    gone = kubectl(url, "delete", "pod", "p1")
    assert gone.returncode == 0, gone.stderr
    wait_until(lambda: not cluster.api.list_pods(namespace="default").items, "p1 to go")


# -- fgpu k8s standin ---------------------------------------------------------------------------


def standin_command(*args: str) -> tuple[int, str]:
    from typer.testing import CliRunner

    from fgpu.cli import app

    result = CliRunner().invoke(app, ["k8s", "standin", *args])
    return result.exit_code, result.output


WEBHOOK_YAML = Path(__file__).resolve().parents[2] / "deploy" / "base" / "webhook.yaml"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--webhook-service", "fgpu-system/fgpu-webhook=127.0.0.1:8443"],
            "--webhook-service: 'fgpu-system/fgpu-webhook=127.0.0.1:8443' is not "
            "NAMESPACE/NAME=URL",
        ),
        (["--webhook-ca", "ca.crt"], "--webhook-ca: give an --admission file too"),
        (["--admission", "/nonexistent/webhook.yaml"], "--admission: no file /nonexistent/"),
        (
            ["--admission", str(WEBHOOK_YAML.with_name("namespace.yaml"))],
            "namespace.yaml holds no webhook configuration or admission policy",
        ),
        (["--admission", str(Path(__file__))], "test_kubectl.py: expected '<document start>'"),
        (
            ["--admission", str(WEBHOOK_YAML), "--webhook-ca", "/nonexistent/ca.crt"],
            "--webhook-ca: no file /nonexistent/ca.crt",
        ),
    ],
)
def test_bad_standin_options_are_refused_naming_the_option(args, message) -> None:
    code, output = standin_command(*args)
    assert code == 2
    assert message in output


def test_the_standin_command_registers_nodes_and_calls_the_webhook(tmp_path: Path) -> None:
    from fgpu.k8s.kube import KubeApi, api_client
    from fgpu.k8s.webhook_app import create_app
    from tests.k8s.conftest import Served

    port = free_port()
    with Served(create_app(env_without_isolation=True)) as hook:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fgpu", "k8s", "standin", "--port", str(port),
             "--node", "a", "--node", "b", "--admission", str(WEBHOOK_YAML),
             "--webhook-service", f"fgpu-system/fgpu-webhook={hook.url}"],
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            banner = [proc.stderr.readline().strip() for _ in range(5)]
            assert banner == [
                f"TEST STAND-IN (not Kubernetes) serving on http://127.0.0.1:{port}",
                f"admission webhook pods.fgpu.io: {hook.url}/mutate",
                f"admission webhook pods.fgpu.io: {hook.url}/validate",
                "node: a (Ready)",
                "node: b (Ready)",
            ]
            api = KubeApi(api_client(host=f"http://127.0.0.1:{port}"))
            nodes = api.list_nodes().items
            assert [n["metadata"]["name"] for n in nodes] == ["a", "b"]
            assert nodes[0]["status"]["allocatable"] == {
                "cpu": "128",
                "memory": "1Ti",
                "pods": "110",
            }
            assert nodes[0]["status"]["conditions"][0]["type"] == "Ready"
            body = pod("p", "0.5")
            body["spec"].pop("schedulerName")
            made = api._call(api.core.create_namespaced_pod, "default", body)
            assert made["spec"]["schedulerName"] == "fgpu"  # the webhook admitted it
        finally:
            proc.terminate()
            proc.wait(timeout=30)
