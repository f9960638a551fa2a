"""What fgpu's scheduler and DRA driver agree on: names, and the share written into a claim.

The scheduler allocates a ResourceClaim of device class :data:`DRIVER` by writing its
``status.allocation``: one result per GPU (``driver`` :data:`DRIVER`, ``pool`` the node's
name, ``device`` the GPU's device name in the node's ResourceSlice, :func:`device_name`), the
share as the driver's opaque configuration (:class:`GpuShare` in
``allocation.devices.config[].opaque.parameters``, ``source: FromClaim``), and a node
selector naming the node. The driver reads the same objects back when the kubelet asks it
to prepare the claim. No user can edit a claim's status (``resourceclaims/status`` is the
scheduler's right in RBAC), so what reaches the container is what the scheduler chose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

DRIVER = "gpu.fgpu.io"
"""The driver name; also the DeviceClass's name (``deploy/base/deviceclass.yaml``)."""

SHARE_API_VERSION = "gpu.fgpu.io/v1alpha1"
SHARE_KIND = "GpuShare"
REQUEST = "gpu"
"""The request name in the claims the webhook's ResourceClaimTemplate makes."""

CLAIM_FINALIZER = "resource.kubernetes.io/delete-protection"
"""The finalizer an allocator puts on a claim before allocating it (the kube-scheduler's
``resourceapi.Finalizer``): the resource claim controller deallocates a claim nobody
reserves any more, and removes it, only when it is there."""

TAINT_KEY = "fgpu.io/gpu"
"""The taint on fgpu nodes (``NoSchedule``); the webhook gives fgpu pods its toleration."""

Obj = dict[str, Any]


class ShareError(ValueError):
    """An opaque configuration that is not a readable :class:`GpuShare`; the message names
    the field and the value."""


_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@lru_cache(maxsize=1 << 16)
def device_name(uuid: str) -> str:
    """The device name of a GPU or MIG instance in the node's ResourceSlice: its uuid in
    lower case (``GPU-5e1a...`` -> ``gpu-5e1a...``), so that a name never depends on
    enumeration order and a renumbering agent moves nobody.

    Raises:
        ValueError: the uuid does not make a DNS label (at most 63 characters of
            ``a-z0-9-``), which a device name must be.
    """
    name = uuid.lower()
    if len(name) > 63 or not _LABEL.match(name):
        raise ValueError(f"GPU uuid {uuid!r} does not make a device name (a DNS label)")
    return name


@dataclass(frozen=True, slots=True)
class GpuShare:
    """The share of each allocated GPU, as the scheduler decided it.

    Attributes:
        compute_milli: compute share per GPU in milli-GPU (1..1000).
        memory_mib: memory quota per GPU in MiB (at least 1).
        queue: the pod's queue.
        priority: the pod's fgpu priority (0..1000).
        preemptible: whether fgpu may preempt it (None: the class's default).
        mig: for a MIG instance, ``(instance uuid, parent GPU uuid, profile, start)``.
    """

    compute_milli: int
    memory_mib: int
    queue: str = "default"
    priority: int = 50
    preemptible: bool | None = None
    mig: tuple[str, str, str, int] | None = None

    def to_parameters(self) -> Obj:
        """The ``opaque.parameters`` object."""
        out: Obj = {
            "apiVersion": SHARE_API_VERSION,
            "kind": SHARE_KIND,
            "computeMilli": self.compute_milli,
            "memoryMiB": self.memory_mib,
            "queue": self.queue,
            "priority": self.priority,
        }
        if self.preemptible is not None:
            out["preemptible"] = self.preemptible
        if self.mig is not None:
            uuid, parent, profile, start = self.mig
            out["mig"] = {"uuid": uuid, "gpuUUID": parent, "profile": profile, "start": start}
        return out

    @classmethod
    def from_parameters(cls, data: Any) -> GpuShare:
        """Read ``opaque.parameters``.

        Raises:
            ShareError: not a GpuShare of this version, or a field out of range.
        """
        if not isinstance(data, dict):
            raise ShareError(f"opaque parameters: expected an object, got {data!r}")
        if data.get("apiVersion") != SHARE_API_VERSION or data.get("kind") != SHARE_KIND:
            raise ShareError(
                f"opaque parameters: apiVersion/kind {data.get('apiVersion')!r}/"
                f"{data.get('kind')!r} is not {SHARE_API_VERSION}/{SHARE_KIND}"
            )

        def integer(key: str, low: int, high: int) -> int:
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ShareError(
                    f"opaque parameters: {key} {value!r} is not an integer in {low}..{high}"
                )
            return value

        preemptible = data.get("preemptible")
        if preemptible is not None and not isinstance(preemptible, bool):
            raise ShareError(f"opaque parameters: preemptible {preemptible!r} is not a boolean")
        queue = data.get("queue", "default")
        if not isinstance(queue, str) or not queue:
            raise ShareError(f"opaque parameters: queue {queue!r} is not a queue name")
        mig = data.get("mig")
        held: tuple[str, str, str, int] | None = None
        if mig is not None:
            try:
                held = (
                    str(mig["uuid"]),
                    str(mig["gpuUUID"]),
                    str(mig["profile"]),
                    int(mig["start"]),
                )
            except (KeyError, TypeError, ValueError):
                raise ShareError(f"opaque parameters: mig {mig!r} is not a MIG instance") from None
        return cls(
            mig=held,
            compute_milli=integer("computeMilli", 1, 1000),
            memory_mib=integer("memoryMiB", 1, 1 << 31),
            queue=queue,
            priority=integer("priority", 0, 1000) if "priority" in data else 50,
            preemptible=preemptible,
        )


def allocation(node: str, devices: list[str], share: GpuShare, request: str = REQUEST) -> Obj:
    """A claim's ``status.allocation`` for ``devices`` (device names) of ``node``'s pool with
    ``share`` on each, and the node selector that keeps the pod on ``node``."""
    return {
        "devices": {
            "results": [
                {"request": request, "driver": DRIVER, "pool": node, "device": d} for d in devices
            ],
            "config": [
                {
                    "source": "FromClaim",
                    "requests": [request],
                    "opaque": {"driver": DRIVER, "parameters": share.to_parameters()},
                }
            ],
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def share_of(claim: Obj) -> GpuShare | None:
    """The share in an allocated claim's configuration for this driver (the last one wins,
    as configuration entries are applied in order), or None when there is none.

    Raises:
        ShareError: the configuration is there but unreadable.
    """
    alloc = (claim.get("status") or {}).get("allocation") or {}
    found: GpuShare | None = None
    for entry in (alloc.get("devices") or {}).get("config") or []:
        opaque = (entry or {}).get("opaque") or {}
        if opaque.get("driver") == DRIVER:
            found = GpuShare.from_parameters(opaque.get("parameters"))
    return found


def results_of(claim: Obj) -> list[Obj]:
    """The allocation results of this driver in a claim (empty when not allocated)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return [
        r for r in (alloc.get("devices") or {}).get("results") or [] if r.get("driver") == DRIVER
    ]


def is_fgpu_claim(claim: Obj) -> bool:
    """Whether a claim asks for a device of fgpu's class."""
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        subs = [req.get("exactly")] if req.get("exactly") else req.get("firstAvailable") or []
        if any((s or {}).get("deviceClassName") == DRIVER for s in subs):
            return True
    return False


__all__ = [
    "CLAIM_FINALIZER",
    "DRIVER",
    "REQUEST",
    "SHARE_API_VERSION",
    "SHARE_KIND",
    "TAINT_KEY",
    "GpuShare",
    "ShareError",
    "allocation",
    "device_name",
    "is_fgpu_claim",
    "results_of",
    "share_of",
]
