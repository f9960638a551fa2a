"""The per-user limit on running workloads, on a real root ``fgpu serve`` with real local
users alice and bob (issue 27, point 3 of the attacker's trial: bob's hundreds of 0.001-GPU
tasks each held a root-owned runner process).

- the machine's ``--max-running-per-user`` keeps bob's extra work pending (accepted, not
  refused) with a reason naming the limit and the flag, while alice's work runs; when one of
  bob's running workloads ends, the next of his pending ones starts;
- a queue's ``--max-running-per-user`` holds a user in that queue below the machine's limit;
- bad values of both flags get errors naming the flag and echoing the value.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.localusers import ALICE, BOB, as_user, ensure_users, uid_of
from tests.serverproc import FGPU, ServerProcess, started_server

LIMIT = 3


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    ensure_users()
    extra = ["--max-running-per-user", str(LIMIT)]
    with started_server("fgpu-runlim-", "1xA100-40GB", for_local_users=True, extra=extra) as s:
        yield s


def submit(server: ServerProcess, user: str, *options: str) -> dict[str, Any]:
    answer = server.cli(
        "submit", "-g", "0.001", "--json", *options, "--", "sleep", "600", user=as_user(user)
    )
    return dict(json.loads(answer.stdout))


def owned(listing: dict[str, dict[str, Any]], user: str) -> list[dict[str, Any]]:
    uid = uid_of(user)
    return [w for w in listing.values() if w["owner_uid"] == uid]


def phases(listing: dict[str, dict[str, Any]], user: str) -> list[str]:
    return sorted(str(w["phase"]) for w in owned(listing, user))


def test_the_machines_running_limit_keeps_a_users_extra_work_pending_with_the_reason(
    server: ServerProcess,
) -> None:
    submit(server, BOB, "--array", "0-7", "--name", "tiny")  # accepted whole: 8 tasks
    settled = server.wait_listing(
        lambda ws: (
            phases(ws, BOB).count("running") == LIMIT
            and all(
                str(w["reason"]).startswith("waits:")
                for w in owned(ws, BOB)
                if w["phase"] == "pending"
            )
        ),
        f"{LIMIT} of bob's tasks running, the rest waiting with a reason",
    )
    bob = owned(settled, BOB)
    assert phases(settled, BOB) == ["pending"] * 5 + ["running"] * LIMIT
    waiting = [w for w in bob if w["phase"] == "pending"]
    for w in waiting:
        assert w["reason"] == (
            f"waits: {BOB} runs {LIMIT} workloads, the most this machine allows a user at "
            f"once (fgpu serve --max-running-per-user {LIMIT})"
        ), w
    # alice is not held by bob's count
    mine = [submit(server, ALICE)["id"] for _ in range(2)]
    for workload_id in mine:
        server.wait_phase(workload_id, "running")
    # more rounds start nothing more of bob's
    listing = server.workloads()
    assert phases(listing, BOB).count("running") == LIMIT
    # one of bob's ends: the next of his pending ones starts, and no more
    running = sorted(w["id"] for w in owned(listing, BOB) if w["phase"] == "running")
    server.cli("cancel", running[0], user=as_user(BOB))
    after = server.wait_listing(
        lambda ws: (
            ws[running[0]]["phase"] == "cancelled" and phases(ws, BOB).count("running") == LIMIT
        ),
        "bob's next task to start in place of the cancelled one",
    )
    assert phases(after, BOB).count("pending") == 4


def test_a_queues_running_limit_holds_its_users_below_the_machines(server: ServerProcess) -> None:
    created = server.json("queue", "create", "team", "--member", "*", "--max-running-per-user", "1")
    assert created["max_running_per_user"] == 1
    first, second = (submit(server, ALICE, "-q", "team") for _ in range(2))
    elsewhere = submit(server, ALICE)  # the default queue: only the machine's limit
    server.wait_phase(first["id"], "running")
    server.wait_phase(elsewhere["id"], "running")
    held = server.wait_listing(
        lambda ws: str(ws[second["id"]]["reason"]).startswith("waits:"),
        "the reason of alice's second in team",
    )[second["id"]]
    assert held["phase"] == "pending"
    assert held["reason"] == (
        f"waits: {ALICE} runs 1 workload in queue team, the most queue team allows a user "
        "at once (max_running_per_user 1; fgpu queue set team --max-running-per-user N)"
    )
    # bob has his own count in the queue
    bobs = submit(server, BOB, "-q", "team")
    server.wait_phase(bobs["id"], "running")
    # an admin lifts the queue's limit: alice's second starts
    server.cli("queue", "set", "team", "--max-running-per-user", "none")
    (team,) = [q for q in server.json("queue", "ls") if q["name"] == "team"]
    assert team["max_running_per_user"] is None
    server.wait_phase(second["id"], "running")


@pytest.mark.parametrize("value", ["0", "many", "-2"])
def test_bad_values_of_the_queue_flag_are_named_and_echoed(
    server: ServerProcess, value: str
) -> None:
    answer = server.cli("queue", "create", "bad", "--max-running-per-user", value, check=False)
    assert answer.returncode != 0
    assert f"--max-running-per-user {value!r}: give a whole number >= 1, or none" in (
        answer.stderr
    ), answer.stderr
    assert "bad" not in [q["name"] for q in server.json("queue", "ls")]


def test_a_bad_machine_limit_is_refused_at_start(tmp_path: Any) -> None:
    answer = subprocess.run(
        [
            *FGPU,
            "serve",
            "--socket",
            str(tmp_path / "s.sock"),
            "--state-dir",
            str(tmp_path / "state"),
            "--simulate-gpus",
            "1xA100-40GB",
            "--max-running-per-user",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert answer.returncode != 0
    assert "--max-running-per-user: 0 must be at least 1" in answer.stderr + answer.stdout
