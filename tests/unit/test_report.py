"""Fill-experiment report: buckets, medians over seeds, CSV, plots, comparison table."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from fgpu.sim import report
from fgpu.sim.report import (
    BUCKETS,
    CSV_HEADER,
    PNG_SIGNATURE,
    PUBLISHED_UNALLOCATED_AT_100,
    TOLERANCE,
    RunCurve,
    bucketize,
    comparison_table,
    plot_fragmentation,
    plot_unallocated,
    summarize,
    write_curves_csv,
    write_report,
)

NAN = float("nan")
REPORT_FILES = ["curves.csv", "fragmentation.png", "summary.json", "unallocated.png"]


def curve(
    arrived: npt.ArrayLike,
    allocated: npt.ArrayLike | None = None,
    frag_rate: npt.ArrayLike | None = None,
    frag: npt.ArrayLike | None = None,
    *,
    policy: str = "fgd",
    seed: int = 42,
    failed: int = 0,
    elapsed: float = 1.0,
) -> RunCurve:
    """A run from plain lists; metrics default to zeros of the right length."""
    points = np.asarray(arrived, dtype=np.float64)

    def arr(xs: npt.ArrayLike | None) -> npt.NDArray[np.float64]:
        return np.zeros(points.size) if xs is None else np.asarray(xs, dtype=np.float64)

    return RunCurve(
        policy=policy,
        seed=seed,
        arrived_pct=points,
        allocated_pct=arr(allocated),
        frag_rate_pct=arr(frag_rate),
        frag_pct=arr(frag),
        failed_pods=failed,
        elapsed_s=elapsed,
    )


def expected(values: dict[int, float]) -> npt.NDArray[np.float64]:
    """float64[131], NaN except the given buckets."""
    out = np.full(len(BUCKETS), np.nan)
    for b, v in values.items():
        out[b] = v
    return out


# ----------------------------------------------------------------------------- bucketize
def test_bucketize_returns_three_metrics_of_131_buckets() -> None:
    means = bucketize(curve([50.0], [1.0], [2.0], [3.0]))
    assert list(means) == ["allocated_pct", "frag_rate_pct", "frag_pct"]
    for values in means.values():
        assert values.shape == (131,)
        assert values.dtype == np.float64
    assert (means["allocated_pct"][50], means["frag_rate_pct"][50], means["frag_pct"][50]) == (
        1.0,
        2.0,
        3.0,
    )


def test_half_to_even_and_empty_buckets_take_points_within_one_pct() -> None:
    # 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 3.5 -> 4; buckets 1 and 3 are empty.
    means = bucketize(curve([0.5, 1.5, 2.5, 3.5], [10.0, 20.0, 30.0, 40.0]))
    np.testing.assert_array_equal(
        means["allocated_pct"],
        expected({0: 10.0, 1: 15.0, 2: 25.0, 3: 35.0, 4: 40.0}),
    )


@pytest.mark.parametrize(
    ("arrived", "bucket"),
    [
        pytest.param(0.5, 0, id="0.5-to-0"),
        pytest.param(1.5, 2, id="1.5-to-2"),
        pytest.param(2.5, 2, id="2.5-to-2"),
        pytest.param(99.49, 99, id="99.49-to-99"),
        pytest.param(99.5, 100, id="99.5-to-100"),
        pytest.param(100.5, 100, id="100.5-to-100-half-even"),
        pytest.param(100.51, 101, id="100.51-to-101"),
        pytest.param(101.5, 102, id="101.5-to-102"),
        pytest.param(130.4, 130, id="130.4-to-130"),
    ],
)
def test_point_goes_to_nearest_integer_half_to_even(arrived: float, bucket: int) -> None:
    # A 0 % point on every integer keeps every bucket non-empty; the probe adds 50 to one.
    grid = [float(b) for b in BUCKETS]
    means = bucketize(curve([*grid, arrived], [0.0] * len(grid) + [50.0]))
    np.testing.assert_array_equal(
        means["allocated_pct"],
        expected(dict.fromkeys(BUCKETS, 0.0)) + (np.arange(131) == bucket) * 25.0,
    )


def test_metrics_are_rounded_to_two_decimals_before_the_mean() -> None:
    means = bucketize(
        curve(
            [10.0, 10.2, 20.0, 30.0, 30.1, 30.2],
            allocated=[1.006, 1.006, 0.125, 1.01, 1.02, 1.02],
            frag_rate=[2.004, 2.004, 0.375, 0.0, 0.0, 0.0],
            frag=[0.994, 0.996, 7.0, 0.0, 0.0, 0.0],
        )
    )
    assert means["allocated_pct"][10] == 1.01  # raw mean 1.006
    assert means["frag_rate_pct"][10] == 2.0  # raw mean 2.004
    assert means["frag_pct"][10] == (0.99 + 1.0) / 2
    assert means["allocated_pct"][20] == 0.12  # half to even at the 2nd decimal
    assert means["frag_rate_pct"][20] == 0.38
    assert means["allocated_pct"][30] == (1.01 + 1.02 + 1.02) / 3  # the mean itself unrounded


def test_non_empty_bucket_uses_only_its_own_points() -> None:
    means = bucketize(curve([9.6, 10.4, 11.0], [1.0, 3.0, 50.0]))["allocated_pct"]
    assert means[10] == 2.0  # 11.0 is within 1 % of 10 but bucket 10 has its own points
    assert means[11] == 50.0
    assert means[9] == 1.0  # empty: only 9.6 lies in [8, 10]
    assert means[12] == 50.0  # empty: only 11.0 lies in [11, 13]
    assert np.isnan(means[8])  # nothing in [7, 9]
    assert np.isnan(means[13])  # nothing in [12, 14]


def test_neighbour_window_is_closed_and_mixes_both_sides() -> None:
    means = bucketize(curve([3.0, 5.0], [10.0, 20.0]))["allocated_pct"]
    np.testing.assert_array_equal(means, expected({2: 10.0, 3: 10.0, 4: 15.0, 5: 20.0, 6: 20.0}))


def test_points_past_130_5_only_fill_bucket_130_when_it_is_empty() -> None:
    means = bucketize(curve([129.0, 130.8, 131.4], [1.0, 2.0, 4.0]))["allocated_pct"]
    assert means[129] == 1.0
    assert means[130] == 1.5  # empty: 129.0 and 130.8 lie in [129, 131], 131.4 does not


def test_curve_without_points_is_all_nan() -> None:
    means = bucketize(curve([]))
    for values in means.values():
        assert np.isnan(values).all()


def test_unsorted_points_bucket_the_same() -> None:
    a = bucketize(curve([0.5, 1.5, 2.5, 3.5], [10.0, 20.0, 30.0, 40.0]))
    b = bucketize(curve([3.5, 0.5, 2.5, 1.5], [40.0, 10.0, 30.0, 20.0]))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def reference_bucket_means(arrived: Sequence[float], values: Sequence[float]) -> list[float]:
    """The protocol's rule point by point, as plainly as possible."""
    rounded = [round(float(np.round(v, 2)), 2) for v in values]
    means = []
    for b in BUCKETS:
        own = [v for a, v in zip(arrived, rounded, strict=True) if round(a) == b]
        near = [v for a, v in zip(arrived, rounded, strict=True) if abs(a - b) <= 1]
        chosen = own or near
        means.append(sum(chosen) / len(chosen) if chosen else NAN)
    return means


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bucketize_matches_the_point_by_point_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Sparse steps leave empty buckets; some steps land exactly on .5 and on integers.
    steps = rng.choice([0.0, 0.25, 0.5, 1.0, 1.5, 2.25, 3.0], size=120)
    arrived = np.cumsum(steps)
    allocated = rng.uniform(0.0, 100.0, size=arrived.size)
    means = bucketize(curve(arrived, allocated))["allocated_pct"]
    np.testing.assert_allclose(
        means, reference_bucket_means(list(arrived), list(allocated)), rtol=1e-12
    )


def test_mismatched_lengths_are_rejected() -> None:
    with pytest.raises(ValueError, match="one length"):
        bucketize(curve([1.0, 2.0], [1.0]))


def test_non_finite_arrived_is_rejected() -> None:
    with pytest.raises(ValueError, match="finite"):
        bucketize(curve([1.0, NAN]))


# ----------------------------------------------------------------------------- summarize
AT_100 = [99.8, 100.0, 100.2]


def three_fgd_seeds_and_random() -> list[RunCurve]:
    return [
        curve(AT_100, [90.0] * 3, [40.0] * 3, [4.0] * 3, policy="random", failed=7, elapsed=0.5),
        curve(AT_100, [95.0, 95.0, 95.01], [10.0] * 3, [1.0] * 3, seed=42, failed=3, elapsed=1.5),
        curve(AT_100, [96.5] * 3, [20.0] * 3, [2.0] * 3, seed=43, failed=1, elapsed=2.25),
        curve(AT_100, [94.0] * 3, [30.0] * 3, [3.0] * 3, seed=44, failed=2, elapsed=0.25),
    ]


def test_summary_shape_and_key_order() -> None:
    summary = summarize(three_fgd_seeds_and_random(), [42, 43, 44], 1.3, 12.3456)
    assert list(summary) == ["seeds", "tune", "policies", "elapsed_s"]
    assert summary["seeds"] == [42, 43, 44]
    assert summary["tune"] == 1.3
    assert summary["elapsed_s"] == 12.346
    assert list(summary["policies"]) == ["random", "fgd"]  # order of first appearance
    fgd = summary["policies"]["fgd"]
    assert list(fgd) == [
        "unallocated_gpu_pct",
        "fragmentation_rate_pct",
        "fragment_gpu_pct",
        "failed_pods",
        "elapsed_s",
    ]
    keys = [str(b) for b in range(131)]
    for name in ("unallocated_gpu_pct", "fragmentation_rate_pct", "fragment_gpu_pct"):
        assert list(fgd[name]) == keys
    json.dumps(summary, allow_nan=False)  # strict JSON: no NaN anywhere


def test_summary_is_the_median_over_seeds_per_bucket() -> None:
    fgd = summarize(three_fgd_seeds_and_random(), [42, 43, 44], 1.3, 0.0)["policies"]["fgd"]
    # unallocated at 100 per seed: 100 - 95.00333.. = 4.99667, 3.5, 6.0 -> median, 4 decimals
    assert fgd["unallocated_gpu_pct"]["100"] == 4.9967
    assert fgd["fragmentation_rate_pct"]["100"] == 20.0
    assert fgd["fragment_gpu_pct"]["100"] == 2.0
    assert fgd["unallocated_gpu_pct"]["99"] == 5.0  # empty: 99.8 and 100.0 are within 1 %
    assert fgd["unallocated_gpu_pct"]["50"] is None
    assert fgd["failed_pods"] == 2.0
    assert fgd["elapsed_s"] == 4.0
    random = summarize(three_fgd_seeds_and_random(), [42], 1.3, 0.0)["policies"]["random"]
    assert random["unallocated_gpu_pct"]["100"] == 10.0
    assert random["failed_pods"] == 7.0


def test_median_of_an_even_number_of_seeds_is_the_midpoint() -> None:
    runs = [
        curve([100.0], [96.0], seed=1, failed=1),
        curve([100.0], [95.0], seed=2, failed=2),
    ]
    fgd = summarize(runs, [1, 2], 1.3, 0.0)["policies"]["fgd"]
    assert fgd["unallocated_gpu_pct"]["100"] == 4.5
    assert fgd["failed_pods"] == 1.5


def test_bucket_missing_in_one_seed_is_null() -> None:
    runs = [curve([50.0], [40.0], seed=1), curve([100.0], [90.0], seed=2)]
    unallocated = summarize(runs, [1, 2], 1.3, 0.0)["policies"]["fgd"]["unallocated_gpu_pct"]
    assert unallocated["50"] is None
    assert unallocated["100"] is None


def test_duplicate_policy_and_seed_is_rejected() -> None:
    with pytest.raises(ValueError, match="seed 42"):
        summarize([curve([1.0]), curve([2.0])], [42], 1.3, 0.0)


def test_no_runs_give_no_policies() -> None:
    assert summarize([], [], 1.3, 0.0) == {
        "seeds": [],
        "tune": 1.3,
        "policies": {},
        "elapsed_s": 0.0,
    }


# ----------------------------------------------------------------------------- CSV
def test_curves_csv_has_one_row_per_run_and_bucket(tmp_path: Path) -> None:
    path = tmp_path / "curves.csv"
    write_curves_csv(path, three_fgd_seeds_and_random())
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == list(CSV_HEADER)
    assert rows[0] == [
        "policy",
        "seed",
        "bucket",
        "allocated_pct",
        "fragmentation_rate_pct",
        "fragment_gpu_pct",
    ]
    assert len(rows) == 1 + 4 * 131
    assert rows[1] == ["random", "42", "0", "", "", ""]  # no data: empty cells
    fgd_42 = rows[1 + 131 : 1 + 2 * 131]
    assert fgd_42[100] == ["fgd", "42", "100", "95.003333", "10.0", "1.0"]
    assert [row[2] for row in fgd_42] == [str(b) for b in range(131)]


# ----------------------------------------------------------------------------- plots
def fill_like_runs() -> list[RunCurve]:
    arrived = np.linspace(0.0, 130.0, 400)
    runs = []
    for policy, loss in (("fgd", 5.0), ("best-fit", 7.0)):
        for seed in (42, 43):
            allocated = np.minimum(arrived, 100.0 - loss + 0.1 * (seed - 42))
            rate = np.clip(arrived / 2.0, 0.0, 60.0)
            runs.append(curve(arrived, allocated, rate, rate / 10, policy=policy, seed=seed))
    return runs


@pytest.mark.parametrize(
    "plot", [plot_unallocated, plot_fragmentation], ids=["unallocated", "fragmentation"]
)
def test_plots_write_png_files(tmp_path: Path, plot: Any) -> None:
    path = tmp_path / "figure.png"
    plot(path, fill_like_runs())
    assert path.read_bytes().startswith(PNG_SIGNATURE)


# ----------------------------------------------------------------------------- report
def test_write_report_writes_the_four_files_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "nested" / "report"
    runs = fill_like_runs()
    summary = write_report(out, runs, [42, 43], 1.3, 9.5)
    assert sorted(os.listdir(out)) == REPORT_FILES
    assert json.loads((out / "summary.json").read_text(encoding="utf-8")) == summary
    assert summary == summarize(runs, [42, 43], 1.3, 9.5)
    for png in ("unallocated.png", "fragmentation.png"):
        assert (out / png).read_bytes().startswith(PNG_SIGNATURE)
    assert (out / "curves.csv").read_text(encoding="utf-8").count("\n") == 1 + 4 * 131


def test_write_report_leaves_nothing_behind_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "summary.json").write_text("old", encoding="utf-8")

    def broken_plot(path: object, runs: object) -> None:
        raise RuntimeError("plot failed")

    monkeypatch.setattr(report, "plot_fragmentation", broken_plot)
    with pytest.raises(RuntimeError, match="plot failed"):
        write_report(tmp_path, fill_like_runs(), [42, 43], 1.3, 9.5)
    assert os.listdir(tmp_path) == ["summary.json"]
    assert (tmp_path / "summary.json").read_text(encoding="utf-8") == "old"


# ----------------------------------------------------------------------------- comparison
def policy_stats(at_100: float | None, rate: float | None, failed: float) -> dict[str, Any]:
    return {
        "unallocated_gpu_pct": {"100": at_100},
        "fragmentation_rate_pct": {"100": rate},
        "fragment_gpu_pct": {"100": None},
        "failed_pods": failed,
        "elapsed_s": 1.0,
    }


def test_comparison_table_rows() -> None:
    summary = {
        "seeds": [42],
        "tune": 1.3,
        "policies": {
            "fgd": policy_stats(5.07, 12.345, 2.0),  # +0.30: exactly the tolerance
            "best-fit": policy_stats(6.5, 20.0, 2.5),
            "gpu-packing": policy_stats(8.8, 30.0, 0.0),
            "tuned-fgd": policy_stats(4.1, 10.0, 1.0),
            "random": policy_stats(None, None, 3.0),
        },
        "elapsed_s": 1.0,
    }
    table = comparison_table(summary)
    assert [c.header for c in table.columns] == [
        "policy",
        "fgpu unallocated % @100",
        "published @100",
        "difference",
        "within tolerance",
        "frag. rate % @100",
        "failed pods",
    ]
    rows = list(zip(*(list(c.cells) for c in table.columns), strict=True))
    assert rows == [
        ("fgd", "5.07", "4.77", "+0.30", "yes", "12.35", "2"),
        ("best-fit", "6.50", "7.09", "-0.59", "no", "20.00", "2.5"),
        ("gpu-packing", "8.80", "8.19", "+0.61", "no", "30.00", "0"),
        ("tuned-fgd", "4.10", "—", "—", "—", "10.00", "1"),
        ("random", "—", "13.75", "—", "—", "—", "3"),
    ]


def test_published_values_and_tolerances_cover_the_same_policies() -> None:
    assert set(PUBLISHED_UNALLOCATED_AT_100) == set(TOLERANCE)
    assert PUBLISHED_UNALLOCATED_AT_100["fgd"] == 4.77
    assert PUBLISHED_UNALLOCATED_AT_100["random"] == 13.75


# ----------------------------------------------------------------------------- inputs
DEFAULT_INPUTS = {
    "nodes": "/t/csv/openb_node_list_gpu_node.csv",
    "pods": "/t/csv/openb_pod_list_default.csv",
}
OWN_INPUTS = {"nodes": "/data/nodes.csv", "pods": "/data/pods.csv"}


def test_summary_records_the_inputs_after_the_existing_keys() -> None:
    summary = summarize(three_fgd_seeds_and_random(), [42], 1.3, 1.0, OWN_INPUTS)
    assert list(summary) == ["seeds", "tune", "policies", "elapsed_s", "inputs"]
    assert summary["inputs"] == OWN_INPUTS


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        (None, True),
        (DEFAULT_INPUTS, True),
        (OWN_INPUTS, False),
        ({"nodes": DEFAULT_INPUTS["nodes"], "pods": "/t/csv/openb_pod_list_gpuspec33.csv"}, False),
    ],
    ids=["no-inputs-recorded", "default-files", "own-files", "other-pod-list"],
)
def test_compares_with_published_only_for_the_papers_files(
    inputs: dict[str, str] | None, expected: bool
) -> None:
    summary = summarize([], [], 1.3, 0.0, inputs)
    assert report.compares_with_published(summary) is expected


def comparison_rows(inputs: dict[str, str]) -> tuple[list[str], list[tuple[str, ...]], str]:
    summary = {
        "seeds": [42],
        "tune": 1.3,
        "policies": {"fgd": policy_stats(5.07, 12.345, 2.0)},
        "elapsed_s": 1.0,
        "inputs": inputs,
    }
    table = comparison_table(summary)
    rows = list(zip(*(list(c.cells) for c in table.columns), strict=True))
    return [str(c.header) for c in table.columns], rows, str(table.title)


def test_comparison_table_with_the_papers_files_compares() -> None:
    headers, rows, title = comparison_rows(DEFAULT_INPUTS)
    assert "published @100" in headers
    assert rows == [("fgd", "5.07", "4.77", "+0.30", "yes", "12.35", "2")]
    assert title == "Unallocated GPU at arrived 100 %: fgpu vs FGD paper (ATC '23)"


def test_comparison_table_with_own_files_leaves_the_paper_out() -> None:
    headers, rows, title = comparison_rows(OWN_INPUTS)
    assert headers == ["policy", "fgpu unallocated % @100", "frag. rate % @100", "failed pods"]
    assert rows == [("fgd", "5.07", "12.35", "2")]
    assert title == (
        "Unallocated GPU at arrived 100 % (not the paper's trace files: no published values "
        "to compare)"
    )


class ScatterCalls:
    """Records the published markers drawn on the unallocated figure."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[float], Any]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from matplotlib.axes import Axes

        original = Axes.scatter
        calls = self.calls

        def scatter(ax: Any, x: Any, y: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append((list(y), kwargs.get("color")))
            return original(ax, x, y, *args, **kwargs)

        monkeypatch.setattr(Axes, "scatter", scatter)


def test_published_markers_take_each_policys_colour(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.axes import Axes

    lines: dict[str, Any] = {}
    original_plot = Axes.plot

    def plot(ax: Any, *args: Any, **kwargs: Any) -> Any:
        drawn = original_plot(ax, *args, **kwargs)
        label = kwargs.get("label", "")
        lines[label.split(" (n=")[0]] = drawn[0].get_color()
        return drawn

    monkeypatch.setattr(Axes, "plot", plot)
    markers = ScatterCalls()
    markers.install(monkeypatch)
    plot_unallocated(tmp_path / "u.png", fill_like_runs())
    assert markers.calls == [
        ([PUBLISHED_UNALLOCATED_AT_100["fgd"]], lines["fgd"]),
        ([PUBLISHED_UNALLOCATED_AT_100["best-fit"]], lines["best-fit"]),
    ]
    assert lines["fgd"] != lines["best-fit"]


def test_own_inputs_draw_no_published_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    markers = ScatterCalls()
    markers.install(monkeypatch)
    summary = write_report(tmp_path, fill_like_runs(), [42, 43], 1.3, 1.0, OWN_INPUTS)
    assert summary["inputs"] == OWN_INPUTS
    assert markers.calls == []
    assert json.loads((tmp_path / "summary.json").read_text())["inputs"] == OWN_INPUTS
