"""The governor's executor with real processes: freezes and thaws follow the plan, hints are
authenticated, thaw-before-signal lets a frozen workload exit cleanly, and close() leaves no
process stopped. Both mechanisms run where available (cgroup v2 needs a writable hierarchy).
No assertion here is about timing; waits have generous timeouts."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import fgpu
from fgpu.agent.backend import SimulatedBackend
from fgpu.agent.events import PAUSED, RESUMED
from fgpu.agent.governor.activity import HintListener
from fgpu.agent.governor.freezer import (
    CgroupFreezer,
    Freezer,
    Hastener,
    SignalFreezer,
    cgroup2_mount,
    stat_fields,
)
from fgpu.agent.governor.plan import (
    ComputeMode,
    GpuPolicy,
    PlannerConfig,
    PriorityPolicy,
    RunState,
)
from fgpu.agent.governor.runtime import GovernedWorkload, Governor, GovernorConfig
from fgpu.agent.launcher import Launcher, LaunchSpec, ProcessHandle
from fgpu.log_files import stream_text
from fgpu.sdk.wire import Message, encode

MS = 1_000_000
TIMEOUT_S = 15.0
SRC = str(Path(fgpu.__file__).resolve().parent.parent)
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": SRC}
SPIN = "while True: pass"
GPU = "GPU-00000000-sim0-0000-000000000000"


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def stopped(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] in "Tt"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@pytest.fixture(params=["signal", "cgroup"])
def freezer(request: pytest.FixtureRequest) -> Iterator[Freezer]:
    if request.param == "signal":
        yield SignalFreezer(hasten=True)
        return
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy here")
    root = mount / f"fgpu-test-{os.getpid()}"
    try:
        made = CgroupFreezer(root, hasten=True)
    except OSError as exc:
        pytest.skip(f"cgroup v2 not writable here: {exc}")
    yield made
    deadline = time.monotonic() + TIMEOUT_S
    while root.exists() and time.monotonic() < deadline:
        for group in made.recover():  # processes a failed test left, or not yet reaped
            for pid in made.pids_in(group):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            root.rmdir()
        time.sleep(0.01)


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[Callable[..., ProcessHandle]]:
    launcher = Launcher()
    handles: list[ProcessHandle] = []

    def launch(name: str, code: str = SPIN) -> ProcessHandle:
        spec = LaunchSpec(
            workload_id=name,
            argv=[sys.executable, "-c", code],
            log_dir=tmp_path / "logs",
            env=dict(ENV, FGPU_AGENT_SOCKET=str(tmp_path / "agent.sock")),
            gpu_uuids=[GPU],
            agent_socket=str(tmp_path / "agent.sock"),
        )
        handle = launcher.launch(spec)
        handles.append(handle)
        return handle

    yield launch
    for handle in handles:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(handle.pgid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(handle.pgid, signal.SIGCONT)


def governed(name: str, handle: ProcessHandle, share: int, **kw: object) -> GovernedWorkload:
    return GovernedWorkload(
        workload_id=name,
        handle=handle,
        gpu_uuids=(GPU,),
        compute_milli=(share,),
        **kw,  # type: ignore[arg-type]
    )


def test_freezes_and_thaws_follow_the_plan(
    freezer: Freezer, launched: Callable[..., ProcessHandle]
) -> None:
    clock = FakeClock()
    config = GovernorConfig(gpu_policy=GpuPolicy(mode=ComputeMode.STRICT))
    gov = Governor([GPU], config=config, freezer=freezer, clock=clock)
    handle = launched("alone")
    gov.update([governed("alone", handle, 400)])
    try:
        assert gov.step().states == {"alone": RunState.RUNNING}
        assert not freezer.is_frozen(handle)

        clock.now = 40 * MS  # its 40 ms of the 100 ms period are used
        assert gov.step().states == {"alone": RunState.FROZEN_BY_SHARE}
        assert freezer.is_frozen(handle)
        if isinstance(freezer, SignalFreezer):
            assert all(stopped(p) for p in freezer.pids(handle))

        clock.now = 100 * MS  # next period
        assert gov.step().states == {"alone": RunState.RUNNING}
        assert not freezer.is_frozen(handle)
        assert not any(stopped(p) for p in freezer.pids(handle))
    finally:
        gov.close()


def test_close_leaves_no_process_stopped(
    freezer: Freezer, launched: Callable[..., ProcessHandle]
) -> None:
    clock = FakeClock()
    gov = Governor([GPU], freezer=freezer, clock=clock)
    high = launched("high")
    lows = [launched(f"low{i}") for i in range(3)]
    gov.update(
        [governed("high", high, 400, priority=125)]
        + [governed(f"low{i}", h, 200) for i, h in enumerate(lows)],
    )
    gov.step()  # high is busy (no hints: assumed busy): the others are paused
    assert all(freezer.is_frozen(h) for h in lows)
    pids = [p for h in [high, *lows] for p in freezer.pids(h)]
    assert len(pids) == 4

    gov.close()

    assert not any(freezer.is_frozen(h) for h in lows)
    assert not any(stopped(p) for p in pids)
    assert all(stat_fields(p) is not None for p in pids)  # thawed, not killed


def test_thaw_before_signal_lets_a_frozen_workload_exit_cleanly(
    freezer: Freezer, launched: Callable[..., ProcessHandle], tmp_path: Path
) -> None:
    trap = (
        "import signal, sys, time\n"
        "def bye(*_):\n"
        "    print('clean exit', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('ready', flush=True)\n"
        "while True: pass\n"
    )
    gov = Governor([GPU], freezer=freezer)
    high = launched("high")
    low = launched("low", trap)
    wait_for(lambda: "ready" in stream_text(low.stdout_path), "the handler to be installed")
    gov.update([governed("high", high, 500, priority=125), governed("low", low, 500)])
    gov.start()
    try:
        wait_for(lambda: freezer.is_frozen(low), "the low-priority workload to be paused")

        gov.before_signal("low")
        assert not freezer.is_frozen(low)
        state = Launcher().terminate(low, grace_s=10.0)

        assert state.exit_code == 0
        assert "clean exit" in stream_text(low.stdout_path)
        assert [v.workload_id for v in gov.snapshot().workloads] == ["high"]
        kinds = [(e.workload_id, e.kind) for e in gov.events.since()]
        assert ("low", PAUSED) in kinds
    finally:
        gov.close()


def test_hints_set_activity_and_spoofed_hints_are_dropped(
    freezer: Freezer, launched: Callable[..., ProcessHandle], tmp_path: Path
) -> None:
    listener = HintListener(tmp_path / "agent.sock")
    idle = "import fgpu.sdk, time\nfgpu.sdk.mark_idle()\ntime.sleep(600)\n"
    gov = Governor([GPU], freezer=freezer, listener=listener)
    handle = launched("w", idle)
    gov.update([governed("w", handle, 500)])
    gov.start()
    try:
        wait_for(
            lambda: gov.snapshot().workloads[0].activity == "hints", "the workload's idle hint"
        )
        view = gov.snapshot().workloads[0]
        assert (view.busy, view.state) == (False, RunState.RUNNING)

        # This test process is not part of workload "w": its claim is refused.
        spoof = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        spoof.sendto(encode(Message("w", "busy")), str(tmp_path / "agent.sock"))
        spoof.close()
        wait_for(lambda: gov.snapshot().dropped_hints == 1, "the spoofed hint to be refused")
        assert gov.snapshot().workloads[0].busy is False
    finally:
        gov.close()
    assert not (tmp_path / "agent.sock").exists()


def test_priority_pause_and_resume_with_hints(
    freezer: Freezer, launched: Callable[..., ProcessHandle], tmp_path: Path
) -> None:
    listener = HintListener(tmp_path / "agent.sock")
    flag = tmp_path / "go"
    burst = (
        "import fgpu.sdk, os, time\n"
        "fgpu.sdk.mark_idle()\n"
        f"while not os.path.exists({str(flag)!r}): time.sleep(0.01)\n"
        "with fgpu.sdk.busy():\n"
        "    end = time.monotonic() + 0.3\n"
        "    while time.monotonic() < end: pass\n"
        "time.sleep(600)\n"
    )
    config = GovernorConfig(planner=PlannerConfig(resume_after_ns=100 * MS))
    gov = Governor([GPU], config=config, freezer=freezer, listener=listener)
    high = launched("high", burst)
    low = launched("low")
    gov.update([governed("high", high, 500, priority=125), governed("low", low, 500)])
    gov.start()
    try:
        # Until its first hint, high counts as busy; once idle (plus hysteresis) low runs.
        wait_for(lambda: gov.snapshot().workloads[0].activity == "hints", "high's idle hint")
        wait_for(lambda: gov.snapshot().workloads[1].state is RunState.RUNNING, "low to run")
        assert not freezer.is_frozen(low)
        cursor = gov.events.since()[-1].seq if gov.events.since() else 0

        flag.touch()
        wait_for(lambda: any(e.kind == RESUMED for e in gov.events.since(cursor)), "a resume")

        events = [(e.workload_id, e.kind, e.reason) for e in gov.events.since(cursor)]
        assert events == [("low", PAUSED, "priority"), ("low", RESUMED, "priority")]
        pause = gov.events.since(cursor)[0]
        assert pause.message == "paused: high (priority 125) is busy on " + GPU
        assert not freezer.is_frozen(low)
    finally:
        gov.close()


def test_memory_reports_reach_the_simulated_backend(
    freezer: Freezer, launched: Callable[..., ProcessHandle], tmp_path: Path
) -> None:
    backend = SimulatedBackend("1xA100-40GB")
    gpu = backend.gpus()[0].uuid
    listener = HintListener(tmp_path / "agent.sock")
    gov = Governor([gpu], freezer=freezer, listener=listener, backend=backend)
    code = "import fgpu.sdk, time\nfgpu.sdk.report_memory(1234)\ntime.sleep(600)\n"
    handle = launched("w", code)
    gov.update(
        [GovernedWorkload(workload_id="w", handle=handle, gpu_uuids=(gpu,), compute_milli=(500,))]
    )
    gov.start()
    try:
        wait_for(lambda: bool(backend.process_memory()), "the memory report")
        [report] = backend.process_memory()
        assert (report.gpu_uuid, report.used_mib) == (gpu, 1234)
        assert report.pid in freezer.pids(handle)
    finally:
        gov.close()


def test_update_rejects_overbooked_gpus_and_unknown_gpus(
    launched: Callable[..., ProcessHandle],
) -> None:
    gov = Governor([GPU], freezer=SignalFreezer())
    handle = launched("a")
    try:
        with pytest.raises(ValueError, match="over 1000"):
            gov.update([governed("a", handle, 700), governed("b", handle, 400)])
        other = GovernedWorkload(
            workload_id="c", handle=handle, gpu_uuids=("GPU-other",), compute_milli=(100,)
        )
        with pytest.raises(ValueError, match="not governed"):
            gov.update([other])
    finally:
        gov.close()


def test_a_squeezed_share_is_lent_and_its_workload_paused_while_the_squeezer_is_busy(
    freezer: Freezer, launched: Callable[..., ProcessHandle]
) -> None:
    # the trial's GPU: low1 and low2 at 500, low2 squeezed by a critical 500 (1500 in all)
    clock = FakeClock()
    gov = Governor([GPU], freezer=freezer, clock=clock)
    low1, low2, crit = launched("low1"), launched("low2"), launched("crit")
    try:
        with pytest.raises(ValueError, match="not squeezed add up to 1500 milli"):
            gov.update(
                [
                    governed("low1", low1, 500, priority=25),
                    governed("low2", low2, 500, priority=25),
                    governed("crit", crit, 500, priority=125),
                ]
            )
        gov.update(
            [
                governed("low1", low1, 500, priority=25),
                governed("low2", low2, 500, priority=25, squeezed_by=("crit",)),
                governed("crit", crit, 500, priority=125),
            ]
        )
        decided = gov.step()
        assert decided.states == {
            "low1": RunState.FROZEN_BY_PRIORITY,
            "low2": RunState.FROZEN_BY_PRIORITY,
            "crit": RunState.RUNNING,
        }
        assert decided.blockers["low2"] == f"paused: squeezed by crit, which is busy on {GPU}"
        assert freezer.is_frozen(low1)
        assert freezer.is_frozen(low2)
        assert not freezer.is_frozen(crit)
        views = {v.workload_id: v for v in gov.snapshot().workloads}
        assert set(views) == {"low1", "low2", "crit"}

        # released (the squeezer ended): the service lists low2 without squeezed_by
        gov.update(
            [governed("low1", low1, 500, priority=25), governed("low2", low2, 500, priority=25)]
        )
        clock.now = 10 * MS
        decided = gov.step()
        assert RunState.FROZEN_BY_PRIORITY not in decided.states.values()
        assert not freezer.is_frozen(crit)
    finally:
        gov.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="changing another process's policy needs root")
def test_hastener_boosts_runnable_tasks_and_restores_their_policy(
    launched: Callable[..., ProcessHandle],
) -> None:
    handle = launched("w")
    wait_for(lambda: stat_fields(handle.pgid) is not None, "the workload to start")
    hastener = Hastener()
    os.killpg(handle.pgid, signal.SIGSTOP)
    try:
        wait_for(lambda: stopped(handle.pgid), "the task to stop")
        hastener.boost([handle.pgid])  # a stopped task is left alone
        assert os.sched_getscheduler(handle.pgid) == os.SCHED_OTHER
        os.killpg(handle.pgid, signal.SIGCONT)
        wait_for(lambda: stat_fields(handle.pgid)[0] == "R", "the task to run")  # type: ignore[index]

        hastener.boost([handle.pgid])
        assert os.sched_getscheduler(handle.pgid) & ~getattr(os, "SCHED_RESET_ON_FORK", 0) == (
            os.SCHED_FIFO
        )
        hastener.restore()
        assert os.sched_getscheduler(handle.pgid) == os.SCHED_OTHER
    finally:
        hastener.restore()


def test_a_released_workload_relaunched_under_its_id_is_governed_again(
    launched: Callable[..., ProcessHandle],
) -> None:
    gov = Governor([GPU], freezer=SignalFreezer(), clock=FakeClock())
    first = launched("w")
    try:
        gov.update([governed("w", first, 500)])
        gov.before_signal("w")
        gov.update([governed("w", first, 500)])  # still listed while it exits
        assert gov.snapshot().workloads == ()

        second = launched("w2")  # the relaunch: same id, new process
        gov.update([governed("w", second, 500)])
        assert [v.workload_id for v in gov.snapshot().workloads] == ["w"]
        assert gov.pids("w") == SignalFreezer().pids(second)
    finally:
        gov.close()


def test_a_compressed_hold_is_one_paused_and_one_resumed_event(
    freezer: Freezer, launched: Callable[..., ProcessHandle]
) -> None:
    """Under compress the low workload runs floor leases inside its hold; those are not
    pauses and resumes of their own (they flooded the event log, ten pairs a second)."""
    clock = FakeClock()
    config = GovernorConfig(gpu_policy=GpuPolicy(priority_policy=PriorityPolicy.COMPRESS))
    gov = Governor([GPU], config=config, freezer=freezer, clock=clock)
    high, low = launched("high"), launched("low")
    gov.update([governed("high", high, 500, priority=125), governed("low", low, 500)])
    try:
        lease_states = set()
        for step in range(100):  # one second, both busy (no hints: assumed busy)
            clock.now = step * 10 * MS
            lease_states.add(gov.step().states["low"])
        assert lease_states == {RunState.RUNNING, RunState.FROZEN_BY_PRIORITY}  # floor leases
        kinds = [e.kind for e in gov.events.since(0, "low")]
        assert kinds == ["paused"]
        assert gov.events.since(0, "low")[0].reason == "compress"

        gov.update([governed("low", low, 500)])  # the high one is gone: the hold ends
        clock.now = 2_000 * MS
        gov.step()
        assert [e.kind for e in gov.events.since(0, "low")] == ["paused", "resumed"]
    finally:
        gov.close()


@pytest.mark.parametrize("mode", [ComputeMode.FAIR, ComputeMode.STRICT])
def test_the_achieved_shares_of_one_gpu_add_up_to_at_most_one(
    mode: ComputeMode, launched: Callable[..., ProcessHandle]
) -> None:
    # two busy workloads (no hints: assumed busy) that run at the same time split the GPU;
    # `fgpu top` once showed 0.692 + 0.495 for such a pair
    clock = FakeClock()
    config = GovernorConfig(gpu_policy=GpuPolicy(mode=mode))
    gov = Governor([GPU], config=config, freezer=SignalFreezer(), clock=clock)
    a = governed("a", launched("a"), 600)
    gov.update([a])  # a runs alone for a while, then b comes
    try:
        for step in range(1, 201):  # 2 s of 10 ms steps
            clock.now = step * 10 * MS
            if step == 50:
                gov.update([a, governed("b", launched("b"), 400)])
            gov.step()
            achieved = {v.workload_id: v.achieved_milli for v in gov.snapshot().workloads}
            assert sum(achieved.values()) <= 1000, (step, achieved)
        assert achieved["a"] > 0, achieved
        assert achieved["b"] > 0, achieved
        assert achieved["a"] >= achieved["b"], achieved  # the larger share gets more
    finally:
        gov.close()


@contextlib.contextmanager
def no_free_descriptors() -> Iterator[None]:
    """Every file descriptor of this process taken (the soft ``RLIMIT_NOFILE`` lowered to
    just above the highest open one, the rest filled), as when a flood of connections took
    them; restored after."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(name) for name in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 8, hard))
    taken: list[int] = []
    try:
        while True:
            try:
                taken.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        with pytest.raises(OSError, match="Too many open files"):
            os.open("/dev/null", os.O_RDONLY)  # really none left
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_cgroup_freezer_freezes_and_thaws_with_no_descriptor_left(
    freezer: Freezer, launched: Callable[..., ProcessHandle]
) -> None:
    """Issue 27: a flood of connections took every descriptor and the governor failed its
    freezes (it opened ``cgroup.freeze`` per freeze). Its files stay open from adoption."""
    if not isinstance(freezer, CgroupFreezer):
        pytest.skip("the signal freezer has no control files (it reads /proc per look)")
    handle = launched("starved")
    freezer.adopt(handle)
    wait_for(lambda: bool(freezer.pids(handle)), "the workload in its cgroup")
    try:
        with no_free_descriptors():
            freezer.freeze(handle)
            assert freezer.wait_frozen(handle, TIMEOUT_S)
            assert freezer.is_frozen(handle)
            freezer.thaw(handle)
            frozen_after_thaw = freezer.is_frozen(handle)
        assert not frozen_after_thaw
    finally:
        freezer.release(handle)


class Segment:
    """A stand-in for a workload's launch gate where only its presence is looked at (the
    governor releases it when the workload goes)."""

    def release(self) -> None:
        return None


def test_the_loop_reads_segments_every_5_ms_only_where_that_is_news(
    launched: Callable[..., ProcessHandle],
) -> None:
    """The loop wakes every GATE_POLL_NS for a workload held at its gate, or using CUDA
    where its device time counts (strict, or neighbours); not for one running alone with a
    fair share, or one that has not used CUDA yet (device time is charged as wall time until
    its first launch is seen, at the latest at the period's wake-up)."""
    gov = Governor([GPU], freezer=SignalFreezer(hasten=True), clock=FakeClock())
    try:
        a, b = launched("a"), launched("b")
        gov.update([governed("a", a, 1000)])
        record = gov._records["a"]
        assert not gov._gates_to_watch()  # no segment at all
        record.gate = Segment()  # type: ignore[assignment]
        assert not gov._gates_to_watch()  # running, no CUDA yet
        record.cuda = True
        assert not gov._gates_to_watch()  # alone on its GPU, fair
        record.state = RunState.FROZEN_BY_SHARE
        assert gov._gates_to_watch()  # held: its launches at the gate are the news
        record.state = RunState.RUNNING
        gov.update([governed("a", a, 1000, mode=ComputeMode.STRICT)])
        gov._records["a"].gate, gov._records["a"].cuda = Segment(), True  # type: ignore[assignment]
        assert gov._gates_to_watch()  # a strict budget counts its device time
        gov.update([governed("a", a, 500), governed("b", b, 500)])
        gov._records["a"].gate, gov._records["a"].cuda = Segment(), True  # type: ignore[assignment]
        assert gov._gates_to_watch()  # a neighbour on its GPU
    finally:
        gov.close()
