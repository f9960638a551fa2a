"""best-fit: the node with the least leftover CPU and GPU after placing.

Score (fgd-protocol.md, from the published simulator's best-fit plugin)::

    floor(100 * (1 - (0.5 * (cpu_free - cpu_req) / CPU_max + 0.5 * (gpu_free - gpu_req) / GPU_max)))

with CPU_max, GPU_max the largest node's capacity; highest wins. GPU: best-fit.
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
class BestFit(PlacementPolicy):
    """Least leftover resources, as an integer score 0..100."""

    name = "best-fit"

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
        cpu_left = (state.cpu_free[candidates] - request.cpu_milli) / cpu_max * 0.5
        gpu_left = (
            (node_gpu_free(state, candidates) - request_gpu_milli(request, need, candidates))
            / gpu_max
            * 0.5
        )
        return np.floor((1.0 - (cpu_left + gpu_left)) * 100.0).astype(np.int64)
