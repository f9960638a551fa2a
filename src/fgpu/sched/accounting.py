"""What a running workload counts as allocated GPU compute: the one figure behind every view.

A squeezed workload (:mod:`fgpu.sched.squeeze`) keeps its GPU memory, CPU and host memory,
but its compute is lent to the workloads that squeezed it, which count it. So its compute
counts nowhere as allocation (of its queue, of its GPU) nor as demand, and the queues'
allocations never add up to more than the GPUs they share (DESIGN.md section 5, squeeze
before evict). The decision core, the service's queue and GPU views (``fgpu queue ls``,
``fgpu top``, the dashboard) and its Prometheus series (``fgpu_queue_allocated_gpus``,
``fgpu_gpu_compute_allocated_ratio``) all count through :func:`counted_gpu_milli`.

Pure (no I/O).
"""

from __future__ import annotations

from collections.abc import Sequence


def counted_gpu_milli(gpu_milli: Sequence[int], squeezed: bool) -> int:
    """The GPU compute a running workload counts as allocated, in milli-GPU.

    Args:
        gpu_milli: its granted compute per GPU it holds (milli-GPU, 0..1000 each); pass one
            GPU's grant alone to count per GPU.
        squeezed: whether it is squeezed now (its compute lent to its squeezers).

    Returns:
        ``sum(gpu_milli)``, or 0 while it is squeezed.
    """
    return 0 if squeezed else sum(gpu_milli)


__all__ = ["counted_gpu_milli"]
