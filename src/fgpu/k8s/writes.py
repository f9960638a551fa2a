"""What the fgpu scheduler writes to the Kubernetes API besides Bindings and evictions: the
per-pod environment ConfigMap, ``PodScheduled=False`` conditions, events and annotations.

Each function makes one logical write; failures of conditions, events and annotations are
logged and swallowed (the next round writes them again when still needed), the ConfigMap's
raise (a pod is not bound without its environment).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import Any

from fgpu.k8s import wire
from fgpu.k8s.kube import KubeApi, KubeError

log = logging.getLogger("fgpu.k8s.scheduler")

Obj = Mapping[str, Any]
COMPONENT = "fgpu-scheduler"
"""The ``source.component`` and ``reportingComponent`` of fgpu's events."""


def now_rfc3339() -> str:
    """The current UTC time as the API writes it (``2026-11-29T20:00:00Z``)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def env_data(workload_id: str, uuids: list[str], milli: int, memory_mib: int) -> dict[str, str]:
    """What a placed pod's containers see (DESIGN.md section 7): the GPUs by UUID and the
    limits the governor and memory guard enforce. A pod without GPUs gets
    ``NVIDIA_VISIBLE_DEVICES=void`` (no GPU at all)."""
    devices = ",".join(uuids) if uuids else "void"
    return {
        "NVIDIA_VISIBLE_DEVICES": devices,
        "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        "FGPU_WORKLOAD_ID": workload_id,
        "FGPU_GPU_COMPUTE_MILLI": str(milli),
        "FGPU_GPU_MEMORY_MIB": str(memory_mib),
        "FGPU_AGENT_SOCKET": wire.AGENT_SOCKET,
    }


def write_env(
    api: KubeApi, ns: str, cm_name: str, uid: str, pod_name: str, data: dict[str, str]
) -> None:
    """Create the pod's environment ConfigMap, owned by the pod (so deleted with it). One
    left by an earlier attempt at the same pod (same uid) is replaced.

    Raises:
        KubeError: the API refused; 409 when a ConfigMap of that name belongs to another pod.
    """
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": cm_name,
            "namespace": ns,
            "labels": {wire.MANAGED_LABEL: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": uid,
                    "blockOwnerDeletion": False,
                    "controller": False,
                }
            ],
        },
        "data": data,
    }
    try:
        api.create_config_map(ns, body)
    except KubeError as exc:
        if exc.status != 409:
            raise
        # left by an earlier attempt at this pod (the bind failed, or the scheduler
        # stopped between the two writes): make it say this placement
        old = api.get_config_map(ns, cm_name)
        owners = {r.get("uid") for r in old["metadata"].get("ownerReferences") or []}
        if uid not in owners:
            raise KubeError(
                409, "Conflict", f"ConfigMap {ns}/{cm_name} belongs to another pod"
            ) from None
        api.delete_config_map(ns, cm_name)
        api.create_config_map(ns, body)


def mark_unschedulable(api: KubeApi, pod: Obj, reason: str) -> bool:
    """Set ``PodScheduled=False`` (reason ``Unschedulable``) with ``reason`` as its message.

    Returns:
        Whether it was written.
    """
    meta = pod["metadata"]
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": reason,
        "lastTransitionTime": now_rfc3339(),
    }
    try:
        api.patch_pod_status(
            meta.get("namespace", "default"),
            meta["name"],
            {"status": {"conditions": [condition]}},
        )
    except KubeError as exc:
        log.debug("condition on %s: %s", meta["name"], exc)
        return False
    return True


def annotate(api: KubeApi, pod: Obj, notes: Mapping[str, str | None]) -> None:
    """Set (or, with None, remove) annotations on a pod."""
    meta = pod["metadata"]
    try:
        api.patch_pod(
            meta.get("namespace", "default"),
            meta["name"],
            {"metadata": {"annotations": dict(notes)}},
        )
    except KubeError as exc:
        log.debug("annotating %s: %s", meta["name"], exc)


def post_event(api: KubeApi, pod: Obj, type_: str, reason: str, message: str) -> None:
    """Record an event on a pod (``type_`` Normal or Warning; the message cut at 1024)."""
    meta = pod["metadata"]
    ns = meta.get("namespace", "default")
    now = now_rfc3339()
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": ns},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": ns,
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        api.create_event(ns, body)
    except KubeError as exc:
        log.debug("event on %s: %s", meta["name"], exc)
