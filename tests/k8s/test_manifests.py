"""deploy/: every kustomize base and overlay renders with ``kubectl kustomize``, and every
rendered object deserialises into the official client's models without losing a field
(a misspelt or misplaced field would be dropped and the round trip would differ)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fgpu.k8s.objects import queue_spec
from fgpu.sched.workload import PRIORITY_CLASSES

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
TARGETS = [DEPLOY / "base", *sorted((DEPLOY / "overlays").iterdir())]
KUBECTL = shutil.which("kubectl")


def render(folder: Path) -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed (it renders the kustomizations)")
    out = subprocess.run(
        [KUBECTL, "kustomize", str(folder)], check=True, capture_output=True, text=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def model_name(obj: dict[str, Any]) -> str:
    version = obj["apiVersion"].rsplit("/", 1)[-1]
    return version[0].upper() + version[1:] + obj["kind"]


def normal(value: Any) -> Any:
    """JSON with empty maps and lists dropped (the client drops them too)."""
    if isinstance(value, dict):
        out = {k: normal(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in ({}, [], None)}
    if isinstance(value, list):
        return [normal(v) for v in value]
    return value


@pytest.mark.parametrize("folder", TARGETS, ids=[p.name for p in TARGETS])
def test_every_rendered_object_deserialises_into_the_client_models(folder: Path) -> None:
    from kubernetes import client

    objects = render(folder)
    api = client.ApiClient()
    kinds = {o["kind"] for o in objects}
    assert {
        "CustomResourceDefinition",
        "PriorityClass",
        "ClusterRole",
        "Deployment",
        "DaemonSet",
        "MutatingWebhookConfiguration",
        "Service",
        "DeviceClass",
    } <= kinds
    for obj in objects:
        if obj["apiVersion"].startswith("cert-manager.io/"):
            continue  # cert-manager's resources: no model in the client (test_install.py)
        name = model_name(obj)
        assert hasattr(client, name), f"no client model {name} for {obj['kind']}"
        model = api.deserialize(json.dumps(obj), name, "application/json")
        back = api.sanitize_for_serialization(model)
        assert normal(back) == normal(obj), f"{obj['kind']} {obj['metadata']['name']} changed"


def test_priority_classes_match_the_design() -> None:
    objects = render(DEPLOY / "base")
    classes = {o["metadata"]["name"]: o["value"] for o in objects if o["kind"] == "PriorityClass"}
    components = {"fgpu-node-critical", "fgpu-cluster-critical"}  # fgpu's own pods
    assert set(classes) - components == {f"fgpu-{k}" for k in PRIORITY_CLASSES}
    assert {k: classes[f"fgpu-{k}"] for k in PRIORITY_CLASSES} == PRIORITY_CLASSES


def test_the_queue_schema_names_the_fields_the_scheduler_reads() -> None:
    objects = render(DEPLOY / "base")
    crd = next(o for o in objects if o["kind"] == "CustomResourceDefinition")
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]
    assert set(props) == {
        "quota",
        "limit",
        "overQuotaWeight",
        "priority",
        "parent",
        "namespaces",  # fgpu.k8s.tenancy
        "nonPreemptible",
        "squeeze",
    }
    spec = queue_spec(
        {
            "metadata": {"name": "team-a"},
            "spec": {
                "quota": 1.5,
                "limit": 4,
                "overQuotaWeight": 2,
                "priority": 1,
                "parent": "org",
                "squeeze": False,
            },
        }
    )
    assert spec.squeeze is False
    assert spec.quota.gpu_milli == 1500
    assert spec.over_quota_weight == 2
    assert spec.parent == "org"


def _rules(objects: list[dict[str, Any]], role: str) -> set[tuple[str, str, str]]:
    found = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == role)
    return {
        (group, resource, verb)
        for rule in found["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_dra_path_needs_no_configmap_rights_and_the_old_path_says_so() -> None:
    base = render(DEPLOY / "base")
    scheduler = _rules(base, "fgpu-scheduler")
    assert not {r for r in scheduler if r[1] == "configmaps"}
    assert ("resource.k8s.io", "resourceclaims/status", "update") in scheduler
    agent = _rules(base, "fgpu-node-agent")
    assert ("resource.k8s.io", "resourceslices", "create") in agent
    assert ("resource.k8s.io", "resourceclaims", "get") in agent
    (klass,) = [o for o in base if o["kind"] == "DeviceClass"]
    assert klass["metadata"]["name"] == "gpu.fgpu.io"
    (daemon,) = [o for o in base if o["kind"] == "DaemonSet"]
    assert daemon["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
    mounts = {
        m["mountPath"] for m in daemon["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    assert {"/var/lib/kubelet/plugins_registry", "/var/run/cdi"} <= mounts
    old = render(DEPLOY / "overlays" / "env-without-isolation")
    assert ("", "configmaps", "create") in _rules(old, "fgpu-scheduler")
    for obj in old:
        if obj["kind"] in ("Deployment", "DaemonSet"):
            args = obj["spec"]["template"]["spec"]["containers"][0]["args"]
            assert "--env-without-isolation" in args, obj["metadata"]["name"]
