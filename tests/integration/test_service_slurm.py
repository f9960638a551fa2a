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
from tests.integration.test_service import make, until

ME = Caller(os.getuid(), admin=True)
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _array_phases(svc: Service, array_id: str) -> list[str]:
    return [
        w.phase
        for w in svc.list_workloads(include_done=True)
        if w.array is not None and w.array.id == array_id
    ]


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
            await svc.stop()

    asyncio.run(scenario())
