"""One figure for a queue's allocation (issue 25, point 1): squeezed compute counts nowhere.

The README's squeeze example on the real ``fgpu serve`` with one simulated A100-80GB and real
processes: two ``-p low -g 0.5`` and one ``-p critical -g 0.5`` (each with a ``--gpu-memory``
that lets all three fit). One low job is squeezed; the GPU is granted exactly once, so every
view says 1.0 GPU allocated to ``default``: ``fgpu queue ls`` (table and ``--json``), the
dashboard's queue table, ``fgpu_queue_allocated_gpus`` on ``/metrics``, ``fgpu top`` and the
decision core itself (``Scheduler.decide`` on the service's store, read while it runs).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fgpu.agent.backend import SimulatedBackend
from fgpu.plugins import create_policy
from fgpu.sched.decide import Scheduler
from fgpu.sched.rounds import state_with, target_for, target_key
from fgpu.server.machine import discover
from fgpu.store import ACTIVE_PHASES, Store, to_core
from tests.serverproc import ServerProcess, started_server

GPU = "1xA100-80GB"


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    with started_server("fgpu-one-figure-", GPU) as proc:
        yield proc


def sleeper() -> list[str]:
    return [sys.executable, "-c", "import time; time.sleep(600)"]


def over_socket(proc: ServerProcess, path: str) -> str:
    transport = httpx.HTTPTransport(uds=str(proc.socket))
    with httpx.Client(transport=transport, base_url="http://fgpu", timeout=30) as client:
        answer = client.get(path)
    assert answer.status_code == 200, (path, answer.status_code, answer.text)
    return answer.text


def metric(text: str, series: str, queue: str) -> float:
    found = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == series and s.labels.get("queue") == queue
    ]
    assert len(found) == 1, (series, found)
    return float(found[0])


def dashboard_allocated(html: str, queue: str) -> float:
    """The ``allocated`` cell (the 4th) of ``queue``'s row in the dashboard's queue table."""
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', html, re.S)
    assert row, html
    cells = re.findall(r"<td>([^<]*)</td>", row.group(1))
    return float(cells[2])  # the name cell holds a swatch: quota, fair share, allocated


def core_allocated(proc: ServerProcess, queue: str) -> int:
    """What the decision core counts as ``queue``'s allocated GPU compute, from a round
    decided on the running service's own store (SQLite in WAL mode: read beside it)."""
    store = Store.open(proc.state_dir / "fgpu.db")
    try:
        records = store.list_workloads(ACTIVE_PHASES)
        (host,) = {r.allocation.node_name for r in records if r.allocation is not None}
        machine = discover(SimulatedBackend(GPU, host), host)
        index = {n.name: i for i, n in enumerate(machine.nodes)}
        workloads = [to_core(r, index) for r in records]
        state = state_with(machine.nodes, workloads, lambda w, e: pytest.fail(f"{w.id}: {e}"))
        target = target_for(target_key(workloads))  # as the service's rounds
        policy = create_policy("fgd-pattern", target=target, rng=np.random.default_rng(0))
        decision = Scheduler(policy).decide(
            time.time(), state, store.queue_tree(), workloads, store.load_holds()
        )
    finally:
        store.close()
    return decision.allocated[queue].gpu_milli


def test_squeezed_compute_counts_once_in_every_view(server: ServerProcess) -> None:
    memory = ("--gpu-memory", "20GiB")
    lows = [
        server.submit("-p", "low", "-g", "0.5", *memory, "--name", n, command=sleeper())
        for n in ("low1", "low2")
    ]
    for wid in lows:
        server.wait_phase(wid, "running")
    svc = server.submit("-p", "critical", "-g", "0.5", *memory, "--name", "svc", command=sleeper())
    server.wait_phase(svc, "running")
    listing = server.wait_listing(
        lambda ls: sum(1 for w in lows if ls[w]["squeezed"]) == 1, "one low job squeezed"
    )
    assert all(listing[w]["phase"] in ("running", "paused") for w in lows), listing
    assert all(listing[w]["restarts"] == 0 for w in lows), listing  # squeezed, not evicted

    # three jobs hold 0.5 each, one of them squeezed: the queue is granted 1.0 GPU
    (queue,) = [q for q in server.json("queue", "ls") if q["name"] == "default"]
    assert queue["allocated_milli"] == 1000, queue
    assert queue["running"] == 3, queue
    table = server.cli("queue", "ls", env_extra={"COLUMNS": "200"}).stdout
    (row,) = [line for line in table.splitlines() if line.lstrip(" │┃|").startswith("default")]
    cells = [c for c in re.split(r"[\s│┃|]+", row) if c]
    # NAME PARENT QUOTA LIMIT WEIGHT PRIORITY ALLOCATED ...
    assert cells[6] == "1", table

    html = over_socket(server, "/ui/fragment/overview")
    assert dashboard_allocated(html, "default") == 1.0

    metrics = over_socket(server, "/metrics")
    assert metric(metrics, "fgpu_queue_allocated_gpus", "default") == 1.0

    (gpu,) = server.json("top")
    assert gpu["allocated_milli"] == 1000, gpu

    assert core_allocated(server, "default") == 1000
