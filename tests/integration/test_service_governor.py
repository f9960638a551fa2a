"""The governor and the memory guard inside the service: real processes on simulated GPUs.

Issue "Enforce shares on the GPU": a busy critical workload pauses low-priority neighbours
on its GPU and they resume after it goes idle (hints through :mod:`fgpu.sdk`); a frozen
workload can be cancelled (it is thawed before SIGTERM); a workload over its memory quota
is stopped with an event naming used and allowed MiB while its neighbour keeps running;
no process is left stopped when the service stops.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import psutil

from fgpu.agent.governor.runtime import WorkloadView
from fgpu.log_files import stream_text
from fgpu.server.service import Service
from fgpu.wire import QueueBody, SubmitRequest
from tests.integration.test_service import ME, make, phases, until

SLEEPER = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"]


def critical_until(flag: Path) -> list[str]:
    """A latency-critical service: busy (no hint yet) until ``flag`` exists, then idle."""
    program = (
        "import os, time, fgpu.sdk\n"
        "print('ready', flush=True)\n"
        f"while not os.path.exists({str(flag)!r}):\n"
        "    time.sleep(0.05)\n"
        "fgpu.sdk.mark_idle()\n"
        "print('idle', flush=True)\n"
        "time.sleep(120)\n"
    )
    return [sys.executable, "-c", program]


def over_quota(mib: int) -> list[str]:
    """Reports ``mib`` of GPU memory through the SDK (what a simulated GPU believes)."""
    program = (
        "import time, fgpu.sdk\n"
        "print('ready', flush=True)\n"
        f"assert fgpu.sdk.report_memory({mib})\n"
        "time.sleep(120)\n"
    )
    return [sys.executable, "-c", program]


def group(tmp_path: Path, workload_id: str) -> int:
    """The workload's process group (its command's pid)."""
    handle = json.loads((tmp_path / "logs" / workload_id / "handle.json").read_text())
    return int(handle["pgid"])


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP: state T) or frozen (cgroup freezer: the task
    sleeps in the freezer, which /proc shows as the cgroup's ``frozen`` flag)."""
    try:
        if psutil.Process(pid).status() == psutil.STATUS_STOPPED:
            return True
    except psutil.NoSuchProcess:
        return False
    return _cgroup_frozen(pid)


def _cgroup_frozen(pid: int) -> bool:
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        if line.startswith("0::"):
            for root in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
                events = root / line[3:].lstrip("/") / "cgroup.events"
                if events.is_file():
                    return "frozen 1" in events.read_text()
    return False


def holder_state(svc: Service, workload_id: str) -> str | None:
    for node in svc.nodes():
        for gpu in node.gpus:
            for h in gpu.holders:
                if h.workload_id == workload_id:
                    return h.state
    return None


def governed(svc: Service, workload_id: str) -> WorkloadView | None:
    """The governor's view of the workload (what ``fgpu top`` and the metrics show)."""
    views = svc.enforcement.governor.snapshot().workloads
    return next((v for v in views if v.workload_id == workload_id), None)


def ready(tmp_path: Path, workload_id: str) -> bool:
    log = tmp_path / "logs" / workload_id / "stdout.log"
    return "ready" in stream_text(log)


def test_a_busy_critical_workload_pauses_low_ones_which_resume_after_it_idles(
    tmp_path: Path,
) -> None:
    flag = tmp_path / "go-idle"

    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        low_pids: list[int] = []
        try:
            low_a = svc.submit(
                ME, SubmitRequest(command=SLEEPER, gpu="0.25", priority="low", grace_s=5)
            )
            low_b = svc.submit(
                ME, SubmitRequest(command=SLEEPER, gpu="0.25", priority="low", grace_s=5)
            )
            await until(lambda: ready(tmp_path, low_a.id) and ready(tmp_path, low_b.id))
            low_pids = [group(tmp_path, low_a.id), group(tmp_path, low_b.id)]
            # nothing above them yet: they take turns on the GPU (fair, both busy)
            await until(lambda: holder_state(svc, low_a.id) is not None)
            assert {holder_state(svc, w.id) for w in (low_a, low_b)} <= {
                "running",
                "waiting-for-share",
            }
            critical = svc.submit(
                ME,
                SubmitRequest(command=critical_until(flag), gpu="0.5", priority="critical"),
            )
            await until(lambda: ready(tmp_path, critical.id))
            # busy (no hint yet): the low ones are paused
            await until(lambda: all(stopped(p) for p in low_pids))
            assert holder_state(svc, low_a.id) == "paused-by-priority"
            assert holder_state(svc, critical.id) == "running"
            # a frozen workload can still be cancelled: it is thawed, then gets SIGTERM
            svc.cancel(ME, low_a.id)
            await until(lambda: phases(svc)[low_a.id] == "cancelled")
            assert svc.get_workload(low_a.id).exit_code == 128 + signal.SIGTERM
            assert stopped(low_pids[1])
            # the critical one goes idle: after the hysteresis the other low one runs again
            flag.touch()
            await until(lambda: not stopped(low_pids[1]))
            assert holder_state(svc, low_b.id) == "running"
            # agent events reach the store through a background writer
            await until(
                lambda: {"paused", "resumed"} <= {e.kind for e in svc.get_workload(low_b.id).events}
            )
            for wid in (low_b.id, critical.id):
                svc.cancel(ME, wid)
            await until(lambda: all(p == "cancelled" for p in phases(svc).values()))
        finally:
            await svc.stop()
        assert not any(stopped(p) for p in low_pids)  # nothing left stopped

    asyncio.run(scenario())


def test_the_service_leaves_no_process_stopped_when_it_stops(tmp_path: Path) -> None:
    async def scenario() -> list[int]:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        low = svc.submit(ME, SubmitRequest(command=SLEEPER, gpu="0.5", priority="low"))
        await until(lambda: ready(tmp_path, low.id))
        critical = svc.submit(
            ME,
            SubmitRequest(
                command=critical_until(tmp_path / "never"), gpu="0.5", priority="critical"
            ),
        )
        await until(lambda: ready(tmp_path, critical.id))
        pid = group(tmp_path, low.id)
        await until(lambda: stopped(pid))
        await svc.stop()  # workloads keep running for the next start; none stays frozen
        return [pid, group(tmp_path, critical.id)]

    pids = asyncio.run(scenario())
    try:
        assert all(psutil.pid_exists(p) for p in pids)
        assert not any(stopped(p) for p in pids)
    finally:
        for pid in pids:
            with __import__("contextlib").suppress(ProcessLookupError):
                __import__("os").killpg(pid, signal.SIGKILL)


def test_a_workload_over_its_memory_quota_is_stopped_and_its_neighbour_runs_on(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-40GB")
        await svc.start()
        try:
            greedy = svc.submit(ME, SubmitRequest(command=over_quota(5000), gpu_memory="4GiB"))
            modest = svc.submit(ME, SubmitRequest(command=SLEEPER, gpu_memory="4GiB"))
            await until(lambda: phases(svc)[greedy.id] == "failed")
            detail = svc.get_workload(greedy.id)
            assert detail.reason.startswith("stopped: GPU memory over quota on GPU-")
            assert detail.reason.endswith("used 5000 MiB, allowed 4096 MiB")
            assert detail.exit_code == 128 + signal.SIGKILL
            await until(
                lambda: any(e.kind == "memory-exceeded" for e in svc.get_workload(greedy.id).events)
            )
            detail = svc.get_workload(greedy.id)
            memory_events = [e for e in detail.events if e.kind == "memory-exceeded"]
            assert "used 5000 MiB, allowed 4096 MiB" in memory_events[0].message
            assert phases(svc)[modest.id] == "running"
            # the guard (every 0.1 s) may stop the greedy one before the modest one is up
            await until(lambda: ready(tmp_path, modest.id))
            svc.cancel(ME, modest.id)
            await until(lambda: phases(svc)[modest.id] == "cancelled")
        finally:
            await svc.stop()

    asyncio.run(scenario())


def test_borrowed_work_does_not_pause_work_within_its_queues_quota(tmp_path: Path) -> None:
    """Issue 25: team-a (quota 1) runs low-priority work; team-b (quota 0) borrows the rest
    of the GPU for normal-priority work. Both busy: the low one is not paused (it reaches
    a good part of its share) while the borrowed one runs. Work of normal priority within
    team-a's own quota still pauses it."""

    async def scenario() -> None:
        svc = make(tmp_path, "1xA100-80GB")
        await svc.start()
        pids: list[int] = []
        try:
            svc.create_queue(ME, QueueBody(name="team-a", quota=1))
            svc.create_queue(ME, QueueBody(name="team-b", quota=0))
            own = svc.submit(
                ME,
                SubmitRequest(
                    command=SLEEPER, gpu="0.25", priority="low", queue="team-a", grace_s=5
                ),
            )
            lent = svc.submit(
                ME,
                SubmitRequest(
                    command=SLEEPER, gpu="0.25", priority="normal", queue="team-b", grace_s=5
                ),
            )
            await until(lambda: ready(tmp_path, own.id) and ready(tmp_path, lent.id))
            pids = [group(tmp_path, own.id), group(tmp_path, lent.id)]
            # both busy (no hints): once the borrowed one has run a good part of the GPU,
            # the in-quota low one has never been held back by priority (paused, it would
            # have been from the borrowed one's first plan on)
            await until(lambda: (v := governed(svc, lent.id)) is not None and v.busy)
            await until(
                lambda: (v := governed(svc, lent.id)) is not None and v.achieved_milli >= 150
            )
            mine_view = governed(svc, own.id)
            assert mine_view is not None
            assert mine_view.busy
            assert mine_view.paused_ns[1] == 0
            assert mine_view.blocker is None
            assert holder_state(svc, own.id) in {"running", "waiting-for-share"}
            assert holder_state(svc, lent.id) in {"running", "waiting-for-share"}
            assert "paused" not in {e.kind for e in svc.get_workload(own.id).events}
            # normal-priority work within team-a's quota pauses the low one as before
            mine = svc.submit(
                ME,
                SubmitRequest(
                    command=SLEEPER, gpu="0.25", priority="normal", queue="team-a", grace_s=5
                ),
            )
            await until(lambda: ready(tmp_path, mine.id))
            pids.append(group(tmp_path, mine.id))
            await until(lambda: stopped(pids[0]))
            assert holder_state(svc, own.id) == "paused-by-priority"
            await until(lambda: "paused" in {e.kind for e in svc.get_workload(own.id).events})
            pause = [e for e in svc.get_workload(own.id).events if e.kind == "paused"][-1]
            assert mine.id in pause.message
            assert holder_state(svc, lent.id) != "paused-by-priority"  # same priority
            for wid in (own.id, lent.id, mine.id):
                svc.cancel(ME, wid)
            await until(lambda: all(p == "cancelled" for p in phases(svc).values()))
        finally:
            await svc.stop()
        assert not any(stopped(p) for p in pids)

    asyncio.run(scenario())
