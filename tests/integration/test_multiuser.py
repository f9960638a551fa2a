"""A fresh-user trial, end to end (issue 14, "Done when"): the real ``fgpu serve`` as root,
and two real local users, alice and bob, each driving it only through the ``fgpu`` command
line as themselves (``setpriv --reuid``). Bob finds no way to preempt, cancel, or spend the
quota of alice's work; the admin (root) grants more through ``fgpu queue set``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.localusers import ALICE, BOB, as_user, ensure_users, uid_of
from tests.serverproc import ServerProcess, started_server

GRACE = ("--grace", "1")
SLEEP = ("/bin/sleep", "300")
"""The users' workloads: a system binary (this venv's Python may sit in a folder closed to
them)."""


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    ensure_users()
    with started_server("fgpu-users-", "2xA100-40GB", for_local_users=True) as proc:
        yield proc


def refused(server: ServerProcess, user: str, *args: str) -> str:
    """Run ``fgpu ARGS`` as ``user``; it must be refused (exit 1); its stderr."""
    result = server.cli(*args, user=as_user(user), check=False)
    assert result.returncode == 1, (args, result.stdout, result.stderr)
    return result.stderr


def running_pids(server: ServerProcess, ids: list[str]) -> dict[str, int]:
    """The pids of the workloads' commands (the process group leaders the wrapper started)."""
    return {i: int(server.handle(i)["pgid"]) for i in ids}


def test_bob_can_neither_preempt_nor_cancel_alices_work_nor_spend_her_queue(
    server: ServerProcess,
) -> None:
    alice, bob = as_user(ALICE), as_user(BOB)
    server.cli("queue", "create", "team-a", "--quota", "1", "--member", ALICE)
    ids = [
        server.cli("submit", "-g", "1", *GRACE, "--json", "--", *SLEEP, user=alice).stdout
        for _ in range(2)
    ]
    ids = [json.loads(out)["id"] for out in ids]
    for workload in ids:
        server.wait_phase(workload, "running")
    pids = running_pids(server, ids)
    assert {psutil.Process(p).uids().real for p in pids.values()} == {uid_of(ALICE)}
    before = server.workloads()

    # priority above normal, and non-preemptible work, are not bob's to ask for
    stderr = refused(server, BOB, "submit", "-p", "critical", "-g", "1", "--", "true")
    assert stderr.startswith("error: -p: priority critical (125) is above"), stderr
    stderr = refused(server, BOB, "submit", "-p", "1000", "-g", "1", "--", "true")
    assert "rule: users who are not admins submit up to" in stderr, stderr
    stderr = refused(server, BOB, "submit", "--non-preemptible", "-g", "1", "--", "true")
    assert stderr.startswith("error: --non-preemptible: non-preemptible work"), stderr
    # alice's queue is not his to spend, nor to change
    stderr = refused(server, BOB, "submit", "-q", "team-a", "-g", "1", "--", "true")
    assert stderr.startswith(f"error: -q: uid {uid_of(BOB)} ({BOB}) is not a member"), stderr
    stderr = refused(server, BOB, "queue", "set", "team-a", "--add-member", BOB)
    assert "may not manage queues" in stderr, stderr
    # her work is not his to cancel
    stderr = refused(server, BOB, "cancel", ids[0])
    assert "may not cancel" in stderr, stderr
    # all of her work: refused once, up front, not once per workload
    stderr = refused(server, BOB, "cancel", "--all", "-u", ALICE)
    assert stderr == f"error: --user '{ALICE}': only admins may cancel another user's work\n"
    assert server.workloads() == before
    assert running_pids(server, ids) == pids

    # what bob may submit waits behind alice's equal-priority work instead of evicting it
    mine = server.cli("submit", "-g", "1", *GRACE, "--json", "--", *SLEEP, user=bob)
    waiting = json.loads(mine.stdout)
    assert waiting["phase"] == "pending"
    assert server.wait_phase(waiting["id"], "pending")["reason"]
    listing = server.workloads()
    assert [listing[i]["phase"] for i in ids] == ["running", "running"]
    assert running_pids(server, ids) == pids

    # alice, a member, spends team-a; root sees members in the listing
    in_team = server.cli("submit", "-q", "team-a", "-g", "0.5", "--json", "--", "true", user=alice)
    assert json.loads(in_team.stdout)["queue"] == "team-a"
    queues: dict[str, Any] = {q["name"]: q for q in server.json("queue", "ls")}
    assert queues["team-a"]["members"] == [ALICE]
    assert queues["default"]["members"] == ["*"]


def test_an_admin_grants_a_queue_priority_and_edits_its_members(server: ServerProcess) -> None:
    server.cli(
        "queue",
        "create",
        "serving",
        "--member",
        ALICE,
        "--max-priority",
        "critical",
        "--nonpreemptible",
        "--quota",  # non-preemptible work starts only within the queue's quota
        "1",
    )
    server.cli("queue", "set", "serving", "--add-member", BOB)
    (serving,) = [q for q in server.json("queue", "ls") if q["name"] == "serving"]
    assert (serving["members"], serving["max_priority"], serving["nonpreemptible"]) == (
        [ALICE, BOB],
        125,
        True,
    )
    out = server.cli(
        "submit",
        "-q",
        "serving",
        "-p",
        "critical",
        "-g",
        "0.5",
        "--json",
        "--",
        "true",
        user=as_user(BOB),
    ).stdout
    assert (json.loads(out)["priority"], json.loads(out)["preemptible"]) == (125, False)
    server.cli("queue", "set", "serving", "--remove-member", BOB)
    stderr = refused(server, BOB, "submit", "-q", "serving", "-g", "0.5", "--", "true")
    assert "is not a member of queue serving" in stderr, stderr
    # the default queue's membership is the admin's to narrow
    server.cli("queue", "set", "default", "--member", ALICE)
    stderr = refused(server, BOB, "submit", "-g", "0.5", "--", "true")
    assert "is not a member of queue default" in stderr, stderr
    typo = server.cli("queue", "set", "default", "--remove-member", "nobody-here", check=False)
    assert typo.returncode == 2
    assert "nobody-here not listed" in typo.stderr
