"""A full state disk tells the truth (issue 27, point 3).

A real ``fgpu serve`` (SQLite store) whose state folder is a small tmpfs mounted for the test
(root only; unmounted after). With a workload running, the database's write-ahead log is
emptied (``wal_checkpoint(TRUNCATE)``, so every new write needs new space) and the disk is
filled with a real file. Then:

- ``/v1/healthz`` and ``/v1/readyz`` answer 503 and a submission 507, each with the cause;
- the workload exits: the wrapper still records its exit (in the space it prepared at start),
  the store cannot take it, the service keeps it (and says so in its log), and a cancel gets
  507 with the cause;
- once the disk has room again, the kept end is written without a restart (the workload ends
  ``succeeded``, exit code 0), and health and submissions come back.

These servers run without the ballast (``--disk-ballast 0``), the last resort when even that
was used: with it, cancels and ends are written at once (``test_disk_room.py``). Their
output reserve (``--log-disk-reserve 1MiB``) fits the small disk.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fgpu.client.transport import Answer, unix_exchange
from fgpu.log_files import stream_text
from tests.serverproc import ServerProcess, wait_for

DEADLINE_S = 60.0


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A temporary folder whose ``state`` subfolder is a 16 MiB tmpfs."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    root = Path(tempfile.mkdtemp(prefix="fgpu-diskfull-", dir="/tmp"))
    state = root / "state"
    state.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(state)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def server(small_disk: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        small_disk, "1xA100-40GB", ["--disk-ballast", "0", "--log-disk-reserve", "1MiB"]
    )
    proc.start()
    try:
        yield proc
    finally:
        (proc.state_dir / "filler").unlink(missing_ok=True)
        proc.cleanup()


def call(server: ServerProcess, method: str, path: str, body: Any = None) -> Answer:
    return unix_exchange(str(server.socket), 30, method, "/v1" + path, {}, body)


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until its disk refuses more (ENOSPC)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 12):
            block = b"x" * size
            while True:
                try:
                    os.write(fd, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler


def empty_wal(database: Path) -> None:
    """Checkpoint the write-ahead log and truncate it to nothing (waits out readers)."""
    with sqlite3.connect(database, timeout=30) as connection:
        wait_for(
            lambda: connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0,
            "the WAL checkpoint",
        )
    assert (database.parent / (database.name + "-wal")).stat().st_size == 0


def test_a_full_state_disk_is_told_and_a_kept_exit_is_written_when_room_returns(
    server: ServerProcess,
) -> None:
    flag = server.root / "go"
    program = f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.05)\n"
    job = server.submit("-g", "0.5", "--name", "job", command=[sys.executable, "-c", program])
    server.wait_phase(job, "running")
    assert call(server, "GET", "/healthz").status_code == 200

    empty_wal(server.state_dir / "fgpu.db")
    filler = fill(server.state_dir)

    for path in ("/healthz", "/readyz"):
        answer = call(server, "GET", path)
        assert answer.status_code == 503, (path, answer.text)
        detail = answer.json()["detail"]
        assert detail["field"] == "store"
        assert "KiB free" in detail["reason"]
        assert str(server.state_dir) in detail["reason"]
    refused = call(server, "POST", "/workloads", {"command": ["true"], "gpu": "0.1"})
    assert refused.status_code == 507, refused.text
    assert refused.json()["detail"]["field"] == "store"
    assert "KiB free" in refused.json()["detail"]["reason"]

    flag.touch()  # the workload ends while nothing can be written
    exit_file = server.state_dir / "logs" / job / "exit.json"
    wait_for(exit_file.exists, "the wrapper's exit record", DEADLINE_S)
    assert json.loads(exit_file.read_text())["code"] == 0
    wait_for(
        lambda: (
            f"the end of workload {job} (exit code 0) could not be recorded"
            in (server.server_log())
        ),
        "the service to keep the end it could not record",
        DEADLINE_S,
    )
    assert server.phase(job) == "running"  # the store has not taken the end yet
    cancel = call(server, "POST", f"/workloads/{job}/cancel")
    assert cancel.status_code == 507, cancel.text
    assert cancel.json()["detail"]["field"] == "store"
    assert "database or disk is full" in cancel.json()["detail"]["reason"]

    filler.unlink()  # room again: the kept end is written, no restart needed
    done = server.wait_phase(job, "succeeded", timeout_s=DEADLINE_S)
    assert done["exit_code"] == 0
    wait_for(lambda: call(server, "GET", "/healthz").status_code == 200, "health back")
    assert call(server, "GET", "/readyz").json() == {"ready": True}
    again = call(server, "POST", "/workloads", {"command": ["true"], "gpu": "0.1"})
    assert again.status_code == 201, again.text


def test_a_cancel_under_way_completes_when_its_end_could_not_be_recorded_at_once(
    server: ServerProcess,
) -> None:
    """The cancel is recorded (the workload is stopping, it takes its time to end); the disk
    fills; the workload ends. The end is kept, and once there is room the cancel completes."""
    flag = server.root / "go"
    program = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: None)  # ends in its own time\n"
        "print('ready', flush=True)\n"
        f"while not os.path.exists({str(flag)!r}):\n"
        "    time.sleep(0.05)\n"
    )
    job = server.submit("-g", "0.5", "--grace", "300", command=[sys.executable, "-c", program])
    server.wait_phase(job, "running")
    wait_for(
        lambda: "ready" in stream_text(server.state_dir / "logs" / job / "stdout.log"),
        "the workload to handle SIGTERM",
    )
    cancel = call(server, "POST", f"/workloads/{job}/cancel")
    assert cancel.status_code == 200, cancel.text
    wait_for(lambda: server.describe(job)["reason"].startswith("cancelled"), "the stop recorded")

    empty_wal(server.state_dir / "fgpu.db")
    filler = fill(server.state_dir)
    flag.touch()
    wait_for(
        lambda: (
            f"the end of workload {job} (exit code 0) could not be recorded"
            in (server.server_log())
        ),
        "the service to keep the end it could not record",
        DEADLINE_S,
    )
    assert server.phase(job) == "running"

    filler.unlink()
    server.wait_phase(job, "cancelled", timeout_s=DEADLINE_S)
