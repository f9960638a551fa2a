"""binpack and spread: most- and least-allocated node (Kubernetes' MostAllocated and
LeastAllocated scoring strategies, over CPU and GPU compute).

utilization after placing = mean over the node's resources (CPU, and GPU compute where the
node has GPUs) of (capacity - free + request) / capacity; binpack scores
floor(100 * utilization) and picks the best-fit GPU, spread scores
floor(100 * (1 - utilization)) and picks the GPU with the most free compute.
"""

from __future__ import annotations

import numpy as np

from fgpu.model.types import Request
from fgpu.plugins.common import FloatArray, node_gpu_free, request_gpu_milli
from fgpu.plugins.registry import register
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.policy import PlacementPolicy, ScoreArray, worst_fit_gpus
from fgpu.sched.state import BoolArray, ClusterState, GpuNeed, IntArray


def utilization_after(
    state: ClusterState, request: Request, need: GpuNeed, candidates: IntArray
) -> FloatArray:
    """float64[K]: mean fraction of CPU and GPU compute in use after placing ``request``."""
    cpu_cap = np.maximum(state.cpu_capacity[candidates], 1)
    cpu_used = (cpu_cap - state.cpu_free[candidates] + request.cpu_milli) / cpu_cap
    gpu_cap = state.gpu_milli_capacity[candidates].sum(axis=1)
    has_gpu = gpu_cap > 0
    gpu_used = (
        gpu_cap - node_gpu_free(state, candidates) + request_gpu_milli(request, need, candidates)
    ) / np.maximum(gpu_cap, 1)
    return np.where(has_gpu, (cpu_used + gpu_used) / 2.0, cpu_used)


@register
class Binpack(PlacementPolicy):
    """Most-allocated node first."""

    name = "binpack"

    def __init__(
        self, *, rng: np.random.Generator | None = None, target: TargetWorkload | None = None
    ) -> None:
        del rng, target

    def score(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        candidates: IntArray,
        gpus: BoolArray | None,
    ) -> ScoreArray:
        return np.floor(100.0 * utilization_after(state, request, need, candidates)).astype(
            np.int64
        )


@register
class Spread(PlacementPolicy):
    """Least-allocated node first, emptiest GPU."""

    name = "spread"

    def __init__(
        self, *, rng: np.random.Generator | None = None, target: TargetWorkload | None = None
    ) -> None:
        del rng, target

    def score(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        candidates: IntArray,
        gpus: BoolArray | None,
    ) -> ScoreArray:
        used = utilization_after(state, request, need, candidates)
        return np.floor(100.0 * (1.0 - used)).astype(np.int64)

    def select_gpus(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        node: int,
        gpus: BoolArray | None,
    ) -> tuple[int, ...]:
        if gpus is None:
            return ()
        return worst_fit_gpus(state.gpu_free_milli[node], gpus[node], request)
