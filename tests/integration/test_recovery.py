"""Recovery truth (issue 14, point 3): after a crash, a workload whose exit the wrapper
recorded is recorded with that exit code and time, whatever the service had saved; it is
"lost" only when nothing says how it ended.

The crash lands in the window the issue found: after the store recorded ``started`` and the
real wrapper was launched, but before the service saved the process handle. A launcher that
launches for real and then raises :class:`Crash` (a ``BaseException``, which the service
does not catch, as a SIGKILL would not let it) puts the service there; the service is then
abandoned as a killed process leaves it, and a new one starts on the same state folder.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from fgpu.agent.launcher import Launcher, LaunchSpec
from fgpu.agent.process import ProcessHandle, is_same_process
from fgpu.server.service import Caller, Service
from fgpu.wire import SubmitRequest
from tests.serverproc import wait_for

ME = Caller(os.getuid(), admin=True)


class Crash(BaseException):
    """The service dies here."""


class CrashAfterLaunch(Launcher):
    """Launches for real, then the service dies before it can save the handle; the handle
    is kept here so that the test can wait for the real wrapper to end."""

    def __init__(self) -> None:
        super().__init__()
        self.launched: list[ProcessHandle] = []

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        self.launched.append(super().launch(spec))
        raise Crash


class CrashBeforeLaunch(Launcher):
    """The service dies after recording the start, before the wrapper is started."""

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        raise Crash


def make(tmp_path: Path, launcher: Launcher | None = None) -> Service:
    return Service.create(
        simulate_gpus="1xA100-40GB",
        state_dir=tmp_path,
        db=str(tmp_path / "fgpu.db"),
        launcher=launcher,
    )


def abandon(svc: Service) -> None:
    """What a SIGKILL leaves: no stop sequence, the locks dropped by the kernel."""
    assert svc._state_lock is not None
    svc._state_lock.close()
    assert svc._db_claim is not None
    svc._db_claim.release()
    svc.enforcement.close()
    svc.store.close()


def recovered(tmp_path: Path) -> Service:
    """A new service on the same folder after its recovery (its loop is not started)."""
    svc = make(tmp_path)
    svc._recover()
    return svc


def crash_in_start(tmp_path: Path, launcher: Launcher, command: list[str]) -> str:
    """Submit ``command``; the round that starts it crashes inside the launch; the id."""
    svc = make(tmp_path, launcher)
    view = svc.submit(ME, SubmitRequest(command=command, gpu="0.5", grace_s=1.0))
    with pytest.raises(Crash):
        svc.schedule_once()
    assert svc.store.get(view.id).phase == "running"
    assert not (tmp_path / "logs" / view.id / "handle.json").exists()
    abandon(svc)
    return view.id


@pytest.mark.parametrize(("code", "phase"), [(0, "succeeded"), (3, "failed")])
def test_an_exit_recorded_while_the_handle_was_never_saved_is_kept(
    tmp_path: Path, code: int, phase: str
) -> None:
    launcher = CrashAfterLaunch()
    command = [sys.executable, "-c", f"raise SystemExit({code})"]
    workload = crash_in_start(tmp_path, launcher, command)
    (handle,) = launcher.launched
    exit_path = tmp_path / "logs" / workload / "exit.json"
    wait_for(lambda: not is_same_process(handle), "the real wrapper to end")
    assert json.loads(exit_path.read_text())["code"] == code
    written = exit_path.stat().st_mtime

    svc = recovered(tmp_path)
    try:
        record = svc.store.get(workload)
        assert record.phase == phase
        assert record.exit_code == code
        assert record.finished_at == written
        assert "lost" not in record.reason
    finally:
        svc.store.close()


def test_an_earlier_runs_exit_record_does_not_count_for_a_run_that_never_launched(
    tmp_path: Path,
) -> None:
    workload_dir = tmp_path / "logs"
    workload = crash_in_start(tmp_path, CrashBeforeLaunch(), ["true"])
    # an exit record as a previous run (before a preemption) would have left it
    stale = workload_dir / workload / "exit.json"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text('{"code": 0, "reason": null, "pid": 1}\n')
    svc = make(tmp_path)
    started = svc.store.get(workload).started_at
    assert started is not None
    os.utime(stale, (started - 60, started - 60))
    svc.store.close()
    abandon_lockless(svc)

    svc = recovered(tmp_path)
    try:
        record = svc.store.get(workload)
        assert record.phase == "failed"
        assert record.reason == "lost while the service was down"
        assert record.exit_code is None
    finally:
        svc.store.close()


def abandon_lockless(svc: Service) -> None:
    """Drop the locks of a service that was only opened (not crashed)."""
    assert svc._state_lock is not None
    svc._state_lock.close()
    assert svc._db_claim is not None
    svc._db_claim.release()
    svc.enforcement.close()


def test_recovery_runs_in_the_real_start(tmp_path: Path) -> None:
    """The same through :meth:`Service.start` (the path ``fgpu serve`` takes)."""
    launcher = CrashAfterLaunch()
    workload = crash_in_start(tmp_path, launcher, ["true"])
    (handle,) = launcher.launched
    wait_for(lambda: not is_same_process(handle), "the real wrapper to end")

    async def second() -> None:
        svc = make(tmp_path)
        await svc.start()
        try:
            assert svc.get_workload(workload).phase == "succeeded"
        finally:
            await svc.stop()

    asyncio.run(second())
