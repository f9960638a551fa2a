"""random: a feasible node uniformly at random, then a random eligible GPU.

The draws come from the generator given to the constructor, so a seeded run repeats.
Whole GPUs still take the lowest-index free GPUs (fgd-protocol.md).
"""

from __future__ import annotations

import numpy as np

from fgpu.model.types import Request
from fgpu.plugins.registry import register
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.policy import PlacementPolicy, ScoreArray, best_fit_gpus
from fgpu.sched.state import BoolArray, ClusterState, GpuNeed, IntArray


@register
class RandomPolicy(PlacementPolicy):
    """Uniform choice among feasible nodes and eligible GPUs."""

    name = "random"

    def __init__(
        self, *, rng: np.random.Generator | None = None, target: TargetWorkload | None = None
    ) -> None:
        del target
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def score(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        candidates: IntArray,
        gpus: BoolArray | None,
    ) -> ScoreArray:
        return self.rng.random(candidates.size)

    def select_node(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        candidates: IntArray,
        gpus: BoolArray | None,
        rank: IntArray,
    ) -> int:
        return int(candidates[self.rng.integers(candidates.size)])

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
        if request.is_whole_gpu:
            return best_fit_gpus(state.gpu_free_milli[node], gpus[node], request)
        eligible = np.flatnonzero(gpus[node])
        picked = self.rng.choice(eligible, size=request.gpu_count, replace=False)
        return tuple(sorted(int(i) for i in picked))
