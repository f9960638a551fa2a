"""Nothing stays frozen without the service (issue 14, point 4).

A service killed with SIGKILL while the governor holds a workload frozen leaves a watchdog
behind that thaws it at once (the test waits on the thaw with a generous deadline; it does
not time it); the same for the SIGSTOP freezer, driven by an agent in a child process that
is killed; and empty cgroups that dead agents left are removed when a service starts.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from fgpu.agent.governor.freezer import CgroupFreezer, cgroup2_mount
from tests.integration.test_service_governor import critical_until, stopped
from tests.serverproc import ServerProcess, wait_for

LOW = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(300)"]


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    root = Path(tempfile.mkdtemp(prefix="fgpu-watchdog-", dir="/tmp"))
    proc = ServerProcess(root, "1xA100-40GB")
    try:
        proc.start()
        yield proc
    finally:
        if proc.process is not None and proc.process.poll() is not None:
            proc.start()  # a killed server: start again so that cleanup can cancel
        proc.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def test_a_killed_service_leaves_nothing_frozen(server: ServerProcess) -> None:
    flag = server.root / "never"
    low = server.submit("-p", "low", "-g", "0.25", "--grace", "1", command=LOW)
    server.wait_phase(low, "running")
    critical = server.submit(
        "-p", "critical", "-g", "0.5", "--grace", "1", command=critical_until(flag)
    )
    server.wait_phase(critical, "running")
    pgid = int(server.handle(low)["pgid"])
    wait_for(lambda: stopped(pgid), "the low-priority workload to be paused")

    server.kill()  # SIGKILL: the service thaws nothing itself
    wait_for(lambda: not stopped(pgid), "the watchdog to thaw the paused workload")
    assert psutil.Process(pgid).is_running()


AGENT = """
import os, signal, subprocess, sys, time
from fgpu.agent.governor.freezer import SignalFreezer
from fgpu.agent.governor.watchdog import WatchedFreezer
from fgpu.agent.process import ProcessHandle, start_ticks
from pathlib import Path

child = subprocess.Popen(["sleep", "300"], start_new_session=True)
handle = ProcessHandle(
    workload_id="w", pid=child.pid, create_time=0.0, pgid=child.pid,
    stdout_path=Path("/dev/null"), stderr_path=Path("/dev/null"),
    exit_path=Path("/nonexistent"), start_ticks=start_ticks(child.pid),
)
freezer = WatchedFreezer(SignalFreezer())
freezer.adopt(handle)
freezer.freeze(handle)
assert freezer.wait_frozen(handle, 30.0)
print(child.pid, freezer.watchdog.process.pid, flush=True)
time.sleep(300)
"""


def test_the_signal_freezer_is_thawed_when_its_agent_is_killed() -> None:
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child = 0
    try:
        assert agent.stdout is not None
        line = agent.stdout.readline()
        assert line, "the agent did not freeze its workload"
        child, watchdog = (int(x) for x in line.split())
        assert psutil.Process(child).status() == psutil.STATUS_STOPPED
        agent.kill()
        agent.wait()
        wait_for(
            lambda: psutil.Process(child).status() != psutil.STATUS_STOPPED,
            "the watchdog to SIGCONT the workload",
        )
        wait_for(lambda: not psutil.pid_exists(watchdog) or _zombie(watchdog), "it to exit")
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_empty_cgroups_that_dead_agents_left_are_removed() -> None:
    """Under a parent of the test's own (the shared ``fgpu`` parent may hold other live
    agents' subtrees on this machine)."""
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy here")
    parent = mount / f"fgpu-test-{secrets.token_hex(4)}"
    left = parent / "dead-agent"
    try:
        (left / "w-123").mkdir(parents=True)
    except OSError as exc:
        pytest.skip(f"cannot create cgroups under {mount}: {exc}")
    freezer = CgroupFreezer(parent / "this-agent")
    try:
        assert freezer.remove_empty_neighbours() == [], "a fresh neighbour may be alive"
        assert left.exists()
        # what a start does with neighbours older than NEIGHBOUR_AGE_S (cgroupfs keeps no
        # settable times, so the age is what the test chooses)
        removed = freezer.remove_empty_neighbours(min_age_s=0)
        assert sorted(removed) == [left, left / "w-123"]
        assert not left.exists()
        assert freezer.root.is_dir()
    finally:
        freezer.close()
        for path in (left / "w-123", left, parent):
            if path.exists():
                path.rmdir()
