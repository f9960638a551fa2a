"""The cost of ``--dependency`` is bounded by what it means, not by how it is written
(issue 27, point 4 of the attacker's trial): one request naming an array 1000 times took
3 min 25 s of the server's work. In-process service, real SQLite store, real processes; the
work is counted as the SQL statements the store runs (never timed).

- a condition written many times is one, and the references are resolved together: naming
  an array of 300 tasks 1000 times costs a handful of statements, as naming it once;
- the limit counts expanded tasks (an array counts each task): an array of 1000 tasks and
  one more workload is refused, naming the field, the value (shortened) and the limit.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import event

from fgpu.rules.errors import BadRequest
from fgpu.server.service import Caller, Service
from fgpu.wire import SubmitRequest
from tests.integration.test_service import make, until

ME = Caller(os.getuid(), admin=True)
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


@contextmanager
def statements(svc: Service) -> Iterator[list[str]]:
    """The SQL statements the service's store runs meanwhile."""
    seen: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement)

    event.listen(svc.store.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(svc.store.engine, "before_cursor_execute", count)


async def _stop(svc: Service) -> None:
    for view in svc.list_workloads():
        svc.cancel(ME, view.id)
    await until(lambda: not svc.list_workloads(), 60)
    await svc.stop()


def test_an_array_named_a_thousand_times_costs_what_naming_it_once_does(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            svc.submit(ME, SubmitRequest(command=SLEEP, gpu="0.5", array="0-299%1", name="bigarr"))
            with statements(svc) as once:
                one = svc.submit(
                    ME, SubmitRequest(command=["true"], gpu="0.01", dependency="afterok:bigarr")
                )
            text = "afterok:" + ":".join(["bigarr"] * 1000)
            with statements(svc) as many:
                repeated = svc.submit(
                    ME, SubmitRequest(command=["true"], gpu="0.01", dependency=text)
                )
            # both wait for the same 300 tasks, each once
            for view in (one, repeated):
                record = svc.store.get(view.id)
                assert len(record.dependency) == 300
                assert len(set(record.dependency)) == 300
            reads = [s for s in many if s.lstrip().upper().startswith("SELECT")]
            assert len(many) <= len(once) + 2, (len(once), len(many))
            assert len(reads) <= 10, reads
            # a round weighs each pending dependant's conditions once, and reads no store
            # row for targets that are active (the service's mirror has them)
            await asyncio.to_thread(svc.schedule_once)  # what may start has started
            with statements(svc) as round_:
                await asyncio.to_thread(svc.schedule_once)
            by_id = [s for s in round_ if s.startswith("SELECT") and "workloads.id = ?" in s]
            assert not by_id, round_
            waiting = svc.get_workload(repeated.id)
            assert waiting.phase == "pending"
            assert "waits for afterok:" in waiting.reason
            assert "297 more" in waiting.reason, waiting.reason
        finally:
            await _stop(svc)

    asyncio.run(scenario())


def test_the_limit_counts_an_arrays_tasks_and_the_refusal_names_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            svc.submit(ME, SubmitRequest(command=SLEEP, gpu="0.5", array="0-999%1", name="bigarr"))
            other = svc.submit(ME, SubmitRequest(command=SLEEP, gpu="0.1", name="other"))
            # the whole array is at the limit: accepted
            svc.submit(ME, SubmitRequest(command=["true"], gpu="0.01", dependency="afterok:bigarr"))
            before = len(svc.list_workloads())
            text = f"afterok:bigarr:{other.id},afterany:" + ":".join(["bigarr"] * 500)
            with statements(svc) as work, pytest.raises(BadRequest) as refused:
                svc.submit(ME, SubmitRequest(command=["true"], gpu="0.01", dependency=text))
            assert refused.value.field == "dependency"
            reason = refused.value.reason
            assert "at most 1000" in reason, reason
            assert "1001 workloads or more" in reason, reason
            assert "an array counts each of its tasks" in reason, reason
            assert f"{text[:40]!r}… ({len(text)} characters)" in reason, reason
            assert len(work) <= 10, work
            assert len(svc.list_workloads()) == before  # nothing written
            # as written, past 1000 conditions: refused before any is resolved
            text = "afterok:" + ":".join(["bigarr"] * 1001)
            with statements(svc) as work, pytest.raises(BadRequest) as refused:
                svc.submit(ME, SubmitRequest(command=["true"], gpu="0.01", dependency=text))
            assert "more than 1000 conditions" in refused.value.reason, refused.value.reason
            assert not [s for s in work if "workloads" in s], work
        finally:
            await _stop(svc)

    asyncio.run(scenario())


def test_a_round_reads_finished_targets_in_one_query(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            first = svc.submit(
                ME, SubmitRequest(command=["true"], gpu="0.01", array="0-39", name="quick")
            )
            blocker = svc.submit(ME, SubmitRequest(command=SLEEP, gpu="0.01", name="blocker"))
            assert first.array is not None
            array_id = first.array.id
            await until(
                lambda: all(
                    w.phase == "succeeded"
                    for w in svc.list_workloads(include_done=True)
                    if w.array is not None and w.array.id == array_id
                ),
                60,
            )
            waiting = svc.submit(
                ME,
                SubmitRequest(
                    command=["true"], gpu="0.01", dependency="afterany:quick,afterok:blocker"
                ),
            )
            # as after a restart: what the service learnt of finished targets is forgotten
            svc._outcomes.clear()
            with statements(svc) as round_:
                await asyncio.to_thread(svc.schedule_once)
            by_id = [s for s in round_ if s.startswith("SELECT") and "workloads.id = ?" in s]
            together = [
                s  # whole rows by id (another read of ids alone may run in a round)
                for s in round_
                if s.startswith("SELECT workloads.id, workloads.name") and "workloads.id IN" in s
            ]
            assert not by_id, by_id
            assert len(together) == 1, together
            view = svc.get_workload(waiting.id)
            assert view.phase == "pending"
            assert view.reason.startswith(f"waits for afterok:{blocker.id} (blocker, running)")
        finally:
            await _stop(svc)

    asyncio.run(scenario())
