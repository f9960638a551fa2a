"""Pure domain types and units. Imports nothing else of fgpu."""

from fgpu.model.catalog import (
    GPU_CATALOG,
    GpuModel,
    UnknownGpuModelError,
    canonical_name,
    gpu_model,
)
from fgpu.model.types import Allocation, InvalidRequestError, Node, Request
from fgpu.model.units import (
    MILLI_PER_GPU,
    UnitError,
    format_mib,
    parse_cpu_milli,
    parse_gpu_fraction,
    parse_gpu_request,
    parse_memory_mib,
)

__all__ = [
    "GPU_CATALOG",
    "MILLI_PER_GPU",
    "Allocation",
    "GpuModel",
    "InvalidRequestError",
    "Node",
    "Request",
    "UnitError",
    "UnknownGpuModelError",
    "canonical_name",
    "format_mib",
    "gpu_model",
    "parse_cpu_milli",
    "parse_gpu_fraction",
    "parse_gpu_request",
    "parse_memory_mib",
]
