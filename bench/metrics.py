"""Benchmark: the cost of watching (issue 15).

Prints one JSON object (and writes it with ``--out``). The fleet: an in-process service
with 1,000 running workloads on 64 simulated GPUs (SQLite store; the workloads are recorded
as running without processes, so no governor figures).

- ``scrape``: one ``/metrics`` exposition (sample read from the service's memory, then the
  text), best / median / worst of 20 in ms, the size and series count; the first scrape
  (which also computes the fragmentation) apart;
- ``scrape_governed``: the same, with every share given governor figures (achieved share,
  paused seconds, paused now: the 7 series per share a governed fleet has), added to the
  service's sample at each scrape;
- ``dashboard``: the server-side render of the dashboard's live fragment through the real
  ASGI app (what each open page asks for every ``REFRESH_S``), best / median / worst in ms;
- ``update``: the dashboard in headless Chromium (Debian's ``chromium`` driven by
  Playwright) on a real HTTP listener, logged in with the token: seconds from a
  ``POST /v1/workloads`` (and a ``DELETE``) on the API until the page shows the workload
  in (and gone from) its pending table, without a reload; median and worst of
  ``UPDATES`` each. Skipped (``null``, with why) where Chromium or Playwright is missing;
- ``targets``: scrape under 50 ms and an update within 2 s, with measured / target ratios.

Usage: ``python bench/metrics.py [--out bench/results/metrics-cpu.json]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi.testclient import TestClient

from fgpu.metrics import FleetCollector, FleetSample
from fgpu.sched.workload import Place
from fgpu.server.app import create_app
from fgpu.server.dashboard import REFRESH_S
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


def timed(call: Callable[[], object], rounds: int = ROUNDS) -> list[float]:
    """Milliseconds of each of ``rounds`` calls."""
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        call()
        out.append((time.perf_counter() - t) * 1000)
    return out


def summary(ms: list[float]) -> dict[str, float]:
    return {
        "best_ms": round(min(ms), 2),
        "median_ms": round(statistics.median(ms), 2),
        "worst_ms": round(max(ms), 2),
    }


def governed(sample: FleetSample) -> FleetSample:
    """``sample`` with governor figures on every share (what a governed fleet exports)."""
    shares = [
        dataclasses.replace(
            w, achieved_milli=w.compute_milli, paused_s={"share": 1.5, "priority": 0.0}
        )
        for w in sample.workloads
    ]
    return dataclasses.replace(sample, workloads=shares)


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
                api.delete(f"/v1/workloads/{wid}").raise_for_status()
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
        first = timed(exporter.exposition, 1)
        text = exporter.exposition()
        scrape = timed(exporter.exposition)
        # the same exporter with governor figures on every share
        plain = exporter.fleet
        exporter.fleet = FleetCollector(lambda: governed(svc.metrics.sample()))
        full_text = exporter.exposition()
        scrape_governed = timed(exporter.exposition)
        exporter.fleet = plain
        client = TestClient(create_app(svc, token=TOKEN))  # no lifespan: no loop, no governor
        headers = {"Authorization": f"Bearer {TOKEN}"}
        answer = client.get("/ui/fragment/overview", headers=headers)
        assert answer.status_code == 200, answer.text
        fragment_bytes = len(answer.content)
        render = timed(lambda: client.get("/ui/fragment/overview", headers=headers))
        update = browser_updates(svc)
        svc.store.close()
    scrape_ms = statistics.median(scrape)
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "fleet": {"running": RUNNING, "gpus": GPUS},
        "scrape": {
            "first_ms": round(first[0], 2),
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
            "refresh_s": REFRESH_S,
            "fragment_bytes": fragment_bytes,
            "render": summary(render),
        },
        "update": update,
        "targets": {
            "scrape_ms": TARGETS["scrape_ms"],
            "scrape_ratio": round(scrape_ms / TARGETS["scrape_ms"], 3),
            "scrape_governed_ratio": round(
                statistics.median(scrape_governed) / TARGETS["scrape_ms"], 3
            ),
            "update_s": TARGETS["update_s"],
            "update_ratio": (
                round(update["worst_s"] / TARGETS["update_s"], 3) if "worst_s" in update else None
            ),
        },
    }
    line = json.dumps(result, indent=2)
    print(line)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")


if __name__ == "__main__":
    main()
