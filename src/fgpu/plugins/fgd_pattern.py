"""fgd-pattern: FGD with pattern prices and a CPU-deficit term.

FGD (:mod:`fgpu.plugins.fgd`) measures how a placement changes the node's fragmentation
for the target workload, but it does not know which shares go *together* on one GPU. This
policy first asks the pattern LP of the target's one-GPU shares
(:mod:`fgpu.plugins.pattern_price`): putting a share of ``r`` milli on a GPU with ``f`` free
loses ``L(f, r) = K[f] - y(r) - K[f - r]`` GPUs of LP value (Gupta and Radovanovic,
"Interior-point-based online stochastic bin packing", Operations Research 2020; the
sum-of-squares line of Csirik et al., JACM 2006). FGD's integer score and the CPU deficit
decide among the placements of (about) equal loss.

**Key.** For a share of one GPU, every eligible (node, GPU) pair is ranked by, in order:

1. ``floor(L / 0.02)``, smallest first (:data:`LOSS_BIN` GPUs per bin: a coarse bin, like
   FGD's integer score, leaves room for the next terms);
2. FGD's published integer score 0..100 (fgd-protocol.md), largest first;
3. the node's CPU deficit after the placement, smallest first;
4. a partly used GPU before a fully free one;
5. the node's tie-break rank (the placer's), then the lowest GPU index on the node.

Whole-GPU, multi-GPU and CPU-only requests use terms 2, 3 and 5; their GPUs are FGD's (the
lowest-index free GPUs for whole GPUs, best fit for several shares).

**CPU deficit** of a node after the placement, in whole cores::

    deficit = floor(max(0, idle_gpu_milli / 1000 * scale * cpu_per_gpu - cpu_free_milli) / 1000)

where ``cpu_per_gpu`` (milli-cores per GPU) is the target workload's mean CPU per GPU over
its GPU task types, ``sum_m count_m cpu_m / sum_m count_m gpu_count_m gpu_milli_m * 1000``
(:func:`cpu_per_gpu`), and ``scale`` is :attr:`FgdPattern.cpu_deficit_scale`. It counts the
cores the node lacks to use its idle GPU at a fraction of the workload's usual CPU per GPU: a
GPU stranded without CPU is lost as surely as a 190-milli gap. Among placements FGD scores
equal (its integer bins are coarse), the one that strands fewer cores wins, instead of the
random rank.

**The scale.** ``scale * cpu_per_gpu`` is compared with the nodes' own CPU per GPU. On the
Alibaba cluster ``cpu_per_gpu`` is 10.3-11.0 cores on every pod-list variant, and most GPUs
sit on nodes with 12 cores per GPU (96 cores, 8 GPUs) or 8 (16/2, 32/4, 64/8). Past a scale
of about 1.1 every empty 96/8 node already counts a deficit, the term stops telling nodes
apart by what they stranded and overrides FGD's random tie-breaks with a fixed order: the
"cliff" (1.5 leaves about 5.7 % unallocated against FGD's 4.7 % on the default trace).
At 0.5-0.6 it fires on few nodes and helps less. The default 0.7 was chosen on seeds 42-45
of the default trace; ``bench/results/fill-pattern-scale.json`` has the sweep (README,
"Pattern-priced placement"). Scales above :data:`MAX_CPU_DEFICIT_SCALE` are refused; a
cluster whose nodes have much less CPU per GPU than the workload asks for should use a
smaller scale.

Scores are cached per request shape and node and recomputed only for nodes whose
``state.version`` changed (as in :class:`fgpu.plugins.fgd.Fgd`). The LP is solved once per
target workload (the services build a new policy when their target moves).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from fgpu.model.types import InvalidRequestError, Request
from fgpu.plugins.fgd import Fgd, _ShapeCache
from fgpu.plugins.pattern_price import PatternPrices
from fgpu.plugins.registry import register
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.state import BoolArray, ClusterState, GpuNeed, IntArray

LOSS_BIN = 0.02
"""Width of one loss bin in GPUs (the key's first term is ``floor(L / LOSS_BIN)``)."""
DEFAULT_CPU_DEFICIT_SCALE = 0.7
"""Multiple of the workload's CPU per GPU the deficit asks of each idle GPU (chosen on seeds
42-45 of the default trace; see the module docstring)."""
MAX_CPU_DEFICIT_SCALE = 2.0
"""Largest accepted scale (research only: past about 1.1 is the cliff on the Alibaba
cluster, see the module docstring)."""
_BIN_STEP = 10_000_000
"""Weight of one loss bin in the integer node score (above any span of the other terms)."""
MAX_DEFICIT_CORES = 9_999
"""Deficits are counted up to this many cores (a key term, not an amount)."""
_FGD_STEP = 10_000
"""Weight of one FGD score point in the integer node score (above any deficit)."""
_NO_GPU = -(2**62)
"""GPU score of an ineligible GPU."""


def cpu_per_gpu(target: TargetWorkload) -> float:
    """The target workload's mean CPU per GPU in milli-cores (0 when no type asks for GPU).

    ``sum_m count_m * cpu_m / (sum_m count_m * gpu_count_m * gpu_milli_m / 1000)`` over
    the task types that ask for GPU.
    """
    gpu = sum(t.count * t.gpu_count * t.gpu_milli for t in target.types if t.gpu_count)
    cpu = sum(t.count * t.cpu_milli for t in target.types if t.gpu_count)
    return 1000.0 * cpu / gpu if gpu else 0.0


@register
class FgdPattern(Fgd):
    """Pattern-priced FGD with a CPU-deficit term (module docstring).

    Args:
        rng: unused (the policy draws nothing).
        target: the target workload (required).
        cpu_deficit_scale: multiple of the workload's CPU per GPU that the deficit asks of
            each idle GPU, in [0, 2] (default :attr:`cpu_deficit_scale`, 0.7).

    Raises:
        ValueError: no target workload.
        InvalidRequestError: ``cpu_deficit_scale`` is not a number in [0, 2].
        PatternPriceError: the LP solver failed.
    """

    name = "fgd-pattern"
    cpu_deficit_scale: ClassVar[float] = DEFAULT_CPU_DEFICIT_SCALE

    def __init__(
        self,
        *,
        rng: np.random.Generator | None = None,
        target: TargetWorkload | None = None,
        cpu_deficit_scale: float | None = None,
    ) -> None:
        super().__init__(rng=rng, target=target)
        scale = self.cpu_deficit_scale if cpu_deficit_scale is None else cpu_deficit_scale
        if (
            isinstance(scale, bool)
            or not isinstance(scale, int | float)
            or not 0 <= scale <= MAX_CPU_DEFICIT_SCALE
        ):
            raise InvalidRequestError(
                "cpu_deficit_scale",
                f"{scale!r}: must be a number in [0, {MAX_CPU_DEFICIT_SCALE:g}] "
                f"(the default {DEFAULT_CPU_DEFICIT_SCALE:g} is safe; past about 1.1 the CPU "
                "term overrides FGD's tie-breaks and loses GPU)",
            )
        self.scale = float(scale)
        assert self.target is not None
        self.prices = PatternPrices.from_target(self.target)
        self.cpu_per_gpu = cpu_per_gpu(self.target)

    def deficit_cores(self, idle_milli: IntArray, cpu_free: IntArray) -> IntArray:
        """int64[...]: whole cores the node lacks to serve its idle GPU at ``scale`` times the
        workload's mean CPU per GPU (capped at :data:`MAX_DEFICIT_CORES`).

        Args:
            idle_milli: int64[...] the node's free milli-GPU after the placement.
            cpu_free: int64[...] its free CPU in milli-cores after the placement.
        """
        lack = idle_milli * (self.scale * self.cpu_per_gpu / 1000.0) - cpu_free
        cores = np.floor(np.maximum(lack, 0.0) / 1000.0)
        return np.asarray(np.minimum(cores, MAX_DEFICIT_CORES), dtype=np.int64)

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
        cpu_after = cpu - request.cpu_milli
        if request.gpu_count == 1 and not request.is_whole_gpu and gpus is not None:
            share = need.node_milli[nodes]
            before, after = measure.fractional_trials(free, cpu, model, share, request.cpu_milli)
            fgd = np.asarray(self._to_score(before[:, None] - after, measure), dtype=np.int64)
            loss_bin = np.floor(self.prices.loss(free, share[:, None]) / LOSS_BIN + 1e-9)
            partly = free < state.gpu_milli_capacity[nodes]
            # Per GPU: loss bin, then FGD score (0..100), then partly used; the deficit is
            # the same for every GPU of a node.
            gpu_score = -loss_bin.astype(np.int64) * 1000 + fgd * 2 + partly
            gpu_score = np.where(gpus[nodes], gpu_score, _NO_GPU)
            best = np.argmax(gpu_score, axis=1)
            rows = np.arange(nodes.size)
            idle_after = state.gpu_free_total[nodes] - share
            term2 = fgd[rows, best] * _FGD_STEP - self.deficit_cores(idle_after, cpu_after)
            cache.score[nodes] = (
                -loss_bin[rows, best].astype(np.int64) * _BIN_STEP + term2 * 2 + partly[rows, best]
            )
            cache.gpu[nodes] = best
        else:
            taken = self._trial_gpus(state, request, need, gpus, nodes)
            new_free = free - taken
            before_n = measure.node_fragment(free, cpu, model)
            after_n = measure.node_fragment(new_free, cpu_after, model)
            fgd_n = np.asarray(self._to_score(before_n - after_n, measure), dtype=np.int64)
            idle_after = new_free.sum(axis=1)
            cache.score[nodes] = fgd_n * _FGD_STEP - self.deficit_cores(idle_after, cpu_after)
            cache.gpu[nodes] = -1
        cache.version[nodes] = state.version[nodes]
