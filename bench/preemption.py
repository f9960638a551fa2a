"""Benchmark: preemption that keeps the work (issue 28), five policies on the same days.

Supersedes ``bench/squeeze.py``. Every run replays a generated day (``fgpu sim replay``
defaults but for: 48 hours, offered load 1.1, 3 tenants, 64 A100-80GB in 8-GPU nodes, the
default mix with its inference class and explicit GPU memory, and whole single-GPU work
declaring its memory too, ``-g 1 --gpu-memory ...``) with the same decision core under five
policies:

- ``evict_only``: every preemption evicts at once (squeeze, wait and suspend off);
- ``squeeze``: squeeze before evict (rule 7 of :mod:`fgpu.sched.decide`);
- ``wait``: preemptors below priority 100 wait up to 300 s for capacity to free (rule 10);
- ``suspend``: victims are suspended to host memory where their node's budget allows (rule
  9): every workload is suspendable, each node sets aside ``--host-pool`` GiB (default 256)
  of host memory, the copies run at ``--host-link`` GB/s (default 25, the order of a PCIe
  4.0 x16 link), one copy to host per suspension and one back per restore; a suspended
  workload is restored onto any GPU of its node with room, as a CUDA 13 driver (version >=
  13000) can restore a checkpoint onto another GPU of the same model
  (``--restore-own-gpus``: only onto the GPUs it was suspended from, as CUDA 12.8-12.9
  drivers, r570-r575, restore);
- ``all``: the three together.

Each policy runs on the same days (``--seeds``, default 1 2 3; the seed draws the day and
the node tie-break rank as ``fgpu sim replay`` does). Printed (and written with ``--out``),
one JSON object:

- ``runs``: per policy and seed, goodput (% of fleet GPU-hours: allocated minus work lost
  to evictions minus GPU-hours held while copying, :mod:`fgpu.sim.replay_report`),
  evictions, suspends, squeezes, wasted GPU-hours, copy GPU-hours, mean allocation %,
  critical and high p95 start delay (s), finished and unfinished workloads, wall seconds;
- ``summary``: per policy and figure, ``mean``, ``sd`` (sample standard deviation) and
  ``min``/``max`` over the seeds;
- ``target``: issue 28's bar for ``all`` against ``evict_only`` on the means over the seeds
  both have (goodput at least 80 %, evictions at most a quarter, wasted GPU-hours at most
  half, critical p95 start delay no worse), each part with whether it held, and ``met``;
- ``complete`` and ``missing_runs``: whether every policy ran on every seed.

``--runs FILE`` appends every finished run to FILE (JSON lines) as it ends and skips the
runs FILE already holds for the same day, so a long benchmark can be stopped and resumed;
the report is built from all of them. Runs start evict-only and all-together first (the
target needs both), then suspend, wait and squeeze.

Usage: ``python bench/preemption.py [--seeds 1 2 3] [--hours 48] [--load 1.1]
[--policies ...] [--restore-own-gpus] [--jobs 2] [--runs FILE] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
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
WAIT_S = 300.0
"""The wait before evict of the ``wait`` and ``all`` policies (the issue's default)."""

POLICIES: dict[str, dict[str, Any]] = {
    "evict_only": {"squeeze": False, "suspend": False, "preempt_delay_s": 0.0},
    "squeeze": {"squeeze": True, "suspend": False, "preempt_delay_s": 0.0},
    "wait": {"squeeze": False, "suspend": False, "preempt_delay_s": WAIT_S},
    "suspend": {"squeeze": False, "suspend": True, "preempt_delay_s": 0.0},
    "all": {"squeeze": True, "suspend": True, "preempt_delay_s": WAIT_S},
}

FIGURES = (
    "goodput_pct",
    "evictions",
    "suspends",
    "squeezes",
    "wasted_gpu_hours",
    "copy_gpu_hours",
    "gpu_allocation_pct",
    "critical_p95_start_s",
    "high_p95_start_s",
    "unfinished",
)


def one_run(
    policy: str,
    seed: int,
    hours: float,
    load: float,
    pods_path: str,
    host_pool_gib: float,
    host_link_gb_s: float,
    restore_other_gpus: bool = True,
) -> dict[str, Any]:
    """One replay of the seeded day under ``policy``; the figures the comparison needs."""
    knobs = POLICIES[policy]
    nodes = parse_gpus(GPUS)
    if knobs["suspend"]:
        pool = int(host_pool_gib * 1024)
        nodes = [
            replace(n, suspend_host_memory_mib=pool, restore_other_gpus=restore_other_gpus)
            for n in nodes
        ]
    capacity = sum(n.gpu_count for n in nodes) * 1000
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
        whole_gpu_memory=True,
    )
    scheduler = build_scheduler(
        "fgd-pattern",
        nodes,
        shapes,
        SchedulerConfig(
            squeeze=knobs["squeeze"],
            suspend=knobs["suspend"],
            preempt_delay_s=knobs["preempt_delay_s"],
        ),
        np.random.default_rng(scheduler_seed),
    )
    started = time.perf_counter()
    result = run_replay(
        nodes,
        tenant_queues([f"tenant-{i + 1}" for i in range(TENANTS)], nodes),
        day,
        scheduler,
        hours,
        tick_s=60.0,
        duty=DutyCycles(),
        suspendable=knobs["suspend"],
        host_link_mib_s=host_link_gb_s * 1e9 / 2**20,
    )
    wall = time.perf_counter() - started
    s = summarize_replay(result, wall)
    delays = s["queueing_delay_s"]["per_priority"]
    return {
        "policy": policy,
        "seed": seed,
        "workloads": len(day),
        "goodput_pct": s["goodput_pct"],
        "evictions": s["evictions"],
        "suspends": s["suspends"],
        "restores": s["restores"],
        "squeezes": s["squeezes"],
        "wasted_gpu_hours": s["wasted_gpu_hours"],
        "copy_gpu_hours": s["copy_gpu_hours"],
        "gpu_allocation_pct": s["gpu_allocation_pct"]["mean"],
        "critical_p95_start_s": delays.get("critical", {}).get("p95"),
        "high_p95_start_s": delays.get("high", {}).get("p95"),
        "finished": s["finished"],
        "unfinished": s["unfinished"],
        "wall_s": round(wall, 1),
    }


def spread(values: list[float]) -> dict[str, float | None]:
    """Mean, sample standard deviation (None for one value), min and max."""
    if not values:
        return {"mean": None, "sd": None, "min": None, "max": None}
    return {
        "mean": round(statistics.fmean(values), 3),
        "sd": round(statistics.stdev(values), 3) if len(values) > 1 else None,
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--hours", type=float, default=48.0)
    parser.add_argument("--load", type=float, default=1.1)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--host-pool", type=float, default=256.0, help="GiB per node")
    parser.add_argument("--host-link", type=float, default=25.0, help="GB/s")
    parser.add_argument(
        "--restore-own-gpus",
        dest="restore_other_gpus",
        action="store_false",
        help="suspended work comes back only on the GPUs it was suspended from (CUDA "
        "12.8-12.9 drivers, r570-r575); default: on any GPU of its node (CUDA 13, driver "
        "version >= 13000, restores onto another GPU of the same model)",
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--runs", type=Path, default=None, help="JSON lines of finished runs")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: report the runs --runs holds (the report says which are missing)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    folder = find_trace_dir()
    if folder is None:
        raise SystemExit("the Alibaba trace was not found (set FGPU_TRACE_DIR)")
    pods = str(folder / DEFAULT_PODS)
    first = ["evict_only", "all", "suspend", "wait", "squeeze"]
    order = sorted(args.policies, key=first.index)
    day_key = {
        "hours": args.hours,
        "load": args.load,
        "host_pool_gib": args.host_pool,
        "host_link_gb_s": args.host_link,
        **({"restore_other_gpus": True} if args.restore_other_gpus else {}),
    }
    runs: list[dict[str, Any]] = []
    if args.runs is not None and args.runs.exists():
        for line in args.runs.read_text(encoding="utf-8").splitlines():
            run = json.loads(line)
            if run.get("day") == day_key and run["policy"] in order and run["seed"] in args.seeds:
                runs.append(run)
    done = {(r["policy"], r["seed"]) for r in runs}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(
                one_run,
                p,
                seed,
                args.hours,
                args.load,
                pods,
                args.host_pool,
                args.host_link,
                args.restore_other_gpus,
            )
            for p in order
            for seed in args.seeds
            if (p, seed) not in done and not args.report_only
        ]
        for future in as_completed(futures):
            run = {**future.result(), "day": day_key}
            runs.append(run)
            if args.runs is not None:
                with args.runs.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(run) + "\n")
    runs.sort(key=lambda r: (order.index(r["policy"]), r["seed"]))
    by_policy: dict[str, list[dict[str, Any]]] = {p: [] for p in args.policies}
    for run in runs:
        by_policy[run["policy"]].append(run)
    summary = {
        p: {fig: spread([r[fig] for r in items if r[fig] is not None]) for fig in FIGURES}
        for p, items in by_policy.items()
    }
    missing = [
        f"{p} seed {seed}"
        for p in order
        for seed in args.seeds
        if (p, seed) not in {(r["policy"], r["seed"]) for r in runs}
    ]
    report: dict[str, Any] = {
        "benchmark": "preemption",
        "complete": not missing,
        "missing_runs": missing,
        "day": {
            "gpus": GPUS,
            "tenants": TENANTS,
            "load": args.load,
            "hours": args.hours,
            "seeds": args.seeds,
            "policy": "fgd-pattern",
            "tick_s": 60.0,
            "grace_s": 30.0,
            "whole_gpu_memory": True,
            "duty": {"inference": DutyCycles().inference_duty, "training": 1.0},
            "wait_s": WAIT_S,
            "wait_below_priority": SchedulerConfig().preempt_wait_below,
            "host_pool_gib_per_node": args.host_pool,
            "host_link_gb_s": args.host_link,
            "restore": "onto any GPU of the node"
            if args.restore_other_gpus
            else "onto the GPUs it was suspended from",
        },
        "runs": {p: by_policy[p] for p in args.policies},
        "summary": summary,
    }
    # the target compares the means of `all` and `evict_only` over the seeds both have
    common = sorted(
        {r["seed"] for r in by_policy.get("all", ())}
        & {r["seed"] for r in by_policy.get("evict_only", ())}
    )
    if not common:
        report["target"] = {"met": None, "why": "no seed has both an all and an evict_only run"}
    else:

        def mean(policy: str, fig: str) -> float:
            values = [r[fig] for r in by_policy[policy] if r["seed"] in common]
            return statistics.fmean(float(v) for v in values if v is not None)

        target = {
            "goodput_at_least_80_pct": mean("all", "goodput_pct") >= 80.0,
            "evictions_at_most_a_quarter": mean("all", "evictions")
            <= 0.25 * mean("evict_only", "evictions"),
            "wasted_at_most_half": mean("all", "wasted_gpu_hours")
            <= 0.5 * mean("evict_only", "wasted_gpu_hours"),
            "critical_p95_start_delay_no_worse": mean("all", "critical_p95_start_s")
            <= mean("evict_only", "critical_p95_start_s"),
        }
        report["ratios_all_over_evict_only"] = {
            fig: round(mean("all", fig) / mean("evict_only", fig), 3)
            if mean("evict_only", fig)
            else None
            for fig in ("evictions", "wasted_gpu_hours", "gpu_allocation_pct", "goodput_pct")
        }
        report["target"] = {**target, "seeds": common, "met": all(target.values())}
    report["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
