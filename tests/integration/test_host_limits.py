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
from fgpu.log_files import stream_text
from fgpu.server.service import Caller, Service
from fgpu.wire import SubmitRequest
from tests.localusers import ALICE, ensure_users, uid_of

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
    assert "allocated all" not in stream_text(handle.stdout_path)
    # the wrapper removed the workload's cgroup(s) once it ended
    assert not [p for p in limiter._dirs.values() for p in p.iterdir() if p.is_dir()]


def test_a_process_within_its_memory_limit_runs_to_the_end(
    tmp_path: Path, limiter: HostLimiter
) -> None:
    need(limiter, "memory")
    handle = launch(tmp_path, limiter, [sys.executable, "-c", HOG, "16"], memory_mib=256)
    state = wait_done(handle)
    assert (state.exit_code, state.reason) == (0, None)
    assert "allocated all" in stream_text(handle.stdout_path)


def quota_us(where: Path) -> int:
    """The CFS quota of a cgroup, microseconds per 100 ms period (v2 or v1)."""
    if (where / "cpu.max").exists():
        quota, period = (where / "cpu.max").read_text().split()
        assert period == "100000"
        return int(quota)
    assert (where / "cpu.cfs_period_us").read_text().strip() == "100000"
    return int((where / "cpu.cfs_quota_us").read_text())


def run_busy(
    tmp_path: Path, limiter: HostLimiter, cpu_milli: int, check: Callable[[Path], None]
) -> None:
    """Run four busy processes under ``cpu_milli``; ``check`` their cgroup while they run."""
    workload_id = f"w{uuid.uuid4().hex[:8]}"
    group = limiter.prepare(workload_id, cpu_milli=cpu_milli, memory_mib=0)
    assert group is not None
    where = Path(group.stat_dirs["cpu"])
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
        check(where)
    finally:
        launcher.terminate(handle, grace_s=5.0)
    wait_for(lambda: not where.exists(), "its cgroup to be removed")


def test_half_a_core_is_a_quota_of_50_ms_per_100_ms(tmp_path: Path, limiter: HostLimiter) -> None:
    need(limiter, "cpu")

    def check(where: Path) -> None:
        assert quota_us(where) == 50_000  # while its four busy processes run in it

    run_busy(tmp_path, limiter, 500, check)


def test_busy_processes_over_their_cpu_limit_are_throttled(
    tmp_path: Path, limiter: HostLimiter
) -> None:
    # The kernel throttles a cgroup in each period in which it used up its quota (the time
    # spent throttled is added when the throttle ends: v2 microseconds, v1 ns). A small
    # limit (20 ms per second) is reached even when other work keeps this machine's cores
    # busy; the limit at half a core is the same mechanism with a larger quota (above).
    need(limiter, "cpu")

    def throttled(where: Path) -> bool:
        stats = cpu_stat(where)
        waited = stats.get("throttled_usec", stats.get("throttled_time", 0))
        return stats.get("nr_throttled", 0) > 1 and waited > 0

    def check(where: Path) -> None:
        assert quota_us(where) == 2_000
        wait_for(lambda: throttled(where), "CPU throttling")

    run_busy(tmp_path, limiter, 20, check)


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


SYSTEM_PYTHON = "/usr/bin/python3"
ESCAPE = (
    "import sys\n"
    "for path, text in ((sys.argv[1], '0'), (sys.argv[2], str(1 << 40))):\n"
    "    try:\n"
    "        with open(path, 'w') as handle:\n"
    "            handle.write(text)\n"
    "    except OSError as exc:\n"
    "        print('refused', type(exc).__name__, flush=True)\n"
    "    else:\n"
    "        print('escaped', path, flush=True)\n"
    "chunks = [bytearray(1 << 20) for _ in range(512)]\n"
)


def test_another_users_job_cannot_lift_its_own_limit(tmp_path: Path, limiter: HostLimiter) -> None:
    need(limiter, "memory")
    ensure_users()
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON} to run as another user")
    tmp_path.chmod(0o755)
    workload_id = f"w{uuid.uuid4().hex[:8]}"
    group = limiter.prepare(workload_id, cpu_milli=0, memory_mib=64)
    assert group is not None
    memory_dir = Path(group.join[-1])
    limit_file = memory_dir / (
        "memory.max" if (memory_dir / "memory.max").exists() else "memory.limit_in_bytes"
    )
    home_procs = str(Path(group.home[-1]) / "cgroup.procs")
    handle = Launcher().launch(
        LaunchSpec(
            workload_id=workload_id,
            # the system's interpreter: this checkout's may not be readable to alice
            argv=[SYSTEM_PYTHON, "-c", ESCAPE, home_procs, str(limit_file)],
            log_dir=tmp_path,
            uid=uid_of(ALICE),
            limits=group,
        )
    )
    state = wait_done(handle)
    assert stream_text(handle.stdout_path).split("\n")[:2] == [
        "refused PermissionError",
        "refused PermissionError",
    ]
    assert (state.exit_code, state.reason) == (-9, "out of host memory (limit 64 MiB)")
