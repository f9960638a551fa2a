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
from fgpu.k8s.kube import KubeApi, KubeError
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


def resource_slice(
    node: str, inventory: wire.Inventory, generation: int, node_uid: str | None = None
) -> Obj:
    """The whole ResourceSlice object for ``node``; with ``node_uid``, owned by the Node
    (the garbage collector deletes it with the Node, as the kubelet's DRA plugin helper
    does with its slices)."""
    meta: Obj = {"name": slice_name(node), "labels": {wire.MANAGED_LABEL: "true"}}
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices_of(inventory),
        },
    }


SHARING_DROPPED = "SharedDevicesNotPublished"
"""The reason of the Node event that says the API server dropped
``allowMultipleAllocations`` from the slice (:meth:`SlicePublisher.publish`)."""


def dropped_sharing(sent: Obj, stored: Obj) -> list[str]:
    """The devices ``sent`` with ``allowMultipleAllocations`` that came back without it: the
    API server drops the field where it does not serve it (Kubernetes before 1.36, or the
    ``DRAConsumableCapacity`` feature gate off)."""
    kept = {
        d.get("name"): d.get("allowMultipleAllocations")
        for d in (stored.get("spec") or {}).get("devices") or []
    }
    return [
        str(d["name"])
        for d in sent["spec"]["devices"]
        if d.get("allowMultipleAllocations") and not kept.get(d["name"])
    ]


class SlicePublisher:
    """Keeps ``node``'s ResourceSlice equal to the agent's inventory, owned by its Node.

    Args:
        api: the ``resource.k8s.io`` calls (its :class:`~fgpu.k8s.kube.KubeApi` reads the
            Node and posts events).
        node: this node's name.
    """

    def __init__(self, api: ResourceApi, node: str) -> None:
        self.api = api
        self.node = node
        self.sharing_dropped: list[str] = []
        """The devices whose ``allowMultipleAllocations`` the API server dropped at the
        last publication (empty where it kept them)."""

    def _mine(self) -> list[Obj]:
        return self.api.list_slices(f"spec.nodeName={self.node},spec.driver={DRIVER}").items

    def publish(self, inventory: wire.Inventory) -> Obj:
        """Create or update the slice, owned by the Node (read for its uid; a new pool
        generation only when the devices changed), delete other slices of this driver on
        this node (left by an older version), and check that the API server kept
        ``allowMultipleAllocations`` (:meth:`_check_sharing`).

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
        uid = str(self.api.api.get_node(self.node)["metadata"].get("uid") or "")
        body = resource_slice(self.node, inventory, 1, uid)
        if current is None:
            written = self.api.create_slice(body)
        else:
            same = current["spec"].get("devices") == self._as_stored(body["spec"]["devices"])
            if same and current["metadata"].get("ownerReferences") == body["metadata"].get(
                "ownerReferences"
            ):
                return current
            generation = int(current["spec"]["pool"].get("generation", 0)) + (0 if same else 1)
            body = resource_slice(self.node, inventory, max(1, generation), uid)
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            written = self.api.replace_slice(name, body)
        self._check_sharing(body, written)
        return written

    def _as_stored(self, devices: list[Obj]) -> list[Obj]:
        """``devices`` as this server stores them: without ``allowMultipleAllocations``
        once it was seen dropping it (so an unchanged inventory is not written again)."""
        if not self.sharing_dropped:
            return devices
        return [{k: v for k, v in d.items() if k != "allowMultipleAllocations"} for d in devices]

    def _check_sharing(self, sent: Obj, stored: Obj) -> None:
        """Say once (log and a Warning event on the Node) when the API server dropped
        ``allowMultipleAllocations`` (:func:`dropped_sharing`); docs/kubernetes.md says how
        claims share a GPU there."""
        dropped = dropped_sharing(sent, stored)
        said = bool(self.sharing_dropped)
        self.sharing_dropped = dropped
        if said or not dropped:
            return
        message = (
            f"the API server dropped allowMultipleAllocations from {len(dropped)} device(s) "
            f"of ResourceSlice {stored['metadata']['name']} (Kubernetes before 1.36, or the "
            "DRAConsumableCapacity feature gate off): the slice does not say its GPUs are "
            "shared; fgpu's scheduler still shares them among claims by its own accounting "
            "(docs/kubernetes.md, 'GPUs shared by several claims')"
        )
        log.warning("node %s: %s", self.node, message)
        post_node_event(self.api.api, self.node, "Warning", SHARING_DROPPED, message)

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


def post_node_event(api: KubeApi, node: str, type_: str, reason: str, message: str) -> None:
    """An event about a Node (in namespace ``default``, where the kubelet posts its
    Node's events; ``kubectl describe node`` shows it). Failures are logged."""
    from fgpu.k8s.writes import now_rfc3339

    now = now_rfc3339()
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": "fgpu-node-agent", "host": node},
        "reportingComponent": "fgpu-node-agent",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        api.create_event("default", body)
    except KubeError as exc:
        log.info("event on node %s: %s", node, exc)


__all__ = [
    "COMPUTE",
    "SHARING_DROPPED",
    "SlicePublisher",
    "devices_of",
    "dropped_sharing",
    "mib_quantity",
    "post_node_event",
    "resource_slice",
    "slice_name",
]
