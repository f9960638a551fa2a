"""One damaged row of the store costs only itself (issue 27, trial finding): on a real
``fgpu serve`` with real local users, bob's workload rows are damaged while the server is
down (a JSON column that does not parse on SQLite; JSON of the wrong shape on PostgreSQL,
whose ``json`` type checks the syntax only). Then alice's ``fgpu ls --all-users`` still
answers, leaving them out with a warning naming their ids; a lookup by name or id says the
row is damaged and names the id (409, not 500); the server logs each once; bob cannot cancel
it; root's ``fgpu cancel ID`` ends it, and it lists again as cancelled.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import subprocess
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from tests.localusers import ALICE, BOB, as_user, ensure_users
from tests.serverproc import ServerProcess, started_server, wait_for

SERVER = os.environ.get("FGPU_TEST_POSTGRES_URL", "")


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> Iterator[str]:
    """``--db`` for the server ("" : the SQLite file in its state folder)."""
    if request.param == "sqlite":
        yield ""
        return
    if not SERVER:
        pytest.skip("FGPU_TEST_POSTGRES_URL is not set")
    from fgpu.store import database_url

    server = database_url(SERVER)
    name = f"fgpu_test_{secrets.token_hex(4)}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.dispose()


def damage(server: ServerProcess, db: str, workload_ids: list[str]) -> None:
    """Damage the rows while the server is stopped."""
    if not db:
        with sqlite3.connect(server.state_dir / "fgpu.db") as connection:
            for workload_id in workload_ids:
                connection.execute(
                    "UPDATE workloads SET argv = 'not json{' WHERE id = ?", (workload_id,)
                )
        return
    engine = create_engine(db)
    with engine.begin() as connection:
        for workload_id in workload_ids:
            connection.execute(
                text("""UPDATE workloads SET argv = '{"a": 1}' WHERE id = :id"""),
                {"id": workload_id},
            )
    engine.dispose()


def gone(pid: int) -> bool:
    """The process has ended (a zombie until its parent reaps it counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1].startswith("Z")


def run(server: ServerProcess, user: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    return server.cli(*args, user=as_user(user) if user else (), check=False)


def test_a_damaged_row_is_left_out_named_and_ended_by_root(database: str) -> None:
    ensure_users()
    extra = ["--db", database] if database else []
    with started_server("fgpu-damaged-", "1xA100-40GB", for_local_users=True, extra=extra) as s:
        holder = s.cli("submit", "--gpu", "1", "--json", "--", "sleep", "600", user=as_user(ALICE))
        s.wait_phase(json.loads(holder.stdout)["id"], "running")
        waiting = json.loads(
            s.cli(
                "submit", "--gpu", "0.5", "--name", "bobwait", "--json", "--", "sleep", "600",
                user=as_user(BOB),
            ).stdout
        )["id"]  # fmt: skip
        done = json.loads(
            s.cli(
                "submit", "--gpu", "0.5", "--name", "bobdone", "--json", "--", "sleep", "600",
                user=as_user(BOB),
            ).stdout
        )["id"]  # fmt: skip
        s.cli("cancel", done, user=as_user(BOB))
        assert s.stop() == 0
        damage(s, database, [waiting, done])
        s.start()

        # alice's listings answer, leaving both out with one warning line naming them
        for args in (("ls", "--all-users", "--all"), ("ls", "--all-users", "--all", "--json")):
            listed = run(s, ALICE, *args)
            assert listed.returncode == 0, listed.stderr
            assert "internal error" not in listed.stderr
            warning = [line for line in listed.stderr.splitlines() if "damaged" in line]
            assert len(warning) == 1, listed.stderr
            assert "2 damaged row(s)" in warning[0], warning
            assert waiting in warning[0], warning
            assert done in warning[0], warning
            assert waiting not in listed.stdout
            assert done not in listed.stdout
        active = run(s, ALICE, "ls", "--all-users", "--json")
        assert active.returncode == 0, active.stderr
        assert waiting in active.stderr
        assert done not in active.stderr

        # lookups by name and by id: the id and the damage named, not a 500
        for ref in ("bobwait", waiting):
            for args in (("describe", ref), ("cancel", ref)):
                for user in (ALICE, BOB):
                    looked = run(s, user, *args)
                    assert looked.returncode != 0, looked.stdout
                    assert "internal error" not in looked.stderr, looked.stderr
                    assert waiting in looked.stderr, looked.stderr
                    assert "damaged" in looked.stderr, looked.stderr
                    assert "argv" in looked.stderr, looked.stderr
                    assert f"fgpu cancel {waiting}" in looked.stderr, looked.stderr

        # the server logged each damaged row once, however often it was read
        log = s.server_log()
        assert log.count(f"workload {waiting}: its stored row is damaged") == 1, log
        assert log.count(f"workload {done}: its stored row is damaged") == 1, log

        # root ends them; they list again, cancelled, with the damage in the reason
        for workload_id in (waiting, done):
            ended = run(s, None, "cancel", workload_id, "--json")
            assert ended.returncode == 0, ended.stderr
            assert json.loads(ended.stdout)["phase"] == "cancelled"
        listed = run(s, ALICE, "ls", "--all-users", "--all", "--json")
        assert listed.returncode == 0, listed.stderr
        assert "damaged row(s)" not in listed.stderr, listed.stderr
        rows = {w["id"]: w for w in json.loads(listed.stdout)}
        assert rows[waiting]["phase"] == rows[done]["phase"] == "cancelled"
        assert "damaged row ended by root" in rows[waiting]["reason"]
        assert "argv" in rows[waiting]["reason"]


def test_a_damaged_running_row_does_not_stop_the_start_and_its_process_is_stopped() -> None:
    with started_server("fgpu-damaged-run-", "1xA100-40GB") as s:
        running = s.submit("--gpu", "1", command=["sleep", "600"])
        s.wait_phase(running, "running")
        handle = s.state_dir / "logs" / running / "handle.json"
        wait_for(handle.is_file, "its handle")
        pid = int(s.handle(running)["pid"])
        assert s.stop() == 0  # workloads outlive the server
        os.kill(pid, 0)
        damage(s, "", [running])
        s.start()  # the start reads every running row: this one skipped, not fatal

        wait_for(lambda: gone(pid), "the damaged row's process to be stopped")
        listed = run(s, None, "ls", "--all-users")
        assert listed.returncode == 0, listed.stderr
        assert running in listed.stderr, listed.stderr
        ended = run(s, None, "cancel", running, "--json")
        assert ended.returncode == 0, ended.stderr
        assert json.loads(ended.stdout)["phase"] == "cancelled"
        assert s.phase(running) == "cancelled"


def test_roots_cancel_of_a_row_damaged_while_it_runs_stops_its_process() -> None:
    """The row of a running workload is damaged while the server runs (trial finding: the
    admin's cancel ended the row, then failed with a 500 and left the process running)."""
    with started_server("fgpu-damaged-live-", "1xA100-40GB") as s:
        running = s.submit("--gpu", "1", command=["sleep", "600"])
        s.wait_phase(running, "running")
        wait_for((s.state_dir / "logs" / running / "handle.json").is_file, "its handle")
        pid = int(s.handle(running)["pid"])
        damage(s, "", [running])  # SQLite in WAL mode takes the write beside the server
        ended = run(s, None, "cancel", running, "--json")
        assert ended.returncode == 0, ended.stderr
        assert json.loads(ended.stdout)["phase"] == "cancelled"

        wait_for(lambda: gone(pid), "the cancelled workload's process to end")
        assert s.phase(running) == "cancelled"
        assert "Traceback" not in s.server_log()
