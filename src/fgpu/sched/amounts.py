"""Resource vectors of the decision core: ``[gpu_milli, cpu_milli, memory_mib]``
(:data:`fgpu.sched.workload.RESOURCES`) that a request counts against quotas and an
allocation holds, and the host memory a suspended workload holds."""

from __future__ import annotations

from fgpu.model.types import Allocation, Request
from fgpu.sched.workload import Workload

Vec = list[int]
"""A resource vector, ``[gpu_milli, cpu_milli, memory_mib]``."""


def request_resources(request: Request, largest_gpu_memory: int) -> Vec:
    """[gpu_milli, cpu_milli, memory_mib] a request counts against quotas.

    A share given as memory only is counted as its share of the largest GPU in the cluster
    (the least it can take), ``ceil(memory * 1000 / largest)``.
    """
    if request.gpu_count and request.gpu_milli is None:
        mem = request.gpu_memory_mib or 0
        per_gpu = max(1, -(-mem * 1000 // max(largest_gpu_memory, 1)))
        gpu = request.gpu_count * per_gpu
    else:
        gpu = request.total_gpu_milli
    return [gpu, request.cpu_milli, request.memory_mib]


def allocation_resources(allocation: Allocation) -> Vec:
    """[gpu_milli, cpu_milli, memory_mib] an allocation holds."""
    return [sum(allocation.gpu_milli), allocation.cpu_milli, allocation.memory_mib]


def held_rest(allocation: Allocation) -> Vec:
    """[cpu_milli, memory_mib] an allocation holds."""
    return [allocation.cpu_milli, allocation.memory_mib]


def suspend_host_mib(workload: Workload) -> int:
    """Host memory (MiB) ``workload`` holds once suspended: its GPU memory (copied to host)
    plus its host memory (its frozen processes keep it); see
    :class:`~fgpu.sched.workload.Suspend`."""
    a = workload.allocation
    assert a is not None
    return sum(a.gpu_memory_mib) + a.memory_mib


def add(a: Vec, b: Vec, sign: int = 1) -> Vec:
    """``a + sign * b``, element by element."""
    return [x + sign * y for x, y in zip(a, b, strict=True)]


__all__ = [
    "Vec",
    "add",
    "allocation_resources",
    "held_rest",
    "request_resources",
    "suspend_host_mib",
]
