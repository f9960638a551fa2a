"""A damaged or lost store (issue 27, point 6), with real files and a real ``fgpu serve``.

- One page of the SQLite file overwritten with garbage: the server refuses to start (exit code
  4) with a message that names the file, says what ``PRAGMA quick_check`` found and how to
  recover; the file is left as it was.
- The file emptied while a workload runs, then the server started again: it starts with an
  empty store, and the workload it no longer knows is stopped before the server answers (so
  before any GPU is handed out); a new job then gets the GPU alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.serverproc import FGPU, ServerProcess, sleeper, wait_for

PAGE = 4096


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    root = Path(tempfile.mkdtemp(prefix="fgpu-damaged-", dir="/tmp"))
    proc = ServerProcess(root, "1xA100-40GB")
    proc.start()
    try:
        yield proc
    finally:
        if proc.process is not None and proc.process.poll() is None:
            proc.cleanup()
        for handle in proc.handles():  # whatever is left, the server's or not
            from tests.serverproc import kill_workload

            kill_workload(handle)
        shutil.rmtree(root, ignore_errors=True)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_damaged_page_is_refused_at_start_with_the_recovery_steps(
    server: ServerProcess,
) -> None:
    for i in range(3):
        server.submit("-g", "0.1", "--name", f"w{i}", command=["true"])
    assert server.stop() == 0  # a clean stop checkpoints the log into the file
    database = server.state_dir / "fgpu.db"
    with sqlite3.connect(database) as connection:
        (root,) = connection.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'workloads'"
        ).fetchone()
        (size,) = connection.execute("PRAGMA page_size").fetchone()
    assert size == PAGE
    with database.open("r+b") as handle:  # one page of garbage, the workloads' table
        handle.seek((root - 1) * PAGE)
        handle.write(os.urandom(PAGE))
    before = hashlib.sha256(database.read_bytes()).hexdigest()

    result = subprocess.run(
        [*FGPU, "serve", "--socket", str(server.socket), "--state-dir", str(server.state_dir),
         "--simulate-gpus", server.gpus],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert f"the database {database} is damaged" in result.stderr
    assert "fgpu will not serve from it" in result.stderr
    assert ".recover" in result.stderr
    assert "--db" in result.stderr
    assert hashlib.sha256(database.read_bytes()).hexdigest() == before  # nothing written
    server.process = None  # nothing to clean up on the server's side


def test_an_emptied_store_stops_the_workload_it_no_longer_knows_before_serving(
    server: ServerProcess,
) -> None:
    old = server.submit("-g", "1", "--name", "old", "--grace", "1", command=sleeper(300))
    server.wait_phase(old, "running")
    pgid = int(server.handle(old)["pgid"])
    wrapper = int(server.handle(old)["pid"])
    assert server.stop() == 0  # the workload keeps running without the service
    assert alive(pgid)
    database = server.state_dir / "fgpu.db"
    database.write_bytes(b"")  # emptied
    for suffix in ("-wal", "-shm"):
        Path(str(database) + suffix).unlink(missing_ok=True)

    server.start()  # answers only once recovery is done
    assert not alive(pgid), "the unknown workload was stopped before the server answered"
    assert not alive(wrapper)
    assert server.workloads() == {}  # the store started empty
    assert f"workload {old} (pid {wrapper}) still runs but the store knows it not at all" in (
        server.server_log()
    )
    new = server.submit("-g", "1", "--name", "new", "--grace", "1", command=sleeper(300))
    server.wait_phase(new, "running")


def test_an_emptied_store_also_stops_what_left_the_process_group_through_its_cgroup(
    server: ServerProcess,
) -> None:
    """A process that left its workload's process group (``setsid``) is out of reach of the
    wrapper; the workload's cgroup (cgroup v2 freezer) still holds it."""
    child_file = server.root / "child.pid"
    script = (
        'n=0; while ! grep -q "/$FGPU_WORKLOAD_ID-" /proc/self/cgroup; do '
        "n=$((n+1)); [ $n -gt 600 ] && break; sleep 0.05; done; "
        f"setsid sleep 300 & echo $! > {child_file}; sleep 300"
    )
    old = server.submit("-g", "0.5", "--grace", "1", command=["/bin/sh", "-c", script])
    server.wait_phase(old, "running")
    wait_for(child_file.exists, "the workload to start its escaping child", 60)
    child = int(child_file.read_text())
    if f"/{old}-" not in Path(f"/proc/{child}/cgroup").read_text():
        pytest.skip("no cgroup v2 freezer here: nothing holds a process that left its group")
    assert server.stop() == 0
    database = server.state_dir / "fgpu.db"
    database.write_bytes(b"")
    for suffix in ("-wal", "-shm"):
        Path(str(database) + suffix).unlink(missing_ok=True)

    server.start()
    assert not alive(child), "the escaped process was stopped through its cgroup"
    assert "holds processes of a workload this service does not run" in server.server_log()
