"""Benchmark: the cost of watching (issue 15).

Prints one JSON object (and writes it with ``--out``). The fleet: an in-process service
with 1,000 running workloads on 64 simulated GPUs (SQLite store; the workloads are recorded
as running without processes, so no governor figures).

- ``scrape``: one ``/metrics`` exposition (sample read from the service's memory, then the
  text), best / median / worst of 20 in ms, the size and series count; the first scrape
  (which also computes the fragmentation) apart;
- ``scrape_governed``: the same, with every share governed (achieved share, paused
  seconds, paused now: the 7 series per share a governed fleet has), the governor's views
  built at each scrape by a stand-in (:func:`governor_views`: no processes to govern);
- ``dashboard``: the overview's poll through the real ASGI app (what each open page asks
  every ``POLL_S``), answered 204 while nothing changed, and answered with a fresh render
  right after a submit or a cancel; best / median / worst in ms;
- ``update``: the dashboard in headless Chromium (Debian's ``chromium`` driven by
  Playwright) on a real HTTP listener, logged in with the token: seconds from a
  ``POST /v1/workloads`` (and a ``POST .../cancel``) on the API until the page shows the workload
  in (and gone from) its pending table, without a reload; median and worst of
  ``UPDATES`` each. Skipped (``null``, with why) where Chromium or Playwright is missing;
- ``targets``: scrape under 50 ms and an update within 2 s, with measured / target ratios.

Usage: ``python bench/metrics.py [--out bench/results/metrics-cpu.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi.testclient import TestClient

from fgpu.agent.governor.plan import RunState
from fgpu.agent.governor.runtime import WorkloadView as GovernorView
from fgpu.sched.workload import Place
from fgpu.server.app import create_app
from fgpu.server.dashboard import POLL_S, REFRESH_S
from fgpu.server.service import Caller, Service
from fgpu.wire import SubmitRequest

RUNNING = 1000
GPUS = 64
ROUNDS = 20
UPDATES = 5
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


def timed(call: Callable[[], object], rounds: int = ROUNDS) -> tuple[list[float], list[float]]:
    """Wall and CPU (this process's) milliseconds of each of ``rounds`` calls; the CPU time
    shows the cost apart from the other work of a shared machine."""
    wall, cpu = [], []
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        call()
        cpu.append((time.process_time() - c) * 1000)
        wall.append((time.perf_counter() - t) * 1000)
    return wall, cpu


def summary(measured: tuple[list[float], list[float]]) -> dict[str, float]:
    wall, cpu = measured
    return {
        "best_ms": round(min(wall), 2),
        "median_ms": round(statistics.median(wall), 2),
        "worst_ms": round(max(wall), 2),
        "cpu_median_ms": round(statistics.median(cpu), 2),
    }


def governor_views(svc: Service) -> Callable[[], dict[str, GovernorView]]:
    """A stand-in for the governor's per-workload views (the fleet has no processes to
    govern): one :class:`~fgpu.agent.governor.runtime.WorkloadView` per running workload,
    built at each call as ``Governor.snapshot()`` builds them, so that a scrape exports the
    7 series per share of a governed fleet and pays for reading them."""
    running = [r for r in svc.store.list_workloads(("running",)) if r.allocation is not None]

    def views() -> dict[str, GovernorView]:
        out = {}
        for r in running:
            a = r.allocation
            assert a is not None
            out[r.id] = GovernorView(
                workload_id=r.id,
                gpu_uuids=tuple(a.gpu_uuids),
                compute_milli=tuple(a.gpu_milli),
                priority=r.priority,
                modes=("fair",) * len(a.gpus),
                state=RunState.RUNNING,
                busy=True,
                activity="assumed",
                achieved_milli=min(a.gpu_milli),
                blocker=None,
                enforcement="signal",
                paused_ns=(1_500_000_000, 0),
            )
        return out

    return views


def series_count(text: bytes) -> int:
    return sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def browser_updates(svc: Service) -> dict[str, Any]:
    """Submit / cancel latencies as headless Chromium sees them (see the module doc)."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {"skipped": "playwright is not installed"}
    if chromium is None:
        return {"skipped": "Debian's chromium is not installed"}
    port = free_port()
    config = uvicorn.Config(
        create_app(svc, token=TOKEN),
        host="127.0.0.1",
        port=port,
        lifespan="off",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    shown: list[float] = []
    gone: list[float] = []
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the bench's HTTP listener did not start in 60 s")
            time.sleep(0.05)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(f"{base}/ui/login")
            page.fill("input[name=token]", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_selector(".gpu", timeout=60_000)
            gpus_drawn = page.locator(".gpu").count()
            shares_drawn = page.locator(".share").count()
            for i in range(UPDATES):
                body = {"command": ["true"], "gpu": "8", "name": f"probe-{i}"}
                t = time.perf_counter()
                answer = api.post("/v1/workloads", json=body)
                answer.raise_for_status()
                wid = answer.json()["id"]
                row = f'#pending tr[data-workload="{wid}"]'
                page.wait_for_selector(row, timeout=60_000)
                shown.append(time.perf_counter() - t)
                t = time.perf_counter()
                api.post(f"/v1/workloads/{wid}/cancel").raise_for_status()
                page.wait_for_selector(row, state="detached", timeout=60_000)
                gone.append(time.perf_counter() - t)
            browser.close()
    finally:
        api.close()
        server.should_exit = True
        thread.join(timeout=60)
    every = shown + gone
    return {
        "gpus_drawn": gpus_drawn,
        "shares_drawn": shares_drawn,
        "console_errors": len(errors),
        "submit_shown_s": {
            "median": round(statistics.median(shown), 3),
            "worst": round(max(shown), 3),
        },
        "cancel_shown_s": {
            "median": round(statistics.median(gone), 3),
            "worst": round(max(gone), 3),
        },
        "worst_s": round(max(every), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fgpu-bench-metrics-") as tmp:
        svc = fleet(Path(tmp))
        exporter = svc.metrics
        first = timed(exporter.exposition, 1)[0][0]
        text = exporter.exposition()
        scrape = timed(exporter.exposition)
        # the same service with governor figures on every share (views stand-in)
        ungoverned = svc.enforcement.views
        svc.enforcement.views = governor_views(svc)  # type: ignore[method-assign]
        full_text = exporter.exposition()
        scrape_governed = timed(exporter.exposition)
        svc.enforcement.views = ungoverned  # type: ignore[method-assign]
        client = TestClient(create_app(svc, token=TOKEN))  # no lifespan: no loop, no governor
        headers = {"Authorization": f"Bearer {TOKEN}"}
        answer = client.get("/ui/fragment/overview", headers=headers)
        assert answer.status_code == 200, answer.text
        fragment_bytes = len(answer.content)
        version = answer.text.split("?v=", 1)[1].split('"', 1)[0]
        unchanged = timed(lambda: client.get(f"/ui/fragment/overview?v={version}", headers=headers))
        me = Caller(os.getuid(), True)
        probe = SubmitRequest(command=["true"], gpu="8", name="probe")

        def after_a_change() -> None:  # a submit or a cancel, then the page's next poll
            pending = [w for w in svc.list_workloads() if w.phase == "pending"]
            if pending:
                svc.cancel(me, pending[0].id)
            else:
                svc.submit(me, probe)
            t, c = time.perf_counter(), time.process_time()
            got = client.get(f"/ui/fragment/overview?v={version}", headers=headers)
            changed[0].append((time.perf_counter() - t) * 1000)
            changed[1].append((time.process_time() - c) * 1000)
            assert got.status_code == 200

        changed: tuple[list[float], list[float]] = ([], [])
        for _ in range(ROUNDS):
            after_a_change()
        update = browser_updates(svc)
        svc.store.close()
    scrape_ms = statistics.median(scrape[0])
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "fleet": {"running": RUNNING, "gpus": GPUS},
        "scrape": {
            "first_ms": round(first, 2),
            **summary(scrape),
            "bytes": len(text),
            "series": series_count(text),
        },
        "scrape_governed": {
            **summary(scrape_governed),
            "bytes": len(full_text),
            "series": series_count(full_text),
        },
        "dashboard": {
            "poll_s": POLL_S,
            "refresh_s": REFRESH_S,
            "fragment_bytes": fragment_bytes,
            "poll_unchanged": summary(unchanged),
            "poll_after_a_change": summary(changed),
        },
        "update": update,
        "targets": {
            "scrape_ms": TARGETS["scrape_ms"],
            "scrape_ratio": round(scrape_ms / TARGETS["scrape_ms"], 3),
            "scrape_governed_ratio": round(
                statistics.median(scrape_governed[0]) / TARGETS["scrape_ms"], 3
            ),
            "update_s": TARGETS["update_s"],
            "update_ratio": (
                round(update["worst_s"] / TARGETS["update_s"], 3) if "worst_s" in update else None
            ),
        },
    }
    result["targets"]["met"] = {
        "scrape": scrape_ms < TARGETS["scrape_ms"],
        "scrape_governed": statistics.median(scrape_governed[0]) < TARGETS["scrape_ms"],
        "update": "worst_s" in update and update["worst_s"] < TARGETS["update_s"],
    }
    line = json.dumps(result, indent=2)
    print(line)
    for name, met in result["targets"]["met"].items():
        print(f"target {name}: {'met' if met else 'NOT met'}", file=sys.stderr)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")


if __name__ == "__main__":
    main()
