"""``fgpu run`` (submit, wait, stream both streams, exit with the job's code; Ctrl-C cancels)
and ``fgpu logs`` (both streams in order, ``--stdout``/``--stderr``, ``--tail``, ``--since``,
pending jobs, Ctrl-C on ``-f``), against ``fgpu serve`` as a real process with one simulated
A100 and real workload processes.

The jobs that write to both streams wait, after each write, until the service's ordered log
holds it (the job reads ``output.log`` under the server's state folder): the order they
check is then the order of writes, with no timing assumed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.serverproc import FGPU, TIMEOUT_S, ServerProcess, started_server, wait_for

SYNCED_JOB = r"""
import os, sys, time
from pathlib import Path
log = Path(sys.argv[1]) / "logs" / os.environ["FGPU_WORKLOAD_ID"] / "output.log"
def written(text):
    deadline = time.monotonic() + 60
    while text.encode() not in (log.read_bytes() if log.exists() else b""):
        assert time.monotonic() < deadline, "the log never showed " + text
        time.sleep(0.02)
for stream, text in (("out", "out-1\n"), ("err", "err-1\n"), ("out", "out-2\n")):
    (sys.stdout if stream == "out" else sys.stderr).write(text)
    written(text)
sys.exit(3)
"""
"""Writes out-1 (stdout), err-1 (stderr), out-2 (stdout), each once the log holds the one
before, and exits 3."""

GATED_JOB = r"""
import os, sys, time
from pathlib import Path
print(sys.argv[1])
gate = Path(sys.argv[2])
deadline = time.monotonic() + 120
while not gate.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print(sys.argv[3])
"""
"""Prints argv[1] (plain print: buffered unless PYTHONUNBUFFERED), waits for the file argv[2],
prints argv[3]."""


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with started_server("fgpu-run-", "1xA100-40GB") as running:
        yield running


@pytest.fixture(autouse=True)
def _clean(server: ServerProcess) -> Iterator[None]:
    yield
    for workload_id in server.workloads(all_=False):
        server.cli("cancel", workload_id, check=False)
    wait_for(lambda: not server.workloads(all_=False), "the workloads of the test to end")


def _env(server: ServerProcess) -> dict[str, str]:
    env = dict(server.env)
    env.pop("PYTHONUNBUFFERED", None)  # the service's default is what is tested
    return env


class Cli:
    """``fgpu ARGS`` as a running process whose stdout and stderr are collected as they come."""

    def __init__(self, server: ServerProcess, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*FGPU, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(server),
            cwd=server.root,
        )
        self.out = bytearray()
        self.err = bytearray()
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _pump(pipe: object, into: bytearray) -> None:
        assert pipe is not None
        for data in iter(lambda: os.read(pipe.fileno(), 4096), b""):  # type: ignore[attr-defined]
            into.extend(data)

    def wait(self) -> int:
        code = self.proc.wait(TIMEOUT_S * 2)
        for thread in self._threads:
            thread.join(TIMEOUT_S)
        return code

    def has(self, text: str, stream: str = "err") -> bool:
        return text.encode() in (self.err if stream == "err" else self.out)


def _job_lines(data: bytes) -> list[str]:
    """The lines a job wrote, without the ``fgpu:`` lines of the command itself."""
    return [ln for ln in data.decode().splitlines() if not ln.startswith("fgpu: ")]


def test_run_streams_both_outputs_and_exits_with_the_job_code(server: ServerProcess) -> None:
    cli = Cli(
        server, "run", "-g", "0.5", "--", sys.executable, "-c", SYNCED_JOB, str(server.state_dir)
    )
    assert cli.wait() == 3, cli.err.decode()
    assert _job_lines(cli.out) == ["out-1", "out-2"]
    assert _job_lines(cli.err) == ["err-1"]
    assert cli.has("failed: exit code 3")
    workload_id = cli.err.decode().split("submitted ")[1].split()[0]

    # logs: both streams, in the order written, to stdout
    assert server.cli("logs", workload_id).stdout == "out-1\nerr-1\nout-2\n"
    assert server.cli("logs", "--stdout", workload_id).stdout == "out-1\nout-2\n"
    assert server.cli("logs", "--stderr", workload_id).stdout == "err-1\n"
    assert server.cli("logs", "--tail", "2", workload_id).stdout == "err-1\nout-2\n"
    assert server.cli("logs", "--tail", "1", "--stdout", workload_id).stdout == "out-2\n"
    assert server.cli("logs", "--tail", "0", workload_id).stdout == ""
    assert server.cli("logs", "--since", "1h", workload_id).stdout == "out-1\nerr-1\nout-2\n"
    refused = server.cli("logs", "--since", "yesterday", workload_id, check=False)
    assert refused.returncode == 2
    assert "--since 'yesterday': not a duration" in refused.stderr
    refused = server.cli("logs", "--tail", "-1", workload_id, check=False)
    assert refused.returncode == 2
    assert "--tail" in refused.stderr


def test_run_of_a_job_killed_by_sigkill_exits_137(server: ServerProcess) -> None:
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    cli = Cli(server, "run", "-g", "0.5", "--", sys.executable, "-c", kill)
    assert cli.wait() == 137, cli.err.decode()
    assert cli.has("SIGKILL")


def test_run_waits_showing_the_pending_reason_then_runs(server: ServerProcess) -> None:
    blocker = server.submit("-g", "1", "--grace", "0", command=[*_sleep(600)])
    server.wait_phase(blocker, "running")
    cli = Cli(server, "run", "-g", "1", "--", sys.executable, "-c", "print('ran')")
    wait_for(lambda: cli.has(" is pending: waits for capacity"), "the reason it waits")
    assert cli.proc.poll() is None
    server.cli("cancel", blocker)
    assert cli.wait() == 0, cli.err.decode()
    assert _job_lines(cli.out) == ["ran"]


def test_ctrl_c_cancels_the_job_and_exits_130(server: ServerProcess, tmp_path: Path) -> None:
    gate = tmp_path / "never"
    cli = Cli(
        server,
        "run",
        "-g",
        "0.5",
        "--grace",
        "5",
        "--",
        sys.executable,
        "-c",
        GATED_JOB,
        "ready",
        str(gate),
        "late",
    )
    wait_for(lambda: cli.has("ready", "out"), "the job's first line through run")
    workload_id = cli.err.decode().split("submitted ")[1].split()[0]
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait() == 130, cli.err.decode()
    assert cli.has(f"cancelling {workload_id} (SIGTERM, then SIGKILL after 5 s)")
    assert server.wait_phase(workload_id, "cancelled")["phase"] == "cancelled"
    assert not cli.has("late", "out")


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_closed_terminal_or_sigterm_cancels_the_job_as_srun_does(
    server: ServerProcess, tmp_path: Path, signum: int
) -> None:
    gate = tmp_path / "never"
    cli = Cli(
        server, "run", "-g", "0.5", "--grace", "5", "--",
        sys.executable, "-c", GATED_JOB, "ready", str(gate), "late",
    )  # fmt: skip
    wait_for(lambda: cli.has("ready", "out"), "the job's first line through run")
    workload_id = cli.err.decode().split("submitted ")[1].split()[0]
    cli.proc.send_signal(signum)
    assert server.wait_phase(workload_id, "cancelled")["phase"] == "cancelled"
    assert cli.wait() != 0
    assert not cli.has("late", "out")


def test_a_second_ctrl_c_detaches_and_the_job_goes_on_cancelling(
    server: ServerProcess,
) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready'); "
        "time.sleep(600)"
    )
    cli = Cli(server, "run", "-g", "0.5", "--grace", "600", "--", sys.executable, "-c", stubborn)
    wait_for(lambda: cli.has("ready", "out"), "the job's first line through run")
    workload_id = cli.err.decode().split("submitted ")[1].split()[0]
    cli.proc.send_signal(signal.SIGINT)
    wait_for(lambda: cli.has(f"cancelling {workload_id}"), "run to say it cancels")
    wait_for(lambda: server.describe(workload_id)["stopping"], "the job to be stopping")
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait() == 130
    assert cli.has(f"detached; {workload_id} goes on being cancelled")
    detail = server.describe(workload_id)
    assert detail["phase"] == "running"
    assert detail["stopping"]
    os.killpg(server.handle(workload_id)["pgid"], signal.SIGKILL)  # (its grace is long)
    assert server.wait_phase(workload_id, "cancelled")["phase"] == "cancelled"


def test_run_of_a_preempted_job_shows_it_waiting_again_and_follows_its_restart(
    server: ServerProcess,
) -> None:
    job = "import os; print('up', os.environ['FGPU_WORKLOAD_ID']); import time; time.sleep(600)"
    cli = Cli(
        server, "run", "-g", "1", "-p", "low", "--grace", "0", "--", sys.executable, "-c", job
    )
    wait_for(lambda: cli.has("up", "out"), "the low-priority job to run")
    urgent = server.submit("-g", "1", "-p", "critical", "--grace", "0", command=_sleep(600))
    wait_for(lambda: cli.has(" is pending (restart 1): "), "run to show the job waiting again")
    server.wait_phase(urgent, "running")
    server.cli("cancel", urgent)
    wait_for(lambda: _job_lines(cli.out).count(_job_lines(cli.out)[0]) == 2, "the second start")
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait() == 130


def test_a_python_print_shows_in_the_log_before_the_job_ends(
    server: ServerProcess, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    job = [sys.executable, "-c", GATED_JOB, "early", str(gate), "late"]
    workload_id = server.submit("-g", "0.5", command=job)
    # the first print is in the log while the job still waits for the gate
    wait_for(
        lambda: server.cli("logs", workload_id).stdout == "early\n", "the first print in the log"
    )
    assert server.phase(workload_id) == "running"
    # --since a time after it shows only what comes next
    after_early = datetime.now().isoformat()
    gate.touch()
    server.wait_phase(workload_id, "succeeded")
    assert server.cli("logs", workload_id).stdout == "early\nlate\n"
    assert server.cli("logs", "--since", after_early, workload_id).stdout == "late\n"


def test_a_users_own_pythonunbuffered_is_kept(server: ServerProcess) -> None:
    show = "import os; print(repr(os.environ.get('PYTHONUNBUFFERED')))"
    result = server.cli(
        "run", "-g", "0.5", "--", sys.executable, "-c", show, env_extra={"PYTHONUNBUFFERED": ""}
    )
    assert result.stdout == "''\n"
    plain = subprocess.run(
        [*FGPU, "run", "-g", "0.5", "--", sys.executable, "-c", show],
        capture_output=True,
        text=True,
        env=_env(server),
        cwd=server.root,
        timeout=TIMEOUT_S * 2,
    )
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout == "'1'\n"


def test_logs_of_a_pending_job_say_so_with_the_reason(server: ServerProcess) -> None:
    blocker = server.submit("-g", "1", "--grace", "0", command=[*_sleep(600)])
    server.wait_phase(blocker, "running")
    waiting = server.submit("-g", "1", command=[*_sleep(1)])
    server.wait_phase(waiting, "pending")
    reason = server.describe(waiting)["reason"]
    result = server.cli("logs", waiting)
    assert result.stdout == ""
    assert f"{waiting} is pending: {reason}" in " ".join(result.stderr.split())


def test_logs_follow_interrupted_exits_130(server: ServerProcess, tmp_path: Path) -> None:
    job = [sys.executable, "-c", GATED_JOB, "ready", str(tmp_path / "never"), "late"]
    workload_id = server.submit("-g", "0.5", "--grace", "0", command=job)
    cli = Cli(server, "logs", "-f", workload_id)
    wait_for(lambda: cli.has("ready", "out"), "logs -f to print the job's first line")
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait() == 130
    assert server.phase(workload_id) == "running"  # following stops; the job goes on


def _sleep(seconds: float) -> list[str]:
    return [sys.executable, "-c", f"import time; time.sleep({seconds})"]


def test_a_workload_of_an_older_fgpu_shows_one_stream_and_says_why_not_both(
    server: ServerProcess,
) -> None:
    job = [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"]
    workload_id = server.submit("-g", "0.5", command=job)
    server.wait_phase(workload_id, "succeeded")
    # what an fgpu before the ordered log left: the two plain logs only
    folder = server.state_dir / "logs" / workload_id
    (folder / "output.log").unlink()
    (folder / "stdout.log").write_text("out\n")
    (folder / "stderr.log").write_text("err\n")
    assert server.cli("logs", "--stdout", workload_id).stdout == "out\n"
    assert server.cli("logs", "--stderr", "--tail", "1", workload_id).stdout == "err\n"
    refused = server.cli("logs", workload_id, check=False)
    assert refused.returncode == 2
    assert "kept no ordered log of both streams; ask for stdout or stderr" in refused.stderr
    refused = server.cli("logs", "--stdout", "--since", "1h", workload_id, check=False)
    assert refused.returncode == 2
    assert "--since: " in refused.stderr
    assert "kept no times" in refused.stderr


def test_run_of_a_job_cancelled_by_someone_else_or_not_found_says_so(
    server: ServerProcess,
) -> None:
    blocker = server.submit("-g", "1", "--grace", "0", command=_sleep(600))
    server.wait_phase(blocker, "running")
    cli = Cli(server, "run", "-g", "1", "--name", "never-runs", "--", *_sleep(1))
    wait_for(lambda: cli.has(" is pending: "), "run to show the pending reason")
    server.cli("cancel", "never-runs")
    assert cli.wait() == 143
    assert "cancelled: cancelled by" in cli.err.decode()
    server.cli("cancel", blocker)

    missing = Cli(server, "run", "-g", "0.5", "--", "no-such-command-fgpu")
    assert missing.wait() == 127
    assert "failed: exit code 127 (command not found: 'no-such-command-fgpu')" in (
        missing.err.decode()
    )


def test_run_and_logs_follow_wait_out_a_restart_of_the_server(tmp_path: Path) -> None:
    """A restart leaves running work running: ``run`` and ``logs -f`` say the server is
    away, wait for it, and go on to the job's end and code (a trial: both exited 1 with
    "no fgpu server" while the job went on)."""
    with started_server("fgpu-outage-", "1xA100-40GB") as server:
        gate = tmp_path / "gate"
        job = [sys.executable, "-u", "-c", GATED_JOB, "before", str(gate), "after"]
        run = Cli(server, "run", "-g", "0.5", "--", *job)
        wait_for(lambda: run.has("before", "out"), "the job's first line through run")
        workload_id = run.err.decode().split("submitted ")[1].split()[0]
        follow = Cli(server, "logs", "-f", workload_id)
        wait_for(lambda: follow.has("before", "out"), "the job's first line through logs -f")
        server.stop()
        for cli in (run, follow):  # each has looked and found no server
            wait_for(lambda cli=cli: cli.has("waiting up to 120 s"), "the outage said")
        server.start()
        gate.touch()
        assert run.wait() == 0, run.err.decode()
        assert follow.wait() == 0, follow.err.decode()
        for cli in (run, follow):
            assert _job_lines(bytes(cli.out)) == ["before", "after"]
            assert cli.has("the fgpu server answers again"), cli.err.decode()


def test_ctrl_c_while_the_server_is_away_says_the_job_goes_on_and_exits_130(
    tmp_path: Path,
) -> None:
    """The cancel cannot reach a server that is away: ``run`` says so and how to cancel
    later, and exits 130 (a re-trial: it exited 1 with "no fgpu server")."""
    with started_server("fgpu-outage-int-", "1xA100-40GB") as server:
        gate = tmp_path / "gate"
        run = Cli(server, "run", "-g", "0.5", "--", sys.executable, "-u", "-c", GATED_JOB,
                  "before", str(gate), "after")  # fmt: skip
        wait_for(lambda: run.has("before", "out"), "the job's first line through run")
        workload_id = run.err.decode().split("submitted ")[1].split()[0]
        server.stop()
        wait_for(lambda: run.has("waiting up to 120 s"), "the outage said")
        run.proc.send_signal(signal.SIGINT)
        assert run.wait() == 130, run.err.decode()
        assert run.has(f"cannot cancel {workload_id}: "), run.err.decode()
        assert run.has(f"`fgpu cancel {workload_id}` once the server answers")
        server.start()  # it went on: still running under the restarted server
        assert server.phase(workload_id) == "running"
        gate.touch()
        assert server.wait_phase(workload_id, "succeeded")["phase"] == "succeeded"
