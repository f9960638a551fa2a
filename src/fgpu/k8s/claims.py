"""The scheduler's side of Dynamic Resource Allocation: a pod's fgpu claim, its allocation,
and the ledger read back from claims.

An fgpu pod carries a ResourceClaim asking for one device of class
:data:`~fgpu.k8s.dra.share.DRIVER` (the webhook adds ``spec.resourceClaims`` entry
:data:`POD_CLAIM` from the namespace's ResourceClaimTemplate :data:`TEMPLATE`, which the
scheduler creates when a pod needs it; fgpu never allocates a claim a user wrote). Before it
binds the pod, the scheduler writes the claim's ``status``: the allocation (one result per
GPU, the share as opaque configuration, the node selector; :func:`fgpu.k8s.dra.share.
allocation`) and ``reservedFor`` the pod (:func:`allocate`). A restarted scheduler reads
what bound pods hold from their claims (:func:`assignment_from_claim`), which no user can
edit (``resourceclaims/status`` is the scheduler's right).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fgpu.k8s import wire
from fgpu.k8s.dra.share import (
    CLAIM_FINALIZER,
    DRIVER,
    REQUEST,
    GpuShare,
    ShareError,
    allocation,
    device_name,
    is_fgpu_claim,
    results_of,
    share_of,
)
from fgpu.k8s.refusals import writing
from fgpu.k8s.resourceapi import ResourceApi

Obj = dict[str, Any]

TEMPLATE = "fgpu-gpu"
"""The ResourceClaimTemplate the webhook's pod claim entry names (one per namespace)."""
POD_CLAIM = "fgpu-gpu"
"""The name of the pod's ``spec.resourceClaims`` entry the webhook adds."""


def template_body() -> Obj:
    """The namespace's ResourceClaimTemplate: one device of fgpu's class."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "labels": {wire.MANAGED_LABEL: "true"}},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": REQUEST, "exactly": {"deviceClassName": DRIVER}}]}
            }
        },
    }


def pod_claim(pod: Obj, claims: Mapping[str, Obj]) -> tuple[Obj | None, str]:
    """A pod's fgpu claim, or why there is none yet: only the claim made for this pod from
    its ``spec.resourceClaims`` entry :data:`POD_CLAIM` of ResourceClaimTemplate
    :data:`TEMPLATE` (owned by the pod). A claim a user wrote is never the pod's fgpu claim,
    whatever its device class: the scheduler would write one GPU's share into a claim that
    may ask for more, or that other pods hold (the webhook refuses such pods).

    Args:
        pod: the pod.
        claims: ``namespace/name`` -> ResourceClaim.

    Returns:
        ``(claim, "")``, or ``(None, reason)``; the reason starts with ``waiting`` when the
        claim is still to be made from the template.
    """
    ns = pod["metadata"].get("namespace", "default")
    made = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    ours = {"name": POD_CLAIM, "resourceClaimTemplateName": TEMPLATE}
    entries = (pod.get("spec") or {}).get("resourceClaims") or []
    if ours not in entries:
        return None, (
            f"no spec.resourceClaims entry {POD_CLAIM!r} of ResourceClaimTemplate {TEMPLATE!r} "
            "(the fgpu webhook adds it to fgpu pods; fgpu never allocates a claim a user "
            "wrote): create the pod again once the webhook runs"
        )
    name = made.get(POD_CLAIM)
    if not name:
        return None, (
            f"waiting for its ResourceClaim {POD_CLAIM!r} to be made from "
            f"ResourceClaimTemplate {TEMPLATE!r}"
        )
    claim = claims.get(f"{ns}/{name}")
    if claim is None:
        return None, f"waiting for its ResourceClaim {name!r}"
    owners = claim["metadata"].get("ownerReferences") or []
    if not any(o.get("uid") == pod["metadata"].get("uid") for o in owners):
        return None, f"waiting for its ResourceClaim {name!r} (owned by another pod)"
    if not is_fgpu_claim(claim):
        return None, (
            f"its ResourceClaim {name!r} does not ask for device class {DRIVER} (the "
            f"namespace's ResourceClaimTemplate {TEMPLATE!r} was changed; delete it and fgpu "
            "makes it again)"
        )
    return claim, ""


def share_for(assignment: wire.Assignment) -> GpuShare:
    """The share the driver gets for an assignment."""
    mig = assignment.mig
    return GpuShare(
        compute_milli=max(1, assignment.gpu_milli[0]) if assignment.gpu_milli else 1000,
        memory_mib=max(1, assignment.gpu_memory_mib[0]) if assignment.gpu_memory_mib else 1,
        queue=assignment.queue,
        priority=assignment.priority,
        preemptible=assignment.preemptible,
        mig=None if mig is None else (assignment.uuids[0], mig.gpu_uuid, mig.profile, mig.start),
    )


def allocate(api: ResourceApi, claim: Obj, pod: Obj, assignment: wire.Assignment) -> Obj:
    """Write the claim's allocation for ``assignment`` and reserve it for ``pod`` (one status
    write, with the claim's ``resourceVersion`` as precondition), after adding the finalizer
    :data:`~fgpu.k8s.dra.share.CLAIM_FINALIZER` where it is missing (as the kube-scheduler
    does: without it the resource claim controller never deallocates the claim once its
    pod is gone). A claim left allocated differently by an earlier attempt at the same pod
    is first deallocated.

    Returns:
        The claim as written.

    Raises:
        WriteRefused: the API refused (409: the claim changed meanwhile), naming the write.
        ValueError: a uuid that makes no device name.
    """
    meta = claim["metadata"]
    ns, name = meta.get("namespace", "default"), meta["name"]
    wanted = allocation(
        assignment.node,
        [device_name(u) for u in assignment.uuids],
        share_for(assignment),
        request=_request_name(claim),
    )
    reserve = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    status = claim.get("status") or {}
    if status.get("allocation") == wanted and reserve in (status.get("reservedFor") or []):
        return claim
    finalizers = list(meta.get("finalizers") or [])
    if CLAIM_FINALIZER not in finalizers:
        marked: Obj = {
            "metadata": {**meta, "finalizers": [*finalizers, CLAIM_FINALIZER]},
            "spec": claim.get("spec"),
        }
        meta = writing("update", "resourceclaims", lambda: api.replace_claim(ns, name, marked))[
            "metadata"
        ]
    body = {"metadata": dict(meta), "spec": claim.get("spec"), "status": {}}
    if status.get("allocation") is not None and status.get("allocation") != wanted:
        stale = body  # deallocate the stale attempt
        body = writing(
            "update", "resourceclaims/status", lambda: api.replace_claim_status(ns, name, stale)
        )
        body = {"metadata": body["metadata"], "spec": body.get("spec"), "status": {}}
    body["status"] = {"allocation": wanted, "reservedFor": [reserve]}
    written: Obj = writing(
        "update", "resourceclaims/status", lambda: api.replace_claim_status(ns, name, body)
    )
    return written


def _request_name(claim: Obj) -> str:
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if ((req.get("exactly") or {}).get("deviceClassName")) == DRIVER:
            return str(req.get("name") or REQUEST)
    return REQUEST


def assignment_from_claim(
    claim: Obj, requests: tuple[int, int], node: str, at: Mapping[str, int]
) -> wire.Assignment | str:
    """What a bound pod holds, read from its allocated claim.

    Args:
        claim: the pod's fgpu claim.
        requests: the pod's ``(cpu_milli, memory_mib)`` (:func:`~fgpu.k8s.objects.
            container_requests`), counted with it.
        node: the node it is bound to.
        at: GPU uuid -> the GPU's index on that node (GPUs the decision core shares).

    Returns:
        The assignment, or why the claim does not say.
    """
    name = claim["metadata"]["name"]
    try:
        share = share_of(claim)
    except ShareError as exc:
        return f"claim {name}: {exc}"
    results = results_of(claim)
    if share is None or not results:
        return f"claim {name} is not allocated by fgpu"
    pools = {r.get("pool") for r in results}
    if pools != {node}:
        return f"claim {name} is allocated on {sorted(map(str, pools))}, not on {node}"
    cpu, memory = requests
    if share.mig is not None:
        uuid, parent, profile, start = share.mig
        return wire.Assignment(
            node,
            (uuid,),
            (0,),
            (share.compute_milli,),
            (share.memory_mib,),
            cpu,
            memory,
            share.queue,
            share.priority,
            share.preemptible,
            wire.MigHeld(parent, profile, start),
        )
    by_name = {device_name(u): u for u in at}
    try:
        uuids = tuple(by_name[str(r.get("device"))] for r in results)
    except KeyError as exc:
        return f"claim {name}: device {exc.args[0]} is not in the node's inventory any more"
    n = len(uuids)
    return wire.Assignment(
        node,
        uuids,
        tuple(at[u] for u in uuids),
        (share.compute_milli,) * n,
        (share.memory_mib,) * n,
        cpu,
        memory,
        share.queue,
        share.priority,
        share.preemptible,
    )


__all__ = [
    "POD_CLAIM",
    "TEMPLATE",
    "allocate",
    "assignment_from_claim",
    "pod_claim",
    "share_for",
    "template_body",
]
