"""Names and shapes fgpu writes on Kubernetes objects (annotations, labels, the ``Queue``
custom resource, the per-pod environment ConfigMap).

Pod annotations a user writes (all optional; see docs/kubernetes.md):

============================  =========================================================
``fgpu.io/gpu``               ``"0.5"`` (a share of one GPU) or ``"2"`` (whole GPUs)
``fgpu.io/gpu-count``         number of GPUs; with ``fgpu.io/gpu`` below 1, that share on
                              each (``-g 2 --gpu-fraction 0.3``)
``fgpu.io/gpu-memory``        memory quota per GPU (``5Gi``, ``5GiB``, ``5120Mi``)
``fgpu.io/gpu-model``         allowed models, comma-separated
``fgpu.io/mig-profile``       a MIG profile
``fgpu.io/queue``             leaf queue (default ``default``)
``fgpu.io/priority``          number or class name; default: the pod's PriorityClass
                              value when it has one, else ``normal`` (50)
``fgpu.io/preemptible``       ``"true"``/``"false"``; default: priority below 100
============================  =========================================================

What fgpu writes:

- webhook, on the pod: ``fgpu.io/env-configmap`` (the ConfigMap its containers' ``envFrom``
  names), ``schedulerName: fgpu``;
- scheduler, in the Binding (so atomically with ``spec.nodeName``): ``fgpu.io/assignment``
  (JSON, :class:`Assignment`) and ``fgpu.io/gpu-uuids``; before the Binding, the ConfigMap
  with ``NVIDIA_VISIBLE_DEVICES`` and the ``FGPU_*`` limits; ``fgpu.io/hold`` on a
  preemptor while capacity is held for it;
- only the scheduler may change the pod annotations above after creation (the webhook
  refuses anyone else's update);
- node agent, on its Node: label ``fgpu.io/managed=true``, labels ``fgpu.io/gpu-model`` and
  ``fgpu.io/gpu-count``, annotation ``fgpu.io/inventory`` (JSON, :class:`Inventory`) and
  ``fgpu.io/usage``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEDULER_NAME = "fgpu"
SCHEDULER_USER = "system:serviceaccount:fgpu-system:fgpu-scheduler"
"""The user the scheduler's API calls come as by default (its service account in
deploy/base); the webhook lets only it change :data:`FGPU_ANNOTATIONS` on a pod."""
PREFIX = "fgpu.io/"

GPU = "fgpu.io/gpu"
GPU_COUNT = "fgpu.io/gpu-count"
GPU_MEMORY = "fgpu.io/gpu-memory"
GPU_MODEL = "fgpu.io/gpu-model"
MIG_PROFILE = "fgpu.io/mig-profile"
QUEUE = "fgpu.io/queue"
PRIORITY = "fgpu.io/priority"
PREEMPTIBLE = "fgpu.io/preemptible"
USER_ANNOTATIONS = (
    GPU,
    GPU_COUNT,
    GPU_MEMORY,
    GPU_MODEL,
    MIG_PROFILE,
    QUEUE,
    PRIORITY,
    PREEMPTIBLE,
)

ENV_CONFIGMAP = "fgpu.io/env-configmap"
ASSIGNMENT = "fgpu.io/assignment"
GPU_UUIDS = "fgpu.io/gpu-uuids"
HOLD = "fgpu.io/hold"
SQUEEZED_BY = "fgpu.io/squeezed-by"
"""On a running pod that is squeezed (squeeze before evict): the keys (``namespace/name``)
of the pods that took its compute, comma-separated (empty: none now); absent otherwise."""
SUSPEND = "fgpu.io/suspend"
"""On a running pod: ``"true"`` asks its node agent to suspend it to host memory (CUDA
checkpoint, cgroup frozen; :mod:`fgpu.k8s.suspend`); removed: restore it. Written by the
scheduler when the decision core suspends a victim, removed when it restores it."""
SUSPENDED = "fgpu.io/suspended"
"""Written by the node agent on a pod it suspended: JSON ``{"pids": [...], "copy_s": s}``,
or ``{"error": "..."}`` when the suspend failed; removed when it is restored."""
RESTORED = "fgpu.io/restored"
"""Written by the node agent when it restored a pod (with the removal of
:data:`SUSPENDED`): JSON ``{"copy_s": s}``, the host-to-device copy time."""
WEBHOOK_ANNOTATIONS = (ENV_CONFIGMAP,)
"""Pod annotations the webhook writes at creation."""
SCHEDULER_ANNOTATIONS = (ASSIGNMENT, GPU_UUIDS, HOLD, SQUEEZED_BY, SUSPEND)
"""Pod annotations the scheduler writes (the Binding, or a pod patch for the hold)."""
AGENT_ANNOTATIONS = (SUSPENDED, RESTORED)
"""Pod annotations the node agent writes on the pods bound to its node."""
FGPU_ANNOTATIONS = WEBHOOK_ANNOTATIONS + SCHEDULER_ANNOTATIONS + AGENT_ANNOTATIONS
"""Pod annotations fgpu writes; users may not set or change them (the webhook refuses)."""
AGENT_USER = "system:serviceaccount:fgpu-system:fgpu-node-agent"
"""The user the node agents' API calls come as by default (their service account in
deploy/base); the webhook lets it change :data:`AGENT_ANNOTATIONS` (and the scheduler
every annotation of :data:`FGPU_ANNOTATIONS`)."""

MANAGED_LABEL = "fgpu.io/managed"
MODEL_LABEL = "fgpu.io/gpu-model"
COUNT_LABEL = "fgpu.io/gpu-count"
INVENTORY = "fgpu.io/inventory"
USAGE = "fgpu.io/usage"
MIG_REQUEST = "fgpu.io/mig-request"
MIG_STATUS = "fgpu.io/mig-status"

DEFAULT_QUEUE = "default"
AGENT_SOCKET = "/run/fgpu/agent.sock"
"""Where the node agent listens on each node (hostPath); given to workloads as
``FGPU_AGENT_SOCKET``."""

RESERVED_ENV = (
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "FGPU_WORKLOAD_ID",
    "FGPU_GPU_COMPUTE_MILLI",
    "FGPU_GPU_MEMORY_MIB",
    "FGPU_AGENT_SOCKET",
)
"""Variables the ConfigMap sets; a container's own ``env`` would win over ``envFrom``, so
the webhook refuses pods that set them."""


class WireError(ValueError):
    """An fgpu annotation that cannot be read; names the annotation and the reason."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"{key}: {reason}")


@dataclass(frozen=True, slots=True)
class MigHeld:
    """The MIG instance an assignment holds.

    Attributes:
        gpu_uuid: the instance's GPU (``GPU-...``).
        profile: its profile (``3g.40gb``).
        start: its first memory slice.
    """

    gpu_uuid: str
    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where a pod was placed, carried in the Binding as ``fgpu.io/assignment``.

    Attributes:
        node: node name.
        uuids: the GPUs' UUIDs (what the container sees), in ``gpus`` order.
        gpus: GPU indices in the node's inventory when bound (UUIDs win on a mismatch).
        gpu_milli: compute share per GPU, milli-GPU.
        gpu_memory_mib: memory quota per GPU, MiB.
        cpu_milli: CPU counted for the pod, milli-cores.
        memory_mib: host memory counted for the pod, MiB.
        queue: the queue it was admitted to.
        priority: its priority when placed.
        preemptible: None (default rule), True or False.
        mig: for a MIG pod, the instance it holds (then ``uuids`` is the instance's
            ``MIG-...`` uuid, ``gpus`` its GPU's index, ``gpu_milli`` and
            ``gpu_memory_mib`` the instance's share and memory); None for a share of GPUs.

    The queue and priority are kept here rather than read again from the pod's annotations,
    which stay editable after the bind: the ledger counts what was granted.
    """

    node: str
    uuids: tuple[str, ...]
    gpus: tuple[int, ...]
    gpu_milli: tuple[int, ...]
    gpu_memory_mib: tuple[int, ...]
    cpu_milli: int
    memory_mib: int
    queue: str = DEFAULT_QUEUE
    priority: int = 50
    preemptible: bool | None = None
    mig: MigHeld | None = None

    def to_json(self) -> str:
        """The annotation's text."""
        data: dict[str, Any] = {
            "node": self.node,
            "queue": self.queue,
            "priority": self.priority,
            "preemptible": self.preemptible,
            "uuids": list(self.uuids),
            "gpus": list(self.gpus),
            "gpu_milli": list(self.gpu_milli),
            "gpu_memory_mib": list(self.gpu_memory_mib),
            "cpu_milli": self.cpu_milli,
            "memory_mib": self.memory_mib,
        }
        if self.mig is not None:
            data["mig"] = {
                "gpu_uuid": self.mig.gpu_uuid,
                "profile": self.mig.profile,
                "start": self.mig.start,
            }
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Assignment:
        """Inverse of :meth:`to_json`.

        Raises:
            WireError: not the JSON this module writes.
        """
        try:
            data = json.loads(text)
            mig = data.get("mig")
            out = cls(
                node=str(data["node"]),
                uuids=tuple(str(u) for u in data["uuids"]),
                gpus=tuple(int(g) for g in data["gpus"]),
                gpu_milli=tuple(int(m) for m in data["gpu_milli"]),
                gpu_memory_mib=tuple(int(m) for m in data["gpu_memory_mib"]),
                cpu_milli=int(data["cpu_milli"]),
                memory_mib=int(data["memory_mib"]),
                queue=str(data.get("queue", DEFAULT_QUEUE)),
                priority=int(data.get("priority", 50)),
                preemptible=None if data.get("preemptible") is None else bool(data["preemptible"]),
                mig=None
                if mig is None
                else MigHeld(str(mig["gpu_uuid"]), str(mig["profile"]), int(mig["start"])),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WireError(ASSIGNMENT, f"not an fgpu assignment: {exc}") from None
        if not (len(out.uuids) == len(out.gpus) == len(out.gpu_milli) == len(out.gpu_memory_mib)):
            raise WireError(ASSIGNMENT, "uuids, gpus and shares differ in length")
        if out.mig is not None and len(out.uuids) != 1:
            raise WireError(ASSIGNMENT, "a MIG assignment holds exactly one instance")
        return out


@dataclass(frozen=True, slots=True)
class InventoryMigInstance:
    """A MIG instance of a GPU in MIG mode, as the node agent publishes it."""

    uuid: str
    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class InventoryGpu:
    """One GPU the node agent publishes.

    Attributes:
        index: its index in the inventory (0.. over the GPUs fgpu owns on the node).
        uuid: ``GPU-...``.
        model: catalog model name.
        memory_mib: its memory.
        mig: None for a GPU not in MIG mode (a GPU the decision core shares out); for a GPU
            in MIG mode, its instances (possibly none), which only MIG pods get.
    """

    index: int
    uuid: str
    model: str
    memory_mib: int
    mig: tuple[InventoryMigInstance, ...] | None = None

    def to_data(self) -> dict[str, Any]:
        """The GPU's JSON object."""
        data: dict[str, Any] = {
            "index": self.index,
            "uuid": self.uuid,
            "model": self.model,
            "memory_mib": self.memory_mib,
        }
        if self.mig is not None:
            data["mig"] = {
                "instances": [
                    {"uuid": i.uuid, "profile": i.profile, "start": i.start} for i in self.mig
                ]
            }
        return data

    @classmethod
    def from_data(cls, g: Any) -> InventoryGpu:
        """Inverse of :meth:`to_data` (raises what bad data raises: KeyError, TypeError,
        ValueError, AttributeError)."""
        mig = g.get("mig")
        return cls(
            int(g["index"]),
            str(g["uuid"]),
            str(g["model"]),
            int(g["memory_mib"]),
            None
            if mig is None
            else tuple(
                InventoryMigInstance(str(i["uuid"]), str(i["profile"]), int(i["start"]))
                for i in mig["instances"]
            ),
        )


@dataclass(frozen=True, slots=True)
class Inventory:
    """A node's GPUs as its agent publishes them (``fgpu.io/inventory``).

    Attributes:
        gpus: the GPUs fgpu owns on the node (a subset when the NVIDIA device plugin keeps
            the others), by index.
        backend: ``nvml`` or ``simulated``.
        agent: the agent's version.
        suspend_host_memory_mib: host memory (MiB) the node keeps for pods suspended to
            host memory (issue 28; the scheduler's suspend budget for the node); 0 when the
            agent cannot suspend pods (no CUDA checkpoint API in the node's driver, no pod
            cgroups, or ``--suspend-host-memory 0``): victims there are evicted.
        suspend_note: why the agent cannot suspend pods, when it cannot (for people).
    """

    gpus: tuple[InventoryGpu, ...]
    backend: str
    agent: str = "1"
    suspend_host_memory_mib: int = 0
    suspend_note: str = ""

    def to_json(self) -> str:
        """The annotation's text (``suspend`` only when the agent can suspend pods or says
        why it cannot)."""
        data: dict[str, Any] = {
            "gpus": [g.to_data() for g in self.gpus],
            "backend": self.backend,
            "agent": self.agent,
        }
        if self.suspend_host_memory_mib or self.suspend_note:
            data["suspend"] = {"host_memory_mib": self.suspend_host_memory_mib}
            if self.suspend_note:
                data["suspend"]["note"] = self.suspend_note
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Inventory:
        """Inverse of :meth:`to_json`.

        Raises:
            WireError: not the JSON the agent writes.
        """
        try:
            data: Any = json.loads(text)
            gpus = tuple(InventoryGpu.from_data(g) for g in data["gpus"])
            suspend = data.get("suspend") or {}
            budget = int(suspend.get("host_memory_mib", 0))
            if budget < 0:
                raise ValueError(f"suspend.host_memory_mib {budget} is negative")
            return cls(
                gpus,
                str(data.get("backend", "")),
                str(data.get("agent", "")),
                budget,
                str(suspend.get("note", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WireError(INVENTORY, f"not an fgpu inventory: {exc}") from None


def _placement(text: str) -> tuple[str, int]:
    profile, at, start = text.rpartition("@")
    if not at or not profile or not start.isdigit():
        raise ValueError(f"{text!r} is not PROFILE@START")
    return profile, int(start)


@dataclass(frozen=True, slots=True)
class MigLayoutRequest:
    """The MIG layouts the scheduler wants on a node (``fgpu.io/mig-request`` on the Node).

    Attributes:
        generation: increases with every request written for the node; the request is
            pending while the agent's :class:`MigLayoutStatus` has a lower generation.
        gpus: GPU uuid -> the whole layout wanted on it, ``(profile, start)`` pairs: the
            agent destroys the instances not in it and creates the missing ones (so applying
            it twice changes nothing the second time).
        time: when the scheduler wrote it (seconds since the epoch).
    """

    generation: int
    gpus: Mapping[str, tuple[tuple[str, int], ...]]
    time: float = 0.0

    def to_json(self) -> str:
        """The annotation's text: ``{"generation": 3, "gpus": {"GPU-...": ["3g.40gb@4"]},
        "time": ...}``."""
        return json.dumps(
            {
                "generation": self.generation,
                "gpus": {u: [f"{p}@{s}" for p, s in layout] for u, layout in self.gpus.items()},
                "time": self.time,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> MigLayoutRequest:
        """Inverse of :meth:`to_json`.

        Raises:
            WireError: not the JSON the scheduler writes.
        """
        try:
            data = json.loads(text)
            gpus = {
                str(u): tuple(_placement(str(p)) for p in layout)
                for u, layout in dict(data["gpus"]).items()
            }
            return cls(int(data["generation"]), gpus, float(data.get("time", 0.0)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WireError(MIG_REQUEST, f"not an fgpu MIG request: {exc}") from None


@dataclass(frozen=True, slots=True)
class MigLayoutStatus:
    """What the node agent did with the last MIG request (``fgpu.io/mig-status`` on the
    Node, written in one patch with the inventory that shows the result).

    Attributes:
        generation: the request's generation.
        errors: GPU uuid -> why that GPU was not changed (empty: all done).
        time: when the agent wrote it (seconds since the epoch).
    """

    generation: int
    errors: Mapping[str, str] = field(default_factory=dict)
    time: float = 0.0

    def to_json(self) -> str:
        """The annotation's text."""
        return json.dumps(
            {"generation": self.generation, "errors": dict(self.errors), "time": self.time},
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> MigLayoutStatus:
        """Inverse of :meth:`to_json`.

        Raises:
            WireError: not the JSON the agent writes.
        """
        try:
            data = json.loads(text)
            errors = {str(u): str(e) for u, e in dict(data.get("errors") or {}).items()}
            return cls(int(data["generation"]), errors, float(data.get("time", 0.0)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WireError(MIG_STATUS, f"not an fgpu MIG status: {exc}") from None


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """An object's annotations (empty when it has none)."""
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name``: the workload id fgpu gives a pod."""
    meta = pod["metadata"]
    return f"{meta.get('namespace', 'default')}/{meta['name']}"


def squeezed_by(text: str | None) -> tuple[str, ...]:
    """The pod keys of a :data:`SQUEEZED_BY` annotation (none for None or empty)."""
    return tuple(k for k in (text or "").split(",") if k)
