"""Benchmark: ``fgd-pattern`` against ``fgd`` on the Alibaba pod-list variants.

Two experiments, each printing one JSON object (and writing it with ``--out``):

- ``variants``: every ``openb_pod_list_*.csv`` in the trace folder (or those given with
  ``--pods``), ``fgd`` and ``fgd-pattern``, seeds 42..51: the 10-seed median unallocated GPU %
  at arrived 100 %, the per-seed values, on how many seeds the new policy is better, and the
  median time per run of each policy;
- ``scale``: the same for ``fgd-pattern`` with CPU-deficit scales 0.5 .. 1.5 (registered
  here as ``fgd-pattern-scale<s>``) on the given variants, next to ``fgd``.

The JSON is written again after every variant (``--out``), so an interrupted run keeps what
it measured. ``--default-seeds`` applies to ``openb_pod_list_default.csv`` (the headline),
``--seeds`` to the other variants (fewer seeds cut the time on a busy machine).

Usage::

    python bench/fill_pattern.py variants [--seeds 42-51] [--default-seeds 42-51]
        [--pods a.csv,b.csv] [--out F]
    python bench/fill_pattern.py scale [--scales 0.5,0.7,0.85,1.0,1.5] [--pods ...] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from fgpu.plugins import policy_names, register
from fgpu.plugins.fgd_pattern import FgdPattern
from fgpu.sim.experiment import (
    DEFAULT_NODES,
    DEFAULT_PODS,
    Trace,
    find_trace_dir,
    parse_seeds,
    run_experiment,
)
from fgpu.sim.report import RunCurve, bucketize, summarize

DEFAULT_SCALES = (0.5, 0.7, 0.85, 1.0, 1.5)
SCALE_PODS = (
    "openb_pod_list_default.csv",
    "openb_pod_list_gpushare100.csv",
    "openb_pod_list_gpuspec33.csv",
    "openb_pod_list_multigpu50.csv",
    "openb_pod_list_cpu250.csv",
)


def scaled_policy(scale: float) -> str:
    """Register (once) ``fgd-pattern`` with another default scale; return its name.

    Registered at import time of this module for :data:`DEFAULT_SCALES`, so that worker
    processes (fork or spawn) know the names too.
    """
    name = f"fgd-pattern-scale{scale:g}"
    if name not in policy_names():
        attrs = {"name": name, "cpu_deficit_scale": scale}
        register(type(f"FgdPatternScale{scale:g}", (FgdPattern,), attrs))
    return name


for _scale in DEFAULT_SCALES:
    scaled_policy(_scale)


def unallocated_at_100(run: RunCurve) -> float:
    """One run's unallocated GPU % at arrived 100 % (bucket mean, protocol step 7)."""
    return round(100.0 - float(bucketize(run)["allocated_pct"][100]), 3)


def compare(trace: Trace, policies: list[str], seeds: list[int], workers: int) -> dict[str, Any]:
    """Run ``policies`` x ``seeds``; the first policy is the baseline."""
    start = time.perf_counter()
    runs = run_experiment(trace, policies, seeds, workers=workers)
    wall = time.perf_counter() - start
    summary = summarize(runs, seeds, 1.3, round(wall, 3))
    base = policies[0]
    base_seed = {r.seed: unallocated_at_100(r) for r in runs if r.policy == base}
    out: dict[str, Any] = {"wall_s": round(wall, 2)}
    for name in policies:
        mine = [r for r in runs if r.policy == name]
        per_seed = {r.seed: unallocated_at_100(r) for r in mine}
        entry: dict[str, Any] = {
            "median_unallocated_pct_at_100": summary["policies"][name]["unallocated_gpu_pct"][
                "100"
            ],
            "per_seed": per_seed,
            "failed_pods_median": statistics.median(r.failed_pods for r in mine),
            "run_s_median": round(statistics.median(r.elapsed_s for r in mine), 3),
        }
        if name != base:
            entry["better_than_" + base + "_on_seeds"] = sum(
                per_seed[s] < base_seed[s] for s in seeds
            )
            entry["difference_vs_" + base] = round(
                entry["median_unallocated_pct_at_100"] - out[base]["median_unallocated_pct_at_100"],
                4,
            )
            entry["time_ratio_vs_" + base] = round(
                entry["run_s_median"] / max(out[base]["run_s_median"], 1e-9), 3
            )
        out[name] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=["variants", "scale"])
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--default-seeds", default="42-51", help="seeds of the default trace")
    parser.add_argument("--pods", default="", help="comma-separated pod-list file names")
    parser.add_argument("--scales", default=",".join(f"{s:g}" for s in DEFAULT_SCALES))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()

    folder = find_trace_dir()
    if folder is None:
        raise SystemExit("the Alibaba trace was not found; set FGPU_TRACE_DIR")
    seeds = parse_seeds(args.seeds)
    default_seeds = parse_seeds(args.default_seeds)
    if args.pods:
        pods = [p.strip() for p in args.pods.split(",") if p.strip()]
    elif args.experiment == "scale":
        pods = list(SCALE_PODS)
    else:
        found = sorted(p.name for p in folder.glob("openb_pod_list_*.csv"))
        pods = sorted(found, key=lambda name: name != DEFAULT_PODS)  # the headline first
    if args.experiment == "variants":
        policies = ["fgd", "fgd-pattern"]
    else:
        policies = ["fgd", *(scaled_policy(float(s)) for s in args.scales.split(","))]

    results: dict[str, Any] = {}
    start = time.perf_counter()
    for name in pods:
        trace = Trace.load(folder / DEFAULT_NODES, folder / name)
        mine = default_seeds if name == DEFAULT_PODS else seeds
        results[name] = {"seeds": mine, **compare(trace, policies, mine, args.workers)}
        report(args, policies, seeds, default_seeds, results, start, done=False)
    report(args, policies, seeds, default_seeds, results, start, done=True)


def report(
    args: argparse.Namespace,
    policies: list[str],
    seeds: list[int],
    default_seeds: list[int],
    results: dict[str, Any],
    start: float,
    done: bool,
) -> None:
    """Write the JSON so far to ``--out``; print it when ``done``."""
    result = {
        "benchmark": f"fill-pattern-{args.experiment}",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
        "seeds": seeds,
        "default_trace_seeds": default_seeds,
        "complete": done,
        "workers": args.workers,
        "policies": policies,
        "wall_s": round(time.perf_counter() - start, 1),
        "variants": results,
    }
    text = json.dumps(result, indent=2)
    if done:
        print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
