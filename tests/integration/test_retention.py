"""Retention (issue 27, point 2): finished workloads, their events and log folders are
deleted after ``fgpu serve --retention``, in the background, a bounded batch at a time;
active work and young finished work stay. Bad retention flags are refused at start, naming
the flag and echoing the value; ``--help`` states the defaults."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from fgpu.server.retention import Pruner, RetentionPolicy, parse_duration
from fgpu.store import Store
from tests.serverproc import FGPU, started_server, wait_for
from tests.unit.test_store_support import Counter, allocation_for, half_gpu


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_pass_deletes_old_finished_work_with_its_logs_in_batches(tmp_path: Path) -> None:
    clock = Clock()
    store = Store.open(tmp_path / "fgpu.db", clock=clock, new_id=Counter("w"))
    from fgpu.store.records import QueueConfig

    store.create_queue(QueueConfig("default", members=("*",)))
    logs = tmp_path / "logs"
    old = []
    for _ in range(450):  # more than two batches
        record = store.submit(owner_uid=1000, queue="default", request=half_gpu(), argv=["true"])
        store.mark_running(record.id, allocation_for(record.request))
        store.mark_finished(record.id, "succeeded", exit_code=0)
        (logs / record.id).mkdir(parents=True)
        (logs / record.id / "stdout.log").write_text("out\n")
        old.append(record.id)
    clock.now += 3600
    young = store.submit(owner_uid=1000, queue="default", request=half_gpu(), argv=["true"])
    (logs / young.id).mkdir(parents=True)
    pruner = Pruner(store.prune, logs, clock, retention_s=1800)
    batches = []
    real_batch = pruner.batch

    def counted() -> object:
        done = real_batch()
        batches.append(len(done.workload_ids))
        return done

    pruner.batch = counted  # type: ignore[method-assign]
    deleted = asyncio.run(pruner.pass_once())
    assert deleted == 450
    assert max(batches) <= 200  # bounded: PRUNE_BATCH workloads a transaction
    assert len(batches) >= 3
    assert [r.id for r in store.list_workloads()] == [young.id]
    assert sorted(p.name for p in logs.iterdir()) == [young.id]
    assert pruner.workloads == 450
    assert pruner.events >= 450 * 3
    store.close()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 7 * 86400.0), ("12h", 43200.0), ("30m", 1800.0), ("90s", 90.0), ("2w", 1209600.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration("--retention", text) == seconds


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--retention", "forever", "--retention: 'forever' is not a duration"),
        ("--retention", "0d", "--retention: '0d' must be longer than 0"),
        ("--retention", "-1d", "--retention: '-1d' is not a duration"),
        ("--event-interval", "2days", "--event-interval: '2days' is not a duration"),
        ("--event-interval", "2d", "--event-interval: 172800.0 must be between 0 and 86400"),
        ("--max-stored-bytes", "lots", "--max-stored-bytes: 'lots'"),
        ("--max-stored-bytes", "1KiB", "--max-stored-bytes: 1024 must be at least"),
    ],
)
def test_bad_retention_flags_are_refused_at_start(
    flag: str, value: str, says: str, tmp_path: Path
) -> None:
    run = subprocess.run(
        [
            *FGPU,
            "serve",
            "--socket",
            str(tmp_path / "s.sock"),
            "--state-dir",
            str(tmp_path),
            "--simulate-gpus",
            "1xA100-40GB",
            flag,
            value,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert says in run.stderr, run.stderr


def test_the_help_states_the_defaults() -> None:
    run = subprocess.run(
        [*FGPU, "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    text = " ".join(run.stdout.split())
    for flag, default in (
        ("--retention", "7d"),
        ("--event-interval", "60s"),
        ("--max-stored-bytes", "256MiB"),
        ("--max-log-bytes", "64MiB"),
    ):
        assert flag in text, flag
        assert f"[default: {default}]" in text, (flag, default)


def test_the_service_prunes_finished_work_in_the_background(tmp_path: Path) -> None:
    with started_server("fgpu-keep-", "1xA100-40GB", extra=["--retention", "3s"]) as server:
        done = server.submit("--gpu", "0.1", command=["true"])
        kept = server.submit("--gpu", "0.1", command=["sleep", "600"])
        server.wait_phase(done, "succeeded")
        folder = server.state_dir / "logs" / done
        assert folder.exists()
        wait_for(lambda: done not in server.workloads(), f"{done} to be pruned", 60)
        assert not folder.exists()
        assert kept in server.workloads()  # active work is never pruned
        assert "retention: deleted 1 finished workload(s)" in server.server_log()
        events = server.describe(kept)["events"]
        assert [e["kind"] for e in events][:1] == ["submitted"]


def test_a_default_policy_is_a_week_and_a_minute() -> None:
    policy = RetentionPolicy()
    policy.check()
    assert (policy.retention_s, policy.event_interval_s) == (7 * 86400.0, 60.0)
