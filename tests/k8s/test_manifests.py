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
    } <= kinds
    for obj in objects:
        name = model_name(obj)
        assert hasattr(client, name), f"no client model {name} for {obj['kind']}"
        model = api.deserialize(json.dumps(obj), name, "application/json")
        back = api.sanitize_for_serialization(model)
        assert normal(back) == normal(obj), f"{obj['kind']} {obj['metadata']['name']} changed"


def test_priority_classes_match_the_design() -> None:
    objects = render(DEPLOY / "base")
    classes = {o["metadata"]["name"]: o["value"] for o in objects if o["kind"] == "PriorityClass"}
    assert classes == {f"fgpu-{k}": v for k, v in PRIORITY_CLASSES.items()}


def test_the_queue_schema_names_the_fields_the_scheduler_reads() -> None:
    objects = render(DEPLOY / "base")
    crd = next(o for o in objects if o["kind"] == "CustomResourceDefinition")
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]
    assert set(props) == {"quota", "limit", "overQuotaWeight", "priority", "parent"}
    spec = queue_spec(
        {
            "metadata": {"name": "team-a"},
            "spec": {
                "quota": 1.5,
                "limit": 4,
                "overQuotaWeight": 2,
                "priority": 1,
                "parent": "org",
            },
        }
    )
    assert spec.quota.gpu_milli == 1500
    assert spec.over_quota_weight == 2
    assert spec.parent == "org"
