"""The admission webhook's part on the DRA path (:mod:`fgpu.k8s.webhook`, module docstring):
the pod's claim entry from fgpu's ResourceClaimTemplate referenced by every container, the
toleration of the fgpu nodes' taint, and the refusals that keep a container to its claim's
devices (privileged containers, also ephemeral ones; the interposer's variables in ``env``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fgpu.k8s.claims import POD_CLAIM, TEMPLATE
from fgpu.k8s.dra.share import DRIVER, TAINT_KEY, is_fgpu_claim
from fgpu.k8s.objects import PodRequestError

Obj = Mapping[str, Any]

DRA_RESERVED_ENV = ("LD_PRELOAD", "FGPU_SEG")
"""Variables the DRA driver's CDI spec sets (the interposer); refused in a pod's own env."""
TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
"""The toleration of the fgpu nodes' taint that fgpu pods get."""


def check_privileged(spec: Obj, groups: tuple[str, ...] = ("initContainers", "containers")) -> None:
    """Refuse privileged containers in an fgpu pod: a privileged container sees every device
    node of the host, so every GPU, whatever its claim says.

    Raises:
        PodRequestError: naming the container's field.
    """
    for group in groups:
        for i, c in enumerate(spec.get(group) or []):
            if ((c.get("securityContext") or {}).get("privileged")) is True:
                raise PodRequestError(
                    f"spec.{group}[{i}].securityContext.privileged",
                    "true: a privileged container sees every GPU of the node, not only the "
                    "one fgpu gives the pod; fgpu pods run unprivileged",
                )


def check_user_claims(pod: Obj, claim_of: Callable[[Obj], tuple[str, Obj | None]]) -> None:
    """Refuse a pod whose ``spec.resourceClaims`` entries, other than fgpu's own
    ``fgpu-gpu`` entry, name a ResourceClaim or ResourceClaimTemplate asking for fgpu's
    device class: fgpu allocates only the claim it made for the pod, so such a claim would
    either never be allocated (the pod never starts) or be a way to hold GPUs the ledger
    does not count.

    Args:
        pod: the pod.
        claim_of: an entry -> ``(what, object)``: ``"ResourceClaim mine"`` or
            ``"ResourceClaimTemplate t"`` and the object read (None: not found; a claim
            made later is still refused by the scheduler, which never allocates it).

    Raises:
        PodRequestError: naming ``spec.resourceClaims[i]`` and the claim.
    """
    ours = {"name": POD_CLAIM, "resourceClaimTemplateName": TEMPLATE}
    for i, entry in enumerate((pod.get("spec") or {}).get("resourceClaims") or []):
        if entry == ours:
            continue
        what, found = claim_of(entry)
        if found is None:
            continue
        body = found.get("spec") or {}
        if "resourceClaimTemplateName" in entry:
            body = body.get("spec") or {}
        if is_fgpu_claim({"spec": body}):
            raise PodRequestError(
                f"spec.resourceClaims[{i}]",
                f"{entry.get('name')!r} names {what} of device class {DRIVER}; fgpu gives "
                f"GPUs only through the claim it adds ({POD_CLAIM!r}, from its template "
                f"{TEMPLATE}) and never allocates a claim a user wrote; remove this entry "
                "and ask with the fgpu.io/ annotations",
            )


def dra_ops(pod: Obj, ask_gpus: bool) -> list[dict[str, Any]]:
    """The JSON patch ops of the DRA path after the common ones (``ask_gpus``: the pod asks
    for GPUs or a MIG instance, so it gets the claim; every fgpu pod gets the toleration).

    Raises:
        PodRequestError: a privileged container, an interposer variable in ``env``, or a
            ``fgpu-gpu`` claim entry other than fgpu's own.
    """
    spec = pod.get("spec") or {}
    check_privileged(spec)
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            for env in c.get("env") or []:
                if env.get("name") in DRA_RESERVED_ENV:
                    raise PodRequestError(
                        f"spec.{group}[{i}].env",
                        f"{env.get('name')} is set by fgpu's DRA driver (the interposer that "
                        "enforces the pod's share); remove it",
                    )
    ops: list[dict[str, Any]] = []
    tolerations = spec.get("tolerations") or []
    if TOLERATION not in tolerations:
        ops.append({"op": "add", "path": "/spec/tolerations", "value": [*tolerations, TOLERATION]})
    if not ask_gpus:
        return ops
    ours = {"name": POD_CLAIM, "resourceClaimTemplateName": TEMPLATE}
    entries = spec.get("resourceClaims") or []
    taken = [e for e in entries if e.get("name") == POD_CLAIM]
    if taken and taken[0] != ours:
        i = entries.index(taken[0])
        raise PodRequestError(
            f"spec.resourceClaims[{i}]",
            f"{POD_CLAIM!r} is the claim entry fgpu adds (template {TEMPLATE}; fgpu never "
            "allocates a claim a user wrote); rename this entry, or remove it and let fgpu "
            "add its own",
        )
    if not taken:
        ops.append({"op": "add", "path": "/spec/resourceClaims", "value": [*entries, ours]})
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            resources = c.get("resources") or {}
            refs = resources.get("claims") or []
            if any(r.get("name") == POD_CLAIM for r in refs):
                continue
            if not c.get("resources"):
                ops.append({"op": "add", "path": f"/spec/{group}/{i}/resources", "value": {}})
            ops.append(
                {
                    "op": "add",
                    "path": f"/spec/{group}/{i}/resources/claims",
                    "value": [*refs, {"name": POD_CLAIM}],
                }
            )
    return ops


__all__ = ["DRA_RESERVED_ENV", "TOLERATION", "check_privileged", "check_user_claims", "dra_ops"]
