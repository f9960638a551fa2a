"""``fgpu cancel --now`` (trial finding: work that ignores SIGTERM under a long ``--grace``
held its GPU share for up to an hour, and nobody could end it sooner): on a real ``fgpu
serve`` with real local users, bob's workload that ignores SIGTERM stays stopping after a
plain cancel; alice may not kill it; bob's, or root's, ``--now`` kills it at once and it ends
cancelled, its GPU free for the next workload.
"""

from __future__ import annotations

import json
import os

from tests.localusers import ALICE, BOB, as_user, ensure_users
from tests.serverproc import started_server, wait_for

STUBBORN = ["/bin/sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie until its parent reaps it
        return not stat.read().split(") ")[1].startswith("Z")


def test_cancel_now_kills_work_that_ignores_sigterm() -> None:
    ensure_users()
    with started_server("fgpu-now-", "1xA100-40GB", for_local_users=True) as s:
        bob, alice = as_user(BOB), as_user(ALICE)
        submitted = s.cli(
            "submit", "-g", "1", "--grace", "3600", "--json", "--", *STUBBORN, user=bob
        )
        wid = str(json.loads(submitted.stdout)["id"])
        s.wait_phase(wid, "running")
        wait_for(lambda: "ready" in s.cli("logs", wid, user=bob, check=False).stdout, "ready")
        pid = int(s.handle(wid)["pgid"])

        s.cli("cancel", wid, user=bob)  # SIGTERM, ignored: it keeps running, stopping
        assert s.phase(wid) == "running"
        assert alive(pid)
        refused = s.cli("cancel", wid, "--now", user=alice, check=False)
        assert refused.returncode != 0
        assert "may not cancel" in refused.stderr, refused.stderr
        assert alive(pid)

        s.cli("cancel", wid, "--now", user=bob)
        s.wait_phase(wid, "cancelled")
        wait_for(lambda: not alive(pid), "the workload's process to be killed")
        nxt = s.submit("-g", "1", command=["true"])  # its GPU is free again
        s.wait_phase(nxt, "succeeded")


def test_root_cancels_another_users_stubborn_array_now() -> None:
    ensure_users()
    with started_server("fgpu-now-root-", "1xA100-40GB", for_local_users=True) as s:
        bob = as_user(BOB)
        s.cli(
            "submit", "-g", "0.5", "--grace", "3600", "--array", "0-1", "--name", "stub",
            "--", *STUBBORN, user=bob,
        )  # fmt: skip
        tasks = [w["id"] for w in s.workloads().values() if w["name"].startswith("stub")]
        assert len(tasks) == 2
        for wid in tasks:
            s.wait_phase(wid, "running")
        pids = [int(s.handle(wid)["pgid"]) for wid in tasks]
        s.cli("cancel", "stub", "--now")  # root, by the name of bob's array
        for wid in tasks:
            s.wait_phase(wid, "cancelled")
        wait_for(lambda: not any(alive(p) for p in pids), "both tasks killed")
