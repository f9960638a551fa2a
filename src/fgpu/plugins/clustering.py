"""gpu-clustering: keep pods of the same GPU class together (FGD paper's baseline).

Classes: a share of one GPU, 1, 2, 4 or 8 whole GPUs (any other count is its own class).
Tiers, from the published simulator's plugin (fgd-protocol.md)::

    (75, 100]  the node hosts only pods of the pod's class
    (50, 75]   the node hosts several classes including the pod's
    (25, 50]   the node hosts no GPU pod
    (0, 25]    the node hosts only other classes

inside a tier ``25 * (GPU_max - gpu_free) // GPU_max`` (integer division, GPU_max the largest
node's GPU milli) is added, so fuller nodes win. CPU-only pods score 0 everywhere and the
tie-break rank decides. GPU: best-fit.

The policy remembers the classes placed on each node through :meth:`on_allocate` and
:meth:`on_release`; use one policy object per cluster state.
"""

from __future__ import annotations

import numpy as np

from fgpu.model.types import Allocation, Request
from fgpu.plugins.common import gpu_class, largest_node, node_gpu_free
from fgpu.plugins.registry import register
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.policy import PlacementPolicy, ScoreArray
from fgpu.sched.state import BoolArray, ClusterState, GpuNeed, IntArray


@register
class GpuClustering(PlacementPolicy):
    """Tiered by which GPU classes a node already hosts."""

    name = "gpu-clustering"

    def __init__(
        self, *, rng: np.random.Generator | None = None, target: TargetWorkload | None = None
    ) -> None:
        del rng, target
        self._names: tuple[str, ...] | None = None
        self.hosted: IntArray = np.zeros((0, 1), dtype=np.int64)
        """int64[N, C]: number of pods of each class on each node."""

    def _bind(self, state: ClusterState) -> None:
        if self._names is not state.node_names:
            self._names = state.node_names
            self.hosted = np.zeros((state.num_nodes, state.max_gpus + 1), dtype=np.int64)

    def score(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        candidates: IntArray,
        gpus: BoolArray | None,
    ) -> ScoreArray:
        self._bind(state)
        if request.gpu_count == 0:
            return np.zeros(candidates.size, dtype=np.int64)
        _, gpu_max = largest_node(state)
        hosted = self.hosted[candidates] > 0
        same = hosted[:, gpu_class(request.gpu_count, int(need.node_milli[candidates[0]]))]
        classes = hosted.sum(axis=1)
        tier = np.where(same, np.where(classes == 1, 75, 50), np.where(classes == 0, 25, 0))
        left = node_gpu_free(state, candidates)
        inner = (25 * (int(gpu_max) - left)) // int(gpu_max)
        return np.asarray(tier + inner, dtype=np.int64)

    def _count(self, state: ClusterState, allocation: Allocation, delta: int) -> None:
        if not allocation.gpus:
            return
        self._bind(state)
        cls = gpu_class(len(allocation.gpus), allocation.gpu_milli[0])
        self.hosted[allocation.node, cls] += delta

    def on_allocate(self, state: ClusterState, allocation: Allocation) -> None:
        self._count(state, allocation, 1)

    def on_release(self, state: ClusterState, allocation: Allocation) -> None:
        self._count(state, allocation, -1)
