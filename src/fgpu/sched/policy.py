"""The placement-policy interface: score feasible nodes, then choose GPUs on the winner.

A policy is a small object with two extension points (STYLE.md 2): :meth:`score` over the
feasible nodes and :meth:`select_gpus` on the chosen node. :class:`fgpu.sched.placer.Placer`
runs the filter, asks the policy, breaks ties and binds. Policies live in
:mod:`fgpu.plugins` and are registered by name there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from fgpu.model.types import Allocation, Request
from fgpu.sched.state import BoolArray, ClusterState, GpuNeed, IntArray

ScoreArray = npt.NDArray[np.int64] | npt.NDArray[np.float64]


class PlacementPolicy(ABC):
    """Base class of placement policies.

    Subclasses set :attr:`name` and implement :meth:`score`; the default GPU choice is
    best-fit (:func:`best_fit_gpus`). A policy may keep caches; they must be keyed on
    ``state.version`` so that they stay right after any change, including on copies.
    """

    name: ClassVar[str]

    @abstractmethod
    def score(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        candidates: IntArray,
        gpus: BoolArray | None,
    ) -> ScoreArray:
        """Score the feasible nodes; higher is better.

        Args:
            state: the cluster.
            request: the request being placed.
            need: the request resolved per GPU (``state.gpu_need(request)``).
            candidates: int64[K] indices of the feasible nodes (K >= 1), ascending.
            gpus: bool[N, G] eligible GPUs (None for CPU-only requests).

        Returns:
            int64[K] or float64[K] scores aligned with ``candidates``.
        """

    def select_node(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        candidates: IntArray,
        gpus: BoolArray | None,
        rank: IntArray,
    ) -> int:
        """Pick the node: highest score, ties to the lowest ``rank`` (int64[N])."""
        scores = self.score(state, request, need, candidates, gpus)
        return pick_highest(scores, candidates, rank)

    def select_gpus(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        node: int,
        gpus: BoolArray | None,
    ) -> tuple[int, ...]:
        """GPUs on ``node`` for ``request``; default: best-fit (see :func:`best_fit_gpus`)."""
        if gpus is None:
            return ()
        return best_fit_gpus(state.gpu_free_milli[node], gpus[node], request)

    def on_allocate(self, state: ClusterState, allocation: Allocation) -> None:  # noqa: B027
        """Hook after a bind; policies that track placements (gpu-clustering) override."""

    def on_release(self, state: ClusterState, allocation: Allocation) -> None:  # noqa: B027
        """Hook after a release."""


def pick_highest(scores: ScoreArray, candidates: IntArray, rank: IntArray) -> int:
    """Index of the best candidate: highest score, equal scores to the lowest rank.

    Args:
        scores: int64[K] or float64[K].
        candidates: int64[K] node indices.
        rank: int64[N] tie-break rank of every node (unique values).
    """
    best = np.flatnonzero(scores == scores.max())
    if best.size == 1:
        return int(candidates[best[0]])
    tied = candidates[best]
    return int(tied[np.argmin(rank[tied])])


def best_fit_gpus(free: IntArray, eligible: BoolArray, request: Request) -> tuple[int, ...]:
    """Best-fit GPU choice on one node (fgd-protocol.md, "Best-fit GPU").

    Whole GPUs: the lowest-index eligible (fully free) GPUs. Shares: the eligible GPUs with
    the least free milli-GPU, lowest index on ties.

    Args:
        free: int64[G] free milli-GPU of the node's GPUs.
        eligible: bool[G] GPUs that can hold one share.
        request: the request (``gpu_count`` GPUs are returned).
    """
    k = request.gpu_count
    idx = np.flatnonzero(eligible)
    if request.is_whole_gpu:
        return tuple(int(i) for i in idx[:k])
    order = idx[np.argsort(free[idx], kind="stable")]
    return tuple(sorted(int(i) for i in order[:k]))


def worst_fit_gpus(free: IntArray, eligible: BoolArray, request: Request) -> tuple[int, ...]:
    """The eligible GPUs with the most free milli-GPU, lowest index on ties (for spreading)."""
    k = request.gpu_count
    idx = np.flatnonzero(eligible)
    order = idx[np.argsort(-free[idx], kind="stable")]
    return tuple(sorted(int(i) for i in order[:k]))
