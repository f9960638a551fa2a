"""What installing fgpu on a cluster takes: the image definition, overlays that work from a
copy, webhook certificates without hand edits, a disruption budget for the webhook, and
PriorityClasses a managed cluster accepts.

No container engine runs here, so the Dockerfile is checked, not built: its instructions
parse, every file it copies is in the build context and not excluded by ``.dockerignore``,
and its entry point is the console script the manifests' arguments call.

Kubernetes semantics relied on:

- PriorityClass (scheduling.k8s.io/v1): names starting with ``system-`` are reserved, and a
  class that is not a system one may have a value of at most 1,000,000,000; managed
  clusters (GKE) admit ``system-node-critical``/``system-cluster-critical`` outside
  ``kube-system`` only through a ResourceQuota;
- cert-manager's CA injector fills a webhook configuration's ``caBundle`` from the
  Certificate named in its ``cert-manager.io/inject-ca-from`` annotation;
- the Eviction API refuses (429) an eviction that would break a PodDisruptionBudget's
  ``minAvailable`` ("API-initiated eviction"; node drains use it).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import shutil
import socket
import ssl
import subprocess
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest

from fgpu.k8s.kube import KubeError
from tests.k8s.kube import MERGE_PATCH, wait_until
from tests.k8s.test_manifests import DEPLOY, render

ROOT = DEPLOY.parent
MAX_USER_PRIORITY = 1_000_000_000


# ------------------------------------------------------------------------------ image
def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as ``(KEYWORD, arguments)``, continuation lines joined
    and comments dropped (the Dockerfile reference's syntax)."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends in a continuation"
    return out


def ignored(path: str) -> bool:
    """Whether ``.dockerignore`` leaves ``path`` out of the build context (its rules in
    order, ``!`` re-including, the last match winning)."""
    out = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes) or fnmatch.fnmatch(
            path, pattern.replace("**/", "*")
        ):
            out = not negate
    return out


def test_the_dockerfile_copies_only_what_is_in_the_build_context() -> None:
    steps = dockerfile()
    keywords = [k for k, _ in steps]
    known = {"ARG", "FROM", "RUN", "WORKDIR", "COPY", "ENV", "USER", "ENTRYPOINT", "CMD"}
    assert set(keywords) <= known
    assert keywords.count("FROM") == 2  # a build stage with a compiler, a slim final one
    copies = [shlex.split(a) for k, a in steps if k == "COPY" and not a.startswith("--from")]
    sources = [s for c in copies for s in c[:-1]]
    assert {"pyproject.toml", "README.md", "hatch_build.py", "native/", "src/"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert not ignored(source.rstrip("/")), f"COPY {source}: excluded by .dockerignore"
    for needed in ("native/build.py", "src/fgpu/cli/__init__.py", "src/fgpu/k8s/agent.py"):
        assert not ignored(needed), needed
    assert ignored("tests/k8s/test_install.py")  # the context stays small
    assert ignored("src/fgpu/_native/libfgpu.so")  # built inside, never copied from here
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (install,) = [a for k, a in steps if k == "RUN" and "pip install" in a]
    assert "'.[k8s]'" in install
    assert "nvidia-ml-py" in " ".join(pyproject["project"]["dependencies"])  # NVML, no driver
    entry = json.loads(dict(steps)["ENTRYPOINT"])
    assert entry == ["fgpu"]
    assert entry[0] in pyproject["project"]["scripts"]
    assert dict(steps)["USER"] == "65532:65532"


def test_every_component_the_manifests_run_is_a_command_of_the_image() -> None:
    from typer.testing import CliRunner

    from fgpu.cli import app

    objects = render(DEPLOY / "overlays" / "enforcing")
    runs = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0]
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet")
    }
    assert set(runs) == {"fgpu-scheduler", "fgpu-webhook", "fgpu-node-agent"}
    for name, container in runs.items():
        assert container["image"] == "registry.example.com/fgpu:0.1.0", name
        args = container["args"]
        command = [a for a in args if not a.startswith("-")][:2]
        result = CliRunner().invoke(app, [*command, "--help"])
        assert result.exit_code == 0, f"{name}: fgpu {' '.join(command)}: {result.output}"
    env = {e["name"]: e.get("value") for e in runs["fgpu-node-agent"]["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"  # the toolkit injects NVML
    assert runs["fgpu-node-agent"]["securityContext"]["runAsUser"] == 0


# --------------------------------------------------------------------------- overlays
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir())


@pytest.mark.parametrize("name", OVERLAYS)
def test_a_copied_overlay_renders_the_same_from_anywhere(name: str, tmp_path: Path) -> None:
    copy = tmp_path / "my-fgpu"
    shutil.copytree(DEPLOY / "overlays" / name, copy)
    text = (copy / "kustomization.yaml").read_text()
    assert "../../" in text
    # the one documented edit: point resources/components at an fgpu checkout by a relative
    # path (kustomize refuses absolute ones) or at a remote base URL; nothing else in the copy
    # refers to the repository
    where = os.path.relpath(DEPLOY, copy)
    (copy / "kustomization.yaml").write_text(text.replace("../../", f"{where}/"))
    assert render(copy) == render(DEPLOY / "overlays" / name)


# ------------------------------------------------------------------------------ certs
@pytest.mark.parametrize("name", OVERLAYS)
def test_the_webhook_certificate_needs_no_hand_edit(name: str) -> None:
    objects = render(DEPLOY / "overlays" / name)
    assert "caBundle" not in json.dumps(objects)  # no placeholder a Fail policy would trip on
    by = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    hooks = [o for o in objects if o["kind"].endswith("WebhookConfiguration")]
    assert hooks
    for hook in hooks:
        ref = hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        namespace, cert_name = ref.split("/")
        cert = by[("Certificate", cert_name)]
        assert cert["metadata"]["namespace"] == namespace
        for w in hook["webhooks"]:
            svc = w["clientConfig"]["service"]
            assert f"{svc['name']}.{svc['namespace']}.svc" in cert["spec"]["dnsNames"]
            assert ("Service", svc["name"]) in by
        issuer = by[("Issuer", cert["spec"]["issuerRef"]["name"])]
        ca = by[("Certificate", issuer["spec"]["ca"]["secretName"])]
        assert ca["spec"]["isCA"] is True
    deployment = by[("Deployment", "fgpu-webhook")]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == cert["spec"]["secretName"]


# -------------------------------------------------------------------- priority classes
@pytest.mark.parametrize("name", OVERLAYS)
def test_priority_classes_are_ones_a_managed_cluster_accepts(name: str) -> None:
    objects = render(DEPLOY / "overlays" / name)
    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PriorityClass"}
    for class_name, obj in classes.items():
        assert not class_name.startswith("system-"), class_name
        assert obj["value"] <= MAX_USER_PRIORITY, class_name
    for o in objects:
        if o["kind"] in ("Deployment", "DaemonSet"):
            used = o["spec"]["template"]["spec"].get("priorityClassName")
            assert used in classes, f"{o['metadata']['name']}: {used} is not defined here"


def test_the_stand_in_refuses_what_the_api_server_refuses_and_takes_fgpu_classes(
    cluster,
) -> None:
    objects = render(DEPLOY / "base")
    for obj in objects:
        if obj["kind"] == "PriorityClass":
            created = cluster.api._call(
                _scheduling(cluster).create_priority_class, obj
            )  # as kubectl apply would
            assert created["value"] == obj["value"]
    if cluster.real:
        return
    for bad, reason in (
        ({"metadata": {"name": "system-mine"}, "value": 10}, "'system-' prefix are reserved"),
        ({"metadata": {"name": "too-high"}, "value": MAX_USER_PRIORITY + 1}, "1000000000"),
    ):
        with pytest.raises(KubeError) as err:
            cluster.api._call(_scheduling(cluster).create_priority_class, bad)
        assert err.value.status == 422
        assert reason in err.value.message


def _scheduling(cluster) -> Any:
    from kubernetes import client

    return client.SchedulingV1Api(cluster.api.client)


# ------------------------------------------------------------------------------- PDB
def test_the_webhook_budget_keeps_one_replica_through_a_drain(make_cluster) -> None:
    cluster = make_cluster(kubelet=True)
    if cluster.real:
        pytest.skip("creates webhook-labelled pods")
    (budget,) = [o for o in render(DEPLOY / "base") if o["kind"] == "PodDisruptionBudget"]
    budget["metadata"]["namespace"] = cluster.namespace
    from kubernetes import client

    client.PolicyV1Api(cluster.api.client).create_namespaced_pod_disruption_budget(
        cluster.namespace, budget
    )
    labels = budget["spec"]["selector"]["matchLabels"]
    cluster.api.core.create_node({"metadata": {"name": "n1"}})
    cluster.api.core.patch_node_status(
        "n1",
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        _content_type=MERGE_PATCH,
    )
    uids = {}
    for i in range(2):
        made = cluster.api.core.create_namespaced_pod(
            cluster.namespace,
            {
                "metadata": {"name": f"webhook-{i}", "labels": labels},
                "spec": {"containers": [{"name": "w", "image": "fgpu"}]},
            },
        )
        uids[i] = made.metadata.uid
        cluster.api.bind(cluster.namespace, f"webhook-{i}", uids[i], "n1", {})

    def running() -> int:
        pods = cluster.api.list_pods(namespace=cluster.namespace).items
        return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")

    wait_until(lambda: running() == 2, "both webhook pods running")
    cluster.api.evict(cluster.namespace, "webhook-0", uids[0])  # the first may go
    wait_until(lambda: running() == 1, "one webhook pod left")
    with pytest.raises(KubeError) as err:
        cluster.api.evict(cluster.namespace, "webhook-1", uids[1])
    assert err.value.status == 429  # the last one stays: the budget says minAvailable 1


# ------------------------------------------------------------------ certificate renewal
def _pair(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def _served_cert(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_webhook_serves_a_renewed_certificate_without_a_restart(tmp_path: Path) -> None:
    """cert-manager renews the Secret and the kubelet updates the mounted files; the
    webhook's next handshakes present the new certificate (a pair that does not match is
    refused and the old one kept)."""
    from fgpu.k8s.webhook_app import make_server
    from tests.k8s.conftest import free_port

    mounted = tmp_path / "tls"
    mounted.mkdir()
    old_cert, old_key = _pair(tmp_path, "old")
    new_cert, new_key = _pair(tmp_path, "new")
    shutil.copy(old_cert, mounted / "tls.crt")
    shutil.copy(old_key, mounted / "tls.key")
    port = free_port()
    server, reloader = make_server(
        "127.0.0.1", port, str(mounted / "tls.crt"), str(mounted / "tls.key")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "the webhook serving")
        first = _served_cert(port)
        assert reloader.check() is False  # nothing changed
        shutil.copy(new_cert, mounted / "tls.crt")  # a half-written pair: cert without key
        assert reloader.check() is False
        assert _served_cert(port) == first
        shutil.copy(new_key, mounted / "tls.key")
        assert reloader.check() is True
        renewed = _served_cert(port)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert renewed != first
    assert renewed == ssl.PEM_cert_to_DER_cert(new_cert.read_text())
