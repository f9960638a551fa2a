"""Hypothesis: the pattern losses are never negative, and the prices are an optimal dual."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fgpu.plugins.pattern_price import GPU_MILLI, PatternPrices

mixes = st.dictionaries(
    keys=st.integers(1, GPU_MILLI - 1),
    values=st.integers(1, 2000),
    min_size=1,
    max_size=8,
)


@given(mix=mixes)
@settings(max_examples=40, deadline=None)
def test_loss_is_never_negative_and_prices_are_dual_optimal(mix: dict[int, int]) -> None:
    prices = PatternPrices.solve(mix.items())
    free = np.arange(GPU_MILLI + 1)[:, None]  # every f = 0..1000
    size = np.arange(1, GPU_MILLI + 1)[None, :]  # every r = 1..1000, in the mix or not
    loss = prices.loss(free, size)
    assert loss.min() >= 0.0
    # unclipped, the loss is at least -1e-9 wherever the pod fits (superadditivity of K)
    raw = (
        prices.table[free]
        - prices.unit_price[size]
        - prices.table[np.clip(free - size, 0, GPU_MILLI)]
    )
    assert raw[free >= size].min() >= -1e-9
    # K is non-decreasing, and no pattern is worth more than one GPU (dual feasibility)
    assert (np.diff(prices.table) >= 0).all()
    assert prices.table[GPU_MILLI] <= 1.0 + 1e-6
    # strong duality: prices of all pods add up to the LP's GPUs
    total = float(prices.prices @ prices.counts)
    assert abs(total - prices.lp_gpus) <= 1e-6 * max(1.0, prices.lp_gpus)
    # the LP needs at least the pods' milli in GPUs, and never more than one GPU per pod
    milli = sum(s * c for s, c in mix.items()) / GPU_MILLI
    assert milli - 1e-6 <= prices.lp_gpus <= sum(mix.values()) + 1e-6


def brute_force_best(sizes: list[int], prices: list[float], free: int) -> float:
    """Largest price sum of a multiset of ``sizes`` within ``free`` milli, by enumeration."""
    if not sizes:
        return 0.0
    best = brute_force_best(sizes[1:], prices[1:], free)
    for copies in range(1, free // sizes[0] + 1):
        rest = brute_force_best(sizes[1:], prices[1:], free - copies * sizes[0])
        best = max(best, copies * prices[0] + rest)
    return best


@given(
    mix=st.dictionaries(st.integers(150, 999), st.integers(1, 500), min_size=1, max_size=4),
    free=st.integers(0, GPU_MILLI),
)
@settings(max_examples=40, deadline=None)
def test_knapsack_table_matches_enumeration(mix: dict[int, int], free: int) -> None:
    prices = PatternPrices.solve(mix.items())
    expected = brute_force_best(prices.sizes.tolist(), prices.prices.tolist(), free)
    assert abs(float(prices.table[free]) - expected) <= 1e-9
