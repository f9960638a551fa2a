"""Reports for the FGD fill experiment: buckets, medians over seeds, CSV, plots, comparison.

A fill run (one policy, one seed) places pods one at a time and records one point per pod
(``docs/design.md``, "The fill experiment's protocol": One run, Report). This module turns
those points into what the protocol publishes:

1. :func:`bucketize`: per run, the mean of each metric per *arrived %* bucket 0..130.
2. :func:`summarize`: per policy, the median over seeds per bucket (the JSON summary).
3. :func:`write_curves_csv`, :func:`plot_unallocated`, :func:`plot_fragmentation`: the
   per-run curves and the two figures of the paper.
4. :func:`comparison_table`: fgpu's value at arrived 100 % next to the published one
   (:data:`PUBLISHED_UNALLOCATED_AT_100`, Weng et al., "Beware of Fragmentation:
   Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23),
   only when the inputs are the paper's files (:func:`compares_with_published`).
5. :func:`write_report`: all four files into one folder, or none of them.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from rich.table import Table

from fgpu.sim.output import write_files_atomically

if TYPE_CHECKING:
    from matplotlib.axes import Axes

FloatArray = npt.NDArray[np.float64]

BUCKETS = range(0, 131)
"""Arrived-workload buckets, in % of cluster GPU capacity (0..130 inclusive)."""

METRICS = ("allocated_pct", "frag_rate_pct", "frag_pct")
"""Keys of :func:`bucketize`'s result, named like the :class:`RunCurve` fields."""

NEIGHBOUR_PCT = 1.0
"""An empty bucket b takes the points with ``|arrived - b| <= NEIGHBOUR_PCT`` (protocol)."""

METRIC_DECIMALS = 2
"""Each point's metric is rounded to this many decimals before the bucket mean (protocol)."""

SUMMARY_DECIMALS = 4
"""Medians in the JSON summary are rounded to this many decimals."""

PUBLISHED_NODES_FILE = "openb_node_list_gpu_node.csv"
PUBLISHED_PODS_FILE = "openb_pod_list_default.csv"
"""The Alibaba trace files the published values were measured on (compared by file name)."""

PUBLISHED_UNALLOCATED_AT_100: dict[str, float] = {
    "random": 13.75,
    "dotprod": 9.44,
    "gpu-clustering": 8.42,
    "gpu-packing": 8.19,
    "best-fit": 7.09,
    "fgd": 4.77,
}
"""Unallocated GPU % at arrived 100 % in the FGD paper (ATC '23): default Alibaba trace,
median over seeds 42..51 (``fgd-protocol.md``, "Published values")."""

TOLERANCE: dict[str, float] = {
    "random": 0.3,
    "best-fit": 0.3,
    "fgd": 0.3,
    "dotprod": 0.6,
    "gpu-clustering": 0.6,
    "gpu-packing": 0.6,
}
"""Accepted |fgpu - published| in percentage points, about the published seed-to-seed spread
(0.1-0.2 for random, best-fit, fgd; 0.6 for clustering and packing; ``fgd-protocol.md``)."""

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

SUMMARY_FILE = "summary.json"
CURVES_FILE = "curves.csv"
UNALLOCATED_FILE = "unallocated.png"
FRAGMENTATION_FILE = "fragmentation.png"

CSV_HEADER = (
    "policy",
    "seed",
    "bucket",
    "allocated_pct",
    "fragmentation_rate_pct",
    "fragment_gpu_pct",
)


@dataclass(frozen=True)
class RunCurve:
    """The points of one fill run (one policy, one seed), one point per pod.

    Built by the fill simulator after every pod, placed, CPU-only or failed
    (``fgd-protocol.md``, "One run", steps 6-7). Arrays are float64[P], P = number of pods,
    in placement order:

    - ``arrived_pct``: cumulative GPU request of all pods so far (failed included), % of
      cluster GPU capacity;
    - ``allocated_pct``: allocated GPU milli after the pod, % of capacity;
    - ``frag_rate_pct``: cluster fragmentation / total idle GPU milli, % (0 when nothing is
      idle);
    - ``frag_pct``: cluster fragmentation amount, % of capacity.

    ``failed_pods`` counts the pods that fit nowhere; ``elapsed_s`` is the run's wall time in
    seconds.
    """

    policy: str
    seed: int
    arrived_pct: npt.NDArray[np.float64]  # [P] cumulative request so far, % of capacity
    allocated_pct: npt.NDArray[np.float64]  # [P] allocated GPU milli after the pod, %
    frag_rate_pct: npt.NDArray[np.float64]  # [P] fragmentation / idle GPU milli, %
    frag_pct: npt.NDArray[np.float64]  # [P] fragmentation amount, % of capacity
    failed_pods: int
    elapsed_s: float


# ----------------------------------------------------------------------------- buckets
def bucketize(curve: RunCurve) -> dict[str, FloatArray]:
    """Mean of each metric per arrived-% bucket for one run.

    Rule (``fgd-protocol.md``, "One run", step 7):

    - a point goes to bucket ``np.round(arrived_pct)`` (nearest integer, half to even, so
      99.5 and 100.5 both go to 100 while 101.5 goes to 102); points whose bucket is outside
      0..130 are not counted in any bucket directly;
    - each metric is rounded to 2 decimals (``np.round(x, 2)``) *before* the mean;
    - a bucket with no point takes the mean over the points with
      ``|arrived_pct - b| <= 1`` (from any bucket, including arrived values just above
      130.5); if there is none either, its value is NaN.

    Args:
        curve: one run's points.

    Returns:
        ``{"allocated_pct", "frag_rate_pct", "frag_pct"}`` -> float64[131], index = bucket
        (arrived % of capacity); values in % like the inputs.

    Raises:
        ValueError: the curve's arrays are not one-dimensional or differ in length, or an
            arrived value is not finite.
    """
    arrived = np.asarray(curve.arrived_pct, dtype=np.float64)
    values = {name: np.asarray(getattr(curve, name), dtype=np.float64) for name in METRICS}
    if arrived.ndim != 1 or any(v.shape != arrived.shape for v in values.values()):
        shapes = {"arrived_pct": arrived.shape} | {k: v.shape for k, v in values.items()}
        raise ValueError(f"RunCurve arrays must be 1-D of one length, got {shapes}")
    if not np.all(np.isfinite(arrived)):
        raise ValueError("RunCurve.arrived_pct must be finite")

    n_buckets = len(BUCKETS)
    own = np.round(arrived).astype(np.int64) - BUCKETS.start  # bucket index of each point
    own_ok = (own >= 0) & (own < n_buckets)
    own_idx = own[own_ok]
    own_count = np.bincount(own_idx, minlength=n_buckets)

    # A point a lies within NEIGHBOUR_PCT (= 1) of at most three integers, ceil(a - 1) + k,
    # k = 0, 1, 2. List those (point, bucket) pairs once; bincount sums them per bucket.
    first = np.ceil(arrived - NEIGHBOUR_PCT)
    width = int(2 * NEIGHBOUR_PCT) + 1
    cand = first[None, :] + np.arange(width, dtype=np.float64)[:, None]  # [width, P]
    near_ok = (np.abs(arrived[None, :] - cand) <= NEIGHBOUR_PCT) & (
        (cand >= BUCKETS.start) & (cand < BUCKETS.stop)
    )
    near_idx = cand[near_ok].astype(np.int64) - BUCKETS.start
    near_point = np.nonzero(near_ok)[1]  # the point of each pair
    near_count = np.bincount(near_idx, minlength=n_buckets)

    empty = own_count == 0
    fill = empty & (near_count > 0)
    out: dict[str, FloatArray] = {}
    for name, raw in values.items():
        rounded = np.round(raw, METRIC_DECIMALS)
        own_sum = np.bincount(own_idx, weights=rounded[own_ok], minlength=n_buckets)
        near_sum = np.bincount(near_idx, weights=rounded[near_point], minlength=n_buckets)
        mean = np.full(n_buckets, np.nan, dtype=np.float64)
        np.divide(own_sum, own_count, out=mean, where=~empty)
        np.divide(near_sum, near_count, out=mean, where=fill)
        out[name] = mean
    return out


def _by_policy(runs: Sequence[RunCurve]) -> dict[str, list[RunCurve]]:
    """Runs grouped by policy, policies in order of first appearance, runs in input order.

    Raises:
        ValueError: two runs share a (policy, seed).
    """
    groups: dict[str, list[RunCurve]] = {}
    for run in runs:
        group = groups.setdefault(run.policy, [])
        if any(other.seed == run.seed for other in group):
            raise ValueError(f"two runs for policy {run.policy!r} and seed {run.seed}")
        group.append(run)
    return groups


def _stacked(runs: Sequence[RunCurve]) -> dict[str, FloatArray]:
    """Bucket means of several runs: metric name -> float64[S, 131], plus "unallocated_pct"."""
    per_run = [bucketize(run) for run in runs]
    stacked = {name: np.stack([b[name] for b in per_run]) for name in METRICS}
    stacked["unallocated_pct"] = 100.0 - stacked["allocated_pct"]
    return stacked


def _median_map(stack: FloatArray) -> dict[str, float | None]:
    """Median over seeds (axis 0) per bucket as ``{"0": v, ..., "130": v}``, NaN -> None."""
    median = np.median(stack, axis=0)
    return {
        str(b): None if math.isnan(v) else round(float(v), SUMMARY_DECIMALS)
        for b, v in zip(BUCKETS, median, strict=True)
    }


# ----------------------------------------------------------------------------- summary
def summarize(
    runs: list[RunCurve],
    seeds: list[int],
    tune: float,
    elapsed_s: float,
    inputs: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON summary of a fill experiment: per policy, the median over seeds per bucket.

    Shape::

        {"seeds": [...], "tune": 1.3,
         "policies": {"<policy>": {"unallocated_gpu_pct": {"0": m, ..., "130": m},
                                   "fragmentation_rate_pct": {...},
                                   "fragment_gpu_pct": {...},
                                   "failed_pods": median,
                                   "elapsed_s": total over that policy's runs}},
         "elapsed_s": elapsed_s,
         "inputs": {"nodes": "<node CSV>", "pods": "<pod CSV>"}}   # only when given

    Unallocated GPU % = 100 - allocated % (per run and bucket, then the median). Medians use
    ``np.median`` over the policy's runs, so a bucket without data in any one seed is None;
    values are rounded to 4 decimals. Policies appear in the order they first appear in
    ``runs``. Times are rounded to milliseconds. (``fgd-protocol.md``: "Report the median
    over seeds 42..51 per bucket".)

    Args:
        runs: the runs, any order, at most one per (policy, seed).
        seeds: the seeds the experiment asked for (recorded as given).
        tune: the inflation factor of the pod list (1.3 in the protocol).
        elapsed_s: wall time of the whole experiment, seconds.
        inputs: the trace files, ``{"nodes": path, "pods": path}``; recorded as given
            (they decide whether :func:`comparison_table` compares with the paper).

    Raises:
        ValueError: two runs share a (policy, seed), or a run's arrays are malformed.
    """
    policies: dict[str, dict[str, Any]] = {}
    for policy, group in _by_policy(runs).items():
        stacked = _stacked(group)
        policies[policy] = {
            "unallocated_gpu_pct": _median_map(stacked["unallocated_pct"]),
            "fragmentation_rate_pct": _median_map(stacked["frag_rate_pct"]),
            "fragment_gpu_pct": _median_map(stacked["frag_pct"]),
            "failed_pods": float(np.median([run.failed_pods for run in group])),
            "elapsed_s": round(sum(run.elapsed_s for run in group), 3),
        }
    summary: dict[str, Any] = {
        "seeds": [int(s) for s in seeds],
        "tune": float(tune),
        "policies": policies,
        "elapsed_s": round(float(elapsed_s), 3),
    }
    if inputs is not None:
        summary["inputs"] = {"nodes": str(inputs["nodes"]), "pods": str(inputs["pods"])}
    return summary


def compares_with_published(summary: Mapping[str, Any]) -> bool:
    """Whether the summary's runs used the paper's trace files, so the published values
    apply. A summary without ``"inputs"`` (older, or built by hand) counts as the paper's."""
    inputs = summary.get("inputs")
    if inputs is None:
        return True
    return (
        Path(inputs["nodes"]).name == PUBLISHED_NODES_FILE
        and Path(inputs["pods"]).name == PUBLISHED_PODS_FILE
    )


# ----------------------------------------------------------------------------- CSV
def _csv_number(value: float) -> str:
    """A bucket mean as CSV text: up to 6 decimals, empty for NaN."""
    return "" if math.isnan(value) else repr(round(float(value), 6))


def write_curves_csv(path: str | os.PathLike[str], runs: Sequence[RunCurve]) -> None:
    """Write every run's bucket means as CSV, one row per (run, bucket).

    Columns: :data:`CSV_HEADER` (``policy, seed, bucket, allocated_pct,
    fragmentation_rate_pct, fragment_gpu_pct``); percentages as in :func:`bucketize`,
    rounded to 6 decimals; an empty cell where a bucket has no data. Runs in input order,
    buckets 0..130.
    """
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_HEADER)
        for run in runs:
            means = bucketize(run)
            for i, b in enumerate(BUCKETS):
                writer.writerow(
                    [
                        run.policy,
                        run.seed,
                        b,
                        *(_csv_number(means[name][i]) for name in METRICS),
                    ]
                )


# ----------------------------------------------------------------------------- plots
def _plot_bands(
    path: str | os.PathLike[str],
    runs: Sequence[RunCurve],
    metric: str,
    x_range: tuple[int, int],
    ylabel: str,
    title: str,
    extra: Callable[[Axes, FloatArray, dict[str, Any]], None] | None = None,
) -> None:
    """Median line and min..max seed band per policy over ``x_range`` buckets, as PNG.

    ``extra(ax, x, colours)`` may draw more; ``colours`` maps each policy to its line's
    colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first, last = x_range
    sl = slice(first - BUCKETS.start, last - BUCKETS.start + 1)
    x = np.arange(first, last + 1, dtype=np.float64)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    colours: dict[str, Any] = {}  # policy -> matplotlib colour of its line
    try:
        for policy, group in _by_policy(runs).items():
            stack = _stacked(group)[metric][:, sl]
            (line,) = ax.plot(x, np.median(stack, axis=0), label=f"{policy} (n={len(group)})")
            colours[policy] = line.get_color()
            ax.fill_between(
                x, stack.min(axis=0), stack.max(axis=0), color=colours[policy], alpha=0.2
            )
        if extra is not None:
            extra(ax, x, colours)
        ax.set_xlim(first, last)
        ax.set_xlabel("arrived GPU workload (% of cluster GPU capacity)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)


def plot_unallocated(
    path: str | os.PathLike[str], runs: Sequence[RunCurve], published: bool = True
) -> None:
    """Unallocated GPU % vs arrived % (75..130) as PNG: the FGD paper's headline figure.

    One line per policy (median over its seeds) with a shaded min..max band across seeds,
    and the ideal line of perfect packing, where allocated = min(arrived, 100), so
    unallocated = 100 - min(arrived, 100). With ``published`` (the paper's trace), policies
    with a published value get an x marker at arrived 100 % in their line's colour
    (:data:`PUBLISHED_UNALLOCATED_AT_100`).
    """

    def ideal_and_published(ax: Axes, x: FloatArray, colours: dict[str, Any]) -> None:
        ax.plot(
            x, 100.0 - np.minimum(x, 100.0), "k--", linewidth=1, label="ideal (perfect packing)"
        )
        if not published:
            return
        shown = [p for p in colours if p in PUBLISHED_UNALLOCATED_AT_100]
        for i, policy in enumerate(shown):
            ax.scatter(
                [100.0],
                [PUBLISHED_UNALLOCATED_AT_100[policy]],
                marker="x",
                s=60,
                color=colours[policy],
                zorder=3,
                label="published at 100 % (ATC '23), policy's colour" if i == 0 else None,
            )

    _plot_bands(
        path,
        runs,
        "unallocated_pct",
        (75, 130),
        "unallocated GPU (% of capacity)",
        "Unallocated GPU vs arrived workload (median over seeds, band: min..max)",
        ideal_and_published,
    )


def plot_fragmentation(path: str | os.PathLike[str], runs: Sequence[RunCurve]) -> None:
    """Fragmentation rate % vs arrived % (0..130) as PNG, median and min..max band per policy.

    Fragmentation rate = cluster fragmentation / total idle GPU milli (``fgd-protocol.md``).
    """
    _plot_bands(
        path,
        runs,
        "frag_rate_pct",
        (0, 130),
        "fragmentation rate (% of idle GPU)",
        "GPU fragmentation rate vs arrived workload (median over seeds, band: min..max)",
    )


# ----------------------------------------------------------------------------- comparison
def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def comparison_table(summary: Mapping[str, Any]) -> Table:
    """fgpu against the published FGD values at arrived 100 %, as a Rich table.

    Columns: policy; fgpu unallocated % at arrived 100 %; published value; difference
    (fgpu - published, percentage points); within tolerance ("yes"/"no" against
    :data:`TOLERANCE`, "—" when the policy has no published value or fgpu has no data at
    100 %); fragmentation rate % at 100 %; failed pods (median). One row per policy of the
    summary, in its order. The difference is rounded to 4 decimals before the tolerance
    test, so 5.07 against 4.77 counts as exactly 0.30.

    When the summary's inputs are not the paper's files (:func:`compares_with_published`),
    the three comparison columns are left out and the title says why: the published
    values belong to another trace.
    """
    compare = compares_with_published(summary)
    if compare:
        table = Table(title="Unallocated GPU at arrived 100 %: fgpu vs FGD paper (ATC '23)")
    else:
        table = Table(
            title="Unallocated GPU at arrived 100 % (not the paper's trace files: no "
            "published values to compare)"
        )
    table.add_column("policy")
    table.add_column("fgpu unallocated % @100", justify="right")
    if compare:
        table.add_column("published @100", justify="right")
        table.add_column("difference", justify="right")
        table.add_column("within tolerance", justify="center")
    table.add_column("frag. rate % @100", justify="right")
    table.add_column("failed pods", justify="right")
    for policy, stats in summary["policies"].items():
        ours = stats["unallocated_gpu_pct"].get("100")
        published = PUBLISHED_UNALLOCATED_AT_100.get(policy)
        diff = None if ours is None or published is None else round(ours - published, 4)
        verdict = "—"
        if diff is not None:
            verdict = "yes" if abs(diff) <= TOLERANCE[policy] else "no"
        failed = stats["failed_pods"]
        versus = [_fmt(published), _fmt(diff, "+.2f"), verdict] if compare else []
        table.add_row(
            policy,
            _fmt(ours),
            *versus,
            _fmt(stats["fragmentation_rate_pct"].get("100")),
            str(int(failed)) if float(failed).is_integer() else f"{failed:.1f}",
        )
    return table


# ----------------------------------------------------------------------------- report
def write_report(
    out_dir: str | os.PathLike[str],
    runs: list[RunCurve],
    seeds: list[int],
    tune: float,
    elapsed_s: float,
    inputs: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Write summary.json, curves.csv, unallocated.png and fragmentation.png into ``out_dir``.

    ``out_dir`` is created if missing. Each file is first written under a temporary name in
    ``out_dir`` and renamed into place only once all four were produced, so a failure
    leaves no partial output and no temporary file (earlier files of the same names are
    replaced only on success; the four renames themselves are not one atomic step).

    Args:
        out_dir: destination folder.
        runs, seeds, tune, elapsed_s, inputs: as in :func:`summarize`; the published
            markers of unallocated.png appear only for the paper's inputs.

    Returns:
        The summary written to summary.json (see :func:`summarize`).

    Raises:
        ValueError: from :func:`summarize`.
        OSError: the folder or a file cannot be written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(runs, seeds, tune, elapsed_s, inputs)
    published = compares_with_published(summary)

    def write_summary(path: Path) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2, allow_nan=False)
            handle.write("\n")

    writers: list[tuple[str, Callable[[Path], None]]] = [
        (SUMMARY_FILE, write_summary),
        (CURVES_FILE, lambda p: write_curves_csv(p, runs)),
        (UNALLOCATED_FILE, lambda p: plot_unallocated(p, runs, published)),
        (FRAGMENTATION_FILE, lambda p: plot_fragmentation(p, runs)),
    ]
    write_files_atomically(out, writers)
    return summary
