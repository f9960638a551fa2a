"""Benchmark: the cost of watching (issue 15).

Prints one JSON object (and writes it with ``--out``):

- ``scrape``: one ``/metrics`` exposition of ``fgpu serve`` with 1,000 running workloads on
  64 simulated GPUs (in-process service, SQLite store; workloads recorded as running without
  processes), best and median of 20, in ms; the exposition's size and series count;
- ``dashboard``: the server-side render of the dashboard's live fragment (what htmx fetches
  every ``REFRESH_S``) over the same fleet through the real ASGI app, best and median in ms,
  and the worst-case update latency that follows: a change waits at most one refresh period,
  then one render;
- ``targets``: scrape under 50 ms and an update within 2 s, with measured / target ratios.

Usage: ``python bench/metrics.py [--out bench/results/metrics-cpu.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from fgpu.metrics import exposition
from fgpu.sched.workload import Place
from fgpu.server.app import create_app
from fgpu.server.dashboard import REFRESH_S
from fgpu.server.service import Caller, Service
from fgpu.wire import SubmitRequest

RUNNING = 1000
GPUS = 64
ROUNDS = 20
TOKEN = "bench-token-0123456789abcdef"
TARGETS = {"scrape_ms": 50.0, "update_s": 2.0}


def fleet(folder: Path) -> Service:
    """A service with RUNNING workloads placed on GPUS simulated GPUs (no processes)."""
    svc = Service.create(
        simulate_gpus=f"{GPUS}xA100-80GB", state_dir=folder, db=str(folder / "metrics.db")
    )
    me = Caller(os.getuid(), True)
    for i in range(RUNNING):
        svc.submit(me, SubmitRequest(command=["true"], gpu="0.05", name=f"job-{i}"))
    placed = 0
    while placed < RUNNING:
        decision = svc.plan()
        places = [a for a in decision.actions if isinstance(a, Place)]
        if not places:
            raise RuntimeError(f"only {placed} of {RUNNING} placed")
        for action in places:
            a = action.allocation
            uuids = svc.machine.uuids(a.node_name, a.gpus)
            svc._tracked.mark_running(action.workload, a, gpu_uuids=uuids)
        placed += len(places)
    return svc


def timed(call: Any, rounds: int = ROUNDS) -> list[float]:
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        call()
        out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fgpu-bench-metrics-") as tmp:
        svc = fleet(Path(tmp))
        registry = svc.metrics.registry
        text = exposition(registry)
        scrape = timed(lambda: exposition(registry))
        client = TestClient(create_app(svc, token=TOKEN))  # no lifespan: no loop, no governor
        headers = {"Authorization": f"Bearer {TOKEN}"}
        answer = client.get("/ui/fragment/overview", headers=headers)
        assert answer.status_code == 200, answer.text
        render = timed(lambda: client.get("/ui/fragment/overview", headers=headers))
        svc.store.close()
    series = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))
    scrape_ms = statistics.median(scrape)
    update_s = REFRESH_S + max(render) / 1000
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "fleet": {"running": RUNNING, "gpus": GPUS},
        "scrape": {
            "best_ms": round(min(scrape), 2),
            "median_ms": round(scrape_ms, 2),
            "bytes": len(text),
            "series": series,
        },
        "dashboard": {
            "refresh_s": REFRESH_S,
            "render_best_ms": round(min(render), 2),
            "render_median_ms": round(statistics.median(render), 2),
            "update_worst_s": round(update_s, 3),
        },
        "targets": {
            "scrape_ms": TARGETS["scrape_ms"],
            "scrape_ratio": round(scrape_ms / TARGETS["scrape_ms"], 3),
            "update_s": TARGETS["update_s"],
            "update_ratio": round(update_s / TARGETS["update_s"], 3),
        },
    }
    line = json.dumps(result, indent=2)
    print(line)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")


if __name__ == "__main__":
    main()
