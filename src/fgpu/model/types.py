"""Domain types: nodes, requests and allocations, all in integer units.

Units (DESIGN.md section 3): compute in milli-GPU per GPU, memory in MiB, CPU in
milli-cores. Constructors validate and raise :class:`InvalidRequestError` (a ``ValueError``)
naming the field and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fgpu.model.units import MILLI_PER_GPU


class InvalidRequestError(ValueError):
    """A request or node description that breaks a rule; the message names the field."""

    def __init__(self, field_name: str, reason: str) -> None:
        self.field = field_name
        self.reason = reason
        super().__init__(f"{field_name}: {reason}")


@dataclass(frozen=True, slots=True)
class Node:
    """A machine with ``gpu_count`` GPUs of one model.

    Attributes:
        name: unique node name.
        cpu_milli: allocatable CPU in milli-cores.
        memory_mib: allocatable host memory in MiB.
        gpu_count: number of GPUs (0 for a CPU-only node).
        gpu_model: canonical catalog name of the GPUs, or None for a CPU-only node.
        gpu_memory_mib: memory of each GPU in MiB (0 for a CPU-only node).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_model: str | None
    gpu_memory_mib: int

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidRequestError("name", "a node needs a name")
        for attr in ("cpu_milli", "memory_mib", "gpu_count", "gpu_memory_mib"):
            if getattr(self, attr) < 0:
                raise InvalidRequestError(attr, "must not be negative")
        if self.gpu_count > 0 and (self.gpu_model is None or self.gpu_memory_mib <= 0):
            raise InvalidRequestError("gpu_model", "a node with GPUs needs a model and memory")


@dataclass(frozen=True, slots=True)
class Request:
    """What a workload asks for (DESIGN.md section 4).

    Attributes:
        cpu_milli: CPU in milli-cores.
        memory_mib: host memory in MiB.
        gpu_count: number of distinct GPUs (0: CPU only).
        gpu_milli: compute share on *each* of those GPUs, 1..1000; 1000 means whole GPUs,
            which must be fully free. None: derived from ``gpu_memory_mib`` on the chosen
            GPU (memory / GPU memory, at least 1 milli).
        gpu_memory_mib: memory quota on each GPU in MiB. None: proportional to the compute
            share, ``floor(gpu_milli * gpu_memory / 1000)`` of the chosen GPU (flooring keeps
            the quotas on a GPU within its memory when the shares sum to 1000).
        gpu_models: allowed canonical GPU model names; empty means any model.

    Raises:
        InvalidRequestError: negative amounts, a share outside 1..1000, GPU fields on a
            CPU-only request, or neither a share nor a memory quota on a GPU request.
    """

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_count: int = 0
    gpu_milli: int | None = None
    gpu_memory_mib: int | None = None
    gpu_models: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.cpu_milli < 0:
            raise InvalidRequestError("cpu_milli", "must not be negative")
        if self.memory_mib < 0:
            raise InvalidRequestError("memory_mib", "must not be negative")
        if self.gpu_count < 0:
            raise InvalidRequestError("gpu_count", "must not be negative")
        if self.gpu_count == 0:
            if self.gpu_milli not in (None, 0) or self.gpu_memory_mib not in (None, 0):
                raise InvalidRequestError("gpu_count", "GPU share or memory given with 0 GPUs")
            return
        if self.gpu_milli is None and self.gpu_memory_mib is None:
            raise InvalidRequestError("gpu_milli", "a GPU request needs a share or a memory quota")
        if self.gpu_milli is not None and not 1 <= self.gpu_milli <= MILLI_PER_GPU:
            raise InvalidRequestError("gpu_milli", "must be in 1..1000 milli-GPU")
        if self.gpu_memory_mib is not None and self.gpu_memory_mib <= 0:
            raise InvalidRequestError("gpu_memory_mib", "must be positive")

    @property
    def is_cpu_only(self) -> bool:
        """True when no GPU is requested."""
        return self.gpu_count == 0

    @property
    def is_whole_gpu(self) -> bool:
        """True when each requested GPU must be fully free (share 1000)."""
        return self.gpu_count > 0 and self.gpu_milli == MILLI_PER_GPU

    @property
    def total_gpu_milli(self) -> int:
        """Sum of the compute shares over all requested GPUs (0 when memory-derived)."""
        return self.gpu_count * (self.gpu_milli or 0)


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where a request was placed.

    Attributes:
        node: index of the node in the cluster state.
        node_name: the node's name.
        gpus: indices of the GPUs on that node (empty for CPU-only work), ascending.
        gpu_milli: compute share granted on each GPU in ``gpus`` (same order).
        gpu_memory_mib: memory quota granted on each GPU in ``gpus`` (same order).
        cpu_milli: CPU granted in milli-cores.
        memory_mib: host memory granted in MiB.
    """

    node: int
    node_name: str
    gpus: tuple[int, ...]
    gpu_milli: tuple[int, ...]
    gpu_memory_mib: tuple[int, ...]
    cpu_milli: int
    memory_mib: int
