"""Domain types: nodes, requests and allocations, all in integer units.

Units (DESIGN.md section 3): compute in milli-GPU per GPU, memory in MiB, CPU in
milli-cores. Constructors validate and raise :class:`InvalidRequestError` (a ``ValueError``)
naming the field and the reason: amounts must be integers (``int`` or a numpy integer, never
``bool`` or ``float``), not negative, and at most the bounds below; GPU model names known to
the catalog are stored under their catalog name (``"a100-80gb"`` -> ``"A100-80GB"``,
``"A100"`` -> ``"A100-40GB"``), unknown ones as given.
"""

from __future__ import annotations

import numbers
from collections.abc import Set
from dataclasses import dataclass, field

from fgpu.model.catalog import UnknownGpuModelError, canonical_name
from fgpu.model.units import MILLI_PER_GPU

MAX_CPU_MILLI = 10**9
"""Largest CPU amount of a node or request, in milli-cores (a million cores)."""

MAX_MEMORY_MIB = 2**40
"""Largest host or GPU memory of a node or request, in MiB (1 EiB)."""

MAX_GPUS = 64
"""Largest number of GPUs on one node, and so in one request (it must fit on one node)."""

MODEL_SEPARATOR = "|"
"""Joins GPU model names in trace files and target-workload keys; no name may contain it."""


class InvalidRequestError(ValueError):
    """A request or node description that breaks a rule; the message names the field."""

    def __init__(self, field_name: str, reason: str) -> None:
        self.field = field_name
        self.reason = reason
        super().__init__(f"{field_name}: {reason}")

    def __reduce__(self) -> tuple[type[InvalidRequestError], tuple[str, str]]:
        return (type(self), (self.field, self.reason))


def _check_amount(owner: object, name: str, maximum: int) -> None:
    """Check that field ``name`` of ``owner`` is an integer in ``0..maximum``.

    A numpy integer is stored back as a plain ``int`` (``owner`` is a frozen dataclass
    under construction, hence ``object.__setattr__``).

    Raises:
        InvalidRequestError: not an integer (``bool`` and ``float`` included, so NaN too),
            negative, or above ``maximum``.
    """
    value: object = getattr(owner, name)
    if type(value) is int and 0 <= value <= maximum:
        return  # the common case, kept cheap: requests are built per pod in the simulators
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidRequestError(name, f"must be an integer (got {value!r})")
    number = int(value)
    if number < 0:
        raise InvalidRequestError(name, "must not be negative")
    if number > maximum:
        raise InvalidRequestError(name, f"{number} is above the largest supported value {maximum}")
    object.__setattr__(owner, name, number)  # a numpy integer (or an int subclass) -> int


def _check_optional_integer(owner: object, name: str) -> None:
    """Check that field ``name`` is None or an integer (stored back as a plain ``int``);
    its range is the caller's business.

    Raises:
        InvalidRequestError: neither None nor an integer (``bool`` and ``float`` included).
    """
    value: object = getattr(owner, name)
    if value is None or type(value) is int:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidRequestError(name, f"must be an integer (got {value!r})")
    object.__setattr__(owner, name, int(value))


def _model_name(field_name: str, model: object) -> str:
    """Validate one GPU model name; return its catalog name, or the name as given when the
    catalog does not know it (a cluster may have models the catalog lacks).

    Raises:
        InvalidRequestError: not a string, empty, or containing ``|``.
    """
    if not isinstance(model, str):
        raise InvalidRequestError(field_name, f"a GPU model name must be a string (got {model!r})")
    if not model.strip():
        raise InvalidRequestError(field_name, "empty GPU model name")
    if MODEL_SEPARATOR in model:
        raise InvalidRequestError(
            field_name, f"GPU model name {model!r} must not contain {MODEL_SEPARATOR!r}"
        )
    try:
        return canonical_name(model)
    except UnknownGpuModelError:
        return model


@dataclass(frozen=True, slots=True)
class Node:
    """A machine with ``gpu_count`` GPUs of one model.

    Attributes:
        name: unique node name, a non-empty string.
        cpu_milli: allocatable CPU in milli-cores, 0..:data:`MAX_CPU_MILLI`.
        memory_mib: allocatable host memory in MiB, 0..:data:`MAX_MEMORY_MIB`.
        gpu_count: number of GPUs (0 for a CPU-only node), 0..:data:`MAX_GPUS`.
        gpu_model: GPU model, stored under its catalog name when the catalog knows it (else
            as given); None for a CPU-only node (an empty name there becomes None).
        gpu_memory_mib: memory of each GPU in MiB (0 for a CPU-only node),
            0..:data:`MAX_MEMORY_MIB`.
        suspend_host_memory_mib: host memory set aside for suspended work, in MiB,
            0..:data:`MAX_MEMORY_MIB` (DESIGN.md section 5, "keep the work"): a suspended
            workload's GPU memory copied to host plus the host memory its frozen processes
            keep are charged here, apart from ``memory_mib`` (what running work may be
            granted). 0 (the default): suspend is off on this node, victims are evicted.
        restore_other_gpus: the node's CUDA driver can restore a checkpointed process onto
            other GPUs of the same model than those it was checkpointed from (CUDA 13,
            driver version >= 13000, ``gpuPairs``; CUDA 12.8-12.9, r570-r575, restore onto
            the same GPUs). False (the default): a suspended workload is restored only onto
            its own GPUs. The service sets it where its checkpoint driver can remap
            (``CheckpointDriver.can_remap``: the fake driver too); the replay by default.

    Raises:
        InvalidRequestError: an empty name, a non-integer, negative or too large amount, a
            node with GPUs but no model name or no GPU memory, a model that is not a string.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_model: str | None
    gpu_memory_mib: int
    suspend_host_memory_mib: int = 0
    restore_other_gpus: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise InvalidRequestError("name", f"must be a string (got {self.name!r})")
        if not self.name:
            raise InvalidRequestError("name", "a node needs a name")
        _check_amount(self, "cpu_milli", MAX_CPU_MILLI)
        _check_amount(self, "memory_mib", MAX_MEMORY_MIB)
        _check_amount(self, "gpu_count", MAX_GPUS)
        _check_amount(self, "gpu_memory_mib", MAX_MEMORY_MIB)
        _check_amount(self, "suspend_host_memory_mib", MAX_MEMORY_MIB)
        model = self.gpu_model
        if model is not None and not isinstance(model, str):
            raise InvalidRequestError(
                "gpu_model", f"a GPU model name must be a string (got {model!r})"
            )
        if self.gpu_count == 0:
            if model is not None and not model.strip():
                object.__setattr__(self, "gpu_model", None)
            elif model is not None:
                object.__setattr__(self, "gpu_model", _model_name("gpu_model", model))
            return
        if model is None or self.gpu_memory_mib <= 0:
            raise InvalidRequestError("gpu_model", "a node with GPUs needs a model and memory")
        if not model.strip():
            raise InvalidRequestError(
                "gpu_model", f"empty GPU model name on a node with {self.gpu_count} GPU(s)"
            )
        object.__setattr__(self, "gpu_model", _model_name("gpu_model", model))


@dataclass(frozen=True, slots=True)
class Request:
    """What a workload asks for (DESIGN.md section 4).

    Attributes:
        cpu_milli: CPU in milli-cores, 0..:data:`MAX_CPU_MILLI`.
        memory_mib: host memory in MiB, 0..:data:`MAX_MEMORY_MIB`.
        gpu_count: number of distinct GPUs (0: CPU only), 0..:data:`MAX_GPUS`.
        gpu_milli: compute share on *each* of those GPUs, 1..1000; 1000 means whole GPUs,
            which must be fully free. None: derived from ``gpu_memory_mib`` on the chosen
            GPU (memory / GPU memory, at least 1 milli).
        gpu_memory_mib: memory quota on each GPU in MiB, 1..:data:`MAX_MEMORY_MIB`. None:
            proportional to the compute share, ``floor(gpu_milli * gpu_memory / 1000)`` of
            the chosen GPU (flooring keeps the quotas on a GPU within its memory when the
            shares sum to 1000).
        gpu_models: allowed GPU models, a set of names; empty means any model. Stored as a
            frozenset with catalog names where the catalog knows the model (``"a100-80gb"``
            -> ``"A100-80GB"``), other names as given.

    Raises:
        InvalidRequestError: a non-integer (``bool``, ``float``, ``str``), negative or too
            large amount, a share outside 1..1000, GPU fields on a CPU-only request, neither
            a share nor a memory quota on a GPU request, or ``gpu_models`` that is not a set
            of non-empty strings (a plain string is refused: it is one name, not a set).
    """

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_count: int = 0
    gpu_milli: int | None = None
    gpu_memory_mib: int | None = None
    gpu_models: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        _check_amount(self, "cpu_milli", MAX_CPU_MILLI)
        _check_amount(self, "memory_mib", MAX_MEMORY_MIB)
        _check_amount(self, "gpu_count", MAX_GPUS)
        _check_optional_integer(self, "gpu_milli")
        _check_optional_integer(self, "gpu_memory_mib")
        if self.gpu_memory_mib is not None and self.gpu_memory_mib > MAX_MEMORY_MIB:
            raise InvalidRequestError(
                "gpu_memory_mib",
                f"{self.gpu_memory_mib} is above the largest supported value {MAX_MEMORY_MIB}",
            )
        self._check_models()
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

    def _check_models(self) -> None:
        models: object = self.gpu_models
        if type(models) is frozenset and not models:
            return
        if isinstance(models, str | bytes):
            raise InvalidRequestError(
                "gpu_models",
                f"must be a set of GPU model names, not one string (got {models!r}; "
                f"write frozenset({{{models!r}}}))",
            )
        if not isinstance(models, Set):
            raise InvalidRequestError(
                "gpu_models", f"must be a set of GPU model names (got {models!r})"
            )
        names = frozenset(_model_name("gpu_models", m) for m in models)
        if names != models or type(models) is not frozenset:
            object.__setattr__(self, "gpu_models", names)

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
