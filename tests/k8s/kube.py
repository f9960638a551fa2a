"""Builders for the Kubernetes tests: nodes with an fgpu inventory, fgpu pods, waiting."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fgpu.k8s import wire
from fgpu.k8s.kube import MERGE_PATCH, KubeApi
from fgpu.k8s.webhook import mutate
from fgpu_standin.patch import json_patch
from tests.k8s.conftest import Cluster

MODEL_MEMORY = {"A100-80GB": 81920, "A100-40GB": 40960, "H100-80GB": 81920}


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index:02d}"


def add_node(
    cluster: Cluster,
    name: str,
    gpus: int = 8,
    model: str = "A100-80GB",
    cpu: str = "128",
    memory: str = "1024Gi",
) -> None:
    """A Node with ``gpus`` GPUs in its fgpu inventory, Ready."""
    inventory = wire.Inventory(
        tuple(
            wire.InventoryGpu(i, gpu_uuid(name, i), model, MODEL_MEMORY[model]) for i in range(gpus)
        ),
        "simulated",
    )
    cluster.api.core.create_node(
        {
            "metadata": {
                "name": name,
                "labels": {wire.MANAGED_LABEL: "true", "fgpu.io/test": "true"},
                "annotations": {wire.INVENTORY: inventory.to_json()},
            }
        }
    )
    status = {
        "status": {
            "capacity": {"cpu": cpu, "memory": memory, "pods": "500"},
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "500"},
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    }
    cluster.api.core.patch_node_status(name, status, _content_type=MERGE_PATCH)
    cluster.made_node(name)


def pod(
    name: str, gpu: str | None = "0.5", labels: dict[str, str] | None = None, **annotations: str
) -> dict[str, Any]:
    """An fgpu pod; keyword annotations use ``_`` for ``-`` (``gpu_memory="5Gi"``)."""
    notes = {f"fgpu.io/{k.replace('_', '-')}": v for k, v in annotations.items()}
    if gpu is not None:
        notes[wire.GPU] = gpu
    spec_extra = {"priorityClassName": CEILING_CLASS} if "priority" in annotations else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": notes, "labels": labels or {}},
        "spec": {
            **spec_extra,
            "schedulerName": wire.SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sleep", "3600"],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
        },
    }


CEILING_CLASS = "fgpu-test-ceiling"
"""The PriorityClass (value 1000) that :func:`pod` gives pods with ``priority=``: the
``fgpu.io/priority`` annotation may only lower the class's priority
(:mod:`fgpu.k8s.tenancy`), so a pod that asks for a priority needs a class at least as
high."""


def ensure_ceiling_class(cluster: Cluster) -> None:
    """Create :data:`CEILING_CLASS` unless it exists."""
    from kubernetes import client

    try:
        client.SchedulingV1Api(cluster.api.client).create_priority_class(
            {"metadata": {"name": CEILING_CLASS}, "value": 1000}, _preload_content=False
        )
    except client.exceptions.ApiException as exc:
        if exc.status != 409:
            raise


def create(cluster: Cluster, body: dict[str, Any], admit: bool = True) -> dict[str, Any]:
    """Create a pod; ``admit`` applies the webhook's patch first (the environment path, what
    the API server does with the webhook configured; tests of admission itself go through
    HTTP). On a real cluster ``admit`` leaves that to the cluster's own fgpu webhook where it
    has one, and skips the test where that webhook is on the DRA path; a pod to be created
    unadmitted (``admit=False``) skips the test where the cluster has an fgpu webhook."""
    if (body.get("spec") or {}).get("priorityClassName") == CEILING_CLASS:
        ensure_ceiling_class(cluster)
    if cluster.real:
        if admit:
            cluster.require_webhook("env", "none")
            admit = cluster.webhook_mode == "none"
        else:
            cluster.require_webhook("none")
    if admit:
        body = json_patch(body, mutate(body, env_without_isolation=True))
    result: dict[str, Any] = cluster.api._call(
        cluster.api.core.create_namespaced_pod, cluster.namespace, body
    )
    return result


def pods(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.api.list_pods(namespace=cluster.namespace).items


def bound(cluster: Cluster) -> list[dict[str, Any]]:
    return [p for p in pods(cluster) if p["spec"].get("nodeName")]


def assignment(p: dict[str, Any]) -> wire.Assignment:
    return wire.Assignment.from_json(p["metadata"]["annotations"][wire.ASSIGNMENT])


def wait_until(check: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` if it never does (a guard
    against hanging, not a speed assertion)."""
    deadline = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def claims_made(api: KubeApi, namespace: str | None = None) -> bool:
    """Every pod that takes a claim from a template has it (``status.resourceClaimStatuses``
    written by the claim controller, a moment after the pod or its template)."""
    for p in api.list_pods(namespace=namespace).items:
        entries = (p.get("spec") or {}).get("resourceClaims") or []
        wanted = {e["name"] for e in entries if e.get("resourceClaimTemplateName")}
        have = {s.get("name") for s in (p.get("status") or {}).get("resourceClaimStatuses") or []}
        if not wanted <= have:
            return False
    return True


def events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    out = cluster.api._call(cluster.api.core.list_namespaced_event, cluster.namespace)
    return [e for e in out["items"] if e.get("reason") == reason]
