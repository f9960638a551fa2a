"""The launcher with real processes: environment, argv, cwd, logs, exit codes, signals,
pid-reuse guard, re-adoption after the launcher (or the whole agent process) is gone, and
running as another user."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from fgpu.agent.launcher import (
    Launcher,
    LaunchError,
    LaunchSpec,
    ProcessHandle,
    ProcessState,
    ProcessStatus,
)
from fgpu.log_files import stream_text
from fgpu.sdk import PYTHONPATH_DIR

PATH_ONLY = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
TIMEOUT_S = 15.0


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def wait_done(launcher: Launcher, handle: ProcessHandle) -> ProcessState:
    states: list[ProcessState] = []

    def finished() -> bool:
        states.append(launcher.poll(handle))
        return not states[-1].running

    wait_for(finished, f"{handle.workload_id} to end")
    return states[-1]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class TrackingLauncher(Launcher):
    """A Launcher that remembers what it started, so teardown can kill leftovers."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[ProcessHandle] = []

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        handle = super().launch(spec)
        self.started.append(handle)
        return handle


@pytest.fixture
def launcher() -> Iterator[TrackingLauncher]:
    tracking = TrackingLauncher()
    yield tracking
    for handle in tracking.started:  # whatever a failed test left running
        tracking.signal(handle, signal.SIGKILL)


@pytest.fixture
def leftovers() -> Iterator[list[ProcessHandle]]:
    """Handles launched by other Launchers in a test, killed at teardown too."""
    handles: list[ProcessHandle] = []
    yield handles
    for handle in handles:
        Launcher().signal(handle, signal.SIGKILL)


@pytest.fixture
def spec(tmp_path: Path) -> Callable[..., LaunchSpec]:
    def make(argv: list[str], **changes: object) -> LaunchSpec:
        fields: dict[str, object] = {
            "workload_id": "w1",
            "argv": argv,
            "log_dir": tmp_path / "logs",
            "cwd": str(tmp_path),
            "env": dict(PATH_ONLY),
        }
        fields.update(changes)
        return LaunchSpec(**fields)  # type: ignore[arg-type]

    return make


# Waits (at most about 20 s, so nothing outlives an interrupted run for long) for a file.
WAIT_FOR_GO = "i=0; while [ ! -e go ] && [ $i -lt 1000 ]; do sleep 0.02; i=$((i+1)); done; "

PRINT_ENV = textwrap.dedent(
    """
    import json, os
    names = ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "FGPU_WORKLOAD_ID",
             "FGPU_GPU_COMPUTE_MILLI", "FGPU_GPU_MEMORY_MIB", "FGPU_AGENT_SOCKET", "MY_VAR",
             "PYTEST_CURRENT_TEST"]
    print(json.dumps({n: os.environ.get(n) for n in names}))
    """,
)


def test_environment_reaches_the_child(launcher: Launcher, spec: Callable[..., LaunchSpec]) -> None:
    handle = launcher.launch(
        spec(
            [sys.executable, "-c", PRINT_ENV],
            workload_id="env-1",
            env={**PATH_ONLY, "MY_VAR": "mine", "FGPU_WORKLOAD_ID": "spoofed"},
            gpu_uuids=["GPU-aaaa", "MIG-bbbb"],
            compute_milli=500,
            memory_mib=5120,
            agent_socket="/run/fgpu/agent.sock",
        ),
    )
    assert wait_done(launcher, handle) == ProcessState(ProcessStatus.EXITED, 0)
    assert json.loads(stream_text(handle.stdout_path)) == {
        "CUDA_VISIBLE_DEVICES": "GPU-aaaa,MIG-bbbb",
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,MIG-bbbb",
        "FGPU_WORKLOAD_ID": "env-1",
        "FGPU_GPU_COMPUTE_MILLI": "500",
        "FGPU_GPU_MEMORY_MIB": "5120",
        "FGPU_AGENT_SOCKET": "/run/fgpu/agent.sock",
        "MY_VAR": "mine",
        "PYTEST_CURRENT_TEST": None,  # the agent's own environment does not leak in
    }


def test_argv_is_not_shell_interpreted(launcher: Launcher, spec: Callable[..., LaunchSpec]) -> None:
    handle = launcher.launch(
        spec([sys.executable, "-c", "import sys; print(sys.argv[1:])", "$HOME", "a;b", "*"]),
    )
    assert wait_done(launcher, handle).exit_code == 0
    assert stream_text(handle.stdout_path) == "['$HOME', 'a;b', '*']\n"


def test_shell_runs_the_joined_line(launcher: Launcher, spec: Callable[..., LaunchSpec]) -> None:
    handle = launcher.launch(
        spec(
            ["echo", "$FGPU_WORKLOAD_ID", "|", "tr", "a-z", "A-Z"], shell=True, workload_id="sh-1"
        ),
    )
    assert wait_done(launcher, handle).exit_code == 0
    assert stream_text(handle.stdout_path) == "SH-1\n"


def test_cwd_is_honoured(
    launcher: Launcher, spec: Callable[..., LaunchSpec], tmp_path: Path
) -> None:
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    handle = launcher.launch(
        spec([sys.executable, "-c", "import os; print(os.getcwd())"], cwd=str(workdir))
    )
    assert wait_done(launcher, handle).exit_code == 0
    assert stream_text(handle.stdout_path) == f"{workdir}\n"


def test_logs_are_per_workload_and_appended_on_relaunch(
    launcher: Launcher, spec: Callable[..., LaunchSpec], tmp_path: Path
) -> None:
    line = "import sys; print('out', sys.argv[1]); print('err', sys.argv[1], file=sys.stderr)"
    first = launcher.launch(spec([sys.executable, "-c", line, "1"], workload_id="logs-1"))
    assert wait_done(launcher, first).exit_code == 0
    other = launcher.launch(spec([sys.executable, "-c", line, "x"], workload_id="logs-2"))
    again = launcher.launch(spec([sys.executable, "-c", line, "2"], workload_id="logs-1"))
    assert wait_done(launcher, other).exit_code == 0
    assert wait_done(launcher, again).exit_code == 0
    assert first.stdout_path == tmp_path / "logs" / "logs-1" / "stdout.log"
    assert stream_text(first.stdout_path) == "out 1\nout 2\n"
    assert stream_text(first.stderr_path) == "err 1\nerr 2\n"
    assert stream_text(other.stdout_path) == "out x\n"
    # each byte is stored once: the framed log holds both streams, no plain copy beside it
    folder = tmp_path / "logs" / "logs-1"
    assert not first.stdout_path.exists()
    assert not first.stderr_path.exists()
    assert sorted(p.name for p in folder.iterdir()) == ["exit.json", "output.log", "wrapper.log"]
    assert (folder / "wrapper.log").read_text() == ""  # the wrapper had nothing to say


def test_an_older_fgpus_plain_logs_are_set_aside_on_relaunch(
    launcher: Launcher, spec: Callable[..., LaunchSpec], tmp_path: Path
) -> None:
    folder = tmp_path / "logs" / "old-1"
    folder.mkdir(parents=True)
    (folder / "stdout.log").write_text("from the older fgpu\n")
    handle = launcher.launch(spec(["echo", "new"], workload_id="old-1"))
    assert wait_done(launcher, handle).exit_code == 0
    assert stream_text(handle.stdout_path) == "new\n"
    assert (folder / "stdout.log.old").read_text() == "from the older fgpu\n"


@pytest.mark.parametrize(
    ("script", "code", "reason"),
    [
        ("exit 0", 0, None),
        ("exit 3", 3, None),
        ("kill -TERM $$", -15, "ended by SIGTERM"),
    ],
    ids=["zero", "three", "sigterm"],
)
def test_exit_codes_are_kept(
    launcher: Launcher,
    spec: Callable[..., LaunchSpec],
    script: str,
    code: int,
    reason: str | None,
) -> None:
    handle = launcher.launch(spec(["sh", "-c", script]))
    assert wait_done(launcher, handle) == ProcessState(ProcessStatus.EXITED, code, reason)
    assert launcher.read_exit(handle) == code
    assert Launcher().read_exit(handle) == code


def test_commands_that_cannot_start_are_results_not_crashes(
    launcher: Launcher, spec: Callable[..., LaunchSpec], tmp_path: Path
) -> None:
    not_executable = tmp_path / "script.sh"
    not_executable.write_text("#!/bin/sh\necho hi\n")
    cases = [
        (spec(["no-such-command-fgpu"]), 127, "command not found: 'no-such-command-fgpu'"),
        (
            spec(["true"], workload_id="w2", cwd=str(tmp_path / "missing")),
            127,
            f"working directory not found: {str(tmp_path / 'missing')!r}",
        ),
        (spec(["./script.sh"], workload_id="w3"), 126, "permission denied: './script.sh'"),
    ]
    for launch_spec, code, reason in cases:
        handle = launcher.launch(launch_spec)
        assert wait_done(launcher, handle) == ProcessState(ProcessStatus.EXITED, code, reason)
        assert stream_text(handle.stderr_path) == f"fgpu: {reason}\n"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"workload_id": "../escape"}, "cannot name a log directory"),
        ({"workload_id": ""}, "cannot name a log directory"),
        ({"argv": []}, "empty command"),
        ({"argv": ["  "], "shell": True}, "empty command"),
        ({"memory_mib": -1}, "must be >= 0"),
    ],
    ids=["path", "empty-id", "no-argv", "blank-shell", "negative"],
)
def test_invalid_specs_are_launch_errors(
    launcher: Launcher,
    spec: Callable[..., LaunchSpec],
    changes: dict[str, object],
    message: str,
) -> None:
    changes = dict(changes)
    argv = changes.pop("argv", ["true"])
    with pytest.raises(LaunchError, match=message):
        launcher.launch(spec(argv, **changes))


def test_unwritable_log_dir_is_a_launch_error(
    launcher: Launcher, spec: Callable[..., LaunchSpec], tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LaunchError, match="cannot prepare logs"):
        launcher.launch(spec(["true"], log_dir=blocker / "logs"))


GRANDCHILD = "sleep 30 & echo $! > grandchild.pid; echo ready; wait"


def test_signal_reaches_the_whole_group(
    launcher: Launcher, spec: Callable[..., LaunchSpec], tmp_path: Path
) -> None:
    handle = launcher.launch(spec(["sh", "-c", GRANDCHILD]))
    pid_file = tmp_path / "grandchild.pid"
    wait_for(lambda: stream_text(handle.stdout_path) == "ready\n", "the grandchild")
    grandchild = int(pid_file.read_text())
    assert os.getpgid(grandchild) == handle.pgid
    assert launcher.pids(handle) == sorted([handle.pgid, grandchild])
    assert launcher.signal(handle, signal.SIGTERM)
    assert wait_done(launcher, handle) == ProcessState(
        ProcessStatus.EXITED, -15, "ended by SIGTERM"
    )
    wait_for(lambda: gone(grandchild), "the grandchild to end")
    wait_for(lambda: not launcher.is_same_process(handle), "the wrapper to end")
    assert not launcher.signal(handle, signal.SIGTERM)  # nothing left to signal
    assert launcher.pids(handle) == []


def test_the_wrapper_passes_signals_on_to_the_workload(
    launcher: Launcher, spec: Callable[..., LaunchSpec]
) -> None:
    handle = launcher.launch(spec(["sleep", "30"]))
    assert handle.pgid != handle.pid  # the wrapper is outside the workload's group
    os.kill(handle.pid, signal.SIGTERM)  # to the wrapper alone
    assert wait_done(launcher, handle) == ProcessState(
        ProcessStatus.EXITED, -15, "ended by SIGTERM"
    )


def test_terminate_escalates_to_sigkill(
    launcher: Launcher, spec: Callable[..., LaunchSpec]
) -> None:
    handle = launcher.launch(spec(["sh", "-c", "trap '' TERM; echo ready; sleep 30"]))
    wait_for(lambda: stream_text(handle.stdout_path) == "ready\n", "the trap")
    started = time.monotonic()
    state = launcher.terminate(handle, grace_s=0.5)
    took = time.monotonic() - started
    assert state == ProcessState(ProcessStatus.EXITED, -9, "ended by SIGKILL")
    assert 0.5 <= took < 5


def test_terminate_returns_early_when_sigterm_is_obeyed(
    launcher: Launcher, spec: Callable[..., LaunchSpec]
) -> None:
    handle = launcher.launch(spec(["sleep", "30"]))
    started = time.monotonic()
    state = launcher.terminate(handle, grace_s=10)
    assert state == ProcessState(ProcessStatus.EXITED, -15, "ended by SIGTERM")
    assert time.monotonic() - started < 5


def test_terminate_thaws_a_stopped_workload(
    launcher: Launcher, spec: Callable[..., LaunchSpec]
) -> None:
    handle = launcher.launch(spec(["sleep", "30"]))
    assert launcher.signal(handle, signal.SIGSTOP)
    wait_for(lambda: psutil.Process(handle.pgid).status() == psutil.STATUS_STOPPED, "stop")
    state = launcher.terminate(handle, grace_s=10)
    assert state.exit_code == -15


def test_terminate_async(launcher: Launcher, spec: Callable[..., LaunchSpec]) -> None:
    handle = launcher.launch(spec(["sh", "-c", "trap '' TERM; echo ready; sleep 30"]))
    wait_for(lambda: stream_text(handle.stdout_path) == "ready\n", "the trap")
    state = asyncio.run(launcher.terminate_async(handle, grace_s=0.2))
    assert state.exit_code == -9


def test_terminate_of_a_finished_workload_just_reports(
    launcher: Launcher, spec: Callable[..., LaunchSpec]
) -> None:
    handle = launcher.launch(spec(["sh", "-c", "exit 5"]))
    wait_done(launcher, handle)
    assert launcher.terminate(handle, grace_s=10).exit_code == 5


def test_is_same_process_guards_against_pid_reuse(
    launcher: Launcher, spec: Callable[..., LaunchSpec]
) -> None:
    handle = launcher.launch(spec(["sleep", "30"]))
    assert launcher.is_same_process(handle)
    later = dataclasses.replace(handle, create_time=handle.create_time + 10, start_ticks=None)
    assert not launcher.is_same_process(later)
    assert handle.start_ticks is not None
    other_ticks = dataclasses.replace(handle, start_ticks=handle.start_ticks + 1)
    assert not launcher.is_same_process(other_ticks)
    # The pid now belongs to another process (here: this test), started at another time.
    recycled = dataclasses.replace(handle, pid=os.getpid())
    assert not launcher.is_same_process(recycled)
    rebooted = dataclasses.replace(handle, boot_id="another-boot")
    assert not launcher.is_same_process(rebooted)


def test_a_free_pid_is_not_the_same_process(
    launcher: Launcher, spec: Callable[..., LaunchSpec]
) -> None:
    handle = launcher.launch(spec(["true"]))
    wait_done(launcher, handle)  # the outcome is recorded just before the wrapper ends
    wait_for(lambda: not launcher.is_same_process(handle), "the wrapper to end")
    assert launcher.poll(handle).exit_code == 0


def test_re_adoption_after_the_launcher_is_discarded(
    spec: Callable[..., LaunchSpec], tmp_path: Path, leftovers: list[ProcessHandle]
) -> None:
    first = Launcher()
    handle = first.launch(spec(["sh", "-c", WAIT_FOR_GO + "exit 4"]))
    leftovers.append(handle)
    stored = json.dumps(handle.to_dict())
    del first

    second = Launcher()
    found = ProcessHandle.from_dict(json.loads(stored))
    assert found == handle
    assert second.is_same_process(found)
    assert second.poll(found) == ProcessState(ProcessStatus.RUNNING)
    (tmp_path / "go").touch()
    assert wait_done(second, found) == ProcessState(ProcessStatus.EXITED, 4)


AGENT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from fgpu.agent.launcher import Launcher, LaunchSpec
    spec = LaunchSpec(workload_id="adopt", argv=["sh", "-c", sys.argv[2]],
                      log_dir=Path(sys.argv[1]) / "logs", cwd=sys.argv[1],
                      env={"PATH": "/usr/bin:/bin"})
    print(json.dumps(Launcher().launch(spec).to_dict()), flush=True)
    time.sleep(60)
    """,
)


def test_re_adoption_after_the_agent_is_killed(
    tmp_path: Path, leftovers: list[ProcessHandle]
) -> None:
    script = WAIT_FOR_GO + "exit 7"
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(tmp_path), script],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None
        handle = ProcessHandle.from_dict(json.loads(agent.stdout.readline()))
        leftovers.append(handle)
    finally:
        agent.kill()  # SIGKILL: no clean-up in the agent
        agent.wait()
    launcher = Launcher()
    assert launcher.is_same_process(handle)
    assert launcher.poll(handle).running
    (tmp_path / "go").touch()
    assert wait_done(launcher, handle) == ProcessState(ProcessStatus.EXITED, 7)


def test_a_killed_wrapper_is_lost_and_its_group_can_still_be_killed(
    launcher: Launcher, spec: Callable[..., LaunchSpec]
) -> None:
    handle = launcher.launch(spec(["sleep", "30"]))
    os.kill(handle.pid, signal.SIGKILL)
    state = wait_done(launcher, handle)
    assert state.status is ProcessStatus.LOST
    assert state.reason == (
        f"the wrapper (pid {handle.pid}) ended without recording an exit code (killed by SIGKILL)"
    )
    # The command outlived its wrapper; the launcher still recognises and ends the group.
    assert launcher.signal(handle, signal.SIGKILL)
    wait_for(lambda: gone(handle.pgid), "the orphaned command to end")


def test_lost_when_the_record_is_gone_after_a_restart(
    launcher: Launcher, spec: Callable[..., LaunchSpec]
) -> None:
    handle = launcher.launch(spec(["true"]))
    wait_done(launcher, handle)
    wait_for(lambda: not launcher.is_same_process(handle), "the wrapper to end")
    handle.exit_path.unlink()
    state = Launcher().poll(handle)
    assert state.status is ProcessStatus.LOST


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")


@pytest.fixture
def nobody() -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user on this machine")
    return entry.pw_uid, entry.pw_gid


@ROOT_ONLY
def test_runs_as_another_user_when_root(
    launcher: Launcher, spec: Callable[..., LaunchSpec], nobody: tuple[int, int]
) -> None:
    uid, gid = nobody
    handle = launcher.launch(spec(["sh", "-c", "id -u; id -g; id -G"], cwd="/", uid=uid))
    assert wait_done(launcher, handle).exit_code == 0
    lines = stream_text(handle.stdout_path).split("\n")
    assert lines[:2] == [str(uid), str(gid)]
    assert "0" not in lines[2].split()  # root's groups are dropped


@ROOT_ONLY
def test_cwd_the_user_cannot_enter_is_refused(
    launcher: Launcher, spec: Callable[..., LaunchSpec], tmp_path: Path, nobody: tuple[int, int]
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    handle = launcher.launch(spec(["true"], cwd=str(private), uid=nobody[0]))
    assert wait_done(launcher, handle) == ProcessState(
        ProcessStatus.EXITED,
        126,
        f"working directory {str(private)!r} is not accessible to uid {nobody[0]}",
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the non-root refusal")
def test_switching_users_without_root_is_a_launch_error(
    launcher: Launcher, spec: Callable[..., LaunchSpec]
) -> None:
    with pytest.raises(LaunchError, match="not root"):
        launcher.launch(spec(["true"], uid=os.geteuid() + 1))


SYSTEM_PYTHON = "/usr/bin/python3"
README_SNIPPET = textwrap.dedent(
    """
    import fgpu.sdk
    with fgpu.sdk.busy():      # or fgpu.sdk.mark_busy() / fgpu.sdk.mark_idle()
        print("step")
    import sys; print(sys.path[1]); print(sys.path[2])
    """,
)


@pytest.mark.skipif(
    not os.path.exists(SYSTEM_PYTHON)
    or subprocess.run([SYSTEM_PYTHON, "-c", "import fgpu"], capture_output=True).returncode == 0,
    reason="needs a Python without fgpu installed",
)
def test_the_sdk_imports_in_a_python_without_fgpu(
    launcher: Launcher, spec: Callable[..., LaunchSpec], tmp_path: Path
) -> None:
    # the README's snippet, run as written by the system's python3, sends its hints
    import socket

    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(str(tmp_path / "agent.sock"))
    agent.settimeout(TIMEOUT_S)
    try:
        handle = launcher.launch(
            spec(
                [SYSTEM_PYTHON, "-c", README_SNIPPET],
                workload_id="sdk-1",
                env={**PATH_ONLY, "PYTHONPATH": "/users/own/path"},
                agent_socket=str(tmp_path / "agent.sock"),
            ),
        )
        assert wait_done(launcher, handle) == ProcessState(ProcessStatus.EXITED, 0), stream_text(
            handle.stderr_path
        )
        kinds = [json.loads(agent.recv(1024))["k"] for _ in range(2)]
    finally:
        agent.close()
    assert kinds == ["busy", "idle"]
    # the SDK's folder first, the workload's own PYTHONPATH kept after it
    assert stream_text(handle.stdout_path).splitlines() == [
        "step",
        PYTHONPATH_DIR,
        "/users/own/path",
    ]
