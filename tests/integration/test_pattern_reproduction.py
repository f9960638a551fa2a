"""fgd-pattern against fgd on the real default Alibaba trace (slow; two seeds)."""

from __future__ import annotations

import pytest

from fgpu.sim.experiment import DEFAULT_NODES, DEFAULT_PODS, Trace, find_trace_dir, run_experiment
from fgpu.sim.report import bucketize

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trace() -> Trace:
    folder = find_trace_dir()
    if folder is None or not (folder / DEFAULT_NODES).is_file():
        pytest.skip(f"Alibaba trace not found (looked at {folder}; set FGPU_TRACE_DIR)")
    return Trace.load(folder / DEFAULT_NODES, folder / DEFAULT_PODS)


def test_fgd_pattern_leaves_less_unallocated_than_fgd_on_two_seeds(trace: Trace) -> None:
    seeds = [42, 43]
    runs = run_experiment(trace, ["fgd", "fgd-pattern"], seeds, workers=2)
    unallocated = {
        (r.policy, r.seed): 100.0 - float(bucketize(r)["allocated_pct"][100]) for r in runs
    }
    for seed in seeds:
        fgd, pattern = unallocated["fgd", seed], unallocated["fgd-pattern", seed]
        # bench/results/fill-pattern-variants.json: 4.08 against 4.69 (seed 42) and 4.23
        # against 4.62 (seed 43). 0.2 point is about the seed-to-seed spread: the test fails
        # when the gain shrinks to noise.
        assert pattern < fgd - 0.2, (seed, pattern, fgd)
