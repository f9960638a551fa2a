"""Helpers shared by the policies: node-level sums and the largest-node normalizers."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fgpu.model.types import Request
from fgpu.sched.state import ClusterState, GpuNeed, IntArray

FloatArray = npt.NDArray[np.float64]


def largest_node(state: ClusterState) -> tuple[float, float]:
    """(CPU milli-cores, GPU milli) of the largest node: the normalizers of best-fit and
    dot-product. On the Alibaba trace they are 128000 and 8000, the constants of
    fgd-protocol.md (128 vCPU, 8 GPUs)."""
    return float(state.largest_node_cpu), float(state.largest_node_gpu_milli)


def node_gpu_free(state: ClusterState, nodes: IntArray) -> IntArray:
    """int64[K]: total free milli-GPU on each of ``nodes``."""
    return state.gpu_free_total[nodes]


def request_gpu_milli(request: Request, need: GpuNeed, nodes: IntArray) -> IntArray:
    """int64[K]: the request's total milli-GPU on each node (count x per-GPU share)."""
    if request.gpu_count == 0:
        return np.zeros(nodes.shape, dtype=np.int64)
    return np.asarray(need.node_milli[nodes] * request.gpu_count, dtype=np.int64)


def gpu_class(gpu_count: int, gpu_milli: int) -> int:
    """The request class of gpu-clustering: 0 a share of one GPU, k for k whole GPUs."""
    if gpu_count == 1 and gpu_milli < 1000:
        return 0
    return gpu_count
