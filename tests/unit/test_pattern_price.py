"""The pattern LP, its dual prices and the knapsack losses, on mixes with known answers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

from fgpu.model.types import InvalidRequestError
from fgpu.plugins.pattern_price import GPU_MILLI, PatternPrices, best_pattern, knapsack_table
from fgpu.sched.frag import TargetWorkload, TaskType


def all_patterns(sizes: list[int]) -> list[tuple[int, ...]]:
    """Every maximal-or-not multiset of ``sizes`` fitting in 1000 milli (copies per size)."""
    ranges = [range(GPU_MILLI // s + 1) for s in sizes]
    return [
        counts
        for counts in itertools.product(*ranges)
        if any(counts) and sum(c * s for c, s in zip(counts, sizes, strict=True)) <= GPU_MILLI
    ]


def full_lp_value(sizes: list[int], counts: list[int]) -> float:
    """The pattern LP over *all* patterns at once (no column generation)."""
    patterns = np.array(all_patterns(sizes), dtype=np.float64).T  # [S, P]
    res = linprog(
        np.ones(patterns.shape[1]), A_ub=-patterns, b_ub=-np.array(counts, dtype=np.float64)
    )
    assert res.status == 0
    return float(res.fun)


def test_halves_and_quarters_price_by_size_and_lose_nothing_where_patterns_complete() -> None:
    prices = PatternPrices.solve([(500, 3), (250, 5)])
    assert prices.sizes.tolist() == [250, 500]
    assert prices.prices == pytest.approx([0.25, 0.5])
    assert prices.lp_gpus == pytest.approx(3 * 0.5 + 5 * 0.25)
    # K[f]: quarters that fit in f
    assert prices.table[[0, 249, 250, 499, 500, 750, 999, 1000]] == pytest.approx(
        [0, 0, 0.25, 0.25, 0.5, 0.75, 0.75, 1.0]
    )
    # every GPU whose free milli is a multiple of 250 can still be completed
    for free in (250, 500, 750, 1000):
        for size in (250, 500):
            if size <= free:
                assert prices.loss(np.array([free]), size)[0] == pytest.approx(0.0, abs=1e-12)
    # a 300-milli pod (not in the mix) on an empty GPU wastes a quarter: K[1000] - K[300]
    # - K[700] = 1 - 0.25 - 0.5
    assert prices.loss(np.array([1000]), 300)[0] == pytest.approx(0.25)
    # a quarter on a GPU with 400 free leaves 150: K[400] - 0.25 - K[150] = 0
    assert prices.loss(np.array([400]), 250)[0] == pytest.approx(0.0, abs=1e-12)


def test_three_sizes_with_unique_duals() -> None:
    # Optimum: 10 x {810, 190}, 2.5 x {300, 300, 190, 190}, 1 x {190 x 5} = 13.5 GPUs; all
    # three patterns are used, so their price sums are 1: y810 + y190 = 1, 5 y190 = 1,
    # 2 y300 + 2 y190 = 1.
    prices = PatternPrices.solve([(810, 10), (190, 20), (300, 5)])
    assert prices.sizes.tolist() == [190, 300, 810]
    assert prices.prices == pytest.approx([0.2, 0.3, 0.8])
    assert prices.lp_gpus == pytest.approx(13.5)
    assert prices.table[GPU_MILLI] == pytest.approx(1.0)
    # a 300 on an empty GPU: 1 - 0.3 - K[700] (300 + 190 + 190 = 0.7) = 0
    assert prices.loss(np.array([1000]), 300)[0] == pytest.approx(0.0, abs=1e-12)
    # a 300 where 400 is free: K[400] (190 + 190 = 0.4) - 0.3 - K[100] = 0.1
    assert prices.loss(np.array([400]), 300)[0] == pytest.approx(0.1)
    # a 100 (not in the mix) in the 190 gap beside an 810: K[190] - K[100] - K[90] = 0.2
    assert prices.loss(np.array([190]), 100)[0] == pytest.approx(0.2)


def test_repeated_sizes_add_up_and_a_target_gives_its_one_gpu_shares() -> None:
    target = TargetWorkload(
        (
            TaskType(4000, 500, 1, "", 3),
            TaskType(8000, 500, 1, "V100M16", 2),  # models are ignored: one pool
            TaskType(8000, 250, 1, "", 5),
            TaskType(8000, 1000, 2, "", 7),  # whole GPUs: not a share
            TaskType(2000, 0, 0, "", 9),  # CPU-only
        )
    )
    prices = PatternPrices.from_target(target)
    assert prices.sizes.tolist() == [250, 500]
    assert prices.counts.tolist() == [5, 5]
    assert prices.prices == pytest.approx([0.25, 0.5])


def test_no_shares_price_nothing() -> None:
    prices = PatternPrices.solve([])
    assert prices.sizes.size == 0
    assert prices.lp_gpus == 0.0
    assert not prices.table.any()
    assert prices.loss(np.array([1000, 500]), 300).tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("shares", "field", "echo"),
    [
        ([(0, 3)], "gpu_milli", "0"),
        ([(1000, 3)], "gpu_milli", "1000"),
        ([(-5, 3)], "gpu_milli", "-5"),
        ([(500, 0)], "count", "0"),
    ],
    ids=["zero-size", "whole-gpu", "negative", "no-pods"],
)
def test_bad_shares_are_refused_with_the_field(
    shares: list[tuple[int, int]], field: str, echo: str
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        PatternPrices.solve(shares)
    assert info.value.field == field
    assert echo in str(info.value)


@pytest.mark.parametrize(
    ("sizes", "counts"),
    [
        ([300, 350, 450], [7, 11, 5]),
        ([200, 330, 470, 810], [40, 9, 13, 21]),
        ([250, 400, 600], [3, 8, 8]),
        ([220, 230, 320, 650], [62, 140, 328, 253]),
    ],
    ids=["three", "four", "pairs", "trace-like"],
)
def test_column_generation_reaches_the_full_lp(sizes: list[int], counts: list[int]) -> None:
    prices = PatternPrices.solve(list(zip(sizes, counts, strict=True)))
    assert prices.lp_gpus == pytest.approx(full_lp_value(sizes, counts), rel=1e-9)
    # strong duality: the prices of all pods add up to the LP value
    assert float(prices.prices @ prices.counts) == pytest.approx(prices.lp_gpus, rel=1e-9)
    # dual feasibility: no pattern is worth more than one GPU
    assert prices.table[GPU_MILLI] <= 1.0 + 1e-9


def test_best_pattern_rebuilds_the_knapsack_optimum() -> None:
    sizes = np.array([190, 300, 810], dtype=np.int64)
    value, copies = best_pattern(sizes, np.array([0.25, 0.3, 0.7]))
    # 190 x 4 + ... : 0.25 * 5 = 1.25 (950 milli) beats 810 + 190 = 0.95
    assert value == pytest.approx(1.25)
    assert copies.tolist() == [5, 0, 0]
    table, choice = knapsack_table(sizes, np.array([0.25, 0.3, 0.7]))
    assert table[189] == 0.0
    assert choice[190] == 0
    assert choice[191] == -1  # K[191] = K[190]
