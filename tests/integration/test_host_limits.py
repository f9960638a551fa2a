"""``--cpu`` and ``--memory`` as limits (issue 25 point 2), with real processes over them.

Each test uses the cgroups of this host the way the service does (:class:`HostLimiter`:
cgroup v2 where it has the cpu and memory controllers, else the v1 hierarchies). Where none
is writable the tests skip with the reason the limiter gives, the reason that ``fgpu
nodes`` shows (tested without cgroups in tests/unit/test_host_limits.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fgpu.agent.governor.freezer import CgroupFreezer, cgroup2_mount
from fgpu.agent.hostlimits import HostLimiter, LimitGroup, cpu_stat, own_cgroups
from fgpu.agent.launcher import Launcher, LaunchSpec, ProcessHandle, ProcessState
from fgpu.server.service import Caller, Service
from fgpu.wire import SubmitRequest

TIMEOUT_S = 60.0
ME = Caller(os.getuid(), admin=True)

# touches every page, so the memory is really used; far past any limit below
HOG = (
    "import sys\n"
    "chunks = []\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    chunks.append(bytearray(1 << 20))\n"
    "print('allocated all', flush=True)\n"
)
BUSY = "import time\nwhile True:\n    pass\n"
# four busy processes: the group asks for four cores, so it reaches its half core in some
# period even when other work keeps this machine's cores busy
BUSY_FOUR = "import os\nfor _ in range(2):\n    os.fork()\nwhile True:\n    pass\n"


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def limiter() -> Iterator[HostLimiter]:
    found = HostLimiter(f"test-{uuid.uuid4().hex[:8]}")
    yield found
    found.close()


def need(limiter: HostLimiter, what: str) -> None:
    support = limiter.support
    if what == "memory" and not support.memory:
        pytest.skip(f"host memory limits cannot be enforced here: {support.memory_why}")
    if what == "cpu" and not support.cpu:
        pytest.skip(f"CPU limits cannot be enforced here: {support.cpu_why}")


def launch(tmp_path: Path, limiter: HostLimiter, argv: list[str], **limits: int) -> ProcessHandle:
    workload_id = f"w{uuid.uuid4().hex[:8]}"
    group = limiter.prepare(
        workload_id, cpu_milli=limits.get("cpu_milli", 0), memory_mib=limits.get("memory_mib", 0)
    )
    assert group is not None
    return Launcher().launch(
        LaunchSpec(workload_id=workload_id, argv=argv, log_dir=tmp_path, limits=group)
    )


def wait_done(handle: ProcessHandle) -> ProcessState:
    launcher = Launcher()
    states: list[ProcessState] = []

    def finished() -> bool:
        states.append(launcher.poll(handle))
        return not states[-1].running

    wait_for(finished, f"{handle.workload_id} to end")
    return states[-1]


def test_a_process_past_its_memory_limit_is_killed_with_that_reason(
    tmp_path: Path, limiter: HostLimiter
) -> None:
    need(limiter, "memory")
    handle = launch(tmp_path, limiter, [sys.executable, "-c", HOG, "512"], memory_mib=64)
    state = wait_done(handle)
    assert state.exit_code == -9, state
    assert state.reason == "out of host memory (limit 64 MiB)"
    assert "allocated all" not in handle.stdout_path.read_text()
    # the wrapper removed the workload's cgroup(s) once it ended
    assert not [p for p in limiter._dirs.values() for p in p.iterdir() if p.is_dir()]


def test_a_process_within_its_memory_limit_runs_to_the_end(
    tmp_path: Path, limiter: HostLimiter
) -> None:
    need(limiter, "memory")
    handle = launch(tmp_path, limiter, [sys.executable, "-c", HOG, "16"], memory_mib=256)
    state = wait_done(handle)
    assert (state.exit_code, state.reason) == (0, None)
    assert "allocated all" in handle.stdout_path.read_text()


def test_a_busy_process_with_half_a_core_is_throttled(tmp_path: Path, limiter: HostLimiter) -> None:
    need(limiter, "cpu")
    workload_id = f"w{uuid.uuid4().hex[:8]}"
    group = limiter.prepare(workload_id, cpu_milli=500, memory_mib=0)
    assert group is not None
    where = Path(group.stat_dirs["cpu"])
    quota = (
        (where / "cpu.max").read_text().split()
        if (where / "cpu.max").exists()
        else [(where / "cpu.cfs_quota_us").read_text().strip()]
    )
    assert quota[0] == "50000"  # 50 ms of each 100 ms period: half a core
    launcher = Launcher()
    handle = launcher.launch(
        LaunchSpec(
            workload_id=workload_id,
            argv=[sys.executable, "-c", BUSY_FOUR],
            log_dir=tmp_path,
            limits=group,
        )
    )
    try:
        procs = (where / "cgroup.procs").read_text().split()
        assert str(handle.pgid) in procs
        assert str(handle.pid) not in procs  # not the wrapper
        # what it forks stays in it
        wait_for(lambda: len((where / "cgroup.procs").read_text().split()) == 4, "its forks")

        # the kernel throttles it in each period in which it used its quota (the time it
        # spent throttled is added when the throttle ends: v2 microseconds, v1 ns)
        def throttled() -> bool:
            stats = cpu_stat(where)
            waited = stats.get("throttled_usec", stats.get("throttled_time", 0))
            return stats.get("nr_throttled", 0) > 1 and waited > 0

        wait_for(throttled, "CPU throttling")
    finally:
        launcher.terminate(handle, grace_s=5.0)
    wait_for(lambda: not where.exists(), "its cgroup to be removed")


def test_service_records_a_job_killed_by_its_memory_limit_as_failed(tmp_path: Path) -> None:
    async def scenario() -> None:
        svc = Service.create(
            simulate_gpus="1xA100-40GB", state_dir=tmp_path, db=str(tmp_path / "fgpu.db")
        )
        need(svc.host_limits, "memory")
        await svc.start()
        try:
            nodes = svc.nodes()
            assert [la.name for la in nodes[0].host_limits] == ["cpu-limit", "memory-limit"]
            assert nodes[0].host_limits[1].active
            view = svc.submit(
                ME,
                SubmitRequest(
                    command=[sys.executable, "-c", HOG, "512"],
                    gpu="0.5",
                    memory="64MiB",
                    cpu="500m",
                    grace_s=1.0,
                ),
            )
            loop = asyncio.get_running_loop()
            end = loop.time() + TIMEOUT_S
            while svc.get_workload(view.id, ME).phase not in ("failed", "succeeded"):
                assert loop.time() < end, "the job did not end"
                await asyncio.sleep(0.05)
            done = svc.get_workload(view.id, ME)
            assert done.phase == "failed"
            assert done.reason == "out of host memory (limit 64 MiB); exit code 137"
        finally:
            await svc.stop()

    asyncio.run(scenario())


def test_the_freezer_governs_the_workload_in_the_cgroup_it_started_in(tmp_path: Path) -> None:
    # on cgroup v2 a process is in one cgroup only: the freezer must use the host-limits
    # cgroup the wrapper started the command in, not move it out (which would lift the
    # limits). The freezer needs no controller, so this runs wherever cgroup v2 is writable.
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy is mounted")
    try:
        freezer = CgroupFreezer(mount / "fgpu" / f"test-{uuid.uuid4().hex[:8]}")
    except OSError as exc:
        pytest.skip(f"cgroup v2 is not writable here: {exc}")
    own = own_cgroups().get("", "/")
    group = freezer.root / f"job-l{uuid.uuid4().hex[:8]}"
    group.mkdir()
    limits = LimitGroup(join=(str(group),), home=(str(mount / own.lstrip("/")),))
    launcher = Launcher()
    handle = launcher.launch(
        LaunchSpec(
            workload_id="job", argv=[sys.executable, "-c", BUSY], log_dir=tmp_path, limits=limits
        )
    )
    try:
        assert CgroupFreezer.pids_in(group) == [handle.pgid]  # the wrapper left it
        freezer.adopt(handle)
        assert freezer.path(handle) == group
        assert not (freezer.root / f"job-{handle.pgid}").exists()
        freezer.freeze(handle)
        assert freezer.wait_frozen(handle, TIMEOUT_S)
        assert freezer.pids(handle) == [handle.pgid]
        freezer.thaw(handle)
    finally:
        launcher.terminate(handle, grace_s=5.0)
        freezer.release(handle)
        freezer.close()
    assert not group.exists()


def test_empty_folders_that_dead_services_left_are_removed_once_old(limiter: HostLimiter) -> None:
    if not limiter._dirs:
        pytest.skip(f"no writable cgroups here: {limiter.support.memory_why}")
    folder = next(iter(limiter._dirs.values()))
    left = folder.parent / f"test-dead-{uuid.uuid4().hex[:8]}"
    (left / "job-l0").mkdir(parents=True)
    try:
        assert limiter.remove_empty_neighbours() == []  # new: a live service may own it
        assert left.exists()
        removed = limiter.remove_empty_neighbours(min_age_s=0)
        assert left / "job-l0" in removed
        assert left in removed
        assert not left.exists()
    finally:
        with contextlib.suppress(OSError):
            (left / "job-l0").rmdir()
            left.rmdir()
