"""The single-machine service in-process: real SQLite store, real processes, simulated GPUs.

The three situations fgpu exists for (issue "Single-machine GPU sharing service"), plus
restart recovery. The HTTP API and the CLI on top are tested in test_api*/test_cli_service*.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from fgpu.log_files import stream_text
from fgpu.rules.errors import BadRequest, Forbidden
from fgpu.server.service import Caller, Service
from fgpu.users import user_text
from fgpu.wire import QueueBody, SubmitRequest, WorkloadView

ME = Caller(os.getuid(), admin=True)
SLEEP = [sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))"]


def job(seconds: float, **kw: object) -> SubmitRequest:
    kw.setdefault("grace_s", 1.0)
    return SubmitRequest(command=[*SLEEP, str(seconds)], **kw)  # type: ignore[arg-type]


async def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def phases(svc: Service) -> dict[str, str]:
    return {w.id: w.phase for w in svc.list_workloads(include_done=True)}


def crash(svc: Service) -> None:
    """What a SIGKILL leaves: the loop gone, processes running, the state lock released
    (the kernel drops a dead process's locks)."""
    assert svc._task is not None
    svc._task.cancel()
    assert svc._state_lock is not None
    svc._state_lock.close()
    assert svc._db_claim is not None
    svc._db_claim.release()
    # the governor's threads die with a real process; here they are stopped (which also
    # thaws: a restarted agent thaws what it adopts anyway)
    svc.enforcement.close()


def make(tmp_path: Path, gpus: str) -> Service:
    return Service.create(simulate_gpus=gpus, state_dir=tmp_path, db=str(tmp_path / "fgpu.db"))


def test_priority_preempts_batch_and_batch_runs_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            batch = svc.submit(ME, job(30, gpu="0.7", priority="low", name="batch"))
            await until(lambda: phases(svc)[batch.id] == "running")
            # the inference workload runs until the test lets it end (a fixed run time
            # could end before a loaded machine looks)
            release = tmp_path / "infer-may-end"
            until_released = (
                "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)"
            )
            infer = svc.submit(
                ME,
                SubmitRequest(
                    command=[sys.executable, "-c", until_released, str(release)],
                    gpu="0.5",
                    priority="critical",
                    name="infer",
                    grace_s=1.0,
                ),
            )
            await until(lambda: phases(svc)[infer.id] == "running")
            b = svc.get_workload(batch.id)
            assert b.phase == "pending"
            assert b.restarts == 1
            kinds = [e.kind for e in b.events]
            assert kinds[:4] == ["submitted", "started", "process", "stopping"]
            assert "preempted" in kinds
            # the batch job comes back once the inference workload is done
            release.touch()
            await until(lambda: phases(svc)[infer.id] == "succeeded")
            await until(lambda: phases(svc)[batch.id] == "running")
            svc.cancel(ME, batch.id)
            await until(lambda: phases(svc)[batch.id] == "cancelled")
        finally:
            await svc.stop()

    asyncio.run(scenario())


def test_five_3gib_workloads_share_a_16gib_gpu_and_a_sixth_waits_for_memory(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xT4")
        await svc.start()
        try:
            ids = [svc.submit(ME, job(30, gpu_memory="3GiB")).id for _ in range(6)]
            await until(lambda: sum(p == "running" for p in phases(svc).values()) == 5)
            await asyncio.sleep(0.3)
            listed = {w.id: w for w in svc.list_workloads()}
            running = [w for w in listed.values() if w.phase == "running"]
            assert len(running) == 5
            assert all(g.memory_mib == 3072 and g.index == 0 for w in running for g in w.gpus)
            waiting = [w for w in listed.values() if w.phase == "pending"]
            assert len(waiting) == 1
            assert "3072 MiB" in waiting[0].reason
            top = svc.nodes()[0].gpus[0]
            assert top.allocated_memory_mib == 5 * 3072
            assert len(top.holders) == 5
            for wid in ids:
                if phases(svc)[wid] in ("running", "pending"):
                    svc.cancel(ME, wid)
            await until(lambda: all(p == "cancelled" for p in phases(svc).values()))
        finally:
            await svc.stop()

    asyncio.run(scenario())


def test_tenants_borrow_and_reclaim_without_ping_pong(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "4xA100-40GB")
        await svc.start()
        try:
            for team in ("team-a", "team-b"):
                svc.create_queue(ME, QueueBody(name=team, quota=2))

            def held(queue: str) -> int:
                return sum(
                    g.compute_milli
                    for w in svc.list_workloads()
                    if w.queue == queue and w.phase == "running"
                    for g in w.gpus
                )

            a = [svc.submit(ME, job(60, gpu="0.5", queue="team-a")).id for _ in range(10)]
            # team-b is idle: team-a borrows all four GPUs
            await until(lambda: held("team-a") == 4000)
            b = [svc.submit(ME, job(60, gpu="0.5", queue="team-b")).id for _ in range(10)]
            await until(lambda: held("team-b") == 2000 and held("team-a") == 2000)
            await asyncio.sleep(TICK_WAIT)
            assert held("team-a") == 2000
            assert held("team-b") == 2000
            # exactly the borrowed half of team-a was stopped, once each: no ping-pong
            preempted = [w for w in svc.list_workloads() if w.queue == "team-a" and w.restarts]
            assert len(preempted) == 4
            assert all(w.restarts == 1 for w in preempted)
            assert all(w.restarts == 0 for w in svc.list_workloads() if w.queue == "team-b")
            for wid in a + b:
                if phases(svc)[wid] in ("running", "pending"):
                    svc.cancel(ME, wid)
            await until(lambda: all(p == "cancelled" for p in phases(svc).values()))
        finally:
            await svc.stop()

    asyncio.run(scenario())


TICK_WAIT = 1.0


def test_restart_readopts_live_processes_and_keeps_pending_ones(tmp_path: Path) -> None:
    async def first() -> tuple[str, str, str]:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        run = svc.submit(ME, job(30, gpu="1"))
        await until(lambda: svc.store.get(run.id).pid is not None)
        short = svc.submit(ME, job(0.2, gpu="1"))
        wait = svc.submit(ME, job(30, gpu="1"))
        await asyncio.sleep(0.3)
        # the service dies without cleaning up (no stop): processes keep running
        crash(svc)
        return run.id, short.id, wait.id

    run_id, short_id, wait_id = asyncio.run(first())

    async def second() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            got = phases(svc)
            assert sorted(got) == sorted([run_id, short_id, wait_id])  # nothing duplicated
            assert got[run_id] == "running"
            assert got[wait_id] == "pending"
            kinds = [e.kind for e in svc.get_workload(run_id).events]
            assert kinds[-1] == "readopted"
            svc.cancel(ME, run_id)
            await until(lambda: phases(svc)[run_id] == "cancelled")
            await until(lambda: phases(svc)[short_id] == "succeeded")
            await until(lambda: phases(svc)[wait_id] == "running")
            svc.cancel(ME, wait_id)
            await until(lambda: phases(svc)[wait_id] == "cancelled")
        finally:
            await svc.stop()

    asyncio.run(second())


def test_a_process_that_died_while_down_is_marked_lost(tmp_path: Path) -> None:
    async def first() -> tuple[str, int]:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        run = svc.submit(ME, job(30, gpu="0.5"))
        await until(lambda: svc.store.get(run.id).pid is not None)
        record = svc.store.get(run.id)
        assert record.pid is not None
        crash(svc)
        return run.id, record.pid

    run_id, pid = asyncio.run(first())
    command = json.loads((tmp_path / "logs" / run_id / "handle.json").read_text())["pgid"]
    os.kill(pid, signal.SIGKILL)  # the wrapper dies too, so no exit record is written
    os.waitpid(pid, 0)
    assert alive(command)  # the command itself lives on, in its own process group

    async def second() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            record = svc.get_workload(run_id)
            assert record.phase == "failed"
            assert record.reason == (
                "lost while the service was down; its remaining processes were killed"
            )
            await until(lambda: not alive(command))
        finally:
            await svc.stop()

    asyncio.run(second())


def alive(pid: int) -> bool:
    """A live process (not a zombie) with this pid."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_wrapper_killed_from_outside_takes_its_command_with_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            run = svc.submit(ME, job(30, gpu="0.5"))
            await until(lambda: (tmp_path / "logs" / run.id / "handle.json").is_file())
            handle = json.loads((tmp_path / "logs" / run.id / "handle.json").read_text())
            os.kill(handle["pid"], signal.SIGKILL)
            await until(lambda: phases(svc)[run.id] == "failed")
            reason = svc.get_workload(run.id).reason
            assert reason.endswith("; its remaining processes were killed"), reason
            assert "exit code None" not in reason
            await until(lambda: not alive(handle["pgid"]))
        finally:
            await svc.stop()

    asyncio.run(scenario())


def test_a_process_started_but_not_recorded_is_found_and_readopted(tmp_path: Path) -> None:
    """A kill between starting the wrapper and saving its handle leaves a process that the
    store does not name; the next start finds it by its command line, not a second copy."""

    async def first() -> tuple[str, int]:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        run = svc.submit(ME, job(30, gpu="0.5"))
        await until(lambda: svc.store.get(run.id).pid is not None)
        pid = svc.store.get(run.id).pid
        assert pid is not None
        crash(svc)
        # what the kill window leaves: no handle file and no pid in the store
        (tmp_path / "logs" / run.id / "handle.json").unlink()
        with sqlite3.connect(tmp_path / "fgpu.db") as db:
            db.execute(
                "UPDATE workloads SET pid = NULL, create_time = NULL WHERE id = ?", (run.id,)
            )
        return run.id, pid

    run_id, pid = asyncio.run(first())

    async def second() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            record = svc.store.get(run_id)
            assert record.phase == "running"
            assert record.pid == pid  # the same process, found again
            assert (tmp_path / "logs" / run_id / "handle.json").is_file()
            svc.cancel(ME, run_id)
            await until(lambda: phases(svc)[run_id] == "cancelled")
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        finally:
            await svc.stop()

    asyncio.run(second())


def test_a_second_cancel_does_not_signal_again(tmp_path: Path) -> None:
    """Cancel is idempotent: the stop under way keeps its one SIGTERM and its grace clock."""
    marks = tmp_path / "terms.txt"
    program = (
        "import signal, sys, time\n"
        "def on_term(*_):\n"
        f"    open({str(marks)!r}, 'a').write('TERM\\n')\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )

    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            run = svc.submit(
                ME, SubmitRequest(command=[sys.executable, "-c", program], gpu="1", grace_s=1.5)
            )
            log = tmp_path / "logs" / run.id / "stdout.log"
            await until(lambda: "ready" in stream_text(log))
            assert not svc.list_workloads()[0].stopping
            svc.cancel(ME, run.id)
            await until(lambda: marks.is_file())
            listed = svc.list_workloads()[0]
            assert (listed.phase, listed.stopping) == ("running", True)
            svc.cancel(ME, run.id)  # again, while the first stop waits out its grace
            await asyncio.sleep(0.3)
            await until(lambda: phases(svc)[run.id] == "cancelled")
            assert marks.read_text() == "TERM\n"
            assert svc.get_workload(run.id).exit_code == 128 + signal.SIGKILL
        finally:
            await svc.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (dict(gpu="0"), "gpu", "a GPU request must be positive"),
        (dict(gpu="-1"), "gpu", "a GPU request must be positive"),
        (dict(gpu="nan"), "gpu", "not a plain decimal number"),
        (dict(gpu="1.5"), "gpu", "above 1 a GPU request is a whole number of GPUs"),
        (dict(gpu="0.5", mig_profile="3g.20gb"), "mig_profile", "cannot be combined"),
        (dict(gpu_memory="64GiB"), "gpu_memory", "65536 MiB is more than any GPU here has"),
        (dict(gpu="1", gpu_model=["X100"]), "gpu_model", "unknown GPU model 'X100'"),
        (dict(gpu="1", gpu_model=["H100"]), "gpu_model", "no H100-80GB GPU on this machine"),
        (dict(gpu="2"), "gpu", "asks for 2 GPUs; a node here has at most 1"),
        (dict(gpu="1", cpu="100000"), "request", "can never fit this machine"),
        (dict(gpu="0.5", queue="nope"), "queue", "unknown queue 'nope'"),
        (dict(gpu="0.5", priority="urgent"), "priority", "unknown priority 'urgent'"),
        (dict(gpu="0.5", grace_s=-1.0), "grace_s", "must be between 0 and 3600 seconds"),
        (dict(gpu="0.5", priority="1000000"), "priority", "1000000 is above 1000"),
        (dict(gpu="0.5", name="a\x1b[31mred"), "name", "contains the control character"),
        (dict(gpu="0.5", name="two\nlines"), "name", "contains the control character '\\n'"),
        (dict(gpu="0.5", gpu_model=[""]), "gpu_model", "empty model name"),
        (
            dict(gpu="0.5", env={"BIG": "x" * 200_000}),
            "env",
            "one variable has 200005 bytes; the limit is 131072",
        ),
        (
            dict(gpu="0.5", env={f"V{i}": "x" * 100_000 for i in range(11)}),
            "command",
            "the command and its environment take",
        ),
    ],
    ids=[
        "zero",
        "negative",
        "nan",
        "one-and-a-half",
        "with-mig",
        "memory-too-big",
        "unknown-model",
        "absent-model",
        "too-many-gpus",
        "too-much-cpu",
        "unknown-queue",
        "bad-priority",
        "negative-grace",
        "priority-too-high",
        "escape-in-name",
        "newline-in-name",
        "empty-model",
        "huge-variable",
        "huge-environment",
    ],
)
def test_bad_submissions_are_refused_and_nothing_is_stored(
    tmp_path: Path, body: dict[str, object], field: str, reason: str
) -> None:
    svc = make(tmp_path, "1xA100-40GB")
    with pytest.raises(BadRequest) as caught:
        svc.submit(ME, job(1, **body))
    assert caught.value.field == field
    assert reason in caught.value.reason
    assert svc.list_workloads(include_done=True) == []
    svc.store.close()


def test_empty_command_and_other_users_cancel(tmp_path: Path) -> None:
    svc = make(tmp_path, "1xA100-40GB")
    with pytest.raises(BadRequest, match="command: give a command"):
        svc.submit(ME, SubmitRequest(command=[], gpu="0.5"))
    mine = svc.submit(Caller(1000, False), job(1, gpu="0.5"))
    with pytest.raises(Forbidden, match=f"{user_text(1001)} may not cancel it"):
        svc.cancel(Caller(1001, False), mine.id)
    assert svc.get_workload(mine.id).phase == "pending"
    with pytest.raises(Forbidden, match="may not manage queues"):
        svc.create_queue(Caller(1001, False), QueueBody(name="x"))
    svc.store.close()


def test_a_second_service_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    first = make(tmp_path, "1xA100-40GB")
    with pytest.raises(
        ValueError, match=f"--state-dir: another fgpu serve \\(pid {os.getpid()}\\)"
    ):
        make(tmp_path, "1xA100-40GB")
    asyncio.run(first.stop())
    make(tmp_path, "1xA100-40GB").store.close()


def test_logs_are_their_owners(tmp_path: Path) -> None:
    svc = make(tmp_path, "1xA100-40GB")
    mine = svc.submit(Caller(1000, False), job(1, gpu="0.5"))
    assert svc.log_path(Caller(1000, False), mine.id, "stdout").name == "stdout.log"
    assert svc.log_path(ME, mine.id, "stderr").name == "stderr.log"
    with pytest.raises(Forbidden, match="its logs are its owner's"):
        svc.log_path(Caller(1001, False), mine.id, "stdout")
    svc.store.close()


def test_text_that_cannot_reach_a_process_is_refused(tmp_path: Path) -> None:
    svc = make(tmp_path, "1xA100-40GB")
    for body, field in [
        (SubmitRequest(command=["echo", "\ud800"], gpu="1"), "command"),
        (SubmitRequest(command=["echo"], gpu="1", env={"X": "a\x00b"}), "env"),
        (SubmitRequest(command=["echo"], gpu="1", cwd="relative/dir"), "cwd"),
    ]:
        with pytest.raises(BadRequest) as caught:
            svc.submit(ME, body)
        assert caught.value.field == field
    assert svc.list_workloads(include_done=True) == []
    svc.store.close()


def test_restart_with_fewer_gpus_restarts_the_work_that_lost_its_gpu(tmp_path: Path) -> None:
    async def first() -> tuple[str, str]:
        svc = make(tmp_path, "2xA100-40GB")
        await svc.start()
        a = svc.submit(ME, job(30, gpu="1"))
        b = svc.submit(ME, job(30, gpu="1"))
        await until(lambda: all(svc.store.get(x.id).pid for x in (a, b)))
        crash(svc)
        return a.id, b.id

    ids = asyncio.run(first())

    async def second() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            # the work on the missing GPU 1 is stopped and comes back as pending
            await until(lambda: sorted(phases(svc).values()) == ["pending", "running"])
            top = svc.nodes()[0].gpus
            assert len(top) == 1
            assert top[0].allocated_milli == 1000
            for wid in ids:
                svc.cancel(ME, wid)
            await until(lambda: all(p == "cancelled" for p in phases(svc).values()))
        finally:
            await svc.stop()

    asyncio.run(second())


def test_restart_on_other_gpu_models_renames_nodes_and_requeues_the_displaced(
    tmp_path: Path,
) -> None:
    """Mixed models make one node per model (vm/A100-40GB, vm/H100-80GB); one model alone
    makes the node vm: the GPUs keep their UUIDs but change nodes."""

    async def first() -> tuple[str, str]:
        svc = make(tmp_path, "2xA100-40GB,1xH100-80GB")
        await svc.start()
        a = svc.submit(ME, job(30, gpu="1", gpu_model=["A100-40GB"]))
        h = svc.submit(ME, job(30, gpu="1", gpu_model=["H100-80GB"]))
        await until(lambda: all(svc.store.get(x.id).pid for x in (a, h)))
        crash(svc)
        return a.id, h.id

    a_id, h_id = asyncio.run(first())

    async def second() -> None:
        svc = make(tmp_path, "2xA100-40GB")
        await svc.start()
        try:
            assert [n.name for n in svc.store.list_nodes()] == ["vm"]
            # both lost their node; the A100 one runs again, the H100 one waits for an H100
            # (waiting for the restart too: until its stop is handled, the A100 one is still
            # "running" on its old process, which a loaded machine may show first)
            await until(
                lambda: (
                    phases(svc) == {a_id: "running", h_id: "pending"}
                    and svc.store.get(a_id).restarts == 1
                    and svc.store.get(a_id).pid is not None
                )
            )
            for wid in (a_id, h_id):
                svc.cancel(ME, wid)
            await until(lambda: all(p == "cancelled" for p in phases(svc).values()))
        finally:
            await svc.stop()

    asyncio.run(second())


def test_a_second_service_on_the_same_database_is_refused(tmp_path: Path) -> None:
    """The state folder lock does not cover --db: the database is claimed too."""
    first = make(tmp_path / "one", "1xA100-40GB")
    db = str(tmp_path / "one" / "fgpu.db")
    try:
        with pytest.raises(ValueError, match=r"--db: another fgpu serve \(pid \d+\) uses"):
            Service.create(simulate_gpus="1xA100-40GB", state_dir=tmp_path / "two", db=db)
    finally:
        first.store.close()
        assert first._db_claim is not None
        first._db_claim.release()
    second = Service.create(simulate_gpus="1xA100-40GB", state_dir=tmp_path / "two", db=db)
    assert second.list_workloads() == []  # free again once the first let go
    second.store.close()


@pytest.mark.parametrize(
    ("command", "shell", "field", "reason"),
    [
        (["echo", "two"], True, "command", "with shell, give one command line (got 2 arguments)"),
        (["x" * 140_000], False, "command", "one argument has 140001 bytes; the limit is 131072"),
    ],
    ids=["shell-with-two-arguments", "huge-argument"],
)
def test_bad_commands_are_refused(
    tmp_path: Path, command: list[str], shell: bool, field: str, reason: str
) -> None:
    svc = make(tmp_path, "1xA100-40GB")
    with pytest.raises(BadRequest) as caught:
        svc.submit(ME, SubmitRequest(command=command, shell=shell, gpu="0.5"))
    assert (caught.value.field, caught.value.reason) == (field, reason)
    assert svc.list_workloads(include_done=True) == []
    svc.store.close()


def test_a_stop_resumed_after_a_restart_waits_only_the_rest_of_its_grace(
    tmp_path: Path,
) -> None:
    stubborn = [sys.executable, "-c", TERM_IGNORING]

    async def first() -> str:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        run = svc.submit(ME, SubmitRequest(command=stubborn, gpu="1", grace_s=60.0))
        log = tmp_path / "logs" / run.id / "stdout.log"
        await until(lambda: "ready" in stream_text(log))
        svc.cancel(ME, run.id)  # SIGTERM is ignored; SIGKILL is due 60 s from now
        crash(svc)
        return run.id

    run_id = asyncio.run(first())

    async def second() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        svc.clock = lambda: time.time() + 59.0  # 59 of the 60 s have passed
        await svc.start()
        try:
            await until(lambda: phases(svc)[run_id] == "cancelled", timeout=15.0)
            assert svc.get_workload(run_id).exit_code == 128 + signal.SIGKILL
        finally:
            await svc.stop()

    asyncio.run(second())


TERM_IGNORING = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


def test_a_restart_with_another_gpu_in_the_same_place_requeues_its_work(
    tmp_path: Path,
) -> None:
    """One H100 at index 0 before, one A100 at index 0 after: same node name and index,
    another GPU (uuid): the workload is stopped and queued again, never re-adopted onto it."""

    async def first() -> str:
        svc = make(tmp_path, "1xH100-80GB")
        await svc.start()
        run = svc.submit(ME, job(60, gpu="0.5"))
        await until(lambda: svc.store.get(run.id).pid is not None)
        crash(svc)
        return run.id

    run_id = asyncio.run(first())

    async def second() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            await until(lambda: svc.store.get(run_id).restarts == 1)
            await until(lambda: svc.store.get(run_id).phase == "running")
            allocation = svc.store.get(run_id).allocation
            assert allocation is not None
            assert list(allocation.gpu_uuids) == svc.machine.uuids("vm", (0,))
            svc.cancel(ME, run_id)
            await until(lambda: phases(svc)[run_id] == "cancelled")
        finally:
            await svc.stop()

    asyncio.run(second())


@pytest.mark.parametrize("outcome", ["still-running", "exited-0"])
def test_gpus_gone_and_wrapper_dead_at_restart(tmp_path: Path, outcome: str) -> None:
    """The wrapper died while the service was down and the workload's GPU is gone: a command
    that still runs is killed and the workload queued again (one copy, never two); one that
    had ended with 0 is recorded as succeeded, not run again."""
    seconds = 60 if outcome == "still-running" else 1.5

    async def first() -> tuple[str, int, int]:
        svc = make(tmp_path, "2xA100-40GB")
        await svc.start()
        jobs = [svc.submit(ME, job(seconds, gpu="1")) for _ in range(2)]
        await until(lambda: all(svc.store.get(j.id).pid for j in jobs))
        # the one on GPU 1, which the restarted service will not have
        (on_gpu_1,) = [
            j.id for j in jobs if (a := svc.store.get(j.id).allocation) and a.gpus == (1,)
        ]
        handle = json.loads((tmp_path / "logs" / on_gpu_1 / "handle.json").read_text())
        crash(svc)  # before the short job ends: it ends while the service is down
        return on_gpu_1, int(handle["pid"]), int(handle["pgid"])

    run_id, wrapper, command = asyncio.run(first())
    if outcome == "still-running":
        os.kill(wrapper, signal.SIGKILL)
        os.waitpid(wrapper, 0)
    else:
        os.waitpid(wrapper, 0)  # the wrapper records exit code 0, then ends
        assert json.loads((tmp_path / "logs" / run_id / "exit.json").read_text())["code"] == 0

    async def second() -> None:
        svc = make(tmp_path, "1xA100-40GB")  # GPU 1 is gone
        await svc.start()
        try:
            record = svc.store.get(run_id)
            if outcome == "exited-0":
                assert (record.phase, record.exit_code) == ("succeeded", 0)
            else:
                assert record.restarts == 1
                await until(lambda: not alive(command))
            for wid, phase in phases(svc).items():
                if phase in ("pending", "running"):
                    svc.cancel(ME, wid)
            await until(lambda: all(p not in ("pending", "running") for p in phases(svc).values()))
        finally:
            await svc.stop()

    asyncio.run(second())


def test_views_round_trip(tmp_path: Path) -> None:
    svc = make(tmp_path, "1xA100-40GB")
    view = svc.submit(ME, job(1, gpu="0.25", name="tiny"))
    assert isinstance(view, WorkloadView)
    assert view.request.gpu_milli == 250
    assert view.name == "tiny"
    assert view.phase == "pending"
    svc.store.close()
