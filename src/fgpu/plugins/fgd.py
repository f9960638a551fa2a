"""fgd: Fragmentation Gradient Descent (Weng et al., USENIX ATC '23).

Place the pod where the node's fragmentation F_n (see :mod:`fgpu.sched.frag`) grows least.
For a share of one GPU every eligible GPU of the node is tried and the best one kept; whole
GPUs take the lowest-index free GPUs; a CPU-only pod changes only the node's CPU.

Two variants:

- ``fgd`` reproduces the published result: the node score is the integer
  ``floor(100 / (1 + exp(-(F_before - F_after) / 1000)))`` (F in milli-GPU), the highest wins,
  equal scores go to the lowest tie-break rank, and on a node the GPU with the highest
  integer score wins (lowest index on ties). The coarse integer bins plus random-rank ties are
  part of the published 4.77 % figure (fgd-protocol.md).
- ``fgd-exact`` uses the exact fragmentation increase (no rounding); ties only when equal.

Speed: scores depend only on a node's state and the pod's shape, so they are cached per
shape (CPU, share, memory, GPU count) and per node, and recomputed only for nodes whose
``state.version`` changed since (usually the one node that took the previous pod).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fgpu.model.types import Request
from fgpu.plugins.registry import register
from fgpu.sched.frag import FragmentationMeasure, TargetWorkload
from fgpu.sched.policy import PlacementPolicy, ScoreArray, best_fit_gpus
from fgpu.sched.state import BoolArray, ClusterState, GpuNeed, IntArray

ShapeKey = tuple[int, int | None, int | None, int]
_EXP_LIMIT = 700.0
"""|x| bound for ``exp(-x)`` in the sigmoid: exp(709.8) is the largest finite float64."""


class _ShapeCache:
    """Per-node scores for one request shape, valid while ``version`` matches the state."""

    __slots__ = ("gpu", "score", "version")

    def __init__(self, n: int, exact: bool) -> None:
        self.score: ScoreArray = (
            np.zeros(n, dtype=np.float64) if exact else np.zeros(n, dtype=np.int64)
        )
        self.gpu: IntArray = np.full(n, -1, dtype=np.int64)
        self.version: IntArray = np.full(n, -1, dtype=np.int64)


@register
class Fgd(PlacementPolicy):
    """Fragmentation gradient descent with the published integer scores."""

    name = "fgd"
    exact = False

    def __init__(
        self, *, rng: np.random.Generator | None = None, target: TargetWorkload | None = None
    ) -> None:
        del rng
        if target is None:
            raise ValueError(f"policy {self.name}: needs a target workload")
        self.target = target
        self._names: tuple[str, ...] | None = None
        self._measure: FragmentationMeasure | None = None
        self._caches: dict[ShapeKey, _ShapeCache] = {}

    def measure(self, state: ClusterState) -> FragmentationMeasure:
        """The fragmentation measure bound to ``state``'s GPU models (built once per cluster)."""
        if self._names is not state.node_names or self._measure is None:
            self._names = state.node_names
            self._measure = FragmentationMeasure(state.model_names, self.target)
            self._caches = {}
        return self._measure

    def _to_score(self, delta: IntArray, measure: FragmentationMeasure) -> ScoreArray:
        """Score of a weighted fragmentation decrease ``F_before - F_after``.

        The sigmoid's argument is clipped to [-700, 700] before ``exp``: beyond that
        ``exp`` overflows float64 (a RuntimeWarning), while the integer score is already
        0 for x below -5 and 100 for x above 37 (the sigmoid rounds to 1.0), so the clip
        changes no score.
        """
        if self.exact:
            return delta / measure.total_weight
        x = np.clip(delta / (measure.total_weight * 1000.0), -_EXP_LIMIT, _EXP_LIMIT)
        return np.floor((1.0 / (1.0 + np.exp(-x))) * 100.0).astype(np.int64)

    def _cache(self, state: ClusterState, request: Request) -> _ShapeCache:
        self.measure(state)
        key = (request.cpu_milli, request.gpu_milli, request.gpu_memory_mib, request.gpu_count)
        cache = self._caches.get(key)
        if cache is None:
            cache = self._caches[key] = _ShapeCache(state.num_nodes, self.exact)
        return cache

    def _refresh(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        gpus: BoolArray | None,
        nodes: IntArray,
        cache: _ShapeCache,
    ) -> None:
        measure = self.measure(state)
        free = state.gpu_free_milli[nodes]
        cpu = state.cpu_free[nodes]
        model = state.node_model[nodes]
        if request.gpu_count == 1 and not request.is_whole_gpu and gpus is not None:
            before, after = measure.fractional_trials(
                free, cpu, model, need.node_milli[nodes], request.cpu_milli
            )
            scores = self._to_score(before[:, None] - after, measure)
            low: float = -np.inf if self.exact else -1
            scores = np.where(gpus[nodes], scores, low)
            best = np.argmax(scores, axis=1)
            cache.score[nodes] = scores[np.arange(nodes.size), best]
            cache.gpu[nodes] = best
        else:
            taken = self._trial_gpus(state, request, need, gpus, nodes)
            new_free = free - taken
            before = measure.node_fragment(free, cpu, model)
            after = measure.node_fragment(new_free, cpu - request.cpu_milli, model)
            cache.score[nodes] = self._to_score(before - after, measure)
            cache.gpu[nodes] = -1
        cache.version[nodes] = state.version[nodes]

    @staticmethod
    def _trial_gpus(
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        gpus: BoolArray | None,
        nodes: IntArray,
    ) -> npt.NDArray[np.int64]:
        """int64[D, G]: milli-GPU the request would take from each GPU of each node."""
        taken = np.zeros((nodes.size, state.max_gpus), dtype=np.int64)
        if gpus is None or request.gpu_count == 0:
            return taken
        eligible = gpus[nodes]
        if request.is_whole_gpu:
            pick = eligible & (np.cumsum(eligible, axis=1) <= request.gpu_count)
            return np.where(pick, need.milli[nodes], 0).astype(np.int64)
        for row, node in enumerate(nodes):
            for g in best_fit_gpus(state.gpu_free_milli[node], eligible[row], request):
                taken[row, g] = need.milli[node, g]
        return taken

    def score(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        candidates: IntArray,
        gpus: BoolArray | None,
    ) -> ScoreArray:
        cache = self._cache(state, request)
        stale = candidates[cache.version[candidates] != state.version[candidates]]
        if stale.size:
            self._refresh(state, request, need, gpus, stale, cache)
        return cache.score[candidates]

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
        if request.gpu_count == 1 and not request.is_whole_gpu:
            cache = self._cache(state, request)
            if cache.version[node] != state.version[node]:
                self._refresh(state, request, need, gpus, np.array([node]), cache)
            return (int(cache.gpu[node]),)
        return best_fit_gpus(state.gpu_free_milli[node], gpus[node], request)


@register
class FgdExact(Fgd):
    """FGD with exact (unrounded) fragmentation increases; for research."""

    name = "fgd-exact"
    exact = True
