"""Reports of the dynamic simulator: summary.json, timeline.csv and two plots.

:func:`summarize_replay` turns a :class:`fgpu.sim.replay.ReplayResult` into figures:

- ``gpu_allocation_pct``: allocated GPU in % of capacity, time-weighted over the horizon
  (the state after each decision round holds until the next round): ``mean`` and ``p95``
  (the level the allocation is at or below 95 % of the time);
- ``queueing_delay_s``: submission to first start, ``p50`` / ``p95`` over all workloads
  that started, per queue and per priority (``count``: how many started, ``not_started``:
  arrived but never started within the horizon);
- ``completion_time_s``: submission to finish, over the workloads that finished, and
  ``per_priority`` (``p50``, ``p95``, ``mean``, ``count``);
- ``preemptions`` (inside a queue), ``reclaims`` (across queues), ``evictions`` (both);
- ``squeezes``: workloads squeezed instead of evicted (squeeze before evict);
- ``evictions_by_shape``: evictions counted by the shapes of preemptor and victim
  (:func:`evictions_by_shape`), with the bound on what squeezing could replace;
- ``wasted_gpu_hours``: work lost by evictions (run seconds done before the eviction x
  the workload's GPU share, in GPU-hours);
- ``suspends``, ``restores``: workloads suspended to host memory and restored (rule 9 of
  :mod:`fgpu.sched.decide`); ``copy_gpu_hours``: GPU-hours held while their memory was
  copied to or from host memory;
- ``goodput_pct``: GPU-hours of work kept over the fleet's GPU-hours (DESIGN.md section 5):
  allocated minus ``wasted_gpu_hours`` minus ``copy_gpu_hours``, in % of capacity x
  horizon; per queue under ``queues`` as ``goodput_gpu_hours`` (with its
  ``wasted_gpu_hours`` and ``copy_gpu_hours``);
- ``jain_fairness``: Jain's index ``(sum x)^2 / (n * sum x^2)`` of ``x_q = allocated_q /
  fair share_q`` over the queues with a fair share above 0, time-weighted mean over the
  time when at least one queue has one (R. Jain, D. Chiu, W. Hawe, "A Quantitative Measure
  of Fairness and Discrimination for Resource Allocation in Shared Computer Systems", DEC
  TR-301, 1984). 1 means every queue has the same fraction of its fair share; a moment
  when all of them have nothing counts as 1;
- ``finished``, ``unfinished`` (arrived, not finished at the horizon), ``simulated_hours``,
  ``wall_s``.

:func:`write_replay_report` writes all files or none.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from rich.table import Table

from fgpu.sched.workload import PRIORITY_CLASSES
from fgpu.sim.output import write_files_atomically
from fgpu.sim.replay import ReplayResult, WorkloadRecord
from fgpu.sim.workloads import SimWorkload, write_workloads

FloatArray = npt.NDArray[np.float64]

SUMMARY_FILE = "summary.json"
TIMELINE_FILE = "timeline.csv"
ALLOCATION_FILE = "allocation.png"
DELAYS_FILE = "delays.png"
WORKLOADS_FILE = "workloads.csv"

DECIMALS = 3
"""Figures in the summary are rounded to this many decimals."""

DELAY_FLOOR_S = 1.0
"""The delay plot's log axis starts here; shorter delays (0 included) are drawn at it."""


# ----------------------------------------------------------------------------- figures
def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), DECIMALS)


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    p50, p95 = np.percentile(np.asarray(values, dtype=np.float64), [50, 95])
    return {"p50": _round(float(p50)), "p95": _round(float(p95))}


def weighted_percentile(values: FloatArray, weights: FloatArray, q: float) -> float:
    """The smallest value v with (weight of values <= v) >= q x total weight.

    Args:
        values: float64[K].
        weights: float64[K], >= 0, with a positive sum.
        q: in [0, 1].
    """
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    i = int(np.searchsorted(cum, q * cum[-1], side="left"))
    return float(values[order][min(i, len(order) - 1)])


def _durations(result: ReplayResult) -> FloatArray:
    """float64[S]: how long each timeline sample holds (until the next one or the horizon)."""
    times = np.array([s.time_s for s in result.timeline], dtype=np.float64)
    ends = np.append(times[1:], result.horizon_s)
    return np.maximum(ends - times, 0.0)


def _matrix(result: ReplayResult, attr: str) -> FloatArray:
    """float64[S, Q] of a per-queue timeline field (GPU milli)."""
    rows = [getattr(s, attr) for s in result.timeline]
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(result.queues))


def jain_index(allocated: FloatArray, fair_share: FloatArray) -> float | None:
    """Jain's index of allocated / fair share over queues with a fair share > 0 (one moment).

    Returns None when no queue has a fair share; 1.0 when all of them have nothing.
    """
    mask = fair_share > 0
    if not mask.any():
        return None
    x = allocated[mask] / fair_share[mask]
    squares = float((x * x).sum())
    if squares == 0:
        return 1.0
    return float(x.sum()) ** 2 / (int(mask.sum()) * squares)


def _priority_name(priority: int) -> str:
    for name, value in PRIORITY_CLASSES.items():
        if value == priority:
            return name
    return str(priority)


def _delay_group(records: Iterable[WorkloadRecord]) -> dict[str, Any]:
    delays: list[float] = []
    not_started = 0
    for r in records:
        start = r.first_start_s
        if start is None:
            not_started += 1
        else:
            delays.append(start - r.submit_s)
    return {**_percentiles(delays), "count": len(delays), "not_started": not_started}


def summarize_replay(
    result: ReplayResult, wall_s: float, config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The summary of one replay (see the module doc for the figures).

    Args:
        result: the replay.
        wall_s: wall-clock seconds the replay took (measured by the caller).
        config: the inputs, echoed under ``"config"``.
    """
    horizon = result.horizon_s
    arrived = [r for r in result.records if r.submit_s < horizon]
    weights = _durations(result)
    allocated = _matrix(result, "allocated_milli")
    fair = _matrix(result, "fair_share_milli")
    total_pct = allocated.sum(axis=1) * 100.0 / max(result.capacity_gpu_milli, 1)
    mean_pct = float((total_pct * weights).sum() / horizon)
    fleet_gpu_hours = result.capacity_gpu_milli / 1000 * horizon / 3600.0
    allocated_gpu_hours = mean_pct / 100.0 * fleet_gpu_hours
    kept = allocated_gpu_hours - result.wasted_gpu_hours - result.copy_gpu_hours
    goodput_pct = kept * 100.0 / fleet_gpu_hours if fleet_gpu_hours > 0 else 0.0
    p95_pct = weighted_percentile(total_pct, weights, 0.95) if weights.sum() > 0 else 0.0

    jain_num = 0.0
    jain_den = 0.0
    for i in range(len(weights)):
        j = jain_index(allocated[i], fair[i])
        if j is not None and weights[i] > 0:
            jain_num += j * weights[i]
            jain_den += weights[i]
    jain = jain_num / jain_den if jain_den > 0 else None

    per_queue = {q: _delay_group(r for r in arrived if r.queue == q) for q in result.queues}
    priorities = sorted({r.priority for r in arrived}, reverse=True)
    per_priority = {
        _priority_name(p): _delay_group(r for r in arrived if r.priority == p) for p in priorities
    }
    completions = [r.finish_s - r.submit_s for r in arrived if r.finish_s is not None]
    completion_per_priority: dict[str, Any] = {}
    for p in priorities:
        times = [
            r.finish_s - r.submit_s for r in arrived if r.priority == p and r.finish_s is not None
        ]
        completion_per_priority[_priority_name(p)] = {
            **_percentiles(times),
            "mean": _round(float(np.mean(times))) if times else None,
            "count": len(times),
        }
    queues: dict[str, Any] = {}
    for k, q in enumerate(result.queues):
        mine = [r for r in arrived if r.queue == q]
        wasted_q = (result.wasted_gpu_hours_by_queue or (0.0,) * len(result.queues))[k]
        copy_q = (result.copy_gpu_hours_by_queue or (0.0,) * len(result.queues))[k]
        allocated_q = float((allocated[:, k] * weights).sum()) / 1000 / 3600.0
        queues[q] = {
            "mean_allocated_gpus": _round(
                float((allocated[:, k] * weights).sum()) / horizon / 1000
            ),
            "goodput_gpu_hours": _round(allocated_q - wasted_q - copy_q),
            "wasted_gpu_hours": _round(wasted_q),
            "copy_gpu_hours": _round(copy_q),
            "mean_fair_share_gpus": _round(float((fair[:, k] * weights).sum()) / horizon / 1000),
            "arrived": len(mine),
            "finished": sum(1 for r in mine if r.finish_s is not None),
            "evicted": sum(r.evictions for r in mine),
        }
    finished = len(completions)
    return {
        "gpu_allocation_pct": {"mean": _round(mean_pct), "p95": _round(p95_pct)},
        "queueing_delay_s": {
            "all": _delay_group(arrived),
            "per_queue": per_queue,
            "per_priority": per_priority,
        },
        "completion_time_s": {
            **_percentiles(completions),
            "count": finished,
            "per_priority": completion_per_priority,
        },
        "preemptions": result.preemptions,
        "reclaims": result.reclaims,
        "evictions": result.evictions,
        "squeezes": result.squeezes,
        "evictions_by_shape": evictions_by_shape(result),
        "wasted_gpu_hours": _round(result.wasted_gpu_hours),
        "suspends": result.suspends,
        "restores": result.restores,
        "copy_gpu_hours": _round(result.copy_gpu_hours),
        "goodput_pct": _round(goodput_pct),
        "jain_fairness": _round(jain),
        "finished": finished,
        "unfinished": len(arrived) - finished,
        "arrived": len(arrived),
        "queues": queues,
        "rounds": result.rounds,
        "warnings": list(result.warnings),
        "simulated_hours": _round(horizon / 3600.0),
        "wall_s": _round(wall_s),
        "config": dict(config or {}),
    }


def shape_class(gpu_count: int, gpu_milli: int) -> str:
    """``cpu`` (no GPU), ``fractional`` (one GPU, below 1000 milli or memory only: the
    record's milli is then 0), ``whole`` (one whole GPU) or ``multi`` (several GPUs)."""
    if gpu_count == 0:
        return "cpu"
    if gpu_count > 1:
        return "multi"
    return "whole" if gpu_milli >= 1000 else "fractional"


def evictions_by_shape(result: ReplayResult) -> dict[str, Any]:
    """Where evictions come from, and how many a squeeze could replace at most.

    Returns a dict:
        ``pairs``: ``"<kind> <preemptor shape> > <victim shape>"`` -> count (shapes from
            :func:`shape_class`), most frequent first;
        ``squeezable_at_most``: evictions that are preemptions (inside a queue) of a
            single-GPU fractional victim by a single-GPU fractional preemptor: the only pairs
            the squeeze rule allows (a whole GPU holds all of its GPU memory, so nothing
            joins it and it joins nothing; reclaim always evicts). Whether memory fits is not
            checked, so this bounds squeezing from above: ``ratio_at_least`` =
            ``1 - squeezable_at_most / evictions`` is the lowest evictions ratio that
            squeezing alone could reach on this run's eviction mix;
        ``victims``: distinct evicted workloads; ``repeat_victim_evictions``: evictions of
            workloads evicted 5 times or more (thrashing); ``most_per_victim``.
    """
    by_id = {r.id: r for r in result.records}
    pairs: dict[str, int] = {}
    squeezable = 0
    per_victim: dict[str, int] = {}
    for e in result.eviction_log:
        p, v = by_id.get(e.preemptor), by_id[e.victim]
        ps = shape_class(p.gpu_count, p.gpu_milli) if p is not None else "none"
        vs = shape_class(v.gpu_count, v.gpu_milli)
        key = f"{e.kind} {ps} > {vs}"
        pairs[key] = pairs.get(key, 0) + 1
        if e.kind == "preemption" and ps == vs == "fractional":
            squeezable += 1
        per_victim[e.victim] = per_victim.get(e.victim, 0) + 1
    total = len(result.eviction_log)
    return {
        "pairs": dict(sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))),
        "squeezable_at_most": squeezable,
        "ratio_at_least": _round(1 - squeezable / total) if total else None,
        "victims": len(per_victim),
        "repeat_victim_evictions": sum(n for n in per_victim.values() if n >= 5),
        "most_per_victim": max(per_victim.values(), default=0),
    }


# ----------------------------------------------------------------------------- files
def write_timeline_csv(path: str | os.PathLike[str], result: ReplayResult) -> None:
    """One row per timeline sample: ``time_s, pending, running, allocated_milli``, then per
    queue ``allocated_milli.<queue>`` and ``fair_share_milli.<queue>`` (GPU milli)."""
    header = ["time_s", "pending", "running", "allocated_milli"]
    for q in result.queues:
        header += [f"allocated_milli.{q}", f"fair_share_milli.{q}"]
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        for s in result.timeline:
            row: list[object] = [repr(s.time_s), s.pending, s.running, sum(s.allocated_milli)]
            for a, f in zip(s.allocated_milli, s.fair_share_milli, strict=True):
                row += [a, f]
            writer.writerow(row)


def plot_allocation(path: str | os.PathLike[str], result: ReplayResult) -> None:
    """Allocated GPUs over time, stacked by queue, with the capacity line, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = np.array([s.time_s for s in result.timeline] + [result.horizon_s]) / 3600.0
    allocated = _matrix(result, "allocated_milli") / 1000.0
    allocated = np.vstack([allocated, allocated[-1:]])
    fig, ax = plt.subplots(figsize=(10, 5), dpi=100)
    try:
        base = np.zeros(len(times))
        for k, q in enumerate(result.queues):
            top = base + allocated[:, k]
            ax.fill_between(times, base, top, step="post", alpha=0.8, label=q, linewidth=0)
            base = top
        ax.axhline(result.capacity_gpu_milli / 1000.0, color="k", linestyle="--", label="capacity")
        ax.set_xlim(0, result.horizon_s / 3600.0)
        ax.set_ylim(0, result.capacity_gpu_milli / 1000.0 * 1.08)
        ax.set_xlabel("simulated time (hours)")
        ax.set_ylabel("allocated GPUs")
        ax.set_title("GPU allocation by queue")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)


def plot_delays(path: str | os.PathLike[str], result: ReplayResult) -> None:
    """Queueing delay per queue as PNG: the fraction of arrived workloads that waited longer
    than x (complementary CDF), log-log.

    Most workloads of a lightly loaded day start at once, so the tail is what tells the
    queues apart. A workload that never started counts as waiting longer than any x; a
    curve that stays above 0 at the right end shows them. Delays below
    :data:`DELAY_FLOOR_S` (0 included) are drawn at it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    try:
        longest = DELAY_FLOOR_S * 10
        floor = 1.0
        for q in result.queues:
            mine = [r for r in result.records if r.queue == q and r.submit_s < result.horizon_s]
            if not mine:
                continue
            delays = np.sort([r.starts[0] - r.submit_s for r in mine if r.starts], kind="stable")
            x = np.maximum(delays, DELAY_FLOOR_S)
            above = (len(mine) - np.arange(1, len(x) + 1)) / len(mine)  # after each delay
            longest = max(longest, float(x[-1]) * 2 if len(x) else longest)
            floor = min(floor, 0.5 / len(mine))
            xs = np.concatenate([[DELAY_FLOOR_S], x])
            ys = np.concatenate([[1.0], above])
            ax.step(xs, ys, where="post", label=f"{q} ({len(delays)}/{len(mine)} started)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(DELAY_FLOOR_S, longest)
        ax.set_ylim(floor, 1.5)
        ax.set_xlabel(
            f"queueing delay x, submit to first start (s; below {DELAY_FLOOR_S:g} s at it)"
        )
        ax.set_ylabel("fraction of arrived workloads waiting longer than x")
        ax.set_title("Queueing delay per queue (complementary CDF)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)


def write_replay_report(
    out_dir: str | os.PathLike[str],
    result: ReplayResult,
    wall_s: float,
    config: Mapping[str, Any] | None = None,
    workloads: Sequence[SimWorkload] | None = None,
) -> dict[str, Any]:
    """Write summary.json, timeline.csv, allocation.png, delays.png (and workloads.csv when
    ``workloads`` is given, re-playable with ``--workloads``) into ``out_dir``, all or none.

    Returns:
        The summary (:func:`summarize_replay`).

    Raises:
        OSError: the folder or a file cannot be written.
    """
    summary = summarize_replay(result, wall_s, config)

    def write_summary(path: Path) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2, allow_nan=False)
            handle.write("\n")

    writers: list[tuple[str, Callable[[Path], None]]] = [
        (SUMMARY_FILE, write_summary),
        (TIMELINE_FILE, lambda p: write_timeline_csv(p, result)),
        (ALLOCATION_FILE, lambda p: plot_allocation(p, result)),
        (DELAYS_FILE, lambda p: plot_delays(p, result)),
    ]
    if workloads is not None:
        writers.append((WORKLOADS_FILE, lambda p: write_workloads(p, workloads)))
    write_files_atomically(out_dir, writers)
    return summary


# ----------------------------------------------------------------------------- table
def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "—" if value is None else format(value, spec)


def replay_table(summary: Mapping[str, Any]) -> Table:
    """Per queue: mean allocated GPUs, mean fair share, p50/p95 queueing delay, finished."""
    alloc = summary["gpu_allocation_pct"]
    table = Table(
        title=(
            f"Replay: GPU allocation mean {_fmt(alloc['mean'])} % (p95 {_fmt(alloc['p95'])} %), "
            f"goodput {_fmt(summary.get('goodput_pct'))} %, "
            f"Jain {_fmt(summary['jain_fairness'], '.3f')}, "
            f"{summary['preemptions']} preemptions, {summary['reclaims']} reclaims, "
            f"{summary.get('squeezes', 0)} squeezes, {summary.get('suspends', 0)} suspends, "
            f"{_fmt(summary.get('wasted_gpu_hours'), '.1f')} GPU-hours lost to evictions"
        )
    )
    table.add_column("queue")
    table.add_column("mean allocated GPUs", justify="right")
    table.add_column("mean fair share GPUs", justify="right")
    table.add_column("delay p50 (s)", justify="right")
    table.add_column("delay p95 (s)", justify="right")
    table.add_column("goodput GPU-h", justify="right")
    table.add_column("finished / arrived", justify="right")
    delays = summary["queueing_delay_s"]["per_queue"]
    for q, stats in summary["queues"].items():
        table.add_row(
            q,
            _fmt(stats["mean_allocated_gpus"], ".2f"),
            _fmt(stats["mean_fair_share_gpus"], ".2f"),
            _fmt(delays[q]["p50"]),
            _fmt(delays[q]["p95"]),
            _fmt(stats.get("goodput_gpu_hours"), ".1f"),
            f"{stats['finished']} / {stats['arrived']}",
        )
    return table
