"""Nothing a workload starts outlives it (issue 27, the attacker's points 1a, 1b and 2).

Real processes: each workload starts inside a cgroup of its own (the wrapper joins it before
it starts the command, so a child that calls ``setsid`` at once is still in it), and when the
workload ends -- by exiting, by cancel, or by a launch that fails half-way -- every process
in that cgroup is killed before the end is recorded. The cgroup tests need a writable cgroup
v2 hierarchy (root, here the hybrid host's ``/sys/fs/cgroup/unified``) and skip elsewhere with
the reason; without one only the process group and session are reached (README).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fgpu.agent import launcher as launcher_module
from fgpu.agent.governor.freezer import cgroup2_mount
from fgpu.agent.hostlimits import HostLimiter
from fgpu.agent.launcher import Launcher, LaunchError, LaunchSpec, ProcessHandle, ProcessState
from fgpu.agent.process import DEAD_STATES, proc_stat
from fgpu.log_files import stream_text
from fgpu.server.fdbudget import FDS_PER_WORKLOAD, FLOOR_FDS, LAUNCH_FDS
from fgpu.server.service import Caller, Service
from fgpu.wire import SubmitRequest
from tests.localusers import ALICE, ensure_users, uid_of

TIMEOUT_S = 60.0
ME = Caller(os.getuid(), admin=True)


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat.state not in DEAD_STATES


def cgroup_of(pid: int) -> str:
    """The v2 line (``0::/path``) of ``/proc/PID/cgroup``."""
    text = Path(f"/proc/{pid}/cgroup").read_text()
    return next(line[3:] for line in text.splitlines() if line.startswith("0::"))


def need_cgroup_v2() -> None:
    mount = cgroup2_mount()
    if mount is None or not os.access(mount / "cgroup.procs", os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy here: workloads have no cgroup of their own")


@pytest.fixture
def limiter() -> Iterator[HostLimiter]:
    need_cgroup_v2()
    found = HostLimiter(f"test-{uuid.uuid4().hex[:8]}")
    yield found
    found.close()


@pytest.fixture
def strays() -> Iterator[list[int]]:
    """Pids a test's workloads left (killed at the end whatever the test found)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def escaper(pid_file: Path, then: str) -> str:
    """A shell line that starts a child which leaves the session and process group at once
    (``setsid``), waits until the child wrote its pid to ``pid_file``, then runs ``then``."""
    return (
        f"setsid sh -c 'echo $$ > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; exec sleep 300' "
        f"</dev/null >/dev/null 2>&1 & while [ ! -s {pid_file} ]; do sleep 0.01; done; {then}"
    )


def launch(
    tmp_path: Path, limiter: HostLimiter, line: str, uid: int | None = None
) -> tuple[ProcessHandle, list[str]]:
    workload_id = f"w{uuid.uuid4().hex[:8]}"
    group = limiter.prepare(workload_id, cpu_milli=0, memory_mib=0)
    assert group is not None, "every workload gets a cgroup where cgroup v2 is writable"
    handle = Launcher().launch(
        LaunchSpec(
            workload_id=workload_id,
            argv=[line],
            shell=True,
            log_dir=tmp_path,
            limits=group,
            uid=uid,
        )
    )
    return handle, list(group.join)


def wait_done(handle: ProcessHandle) -> ProcessState:
    launcher = Launcher()
    states: list[ProcessState] = []

    def finished() -> bool:
        states.append(launcher.poll(handle))
        return not states[-1].running

    wait_for(finished, f"{handle.workload_id} to end")
    return states[-1]


def test_a_child_that_calls_setsid_at_once_is_in_the_workloads_cgroup(
    tmp_path: Path, limiter: HostLimiter, strays: list[int], request: pytest.FixtureRequest
) -> None:
    # alice's workload: she cannot move her child out of the cgroup either
    ensure_users()
    shared = Path(tempfile.mkdtemp(prefix="fgpu-cg-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    shared.chmod(0o777)  # alice writes her child's pid here
    pid_file = shared / "child.pid"
    mount = cgroup2_mount()
    assert mount is not None
    out_of = mount / "cgroup.procs"  # the root cgroup: out of the workload's
    line = escaper(pid_file, f"echo $(cat {pid_file}) > {out_of} 2>/dev/null || echo refused")
    handle, groups = launch(tmp_path, limiter, line + "; exec sleep 300", uid=uid_of(ALICE))
    try:
        wait_for(lambda: pid_file.exists() and bool(pid_file.read_text().strip()), "its pid")
        child = int(pid_file.read_text())
        strays.append(child)
        own = next(
            Path(g).name for g in groups if limiter.track and Path(g).parent == limiter.track
        )
        assert cgroup_of(child) == cgroup_of(handle.pgid)
        assert cgroup_of(child).endswith("/" + own), cgroup_of(child)
        wait_for(lambda: "refused" in stream_text(handle.stdout_path), "alice's move refused")
        assert cgroup_of(child).endswith("/" + own)
    finally:
        Launcher().terminate(handle, grace_s=5.0)
    assert not alive(child), "the child outlived its workload"


def test_what_a_workload_left_running_is_killed_when_it_exits(
    tmp_path: Path, limiter: HostLimiter, strays: list[int]
) -> None:
    pid_file = tmp_path / "child.pid"
    handle, groups = launch(tmp_path, limiter, escaper(pid_file, "exit 0"))
    state = wait_done(handle)
    child = int(pid_file.read_text())
    strays.append(child)
    assert (state.exit_code, state.reason) == (0, None)
    # once the exit is recorded the leftover is gone, and so is the cgroup
    assert not alive(child), "the setsid child outlived its workload"
    assert not [g for g in groups if Path(g).exists()]


async def started_service(tmp_path: Path) -> Service:
    """A started service on one simulated A100, its store and logs in ``tmp_path``."""
    svc = Service.create(
        simulate_gpus="1xA100-40GB", state_dir=tmp_path, db=str(tmp_path / "fgpu.db")
    )
    await svc.start()
    return svc


async def child_pid(pid_file: Path) -> int:
    """The pid an :func:`escaper` child wrote to ``pid_file``, once it has."""
    loop = asyncio.get_running_loop()
    end = loop.time() + TIMEOUT_S
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert loop.time() < end, "the child did not start"
        await asyncio.sleep(0.02)
    return int(pid_file.read_text())


def test_cancel_and_time_limit_kill_leftovers_before_the_share_is_given_back(
    tmp_path: Path, strays: list[int]
) -> None:
    need_cgroup_v2()

    async def scenario() -> None:
        svc = await started_service(tmp_path)
        loop = asyncio.get_running_loop()
        started: list[str] = []
        try:
            for how in ("cancel", "time limit"):
                pid_file = tmp_path / f"{how.replace(' ', '-')}.pid"
                view = svc.submit(
                    ME,
                    SubmitRequest(
                        command=[escaper(pid_file, "sleep 300")],
                        shell=True,
                        gpu="0.1",
                        grace_s=1.0,
                        time="0:03" if how == "time limit" else None,
                    ),
                )
                started.append(view.id)
                end = loop.time() + TIMEOUT_S
                child = await child_pid(pid_file)
                strays.append(child)
                if how == "cancel":
                    svc.cancel(ME, view.id)
                while svc.get_workload(view.id, ME).phase not in ("cancelled", "failed"):
                    assert loop.time() < end, f"the workload did not end ({how})"
                    await asyncio.sleep(0.02)
                # its share is free now: nothing of it may still run
                assert not alive(child), f"the setsid child outlived the workload ({how})"
        finally:
            for workload_id in started:  # a failed check leaves nothing running
                with contextlib.suppress(Exception):
                    svc.cancel(ME, workload_id)
            end = loop.time() + TIMEOUT_S
            while loop.time() < end and any(
                svc.get_workload(w, ME).phase in ("running", "stopping") for w in started
            ):
                await asyncio.sleep(0.05)
            await svc.stop()

    asyncio.run(scenario())


def test_a_wrapper_killed_from_outside_names_only_what_left_its_process_group(
    tmp_path: Path, strays: list[int]
) -> None:
    """The wrapper SIGKILLed from outside: its process group is killed, and the reason counts
    apart only what had left the group (``setsid``) and was found in the cgroup: the group's
    own dying members, still in the cgroup a moment after the signal, are not counted again
    (a CI failure: "1 process(es) left in its cgroup" for the command itself)."""
    need_cgroup_v2()

    async def scenario() -> None:
        svc = await started_service(tmp_path)
        loop = asyncio.get_running_loop()
        try:
            pid_file = tmp_path / "child.pid"
            view = svc.submit(
                ME, SubmitRequest(command=[escaper(pid_file, "sleep 300")], shell=True, gpu="0.1")
            )
            end = loop.time() + TIMEOUT_S
            child = await child_pid(pid_file)
            strays.append(child)
            handle = json.loads((tmp_path / "logs" / view.id / "handle.json").read_text())
            os.kill(handle["pid"], signal.SIGKILL)
            while svc.get_workload(view.id, ME).phase != "failed":
                assert loop.time() < end, "the workload did not end"
                await asyncio.sleep(0.02)
            reason = svc.get_workload(view.id, ME).reason
            assert reason.endswith(
                "; its remaining processes were killed"
                "; 1 process(es) outside its process group were killed"
            ), reason
            assert not alive(child), "the setsid child outlived the workload"
        finally:
            await svc.stop()

    asyncio.run(scenario())


def test_a_launch_that_fails_half_way_kills_what_it_started(
    tmp_path: Path, limiter: HostLimiter, strays: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the wrapper started the command, then the launcher fails before it has the report
    # (what select() above descriptor 1023 did): nothing may run on untracked
    pid_file = tmp_path / "child.pid"
    real = launcher_module._read_ready_line

    def fails_after_start(fd: int, timeout_s: float) -> str:
        real(fd, timeout_s)
        wait_for(lambda: pid_file.exists() and bool(pid_file.read_text().strip()), "child")
        raise ValueError("filedescriptor out of range in select()")

    monkeypatch.setattr(launcher_module, "_read_ready_line", fails_after_start)
    workload_id = f"w{uuid.uuid4().hex[:8]}"
    group = limiter.prepare(workload_id, cpu_milli=0, memory_mib=0)
    assert group is not None
    with pytest.raises(LaunchError, match="what it had started was killed"):
        Launcher().launch(
            LaunchSpec(
                workload_id=workload_id,
                argv=[escaper(pid_file, "echo $$ > " + str(tmp_path / "main.pid") + "; sleep 300")],
                shell=True,
                log_dir=tmp_path,
                limits=group,
            )
        )
    child = int(pid_file.read_text())
    strays.append(child)
    assert not alive(child)
    main = tmp_path / "main.pid"
    if main.exists():
        strays.append(int(main.read_text()))
        assert not alive(int(main.read_text()))
    assert not [g for g in group.join if Path(g).exists()]


def test_a_launch_works_when_the_agent_has_descriptors_past_1023(tmp_path: Path) -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 1200:
        pytest.skip(f"the file limit here ({soft}) is too low to hold 1100 descriptors")
    held: list[int] = []
    try:
        while not held or held[-1] < 1100:  # the next pipes get numbers past 1023
            held.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
        handle = Launcher().launch(
            LaunchSpec(workload_id="hi", argv=["echo", "hi"], log_dir=tmp_path)
        )
        state = wait_done(handle)
    finally:
        for fd in held:
            os.close(fd)
    assert (state.exit_code, state.reason) == (0, None)
    assert stream_text(handle.stdout_path) == "hi\n"


def test_launches_wait_when_the_service_runs_short_of_descriptors() -> None:
    # bob's array of tiny workloads against the server's file limit (lowered here so that a
    # few dozen reach it): launches past it wait, pending with the reason; none fails half-way
    # and nothing runs untracked; once his work ends, another job runs
    from tests.serverproc import started_server, wait_for

    with started_server("fgpu-fds-", "1xA100-80GB") as server:
        assert server.process is not None
        pid = server.process.pid
        base = len(os.listdir(f"/proc/{pid}/fd"))
        limit = base + LAUNCH_FDS + FLOOR_FDS + 6 * FDS_PER_WORKLOAD + 8
        subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={limit}:{limit}"], check=True)
        server.cli("submit", "-g", "0.001", "--array", "0-29", "--", "sleep", "300")

        def held(listing: dict[str, dict[str, object]]) -> bool:
            return any(
                w["phase"] == "pending" and "file descriptors" in json.dumps(w)
                for w in listing.values()
            ) and not any(
                w["phase"] == "pending" and "file descriptors" not in json.dumps(w)
                for w in listing.values()
            )

        listing = server.wait_listing(held, "launches held for descriptors")
        phases = [w["phase"] for w in listing.values()]
        assert "failed" not in phases, listing
        running = [w for w in listing.values() if w["phase"] == "running"]
        assert running, listing
        assert len(os.listdir(f"/proc/{pid}/fd")) < limit
        assert "file limit (RLIMIT_NOFILE)" in server.server_log()  # raised, or said why not
        other = server.submit("-g", "0.001", command=["echo", "hi"])
        seen = server.wait_listing(
            lambda ls: (
                ls[other]["phase"] == "pending" and "file descriptors" in json.dumps(ls[other])
            ),
            "the other job held",
        )
        assert seen[other]["phase"] == "pending"
        for workload_id in [w for w, v in listing.items() if v["phase"] in ("running", "pending")]:
            server.cli("cancel", workload_id)
        done = server.wait_phase(other, "succeeded", "failed", timeout_s=120.0)
        assert done["phase"] == "succeeded", done
        assert server.cli("logs", other).stdout == "hi\n"
        final = server.workloads()
        assert not [w for w in final.values() if w["phase"] == "failed"], final
        wait_for(
            lambda: not [h for h in server.handles() if alive(int(h["pid"]))],
            "every workload's wrapper to end",
        )
