"""``fgpu k8s node-agent``: the per-node agent (a DaemonSet).

It discovers the node's GPUs (NVML, or the simulated backend where there is none), and
publishes them on its Node: label ``fgpu.io/managed=true``, labels ``fgpu.io/gpu-model``
and ``fgpu.io/gpu-count``, and the annotation ``fgpu.io/inventory`` the scheduler reads.
Every ``interval_s`` it reports per-GPU use (``fgpu.io/usage``: memory in use and
utilization by GPU UUID) and passes its fgpu pods to the enforcer.

Restart safety: the agent keeps no state and never moves or signals pods' processes. It
patches its own Node's labels and annotations, and the inventory it publishes is keyed by
GPU UUID, which the scheduler uses to find a running pod's GPUs; a restart that renumbers
GPUs moves nobody. With ``--gpus`` it owns a subset of the GPUs (the rest stay with the
NVIDIA device plugin on the same node).

Enforcement (the governor and memory guard, DESIGN.md section 7) is called through
:class:`Enforcer`: ``fgpu k8s node-agent`` passes
:class:`~fgpu.k8s.enforce.GovernorEnforcer` where pod cgroups are usable (it thaws pods a
dead agent left frozen when it starts), and :class:`LogOnlyEnforcer` otherwise.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fgpu.agent.backend import GpuBackend, GpuDevice
from fgpu.k8s import wire
from fgpu.k8s.kube import KubeApi, KubeError

log = logging.getLogger("fgpu.k8s.agent")


@dataclass(frozen=True, slots=True)
class PlacedContainer:
    """What the enforcer is told about one fgpu pod on this node.

    Attributes:
        workload_id: ``namespace/name``.
        uid: the pod's uid (its cgroup is named after it).
        assignment: what it was granted (GPU UUIDs, compute milli, memory MiB).
    """

    workload_id: str
    uid: str
    assignment: wire.Assignment


class Enforcer(Protocol):
    """What enforces the pods' shares on the node (:class:`~fgpu.k8s.enforce.GovernorEnforcer`,
    or :class:`LogOnlyEnforcer`)."""

    def sync(self, placed: Sequence[PlacedContainer]) -> None:
        """The fgpu pods now on this node; called every interval."""
        ...


class LogOnlyEnforcer:
    """Enforces nothing, logs the pods it sees (``--no-enforce``, or no usable cgroup v2)."""

    def __init__(self) -> None:
        self._seen: frozenset[str] = frozenset()

    def sync(self, placed: Sequence[PlacedContainer]) -> None:
        """Log the pods to govern when they change."""
        ids = frozenset(p.workload_id for p in placed)
        if ids != self._seen:
            self._seen = ids
            log.info("not enforcing (log only): %d fgpu pod(s) here", len(ids))


def select_gpus(devices: Sequence[GpuDevice], spec: str | None) -> list[GpuDevice]:
    """The GPUs fgpu owns: all, or those in ``spec`` (``"0-3,6"``, by index).

    Raises:
        ValueError: a malformed spec or an index the node does not have.
    """
    if not spec:
        return list(devices)
    wanted: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                wanted.update(range(lo, hi + 1))
            else:
                wanted.add(int(part))
        except ValueError:
            raise ValueError(f"--gpus: {part!r} is not an index or a range like 0-3") from None
    have = {d.index for d in devices}
    missing = sorted(wanted - have)
    if missing:
        raise ValueError(f"--gpus: no GPU {missing[0]} here (indices {sorted(have)})")
    return [d for d in devices if d.index in wanted]


class NodeAgent:
    """Publishes a node's GPUs and usage; calls the enforcer.

    Args:
        api: the Kubernetes API.
        node: this node's name (the DaemonSet passes ``spec.nodeName``).
        backend: GPU backend.
        gpus: the ``--gpus`` spec (None: all).
        enforcer: what enforces the pods' shares (default: :class:`LogOnlyEnforcer`).
    """

    def __init__(
        self,
        api: KubeApi,
        node: str,
        backend: GpuBackend,
        gpus: str | None = None,
        enforcer: Enforcer | None = None,
    ) -> None:
        self.api = api
        self.node = node
        self.backend = backend
        self.devices = select_gpus(backend.gpus(), gpus)
        self.enforcer = enforcer or LogOnlyEnforcer()
        self._stop = threading.Event()

    def inventory(self) -> wire.Inventory:
        """What this agent publishes (indices renumbered 0.. over the owned GPUs)."""
        return wire.Inventory(
            tuple(
                wire.InventoryGpu(i, d.uuid, d.model, d.memory_mib)
                for i, d in enumerate(self.devices)
            ),
            self.backend.kind,
        )

    def publish(self) -> None:
        """Write the labels and the inventory on the Node (one merge patch).

        Raises:
            KubeError: the patch failed.
        """
        inv = self.inventory()
        models = sorted({g.model for g in inv.gpus})
        labels = {
            wire.MANAGED_LABEL: "true",
            wire.COUNT_LABEL: str(len(inv.gpus)),
            wire.MODEL_LABEL: models[0] if len(models) == 1 else ("mixed" if models else "none"),
        }
        self.api.patch_node(
            self.node,
            {"metadata": {"labels": labels, "annotations": {wire.INVENTORY: inv.to_json()}}},
        )

    def report(self) -> None:
        """Publish per-GPU memory in use (MiB) and utilization (%), and sync the enforcer."""
        owned = {d.uuid for d in self.devices}
        memory: dict[str, int] = dict.fromkeys(owned, 0)
        try:
            for proc in self.backend.process_memory():
                if proc.gpu_uuid in owned:
                    memory[proc.gpu_uuid] += proc.used_mib
            util = {u: p for u, p in self.backend.utilization().items() if u in owned}
        except Exception as exc:  # a flaky driver must not stop the agent
            log.warning("reading GPU usage failed: %s", exc)
            util = {}
        usage = {"memory_mib": memory, "utilization": util, "time": int(time.time())}
        self.api.patch_node(
            self.node, {"metadata": {"annotations": {wire.USAGE: json.dumps(usage)}}}
        )
        self.enforcer.sync(self.placed())

    def placed(self) -> list[PlacedContainer]:
        """The fgpu pods bound to this node, with what they were granted."""
        listed = self.api.list_pods(field_selector=f"spec.nodeName={self.node}")
        out: list[PlacedContainer] = []
        for pod in listed.items:
            text = wire.annotations_of(pod).get(wire.ASSIGNMENT)
            if not text or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            try:
                a = wire.Assignment.from_json(text)
            except wire.WireError:
                continue
            out.append(PlacedContainer(wire.pod_key(pod), pod["metadata"].get("uid", ""), a))
        return out

    def run(self, interval_s: float = 10.0) -> None:
        """Publish, then report every ``interval_s`` until :meth:`stop`."""
        while not self._stop.is_set():
            try:
                self.publish()
                break
            except KubeError as exc:
                log.warning("publishing the inventory of %s failed: %s", self.node, exc)
                self._stop.wait(interval_s)
        while not self._stop.wait(interval_s):
            try:
                self.report()
            except KubeError as exc:
                log.warning("reporting usage of %s failed: %s", self.node, exc)

    def stop(self) -> None:
        """End :meth:`run`."""
        self._stop.set()
