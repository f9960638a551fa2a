"""dotprod: Tetris-style alignment (Grandl et al., SIGCOMM '14), as in the FGD experiment.

d = (cpu_free / CPU_max) * (cpu_req / CPU_max) + (gpu_free / GPU_max) * (gpu_req / GPU_max),
score = floor(100 * (1 - d / 2)); the smallest dot product wins (fgd-protocol.md).
GPU: best-fit.
"""

from __future__ import annotations

import numpy as np

from fgpu.model.types import Request
from fgpu.plugins.common import largest_node, node_gpu_free, request_gpu_milli
from fgpu.plugins.registry import register
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.policy import PlacementPolicy, ScoreArray
from fgpu.sched.state import BoolArray, ClusterState, GpuNeed, IntArray


@register
class DotProduct(PlacementPolicy):
    """Smallest dot product of free resources and the request, integer score 0..100."""

    name = "dotprod"

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
        cpu_max, gpu_max = largest_node(state)
        d = (state.cpu_free[candidates] / cpu_max) * (request.cpu_milli / cpu_max) + (
            node_gpu_free(state, candidates) / gpu_max
        ) * (request_gpu_milli(request, need, candidates) / gpu_max)
        return np.floor(100.0 * (1.0 - d / 2.0)).astype(np.int64)
