"""Wait before evict on the real ``fgpu serve`` (issue 28, point 4; rule 10 of
fgpu.sched.decide), driven through the command line: a preemptor below priority ``high``
waits up to a delay (``fgpu serve --preempt-delay``, 5 minutes by default; ``fgpu queue
create|set --preempt-delay`` per queue) for GPUs to free by themselves before it evicts, and
its pending reason says how long it has waited and when it may preempt. Nothing here sleeps
for a fixed time: each test waits for what the server says (a reason, an event, a phase).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serverproc import TIMEOUT_S, ServerProcess, sleeper, wait_for

GRACE = ("--grace", "1")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server with the service's default delay (no ``--preempt-delay``)."""
    srv = ServerProcess(tmp_path_factory.mktemp("delay"), "1xA100-40GB", preempt_delay=None)
    srv.start()
    try:
        yield srv
    finally:
        srv.cleanup()


@pytest.fixture
def fresh(server: ServerProcess) -> Iterator[ServerProcess]:
    """The server, its GPU free again after the test."""
    yield server
    for wid, view in server.workloads(all_=False).items():
        if view["phase"] in ("pending", "running", "paused"):
            server.cli("cancel", wid, check=False)
    wait_for(lambda: not server.workloads(all_=False), "the test's workloads to end")


def queue(server: ServerProcess, name: str) -> dict[str, Any]:
    (found,) = [q for q in server.json("queue", "ls") if q["name"] == name]
    return dict(found)


def queue_row(server: ServerProcess, name: str) -> str:
    table = server.cli("queue", "ls", env_extra={"COLUMNS": "250"}).stdout
    assert "PREEMPT DELAY" in table.splitlines()[0], table
    (row,) = [line for line in table.splitlines() if line.split()[0] == name]
    return row


def reason_with(server: ServerProcess, wid: str, words: str) -> str:
    """Wait until ``wid``'s pending reason holds ``words``; the reason."""
    seen: dict[str, Any] = {}

    def check() -> bool:
        seen.update(server.describe(wid))
        return words in seen["reason"]

    wait_for(check, f"{wid}'s reason to say {words!r}")
    return str(seen["reason"])


def events(server: ServerProcess, wid: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in server.describe(wid)["events"] if e["kind"] == kind]


def test_the_service_waits_five_minutes_by_default_and_says_so(fresh: ServerProcess) -> None:
    server = fresh
    default = queue(server, "default")
    assert (default["preempt_delay_s"], default["effective_preempt_delay_s"]) == (None, 300.0)
    assert "5m (service)" in queue_row(server, "default")

    low = server.submit("-p", "low", "-g", "1", *GRACE, command=sleeper(600))
    server.wait_phase(low, "running")
    new = server.submit("-p", "normal", "-g", "1", *GRACE, command=sleeper(600))
    reason = reason_with(server, new, "before it looks for work to preempt")
    assert re.search(r"\(waited \d+ s of 300 s; looks in \d+ s\)$", reason), reason
    waited = int(re.findall(r"waited (\d+) s", reason)[0])
    assert f"looks in {300 - waited} s" in reason, reason
    # the low one runs on; nobody was told to stop
    low_now = server.describe(low)
    assert (low_now["phase"], low_now["restarts"]) == ("running", 0)
    assert events(server, low, "stopping") == []
    # critical work does not wait (priority 100 and up preempt at once)
    crit = server.submit("-p", "critical", "-g", "1", *GRACE, command=sleeper(600))
    server.wait_phase(crit, "running")
    assert server.describe(low)["restarts"] == 1


def test_a_queue_with_a_short_delay_evicts_once_it_has_passed(fresh: ServerProcess) -> None:
    server = fresh
    server.cli("queue", "create", "short", "--quota", "1", "--preempt-delay", "2s")
    assert queue(server, "short")["effective_preempt_delay_s"] == 2.0
    assert queue_row(server, "short").split()[-1] == "2s"

    low = server.submit("-q", "short", "-p", "low", "-g", "1", *GRACE, command=sleeper(600))
    server.wait_phase(low, "running")
    new = server.submit("-q", "short", "-p", "normal", "-g", "1", *GRACE, command=sleeper(600))
    submitted = server.describe(new)["submitted_at"]
    wait_for(lambda: bool(events(server, low, "stopping")), "the low workload told to stop")
    (stopping,) = events(server, low, "stopping")
    assert f"({new})" in stopping["reason"], stopping  # named as ls names it: NAME (ID)
    assert stopping["time"] >= submitted + 2.0, (stopping, submitted)  # not before the delay
    server.wait_phase(new, "running", timeout_s=TIMEOUT_S)
    assert server.describe(low)["restarts"] == 1
    server.cli("cancel", low, new)
    wait_for(lambda: not server.workloads(all_=False), "the workloads to end")
    server.cli("queue", "rm", "short")


def test_capacity_that_frees_during_the_wait_goes_to_the_preemptor(
    fresh: ServerProcess,
) -> None:
    server = fresh
    server.cli("queue", "create", "patient", "--quota", "1", "--preempt-delay", "1h")
    low = server.submit("-q", "patient", "-p", "low", "-g", "1", *GRACE, command=sleeper(600))
    server.wait_phase(low, "running")
    new = server.submit("-q", "patient", "-p", "normal", "-g", "1", command=sleeper(600))
    assert "of 3600 s; looks in" in reason_with(server, new, "before it looks for work to preempt")
    later = server.submit("-q", "patient", "-p", "low", "-g", "1", command=sleeper(600))
    server.wait_phase(later, "pending")
    server.cli("cancel", low)  # the GPU frees by itself
    server.wait_phase(new, "running")
    assert server.phase(later) == "pending"
    ended = server.wait_phase(low, "cancelled")
    assert ended["restarts"] == 0
    server.cli("cancel", new, later)
    wait_for(lambda: not server.workloads(all_=False), "the workloads to end")
    server.cli("queue", "rm", "patient")


def test_a_queue_delay_is_set_reset_and_refused_when_malformed(fresh: ServerProcess) -> None:
    server = fresh
    server.cli("queue", "create", "tuned", "--preempt-delay", "90")
    assert queue(server, "tuned")["preempt_delay_s"] == 90.0
    server.cli("queue", "set", "tuned", "--preempt-delay", "5m")
    assert queue(server, "tuned")["preempt_delay_s"] == 300.0
    server.cli("queue", "set", "tuned", "--priority", "3")  # other changes keep it
    assert queue(server, "tuned")["preempt_delay_s"] == 300.0
    server.cli("queue", "set", "tuned", "--preempt-delay", "default")
    tuned = queue(server, "tuned")
    assert (tuned["preempt_delay_s"], tuned["effective_preempt_delay_s"]) == (None, 300.0)
    for command, value, why in (
        ("create", "5x", "not a duration"),
        ("create", "-1", "a duration must not be negative"),
        ("set", "soon", "not a duration"),
        ("set", "2000000000", "must be at most"),
    ):
        name = "bad" if command == "create" else "tuned"
        result = server.cli("queue", command, name, "--preempt-delay", value, check=False)
        assert result.returncode == 2, result
        assert f"--preempt-delay {value!r}: {why}" in result.stderr, result.stderr
    assert "bad" not in {q["name"] for q in server.json("queue", "ls")}
    assert queue(server, "tuned")["preempt_delay_s"] is None
    server.cli("queue", "rm", "tuned")


def test_serve_refuses_a_malformed_delay(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fgpu.cli import app

    sock = tmp_path / "run" / "fgpu.sock"
    state = ["--state-dir", str(tmp_path / "s")]
    for value, why in (("soon", "not a duration"), ("-5m", "a duration must not be negative")):
        result = CliRunner().invoke(
            app, ["serve", "--socket", str(sock), *state, f"--preempt-delay={value}"]
        )
        assert result.exit_code == 2, result.output
        assert f"--preempt-delay {value!r}: {why}" in result.stderr
        assert not sock.exists()
