"""Pattern prices: what a GPU's free milli is worth to the workload's mix of GPU shares.

The target workload's shares of one GPU (sizes ``s`` in milli-GPU, with pod counts
``c_s``) define a bin-packing problem: pack all those pods into as few 1000-milli GPUs as
possible. Its linear-programming relaxation over GPU *patterns* (multisets of sizes whose sum
fits in 1000 milli) is the Gilmore-Gomory LP::

    minimise   sum_p x_p
    subject to sum_p a_{s,p} x_p >= c_s   for every size s      (x_p >= 0)

with ``a_{s,p}`` the copies of size ``s`` in pattern ``p``. The dual prices ``y_s`` of the
cover constraints are "GPUs per pod of size s". Patterns are generated as needed (column
generation): after each LP solve the unbounded knapsack over the prices finds the pattern
with the largest price sum; while that sum exceeds 1 the pattern enters the LP (Gilmore and
Gomory, "A linear programming approach to the cutting-stock problem", Operations Research
1961). The LPs are solved with HiGHS through ``scipy.optimize.linprog``.

From the prices, ``K[f]`` (f = 0..1000) is the largest price sum of a multiset of sizes that
fits in ``f`` milli (an unbounded knapsack), and putting a pod of size ``r`` on a GPU with
``f`` free milli loses::

    L(f, r) = K[f] - y(r) - K[f - r]  >= 0

``L = 0`` exactly when the GPU can still be completed to a pattern the LP's optimum uses at
full price. This loss is the pricing rule of Gupta and Radovanovic, "Interior-point-based
online stochastic bin packing", Operations Research 68(5), 2020: the online policy that
places each item where the dual-priced waste grows least, in the line of the sum-of-squares
algorithm of Csirik, Johnson, Kenyon, Orlin, Shor and Weber ("On the sum-of-squares algorithm
for bin packing", JACM 53(1), 2006). For a size outside the target workload ``y(r) = K[r]``
(what the ``r`` milli could have held); ``K`` is superadditive, so ``L >= 0`` for every
``0 < r <= f <= 1000``.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fgpu.model.types import InvalidRequestError
from fgpu.sched.frag import TargetWorkload

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

GPU_MILLI = 1000
"""Capacity of one GPU in milli-GPU."""
PRICE_TOLERANCE = 1e-9
"""A generated pattern enters the LP only when its price sum exceeds 1 by more than this."""
MAX_ROUNDS = 1000
"""Column-generation rounds before giving up (a round adds one pattern; tens suffice)."""


CACHED_MIXES = 64
"""Mixes whose prices :meth:`PatternPrices.from_target` keeps (least recently used out)."""


class PatternPriceError(RuntimeError):
    """The LP solver failed (a broken installation, not bad input); the message says how."""


def knapsack_table(sizes: IntArray, prices: FloatArray) -> tuple[FloatArray, IntArray]:
    """Unbounded knapsack over one GPU: the best price sum per free milli.

    Args:
        sizes: int64[S] item sizes in milli-GPU, each in 1..1000.
        prices: float64[S] item prices (>= 0).

    Returns:
        ``(K, choice)``: float64[1001] with ``K[f]`` the largest price sum of a multiset of
        sizes summing to at most ``f``; int64[1001] with ``choice[f]`` the index of a size
        that a best multiset for ``f`` contains (the rest is a best multiset for
        ``f - sizes[choice[f]]``), or -1 where ``K[f] = K[f - 1]`` (a best multiset for
        ``f - 1`` is also best for ``f``).
    """
    best = [0.0] * (GPU_MILLI + 1)
    choice = [-1] * (GPU_MILLI + 1)
    items = [(int(s), float(p), i) for i, (s, p) in enumerate(zip(sizes, prices, strict=True))]
    for f in range(1, GPU_MILLI + 1):
        value, pick = best[f - 1], -1
        for size, price, i in items:
            if size <= f and best[f - size] + price > value:
                value, pick = best[f - size] + price, i
        best[f] = value
        choice[f] = pick
    return np.array(best, dtype=np.float64), np.array(choice, dtype=np.int64)


def best_pattern(sizes: IntArray, prices: FloatArray) -> tuple[float, IntArray]:
    """The pattern (sizes summing to at most 1000) with the largest price sum.

    Returns:
        ``(K[1000], copies)``: the price sum and int64[S] copies of each size.
    """
    table, choice = knapsack_table(sizes, prices)
    copies = np.zeros(sizes.size, dtype=np.int64)
    f = GPU_MILLI
    while f > 0:
        i = int(choice[f])
        if i < 0:
            f -= 1
        else:
            copies[i] += 1
            f -= int(sizes[i])
    return float(table[GPU_MILLI]), copies


@dataclass(frozen=True)
class PatternPrices:
    """Dual prices of the pattern LP and the knapsack table built on them.

    Attributes:
        sizes: int64[S] the distinct one-GPU shares of the target workload, ascending
            (milli-GPU, 1..999).
        counts: int64[S] pods of each size in the target workload.
        prices: float64[S] dual price ``y_s`` of each size, in GPUs per pod.
        table: float64[1001] ``K[f]``, see the module docstring.
        unit_price: float64[1001] ``y(r)`` for every size ``r`` (``y_s`` for a target size,
            ``K[r]`` otherwise; 0 for r = 0).
        lp_gpus: optimal value of the LP relaxation (GPUs to hold all the target's shares).
        patterns: number of patterns in the final LP.
    """

    sizes: IntArray
    counts: IntArray
    prices: FloatArray
    table: FloatArray
    unit_price: FloatArray
    lp_gpus: float
    patterns: int

    @classmethod
    def solve(cls, shares: Iterable[tuple[int, int]]) -> PatternPrices:
        """Solve the pattern LP for ``(size, pod count)`` pairs (repeated sizes add up).

        No pairs gives all-zero prices (every loss is 0).

        Raises:
            InvalidRequestError: a size outside 1..999 milli or a count below 1 (names the
                field and echoes the value).
            PatternPriceError: HiGHS did not reach an optimum, or column generation did not
                converge in :data:`MAX_ROUNDS` rounds.
        """
        from scipy.optimize import linprog  # imported here: scipy takes a while to load

        merged: Counter[int] = Counter()
        for size, count in shares:
            if not 0 < size < GPU_MILLI:
                raise InvalidRequestError(
                    "gpu_milli", f"{size}: a pattern size must be a share in 1..999 milli"
                )
            if count < 1:
                raise InvalidRequestError("count", f"{count}: a size needs at least one pod")
            merged[int(size)] += int(count)
        sizes = np.array(sorted(merged), dtype=np.int64)
        counts = np.array([merged[s] for s in sizes.tolist()], dtype=np.int64)
        if sizes.size == 0:
            return cls._build(sizes, counts, np.zeros(0), 0.0, 0)
        # Start from the single-size patterns: as many copies as fit.
        columns = [
            np.where(np.arange(sizes.size) == i, GPU_MILLI // s, 0)
            for i, s in enumerate(sizes.tolist())
        ]
        for _ in range(MAX_ROUNDS):
            matrix = np.array(columns, dtype=np.float64).T  # [S, P]
            res = linprog(
                np.ones(matrix.shape[1]),
                A_ub=-matrix,
                b_ub=-counts.astype(np.float64),
                bounds=(0, None),
                method="highs",
            )
            if res.status != 0:
                raise PatternPriceError(f"pattern LP: HiGHS stopped: {res.message}")
            prices = np.maximum(-np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0)
            value, pattern = best_pattern(sizes, prices)
            if value <= 1.0 + PRICE_TOLERANCE:
                return cls._build(sizes, counts, prices, float(res.fun), len(columns))
            columns.append(pattern)
        raise PatternPriceError(f"pattern LP: no convergence in {MAX_ROUNDS} rounds")

    @classmethod
    def from_target(cls, target: TargetWorkload) -> PatternPrices:
        """Prices for the one-GPU shares of ``target`` (whole-GPU and CPU-only types are
        left out: they do not share a GPU). GPU models are ignored: one pool. The last
        :data:`CACHED_MIXES` answers are kept: the services rebuild their policy whenever
        their recent requests change, often to a mix seen before."""
        merged: Counter[int] = Counter()
        for t in target.types:
            if t.gpu_count == 1 and 0 < t.gpu_milli < GPU_MILLI:
                merged[t.gpu_milli] += t.count
        return _solve_cached(tuple(sorted(merged.items())))

    @classmethod
    def _build(
        cls, sizes: IntArray, counts: IntArray, prices: FloatArray, lp_gpus: float, patterns: int
    ) -> PatternPrices:
        table, _ = knapsack_table(sizes, prices)
        unit = table.copy()
        unit[sizes] = prices
        unit[0] = 0.0
        for array in (sizes, counts, prices, table, unit):
            array.setflags(write=False)
        return cls(sizes, counts, prices, table, unit, lp_gpus, patterns)

    def loss(self, free: IntArray, size: IntArray | int) -> FloatArray:
        """``L(f, r) = K[f] - y(r) - K[f - r]`` per GPU (module docstring), clipped at 0
        against float rounding.

        Args:
            free: int64[...] free milli-GPU ``f`` of each GPU (0..1000).
            size: the pod's share ``r`` (int, or int64[...] broadcastable with ``free``).

        Returns:
            float64[...] (the broadcast shape) the loss in GPUs; 0 where ``r > f`` (the pod
            does not fit: the caller masks those GPUs).
        """
        f, r = np.broadcast_arrays(
            np.asarray(free, dtype=np.int64), np.asarray(size, dtype=np.int64)
        )
        rest = np.clip(f - r, 0, GPU_MILLI)
        value = self.table[np.clip(f, 0, GPU_MILLI)] - self.unit_price[np.clip(r, 0, GPU_MILLI)]
        value = value - self.table[rest]
        return np.where(f >= r, np.maximum(value, 0.0), 0.0)


@functools.lru_cache(maxsize=CACHED_MIXES)
def _solve_cached(shares: tuple[tuple[int, int], ...]) -> PatternPrices:
    return PatternPrices.solve(shares)
