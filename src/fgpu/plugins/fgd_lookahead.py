"""fgd-pattern-lookahead: fgd-pattern that tries its best few choices against sampled futures.

Slow (each one-GPU share costs ``options x samples x arrivals`` simulated placements);
meant for research and small clusters, not the default anywhere.

For a share of one GPU:

1. rank the feasible nodes by :class:`fgpu.plugins.fgd_pattern.FgdPattern`'s key and keep
   the best :attr:`FgdPatternLookahead.options` (3), each with its best GPU;
2. draw :attr:`FgdPatternLookahead.samples` (2) futures of
   :attr:`FgdPatternLookahead.arrivals` (20) pods each from the target workload (task type
   m with probability p_m), the same futures for every option (common random numbers);
3. for each option, on a copy of the cluster: place the pod there, then each future pod with
   plain ``fgd-pattern``; the cost is the sum of the pattern losses ``L(f, r)`` (GPUs, see
   :mod:`fgpu.plugins.pattern_price`) of every one-GPU share placed, the pod's own included,
   plus the GPUs of every future pod that fits nowhere;
4. keep the option with the least mean cost; equal costs go to the better key.

Any other request is placed as ``fgd-pattern`` places it. The random generator given to the
policy draws the futures (seeded: runs repeat exactly).

This is a one-step rollout in the sense of Bertsekas ("Rollout algorithms for discrete
optimization: a survey", Handbook of Combinatorial Optimization, 2013): the base policy
evaluates each candidate by simulating what it would do next.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from fgpu.model.types import Request
from fgpu.plugins.fgd_pattern import FgdPattern
from fgpu.plugins.registry import register
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.policy import pick_highest
from fgpu.sched.state import BoolArray, ClusterState, GpuNeed, IntArray


def _is_share(request: Request) -> bool:
    return request.gpu_count == 1 and not request.is_whole_gpu


@register
class FgdPatternLookahead(FgdPattern):
    """fgd-pattern with a short rollout over sampled arrivals (module docstring).

    Args:
        rng: draws the sampled futures (default seeded with 0 by the registry).
        target: the target workload (required); futures are drawn from it.
        cpu_deficit_scale: as :class:`FgdPattern`.

    Raises:
        ValueError: no target workload.
        InvalidRequestError: a bad ``cpu_deficit_scale``.
    """

    name = "fgd-pattern-lookahead"
    options: ClassVar[int] = 3
    samples: ClassVar[int] = 2
    arrivals: ClassVar[int] = 20

    def __init__(
        self,
        *,
        rng: np.random.Generator | None = None,
        target: TargetWorkload | None = None,
        cpu_deficit_scale: float | None = None,
    ) -> None:
        super().__init__(rng=rng, target=target, cpu_deficit_scale=cpu_deficit_scale)
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.base = FgdPattern(target=target, cpu_deficit_scale=self.scale)
        assert self.target is not None
        types = self.target.types
        self._kinds = [
            Request(t.cpu_milli, 0, t.gpu_count, t.gpu_milli or None, None, _models(t.gpu_models))
            for t in types
        ]
        weight = np.array([t.count for t in types], dtype=np.float64)
        self._p = weight / weight.sum()

    def select_node(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        candidates: IntArray,
        gpus: BoolArray | None,
        rank: IntArray,
    ) -> int:
        scores = self.score(state, request, need, candidates, gpus)
        if not _is_share(request) or candidates.size < 2 or gpus is None:
            return pick_highest(scores, candidates, rank)
        order = np.lexsort((rank[candidates], -scores))[: self.options]
        options = [int(candidates[i]) for i in order]
        futures = [
            self.rng.choice(len(self._kinds), size=self.arrivals, p=self._p)
            for _ in range(self.samples)
        ]
        costs = [
            sum(self._rollout(state, request, node, future, rank) for future in futures)
            for node in options
        ]
        return options[int(np.argmin(costs))]  # argmin: the first (best key) on ties

    def _rollout(
        self,
        state: ClusterState,
        request: Request,
        node: int,
        future: IntArray,
        rank: IntArray,
    ) -> float:
        """Cost of placing ``request`` on ``node``, then ``future`` with the base policy."""
        trial = state.copy()
        need = trial.gpu_need(request)
        _, gpus = trial.feasible(request, need)
        chosen = self.select_gpus(trial, request, need, node, gpus)
        cost = self._loss(trial, request, need, node, chosen)
        trial.allocate(request, node, chosen)
        base = self.base
        for kind in future.tolist():
            pod = self._kinds[kind]
            pod_need = trial.gpu_need(pod)
            feasible, pod_gpus = trial.feasible(pod, pod_need)
            candidates = np.flatnonzero(feasible)
            if candidates.size == 0:
                cost += pod.total_gpu_milli / 1000.0
                continue
            where = base.select_node(trial, pod, pod_need, candidates, pod_gpus, rank)
            picked = base.select_gpus(trial, pod, pod_need, where, pod_gpus)
            if _is_share(pod):
                cost += self._loss(trial, pod, pod_need, where, picked)
            trial.allocate(pod, where, picked)
        return cost

    def _loss(
        self,
        state: ClusterState,
        request: Request,
        need: GpuNeed,
        node: int,
        gpus: tuple[int, ...],
    ) -> float:
        g = gpus[0]
        free = state.gpu_free_milli[node, g : g + 1]
        return float(self.prices.loss(free, int(need.milli[node, g]))[0])


def _models(joined: str) -> frozenset[str]:
    return frozenset(joined.split("|")) if joined else frozenset()
