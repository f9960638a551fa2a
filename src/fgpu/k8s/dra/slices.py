"""The node's ResourceSlice: what fgpu's DRA driver publishes about the GPUs it owns.

One slice per node, named ``<node>-gpu.fgpu.io``, in a pool named after the node (one slice
in the pool; the generation goes up with every change of the devices, so a consumer that
sees two generations trusts the newest). Devices, named by their uuids
(:func:`~fgpu.k8s.dra.share.device_name`):

- one per GPU not in MIG mode, attributes ``uuid``, ``model``, ``index`` (inventory order),
  ``memoryMiB``, ``mig`` false; capacity ``memory`` and ``compute`` (1000 milli-GPU),
  written in the API server's canonical form (``80Gi``, ``1k``: :func:`mib_quantity`), so
  that the slice read back equals the one written and an unchanged inventory changes
  nothing; ``allowMultipleAllocations: true`` since fgpu shares a GPU among several claims
  (the consumable-capacity field of ``resource.k8s.io/v1``; fgpu's scheduler does its own
  accounting and never lets the shares add up past the GPU);
- one per MIG instance of a GPU in MIG mode, attributes ``uuid`` (``MIG-...``),
  ``parentUUID``, ``profile``, ``start``, ``index`` (the parent's), ``mig`` true; a GPU in MIG
  mode is not a device itself.

A DRA driver must publish only what it can prepare, so an agent without NVML publishes
nothing (:meth:`SlicePublisher.withdraw`) unless it was told to simulate GPUs.
"""

from __future__ import annotations

import logging
from typing import Any

from fgpu.k8s import wire
from fgpu.k8s.dra.share import DRIVER, device_name
from fgpu.k8s.kube import KubeError
from fgpu.k8s.resourceapi import API_VERSION, ResourceApi

log = logging.getLogger("fgpu.k8s.dra.slices")

Obj = dict[str, Any]


def slice_name(node: str) -> str:
    """The name of ``node``'s slice."""
    return f"{node}-{DRIVER}"


_BINARY = ("Mi", "Gi", "Ti", "Pi", "Ei")
COMPUTE = "1k"
"""A GPU's ``compute`` capacity, 1000 (milli-GPU), as the API server writes the quantity."""


def mib_quantity(mib: int) -> str:
    """``mib`` MiB as the API server writes the quantity: the largest binary suffix that
    keeps it whole (81920 -> ``80Gi``, 1000 -> ``1000Mi``; 0 -> ``0``; Kubernetes API
    reference, "Quantity": canonical form)."""
    if mib == 0:
        return "0"
    power = 0
    while power < len(_BINARY) - 1 and mib % 1024 == 0:
        mib //= 1024
        power += 1
    return f"{mib}{_BINARY[power]}"


def devices_of(inventory: wire.Inventory) -> list[Obj]:
    """The slice's devices for an inventory (module docstring)."""
    out: list[Obj] = []
    for g in inventory.gpus:
        if g.mig is None:
            out.append(
                {
                    "name": device_name(g.uuid),
                    "attributes": {
                        "uuid": {"string": g.uuid},
                        "model": {"string": g.model},
                        "index": {"int": g.index},
                        "memoryMiB": {"int": g.memory_mib},
                        "mig": {"bool": False},
                    },
                    "capacity": {
                        "memory": {"value": mib_quantity(g.memory_mib)},
                        "compute": {"value": COMPUTE},
                    },
                    "allowMultipleAllocations": True,
                }
            )
            continue
        for m in g.mig:
            out.append(
                {
                    "name": device_name(m.uuid),
                    "attributes": {
                        "uuid": {"string": m.uuid},
                        "parentUUID": {"string": g.uuid},
                        "model": {"string": g.model},
                        "profile": {"string": m.profile},
                        "start": {"int": m.start},
                        "index": {"int": g.index},
                        "mig": {"bool": True},
                    },
                }
            )
    return out


def resource_slice(node: str, inventory: wire.Inventory, generation: int) -> Obj:
    """The whole ResourceSlice object for ``node``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node), "labels": {wire.MANAGED_LABEL: "true"}},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices_of(inventory),
        },
    }


class SlicePublisher:
    """Keeps ``node``'s ResourceSlice equal to the agent's inventory.

    Args:
        api: the ``resource.k8s.io`` calls.
        node: this node's name.
    """

    def __init__(self, api: ResourceApi, node: str) -> None:
        self.api = api
        self.node = node

    def _mine(self) -> list[Obj]:
        return self.api.list_slices(f"spec.nodeName={self.node},spec.driver={DRIVER}").items

    def publish(self, inventory: wire.Inventory) -> Obj:
        """Create or update the slice (a new pool generation only when the devices changed),
        and delete other slices of this driver on this node (left by an older version).

        Returns:
            The slice as stored.

        Raises:
            KubeError: the API refused (409 when another writer changed it meanwhile).
        """
        name = slice_name(self.node)
        found = {s["metadata"]["name"]: s for s in self._mine()}
        for other in sorted(found.keys() - {name}):
            self.api.delete_slice(other)
        current = found.get(name)
        devices = devices_of(inventory)
        if current is None:
            return self.api.create_slice(resource_slice(self.node, inventory, 1))
        if current["spec"].get("devices") == devices:
            return current
        generation = int(current["spec"]["pool"].get("generation", 0)) + 1
        body = resource_slice(self.node, inventory, generation)
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.api.replace_slice(name, body)

    def withdraw(self) -> None:
        """Delete this node's slices of this driver (nothing here can be prepared).

        Raises:
            KubeError: the API refused.
        """
        for s in self._mine():
            try:
                self.api.delete_slice(s["metadata"]["name"])
            except KubeError as exc:
                if exc.status != 404:
                    raise


__all__ = [
    "COMPUTE",
    "SlicePublisher",
    "devices_of",
    "mib_quantity",
    "resource_slice",
    "slice_name",
]
