"""GPU catalog: the models fgpu knows, with memory, SM count and MIG capability.

Memory is the nominal device memory in MiB (vendor data sheets: 16 GB -> 16384 MiB).
NVML reports a slightly smaller total on some boards (a T4 shows 15360 MiB); when the
node agent reads a real device, the device's figure wins over this table.

SM counts are from NVIDIA's architecture white papers and product briefs (T4 40, P100 56,
V100 80, A10 72, A30 56, A100 108, L40S 142, H100 SXM5 132, H200 132).

The Alibaba trace (cluster-trace-gpu-v2023) uses its own names: ``V100M16`` and
``V100M32`` are the V100 16 GB and 32 GB boards and are aliases here. ``G2`` and ``G3`` are
undisclosed internal models. fgpu assumes **G2 = 32 GiB, 80 SMs** (an eight-GPU, 96-vCPU
V100-32GB-class server, the trace's most common node) and **G3 = 80 GiB, 108 SMs** (an
eight-GPU, 128-vCPU A100-80GB-class server). The fragmentation experiment does not use
GPU memory, so these assumptions do not change any published figure; they only matter to
callers that ask for GPU memory on those models.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU model.

    Attributes:
        name: canonical name, e.g. ``"A100-80GB"``.
        memory_mib: device memory in MiB.
        sm_count: streaming multiprocessors.
        mig_capable: whether the model supports Multi-Instance GPU.
        assumed: True when the figures are fgpu's assumption (anonymised trace models).
    """

    name: str
    memory_mib: int
    sm_count: int
    mig_capable: bool
    assumed: bool = False


_MODELS: tuple[GpuModel, ...] = (
    GpuModel("T4", 16 * 1024, 40, False),
    GpuModel("P100", 16 * 1024, 56, False),
    GpuModel("V100-16GB", 16 * 1024, 80, False),
    GpuModel("V100-32GB", 32 * 1024, 80, False),
    GpuModel("A10", 24 * 1024, 72, False),
    GpuModel("A30", 24 * 1024, 56, True),
    GpuModel("A100-40GB", 40 * 1024, 108, True),
    GpuModel("A100-80GB", 80 * 1024, 108, True),
    GpuModel("L40S", 48 * 1024, 142, False),
    GpuModel("H100-80GB", 80 * 1024, 132, True),
    GpuModel("H200-141GB", 141 * 1024, 132, True),
    GpuModel("G2", 32 * 1024, 80, False, assumed=True),
    GpuModel("G3", 80 * 1024, 108, False, assumed=True),
)

GPU_CATALOG: dict[str, GpuModel] = {m.name: m for m in _MODELS}
"""Canonical name -> model."""

ALIASES: dict[str, str] = {
    "V100M16": "V100-16GB",
    "V100M32": "V100-32GB",
    "V100": "V100-16GB",
    "A100": "A100-40GB",
    "H100": "H100-80GB",
    "H200": "H200-141GB",
}
"""Other spellings (trace names, short names) -> canonical name."""


class UnknownGpuModelError(KeyError):
    """A GPU model name that is neither canonical nor an alias."""

    def __init__(self, name: str) -> None:
        self.name = name
        known = ", ".join(sorted(GPU_CATALOG))
        aliases = ", ".join(sorted(ALIASES))
        shown = repr(name) if len(name) <= 40 else f"{name[:40]!r}... ({len(name)} characters)"
        super().__init__(
            f"gpu_model: unknown GPU model {shown}; known models: {known} (aliases: {aliases})"
        )

    def __str__(self) -> str:
        return str(self.args[0])


def canonical_name(name: str) -> str:
    """Return the catalog name for ``name`` (canonical or alias, case-insensitive).

    Raises:
        UnknownGpuModelError: the name is not in the catalog.
    """
    key = name.strip()
    if key in GPU_CATALOG:
        return key
    if key in ALIASES:
        return ALIASES[key]
    lowered = key.lower()
    for candidate in GPU_CATALOG:
        if candidate.lower() == lowered:
            return candidate
    for alias, target in ALIASES.items():
        if alias.lower() == lowered:
            return target
    raise UnknownGpuModelError(name)


def models_named(name: str) -> tuple[str, ...]:
    """The catalog models a requested model name means (``--gpu-model``, a pod's annotation).

    A family, the part of canonical names before their ``-`` (``A100``, ``V100``, ``H100``;
    case-insensitive), means every model of it: ``A100`` -> ``("A100-40GB", "A100-80GB")``.
    Any other name means the one model :func:`canonical_name` gives (``A100-80GB``,
    ``V100M32``). (A trace's ``A100`` is one model, :data:`ALIASES`; a request naming a
    family asks for any of its models.)

    Raises:
        UnknownGpuModelError: neither a family nor a model of the catalog.
    """
    prefix = name.strip().lower() + "-"
    family = tuple(m for m in GPU_CATALOG if m.lower().startswith(prefix))
    return family if family else (canonical_name(name),)


def gpu_model(name: str) -> GpuModel:
    """Look a model up by canonical name or alias.

    Raises:
        UnknownGpuModelError: the name is not in the catalog.
    """
    return GPU_CATALOG[canonical_name(name)]
