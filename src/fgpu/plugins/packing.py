"""gpu-packing: fill partly used GPUs first, then free GPUs on used nodes, then empty nodes.

Scores, from the published simulator's plugin (fgd-protocol.md); the GPUs the pod would use
are the eligible ones with the least free compute::

    all GPUs of the node fully free:   max(33 - free GPUs, free GPUs)
    it would use k >= 1 fully free GPUs: max(50 - k, 33)
    it fits on partly used GPUs only:  max(100 - (sum over them of free % ) // 10, 50)

where "free %" is ``free_milli * 100 // 1000`` per GPU. CPU-only pods score 0 everywhere
(the tie-break rank decides). GPU: best-fit.
"""

from __future__ import annotations

import numpy as np

from fgpu.model.types import Request
from fgpu.model.units import MILLI_PER_GPU
from fgpu.plugins.registry import register
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.policy import PlacementPolicy, ScoreArray
from fgpu.sched.state import BoolArray, ClusterState, GpuNeed, IntArray

_NOT_ELIGIBLE = 10 * MILLI_PER_GPU


@register
class GpuPacking(PlacementPolicy):
    """Prefer shared GPUs, then used nodes, then the smallest empty node."""

    name = "gpu-packing"

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
        if request.gpu_count == 0 or gpus is None:
            return np.zeros(candidates.size, dtype=np.int64)
        free = state.gpu_free_milli[candidates]
        fully = ((free == MILLI_PER_GPU) & state.gpu_exists[candidates]).sum(axis=1)
        empty = fully == state.gpu_count[candidates]
        used = np.sort(np.where(gpus[candidates], free, _NOT_ELIGIBLE), axis=1)
        used = used[:, : request.gpu_count]
        fully_used = (used == MILLI_PER_GPU).sum(axis=1)
        pct = (used * 100 // MILLI_PER_GPU).sum(axis=1)
        score = np.where(
            empty,
            np.maximum(33 - fully, fully),
            np.where(
                fully_used > 0, np.maximum(50 - fully_used, 33), np.maximum(100 - pct // 10, 50)
            ),
        )
        return np.asarray(score, dtype=np.int64)
