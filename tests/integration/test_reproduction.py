"""The published FGD fragmentation result on the real default Alibaba trace (slow)."""

from __future__ import annotations

import pytest

from fgpu.plugins import PUBLISHED_POLICIES
from fgpu.sim.experiment import (
    DEFAULT_NODES,
    DEFAULT_PODS,
    Trace,
    find_trace_dir,
    run_experiment,
)
from fgpu.sim.report import PUBLISHED_UNALLOCATED_AT_100, TOLERANCE, summarize

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trace() -> Trace:
    folder = find_trace_dir()
    if folder is None or not (folder / DEFAULT_NODES).is_file():
        pytest.skip(f"Alibaba trace not found (looked at {folder}; set FGPU_TRACE_DIR)")
    return Trace.load(folder / DEFAULT_NODES, folder / DEFAULT_PODS)


def unallocated_at_100(trace: Trace, policies: list[str], seeds: list[int]) -> dict[str, float]:
    runs = run_experiment(trace, policies, seeds, workers=2)
    summary = summarize(runs, seeds, 1.3, 0.0)
    return {p: summary["policies"][p]["unallocated_gpu_pct"]["100"] for p in policies}


def test_two_seeds_rank_the_policies_as_published(trace: Trace) -> None:
    got = unallocated_at_100(trace, ["random", "dotprod", "best-fit", "fgd"], [42, 43])
    assert got["random"] > got["dotprod"] > got["best-fit"] > got["fgd"], got


def test_ten_seeds_reproduce_the_published_table(trace: Trace) -> None:
    got = unallocated_at_100(trace, list(PUBLISHED_POLICIES), list(range(42, 52)))
    for policy, value in got.items():
        published = PUBLISHED_UNALLOCATED_AT_100[policy]
        assert abs(value - published) <= TOLERANCE[policy], (policy, value, published)
