"""A bounded chaos test (issue 14, points 7 and 9): the real ``fgpu serve`` is SIGKILLed
again and again while clients submit (16 x ``-g 0.5`` at once) and cancel concurrently, on
SQLite and on a real PostgreSQL (``FGPU_TEST_POSTGRES_URL``, which ``.ci/run`` sets).

After each kill, before the restart: nothing of the workloads stays frozen (the watchdog).
After each restart, waiting on each condition with a generous deadline (a race between two
looks resolves, a broken invariant does not):

- no acknowledged workload is lost (every id a client got back is listed);
- none runs twice (at most one live wrapper per workload) and there is no orphan (every
  live wrapper belongs to a running or paused workload);
- no GPU is over-allocated (per GPU, the running workloads' compute and memory fit);
- an acknowledged cancel is never undone (the workload does not run again).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shutil
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy import create_engine

from fgpu.client import Client, ClientError
from fgpu.wire import SubmitRequest, WorkloadView
from tests.integration.test_service_governor import stopped
from tests.serverproc import ServerProcess, wait_for

CYCLES = 4
AT_ONCE = 16
GPUS = "4xA100-40GB"
GPU_MEMORY_MIB = 40960
LONG = [sys.executable, "-c", "import time; time.sleep(600)"]
SHORT = ["/bin/true"]
_RUNNER = re.compile(r"/logs/([^/]+)/exit\.json$")


@pytest.fixture
def postgres_db() -> Iterator[str]:
    """A new database on the test server (dropped afterwards); its URL."""
    from tests.integration.test_store_postgres import server_url

    server = server_url()  # skips without the variable, fails when it is set but unusable
    name = f"fgpu_chaos_{secrets.token_hex(4)}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    extra: list[str] = []
    if request.param == "postgres":
        extra = ["--db", request.getfixturevalue("postgres_db")]
    root = Path(tempfile.mkdtemp(prefix="fgpu-chaos-", dir="/tmp"))
    proc = ServerProcess(root, GPUS, extra)
    try:
        proc.start()
        yield proc
    finally:
        if proc.process is not None and proc.process.poll() is not None:
            with contextlib.suppress(AssertionError):
                proc.start()
        proc.cleanup()
        shutil.rmtree(root, ignore_errors=True)


class Clients:
    """Concurrent submitters and cancellers; what the server acknowledged."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.submitted: set[str] = set()
        self.cancelled: set[str] = set()
        self.lock = threading.Lock()

    def submit(self, command: list[str]) -> None:
        with contextlib.suppress(ClientError), Client(self.socket, timeout=60) as client:
            view = client.submit(SubmitRequest(command=command, gpu="0.5", grace_s=1, cwd="/"))
            with self.lock:
                self.submitted.add(view.id)

    def cancel(self, workload_id: str) -> None:
        with contextlib.suppress(ClientError), Client(self.socket, timeout=60) as client:
            client.cancel(workload_id)
            with self.lock:
                self.cancelled.add(workload_id)

    def acknowledged(self) -> int:
        with self.lock:
            return len(self.submitted)


def live_runners(state_dir: Path) -> Counter[str]:
    """Live wrappers per workload id, from ``/proc`` (their ``--exit-file`` names the id)."""
    found: Counter[str] = Counter()
    prefix = str(state_dir)
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info.get("status") == psutil.STATUS_ZOMBIE or "fgpu.agent.runner" not in cmdline:
            continue
        try:
            exit_file = cmdline[cmdline.index("--exit-file") + 1]
        except (ValueError, IndexError):
            continue
        match = _RUNNER.search(exit_file)
        if match and exit_file.startswith(prefix):
            found[match.group(1)] += 1
    return found


def workload_groups(server: ServerProcess) -> list[int]:
    return [int(h["pgid"]) for h in server.handles()]


def listing(server: ServerProcess) -> dict[str, WorkloadView]:
    with Client(server.socket, timeout=60) as client:
        return {w.id: w for w in client.list_workloads(include_done=True)}


def check_invariants(server: ServerProcess, clients: Clients) -> None:
    problems: list[str] = []

    def holds() -> bool:
        problems.clear()
        listed = listing(server)
        runners = live_runners(server.state_dir)
        lost = clients.submitted - listed.keys()
        if lost:
            problems.append(f"acknowledged but lost: {sorted(lost)}")
        twice = {w: n for w, n in runners.items() if n > 1}
        if twice:
            problems.append(f"running twice: {twice}")
        orphans = [
            w for w in runners if w not in listed or listed[w].phase not in ("running", "paused")
        ]
        if orphans:
            problems.append(f"orphan processes of {orphans}")
        per_gpu: dict[tuple[str, int], list[int]] = {}
        for w in listed.values():
            if w.phase in ("running", "paused"):
                for g in w.gpus:
                    used = per_gpu.setdefault((g.node, g.index), [0, 0])
                    used[0] += g.compute_milli
                    used[1] += g.memory_mib
        over = {k: v for k, v in per_gpu.items() if v[0] > 1000 or v[1] > GPU_MEMORY_MIB}
        if over:
            problems.append(f"over-allocated GPUs: {over}")
        revived = [
            w
            for w in clients.cancelled
            if w in listed
            and listed[w].phase not in ("cancelled", "succeeded", "failed")
            and not listed[w].stopping
        ]
        if revived:
            problems.append(f"cancelled but active again: {revived}")
        return not problems

    try:
        wait_for(holds, "the invariants to hold", timeout_s=60)
    except AssertionError:
        raise AssertionError("; ".join(problems) + "\n" + server.server_log()[-3000:]) from None


def test_sigkill_restart_cycles_during_concurrent_submit_and_cancel(
    server: ServerProcess,
) -> None:
    clients = Clients(server.socket)
    for cycle in range(CYCLES):
        before = clients.acknowledged()
        cancellable = sorted(clients.submitted - clients.cancelled)[:4]
        threads = [
            threading.Thread(target=clients.submit, args=(LONG if i % 2 else SHORT,))
            for i in range(AT_ONCE)
        ]
        threads += [threading.Thread(target=clients.cancel, args=(w,)) for w in cancellable]
        for thread in threads:
            thread.start()
        # kill while the burst is under way: once some of it was acknowledged (the last
        # cycle lets the burst finish, so that a full round of 16 is decided too)
        wanted = before + (AT_ONCE if cycle == CYCLES - 1 else 4)
        wait_for(
            lambda wanted=wanted: clients.acknowledged() >= wanted,  # type: ignore[misc]
            "submissions to be acknowledged",
        )
        server.kill()
        for thread in threads:
            thread.join(120)
            assert not thread.is_alive()
        groups = workload_groups(server)
        wait_for(
            lambda groups=groups: not any(stopped(g) for g in groups),  # type: ignore[misc]
            "every workload of the killed server to be thawed",
        )
        server.start()
        check_invariants(server, clients)
    assert clients.acknowledged() >= CYCLES * 4
