"""The per-user running limits before a round (:func:`fgpu.server.quotas.running_gate`):
which pending workloads a round leaves out, in what order the room goes, and the words of
the reason."""

from __future__ import annotations

import os

from fgpu.model.types import Request
from fgpu.server.quotas import running_gate
from fgpu.store.records import QueueConfig, WorkloadRecord
from fgpu.users import user_text

ME = os.getuid()
OTHER = 4_000_123  # no user entry: named "uid 4000123"


def record(
    wid: str,
    phase: str = "pending",
    *,
    owner: int = ME,
    queue: str = "default",
    priority: int = 50,
    at: float = 0.0,
) -> WorkloadRecord:
    return WorkloadRecord(
        id=wid,
        name=wid,
        owner_uid=owner,
        queue=queue,
        phase=phase,
        priority=priority,
        preemptible=None,
        request=Request(gpu_count=1, gpu_milli=1),
        argv=("true",),
        shell=False,
        cwd="/",
        env={},
        grace_s=1.0,
        submitted_at=at,
        started_at=None,
        finished_at=None,
        exit_code=None,
        reason="",
        restarts=0,
        stop_requested_at=None,
        cancelled_by=None,
        pid=None,
        create_time=None,
        stdout_path=None,
        stderr_path=None,
        allocation=None,
    )


def test_the_room_goes_by_priority_then_submission_and_the_rest_wait_naming_the_flag() -> None:
    running = [record("r1", "running"), record("r2", "paused")]
    pending = [
        record("late", at=5.0),
        record("early", at=1.0),
        record("urgent", priority=100, at=9.0),
        record("last", at=7.0),
    ]
    reasons = running_gate(running, pending, {}, machine_cap=4)
    assert set(reasons) == {"late", "last"}  # room for 2: urgent, then early
    assert reasons["late"] == (
        f"waits: {user_text(ME)} runs 4 workloads, the most this machine allows a user at "
        "once (fgpu serve --max-running-per-user 4)"
    )


def test_users_are_counted_apart_and_nothing_binds_under_the_limit() -> None:
    running = [record("mine", "running"), record("theirs", "running", owner=OTHER)]
    pending = [record("a", owner=OTHER), record("b")]
    assert running_gate(running, pending, {}, machine_cap=2) == {}
    reasons = running_gate(running, pending, {}, machine_cap=1)
    assert set(reasons) == {"a", "b"}
    assert reasons["a"].startswith("waits: uid 4000123 runs 1 workload")


def test_a_queues_limit_binds_in_that_queue_only() -> None:
    queues = {"team": QueueConfig("team", max_running_per_user=1)}
    running = [record("t1", "running", queue="team")]
    pending = [record("t2", queue="team"), record("d1"), record("d2")]
    reasons = running_gate(running, pending, queues, machine_cap=64)
    assert reasons == {
        "t2": f"waits: {user_text(ME)} runs 1 workload in queue team, the most queue team "
        "allows a user at once (max_running_per_user 1; fgpu queue set team "
        "--max-running-per-user N)"
    }


def test_the_machines_limit_counts_every_queue() -> None:
    queues = {"team": QueueConfig("team", max_running_per_user=5)}
    running = [record("t1", "running", queue="team"), record("d1", "running")]
    pending = [record("t2", queue="team", at=1.0), record("d2", at=2.0)]
    reasons = running_gate(running, pending, queues, machine_cap=3)
    assert set(reasons) == {"d2"}
    assert "fgpu serve --max-running-per-user 3" in reasons["d2"]
