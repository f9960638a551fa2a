"""Benchmark: squeeze before evict against eviction only, on the same seeded day.

Superseded by ``bench/preemption.py`` (issue 28), which compares squeeze, wait and suspend
on three seeds; kept as issue 17's measure (both runs preempt at once, nothing suspended).

Both runs replay the same generated day (``fgpu sim replay`` defaults but for: 48 hours,
offered load 1.1, 3 tenants, 64 A100-80GB, seed 1, the default mix with its inference
class and explicit GPU memory) with the same decision core, once with ``squeeze`` off
(every preemption evicts) and once on. They run side by side in two processes and one JSON
object is printed (and written with ``--out``):

- per mode: evictions, preemptions, reclaims, squeezes, wasted GPU-hours, mean GPU
  allocation, p95 start delay and completion times per priority, finished workloads;
- per mode, ``evictions_by_shape``: evictions by the shapes of preemptor and victim
  (fractional, whole, multi) and ``squeezable_at_most``, the evictions whose pair the squeeze
  rule allows at all (fractional over fractional, inside a queue; memory not checked);
- ``ratios``: squeeze / evict-only for evictions, wasted GPU-hours, critical p95 start
  delay and mean allocation; ``evictions_at_least``: the lowest evictions ratio a squeeze
  could reach on the evict-only run's eviction mix (every allowed pair squeezed);
- ``target``: the issue's bar (evictions and wasted GPU-hours at most half, critical p95
  start delay no worse, mean allocation no lower) and whether each part is met.

``--min-runtime S`` sets the core's ``min_runtime_s`` in both runs (default 0, as ``fgpu
sim replay``): a workload runs at least S seconds before it can be a victim.

Usage: ``python bench/squeeze.py [--hours 48] [--load 1.1] [--seed 1] [--min-runtime 0]
[--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from fgpu.sched.decide import SchedulerConfig
from fgpu.sim.experiment import DEFAULT_PODS, find_trace_dir
from fgpu.sim.replay import DutyCycles, build_scheduler, parse_gpus, run_replay, tenant_queues
from fgpu.sim.replay_report import summarize_replay
from fgpu.sim.trace import load_pods
from fgpu.sim.workloads import generate

GPUS = "64xA100-80GB"
TENANTS = 3


def one_run(
    squeeze: bool, hours: float, load: float, seed: int, pods_path: str, min_runtime_s: float = 0.0
) -> dict[str, Any]:
    """One replay of the seeded day; the summary's figures that the comparison needs."""
    nodes = parse_gpus(GPUS)
    capacity = sum(n.gpu_count for n in nodes) * 1000
    # the same split of the seed as `fgpu sim replay`: workloads, then the scheduler's rank
    workload_seed, scheduler_seed = np.random.SeedSequence(seed).spawn(2)
    shapes = list(load_pods(pods_path).requests)
    day = generate(
        shapes,
        capacity,
        TENANTS,
        load,
        hours,
        np.random.default_rng(workload_seed),
        gpu_memory_mib=min(n.gpu_memory_mib for n in nodes),
    )
    names = [f"tenant-{i + 1}" for i in range(TENANTS)]
    scheduler = build_scheduler(
        "fgd-pattern",
        nodes,
        shapes,
        # as measured before issue 28: preemption at once, no suspend
        SchedulerConfig(
            squeeze=squeeze, min_runtime_s=min_runtime_s, preempt_delay_s=0.0, suspend=False
        ),
        np.random.default_rng(scheduler_seed),
    )
    started = time.perf_counter()
    result = run_replay(
        nodes,
        tenant_queues(names, nodes),
        day,
        scheduler,
        hours,
        tick_s=60.0,
        duty=DutyCycles(),
    )
    wall = time.perf_counter() - started
    s = summarize_replay(result, wall)
    return {
        "workloads": len(day),
        "evictions": s["evictions"],
        "preemptions": s["preemptions"],
        "reclaims": s["reclaims"],
        "squeezes": s["squeezes"],
        "evictions_by_shape": s["evictions_by_shape"],
        "wasted_gpu_hours": s["wasted_gpu_hours"],
        "gpu_allocation_pct": s["gpu_allocation_pct"],
        "start_delay_s_per_priority": s["queueing_delay_s"]["per_priority"],
        "completion_time_s_per_priority": s["completion_time_s"]["per_priority"],
        "finished": s["finished"],
        "unfinished": s["unfinished"],
        "wall_s": round(wall, 1),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=48.0)
    parser.add_argument("--load", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--min-runtime", type=float, default=0.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    folder = find_trace_dir()
    if folder is None:
        raise SystemExit("the Alibaba trace was not found (set FGPU_TRACE_DIR)")
    pods = str(folder / DEFAULT_PODS)
    with ProcessPoolExecutor(max_workers=2) as pool:
        runs = {
            mode: pool.submit(
                one_run,
                mode == "squeeze",
                args.hours,
                args.load,
                args.seed,
                pods,
                args.min_runtime,
            )
            for mode in ("evict_only", "squeeze")
        }
        results = {mode: f.result() for mode, f in runs.items()}
    evict, squeeze = results["evict_only"], results["squeeze"]
    crit_e = evict["start_delay_s_per_priority"].get("critical", {}).get("p95")
    crit_s = squeeze["start_delay_s_per_priority"].get("critical", {}).get("p95")
    ratios = {
        "evictions": _ratio(squeeze["evictions"], evict["evictions"]),
        "evictions_at_least": evict["evictions_by_shape"]["ratio_at_least"],
        "wasted_gpu_hours": _ratio(squeeze["wasted_gpu_hours"], evict["wasted_gpu_hours"]),
        "critical_p95_start_delay": _ratio(crit_s, crit_e),
        "mean_allocation": _ratio(
            squeeze["gpu_allocation_pct"]["mean"], evict["gpu_allocation_pct"]["mean"]
        ),
    }
    target = {
        "evictions_at_most_half": ratios["evictions"] is not None and ratios["evictions"] <= 0.5,
        "wasted_at_most_half": ratios["wasted_gpu_hours"] is not None
        and ratios["wasted_gpu_hours"] <= 0.5,
        "critical_p95_start_delay_no_worse": (crit_s or 0.0) <= (crit_e or 0.0),
        "mean_allocation_no_lower": squeeze["gpu_allocation_pct"]["mean"]
        >= evict["gpu_allocation_pct"]["mean"],
    }
    report = {
        "benchmark": "squeeze",
        "day": {
            "gpus": GPUS,
            "tenants": TENANTS,
            "load": args.load,
            "hours": args.hours,
            "seed": args.seed,
            "policy": "fgd-pattern",
            "tick_s": 60.0,
            "min_runtime_s": args.min_runtime,
            "duty": {"inference": DutyCycles().inference_duty, "training": 1.0},
        },
        "evict_only": evict,
        "squeeze": squeeze,
        "ratios": ratios,
        "target": {**target, "met": all(target.values())},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    text = json.dumps(report, indent=2)
    print(text)
    for name, met in target.items():
        print(f"target {name}: {'met' if met else 'NOT met'}", file=sys.stderr)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
