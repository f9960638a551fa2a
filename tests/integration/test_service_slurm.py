"""Slurm's habits in the service in-process (real SQLite store, real processes, simulated
GPUs): an array's ``%N`` holds after a preemption sends a task back to pending, and the
filter before the decision core keeps waiting work out of the core's round."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from fgpu.sched.workload import Wait
from fgpu.server.service import Caller, Service
from fgpu.wire import SubmitRequest
from tests.integration.test_service import crash, make, until

ME = Caller(os.getuid(), admin=True)
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _array_phases(svc: Service, array_id: str) -> list[str]:
    return [
        w.phase
        for w in svc.list_workloads(include_done=True)
        if w.array is not None and w.array.id == array_id
    ]


async def _stop(svc: Service) -> None:
    """Cancel what is active and wait for it to end, then stop the service (a stopped
    service leaves running work running, for the next start to adopt)."""
    for view in svc.list_workloads():
        svc.cancel(ME, view.id)
    await until(lambda: not svc.list_workloads(), 60)
    await svc.stop()


def test_the_throttle_holds_after_a_preemption(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            first = svc.submit(
                ME,
                SubmitRequest(command=SLEEP, gpu="0.3", priority="low", array="0-2%1", grace_s=0.5),
            )
            assert first.array is not None
            array_id = first.array.id
            await until(lambda: _array_phases(svc, array_id).count("running") == 1)
            # a critical job takes the GPU: the running task is preempted back to pending
            critical = svc.submit(
                ME, SubmitRequest(command=SLEEP, gpu="1", priority="critical", grace_s=0.5)
            )
            await until(lambda: svc.get_workload(critical.id).phase == "running", 60)
            assert _array_phases(svc, array_id).count("running") == 0
            restarted = [
                w
                for w in svc.list_workloads()
                if w.array is not None and w.array.id == array_id and w.restarts
            ]
            assert len(restarted) == 1
            svc.cancel(ME, critical.id)
            await until(lambda: _array_phases(svc, array_id).count("running") == 1, 60)
            for _ in range(3):  # more rounds place nothing more: %1 holds, restarted or not
                await asyncio.to_thread(svc.schedule_once)
            assert _array_phases(svc, array_id).count("running") == 1
            waiting = [
                w
                for w in svc.list_workloads()
                if w.array is not None and w.array.id == array_id and w.phase == "pending"
            ]
            assert len(waiting) == 2
            assert all("at most 1 at once (%1)" in w.reason for w in waiting)
            # the waiting tasks are kept out of the core's round: no hold, no wait reason of
            # its own, and no demand for their queue
            decision = await asyncio.to_thread(svc.plan)
            seen = {a.workload for a in decision.actions if isinstance(a, Wait)}
            assert not {w.id for w in waiting} & (seen | set(decision.holds))
        finally:
            await _stop(svc)

    asyncio.run(scenario())


def test_a_time_limit_is_kept_across_a_restart_of_the_service(tmp_path: Path) -> None:
    """The limit counts from the run's recorded start, so a service that comes back after a
    crash cancels a re-adopted workload at the same limit."""

    async def first() -> str:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        record = svc.submit(ME, SubmitRequest(command=SLEEP, gpu="0.5", time="0:03", grace_s=30.0))
        await until(lambda: svc.get_workload(record.id).phase == "running")
        crash(svc)
        return record.id

    workload_id = asyncio.run(first())

    async def second() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            await until(lambda: svc.get_workload(workload_id).phase == "cancelled", 60)
            ended = svc.get_workload(workload_id)
            assert ended.reason == "time limit"
            assert ended.exit_code == 143  # SIGTERM from the service that came back
            assert ended.started_at is not None
            assert ended.finished_at is not None
            assert ended.finished_at - ended.started_at >= 3.0
            assert "watched again after the restart" in " ".join(e.message for e in ended.events)
        finally:
            await _stop(svc)

    asyncio.run(second())
