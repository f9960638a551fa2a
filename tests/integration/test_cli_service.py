"""End to end through the command line: ``fgpu serve`` as a real process on a temporary
socket with one simulated A100-40GB, the client commands run against it (in process, over
the real socket), and real workload processes.

Exit codes of the client commands: 0 done, 1 refused by the server or no server, 2 bad
usage or input.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from fgpu.cli import app
from fgpu.client import Client, ClientError
from fgpu.wire import SubmitRequest

TIMEOUT_S = 20.0
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    socket: Path
    root: Path

    def client(self) -> Client:
        return Client(self.socket)

    def phase(self, workload_id: str) -> str:
        with self.client() as client:
            return client.get_workload(workload_id).phase

    def wait_phase(self, workload_id: str, *phases: str) -> None:
        wait_for(lambda: self.phase(workload_id) in phases, f"{workload_id} in {phases}")


def start_server(root: Path, *extra: str) -> Server:
    socket = root / "run" / "fgpu.sock"
    root.mkdir(exist_ok=True)
    log = (root / "serve.log").open("ab")
    command = [sys.executable, "-m", "fgpu", "serve", "--socket", str(socket)]
    command += ["--db", str(root / "fgpu.db"), "--simulate-gpus", "1xA100-40GB"]
    command += ["--state-dir", str(root / "state"), *extra]
    process = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Server(process, socket, root)

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"fgpu serve exited: {(root / 'serve.log').read_text()}")
        try:
            with server.client() as client:
                client.health()
        except ClientError:
            return False
        return True

    wait_for(up, "fgpu serve to answer")
    return server


def stop_server(server: Server) -> int:
    server.process.send_signal(signal.SIGTERM)
    return server.process.wait(TIMEOUT_S)


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="fgpu-cli-", dir="/tmp"))
    folder.chmod(0o755)  # the other user of the identity tests must reach the socket
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Server]:
    running = start_server(root / "main")
    yield running
    with running.client() as client:
        for view in client.list_workloads():
            client.cancel(view.id)
    assert stop_server(running) == 0


@pytest.fixture
def fgpu(server: Server) -> Callable[..., Result]:
    """Run an ``fgpu`` command against the test server, in process."""
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(app, list(args), env={"FGPU_SOCKET": str(server.socket)})

    return run


def as_nobody(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AS_NOBODY, sys.executable, "-m", "fgpu", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={**os.environ, "HOME": "/", "FGPU_SOCKET": str(server.socket)},
    )


def submitted(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["id"])


@pytest.fixture
def clean(server: Server) -> Iterator[None]:
    """Cancel what a test left running, and wait until the GPU is free again."""
    yield
    with server.client() as client:
        for view in client.list_workloads():
            client.cancel(view.id)
        wait_for(lambda: not client.list_workloads(), "the GPU to be free")


# ---------------------------------------------------------------- sharing one GPU
@pytest.mark.usefixtures("clean")
def test_two_half_gpu_jobs_share_one_gpu_and_a_third_waits(
    fgpu: Callable[..., Result], server: Server
) -> None:
    first = submitted(fgpu("submit", "-g", "0.5", "--json", "--", "sleep", "30"))
    second = submitted(fgpu("submit", "-g", "0.5", "--name", "two", "--json", "--", "sleep", "30"))
    server.wait_phase(first, "running")
    server.wait_phase(second, "running")

    top = fgpu("top", "--json")
    assert top.exit_code == 0, top.output
    (gpu,) = json.loads(top.stdout)
    assert gpu["model"] == "A100-40GB"
    assert gpu["allocated_milli"] == 1000
    assert {h["workload_id"]: h["compute_milli"] for h in gpu["holders"]} == {
        first: 500,
        second: 500,
    }
    assert gpu["allocated_memory_mib"] == 40960

    third = submitted(fgpu("submit", "-g", "0.5", "--json", "--", "sleep", "30"))
    wait_for(lambda: "GPU" in fgpu("describe", third, "--json").stdout, "a wait reason")
    detail = json.loads(fgpu("describe", third, "--json").stdout)
    assert detail["phase"] == "pending"
    assert detail["reason"]
    assert detail["events"]
    text = fgpu("describe", third)
    assert text.exit_code == 0
    assert "Waiting because" in text.stdout
    assert third in text.stdout

    listing = fgpu("ls")
    assert listing.exit_code == 0
    assert first in listing.stdout
    assert "running" in listing.stdout

    cancelled = fgpu("cancel", first)
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stdout.startswith(f"{first}: ")
    server.wait_phase(first, "cancelled")
    server.wait_phase(third, "running")

    # several at once: each is tried, the unknown one is reported and sets the exit code
    both = fgpu("cancel", second, "nope", third)
    assert both.exit_code == 1
    assert both.stdout.splitlines()[0].startswith(f"{second}: ")
    assert both.stdout.splitlines()[1].startswith(f"{third}: ")
    assert "ID: no workload with the id, id prefix or name 'nope'" in both.stderr
    server.wait_phase(second, "cancelled")
    server.wait_phase(third, "cancelled")


@pytest.mark.usefixtures("clean")
def test_ls_json_lists_workloads_with_their_gpus(
    fgpu: Callable[..., Result], server: Server
) -> None:
    job = submitted(
        fgpu("submit", "-g", "0.25", "-p", "high", "-q", "default", "--json", "--", "sleep", "30")
    )
    server.wait_phase(job, "running")
    result = fgpu("ls", "--json")
    assert result.exit_code == 0
    (view,) = [v for v in json.loads(result.stdout) if v["id"] == job]
    assert {"id", "name", "phase", "queue", "priority", "gpus"} <= view.keys()
    assert (view["name"], view["phase"], view["queue"], view["priority"]) == (
        "sleep",
        "running",
        "default",
        100,
    )
    (grant,) = view["gpus"]
    assert grant["compute_milli"] == 250
    assert grant["memory_mib"] == 10240


def test_submit_prints_the_id_and_sends_cwd_and_environment(
    fgpu: Callable[..., Result], server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FGPU_TEST_MARK", "seen")
    result = fgpu("submit", "-g", "0.1", "--shell", "--", 'echo "$PWD $FGPU_TEST_MARK"')
    assert result.exit_code == 0, result.output
    job = result.stdout.strip()
    assert "submitted" in result.stderr
    server.wait_phase(job, "succeeded")
    assert fgpu("logs", job).stdout == f"{tmp_path} seen\n"


# ----------------------------------------------------------------------------- logs
def test_logs_stdout_stderr_and_follow(fgpu: Callable[..., Result], server: Server) -> None:
    job = fgpu("submit", "-g", "0.1", "--shell", "--", "echo out; echo err >&2").stdout.strip()
    server.wait_phase(job, "succeeded")
    # both streams by default (the order of two writes this close is the wrapper's reading
    # order; tests/integration/test_cli_run.py checks the order of spaced writes)
    assert sorted(fgpu("logs", job).stdout.splitlines()) == ["err", "out"]
    assert fgpu("logs", job, "--stdout").stdout == "out\n"
    assert fgpu("logs", job, "--stderr").stdout == "err\n"

    slow = fgpu("submit", "-g", "0.1", "--shell", "--", "echo a; sleep 1; echo b").stdout.strip()
    followed = fgpu("logs", "-f", slow)
    assert followed.exit_code == 0, followed.output
    assert followed.stdout == "a\nb\n"
    assert server.phase(slow) == "succeeded"
    # -f ends with the workload's exit code, as a shell gives it
    failing = fgpu("submit", "-g", "0.1", "--shell", "--", "echo c; exit 3").stdout.strip()
    followed = fgpu("logs", "-f", failing)
    assert followed.exit_code == 3, followed.output
    assert followed.stdout == "c\n"
    assert server.phase(failing) == "failed"


# -------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["submit", "-g", "0", "--", "true"], 2, "gpu"),
        (["submit", "-g", "-1", "--", "true"], 2, "gpu"),
        (["submit", "-g", "nan", "--", "true"], 2, "gpu"),
        (["submit", "-g", "1.5", "--", "true"], 2, "gpu"),
        (["submit", "-g", "0.5", "--mig-profile", "1g.5gb", "--", "true"], 2, "mig"),
        (["submit", "--gpu-memory", "100GiB", "--", "true"], 2, ""),
        (["submit", "--gpu-model", "Z100", "--", "true"], 2, "Z100"),
        (["submit", "-q", "nope", "--", "true"], 2, "queue"),
        (["submit"], 2, "give the command"),
        (["submit", "--", ""], 2, "command"),
        (["submit", "--bogus", "--", "true"], 2, "bogus"),
        (["describe", "nope"], 1, "nope"),
        (["describe", ""], 1, "ID '': empty; give a workload id"),
        (["cancel", ""], 1, "ID '': empty; give a workload id"),
        (["cancel", "nope"], 1, "nope"),
        (["logs", "nope"], 1, "nope"),
        (["queue", "rm", "nope"], 1, "nope"),
        (["queue", "set", "nope", "--quota", "1"], 1, "nope"),
        (["queue", "set", "default", "--limit", "1", "--no-limit"], 2, "exclude"),
    ],
    ids=[
        "fraction-0",
        "negative",
        "nan",
        "fraction-1.5",
        "g-and-mig",
        "memory-above-every-gpu",
        "unknown-model",
        "unknown-queue",
        "no-command",
        "empty-command",
        "unknown-option",
        "describe-unknown",
        "describe-empty",
        "cancel-empty",
        "cancel-unknown",
        "logs-unknown",
        "rm-unknown-queue",
        "set-unknown-queue",
        "limit-and-no-limit",
    ],
)
def test_bad_input_exits_with_a_message_and_stores_nothing(
    fgpu: Callable[..., Result], server: Server, args: list[str], code: int, message: str
) -> None:
    with server.client() as client:
        before = len(client.list_workloads(include_done=True))
    result = fgpu(*args)
    assert result.exit_code == code, result.output
    assert message.lower() in result.output.lower()
    with server.client() as client:
        assert len(client.list_workloads(include_done=True)) == before


def test_no_server_is_exit_1_with_how_to_start_one(root: Path) -> None:
    missing = root / "nothing" / "fgpu.sock"
    result = CliRunner().invoke(app, ["ls", "--socket", str(missing)])
    assert result.exit_code == 1
    assert f"no fgpu server at {missing}; start one with `fgpu serve`" in result.stderr


# ---------------------------------------------------------------------------- queues
def test_queue_create_ls_set_rm(fgpu: Callable[..., Result]) -> None:
    created = fgpu("queue", "create", "team-a", "--quota", "0.5", "--limit", "1", "--json")
    assert created.exit_code == 0, created.output
    view = json.loads(created.stdout)
    assert (view["name"], view["quota_milli"], view["limit_milli"]) == ("team-a", 500, 1000)
    # default owns the one GPU: the quotas now promise more than there is
    assert view["warnings"] == [
        "quotas add up to 1.5 GPUs, above the capacity of 1 GPU; guarantees are scaled down "
        "in proportion to quota when demand exceeds capacity"
    ]
    assert "warning: quotas add up to 1.5 GPUs" in created.stderr

    again = fgpu("queue", "create", "team-a")
    assert again.exit_code == 1, again.output

    listed = json.loads(fgpu("queue", "ls", "--json").stdout)
    assert {q["name"] for q in listed} >= {"default", "team-a"}

    changed = json.loads(fgpu("queue", "set", "team-a", "--priority", "60", "--json").stdout)
    assert (changed["quota_milli"], changed["limit_milli"], changed["priority"]) == (500, 1000, 60)
    unlimited = json.loads(fgpu("queue", "set", "team-a", "--no-limit", "--json").stdout)
    assert (unlimited["quota_milli"], unlimited["limit_milli"]) == (500, None)

    assert "team-a" in fgpu("queue", "ls").stdout
    removed = fgpu("queue", "rm", "team-a")
    assert removed.exit_code == 0, removed.output
    assert "team-a" not in {q["name"] for q in json.loads(fgpu("queue", "ls", "--json").stdout)}


def test_nodes_json_and_table(fgpu: Callable[..., Result]) -> None:
    (node,) = json.loads(fgpu("nodes", "--json").stdout)
    assert node["backend"] == "simulated"
    assert [g["model"] for g in node["gpus"]] == ["A100-40GB"]
    assert "1xA100-40GB" in fgpu("nodes").stdout


# ---------------------------------------------------------------------- other users
@needs_root
@pytest.mark.usefixtures("clean")
def test_another_user_may_not_cancel_or_manage_queues(
    fgpu: Callable[..., Result], server: Server
) -> None:
    job = submitted(fgpu("submit", "-g", "0.1", "--json", "--", "sleep", "30"))
    refused = as_nobody(server, "cancel", job)
    assert refused.returncode == 1, refused.stderr
    assert "error:" in refused.stderr
    assert server.phase(job) in ("pending", "running")

    queue = as_nobody(server, "queue", "create", "mine", "--quota", "1")
    assert queue.returncode == 1, queue.stderr
    listing = as_nobody(server, "ls", "--json")
    assert listing.returncode == 0, listing.stderr
    assert job in {v["id"] for v in json.loads(listing.stdout)}

    own = as_nobody(server, "submit", "-g", "0.1", "--json", "--", "sleep", "30")
    assert own.returncode == 0, own.stderr
    mine = json.loads(own.stdout)
    assert mine["owner_uid"] == 65534
    assert as_nobody(server, "cancel", mine["id"]).returncode == 0


# --------------------------------------------------------------------------- serve
def test_a_second_server_on_the_socket_is_refused(server: Server) -> None:
    command = [sys.executable, "-m", "fgpu", "serve", "--socket", str(server.socket)]
    command += ["--simulate-gpus", "1xA100-40GB", "--state-dir", str(server.root / "second")]
    second = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 2
    assert "another fgpu server" in second.stderr
    assert server.socket.exists()
    assert not (server.root / "second").exists(), "the refused server built a service"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "127.0.0.1:0"], "--listen needs a token"),
        (["--listen", "nowhere"], "--listen"),
        (["--token-file", "/nonexistent"], "--token-file is only used with --listen"),
        (["--listen", "127.0.0.1:0", "--token-file", "/nonexistent"], "cannot read"),
        (["--token-user", "0"], "--token-user is only used with --listen"),
        (["--admin", "no-such-user-here"], "--admin"),
        (["--log-level", "loud"], "--log-level"),
        (["--simulate-gpus", "3xZ100"], "Z100"),
        (["--policy", "no-such-policy"], "no-such-policy"),
        (["--db", "nosuchdialect://x"], "nosuchdialect"),
    ],
    ids=[
        "listen-no-token",
        "bad-listen",
        "token-without-listen",
        "token-missing",
        "token-user-without-listen",
        "admin",
        "log-level",
        "gpu-spec",
        "policy",
        "db-url",
    ],
)
def test_serve_refuses_bad_options(
    root: Path, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FGPU_TOKEN", raising=False)
    socket = root / "bad" / "fgpu.sock"
    state = ["--state-dir", str(root / "bad-state")]
    result = CliRunner().invoke(app, ["serve", "--socket", str(socket), *state, *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert not socket.exists()


@pytest.mark.parametrize(
    ("token", "extra", "message"),
    [
        ("short-token", ["--token-user", "65534"], "the token has 11 characters; use at least 16"),
        ("a-long-enough-token-123", [], "--listen as root needs --token-user"),
        ("a-long-enough-token-123", ["--token-user", "no-such-user-here"], "--token-user: no user"),
        ("a-long-enough-token-1234", ["--token-user", "root"], "--token-user: 'root' is root"),
        ("a-long-enough-token-12345", ["--token-user", "0"], "--token-user: '0' is root (uid 0)"),
    ],
    ids=["short", "root-without-token-user", "unknown-token-user", "root-by-name", "root-by-uid"],
)
def test_serve_refuses_weak_token_settings(
    root: Path, token: str, extra: list[str], message: str
) -> None:
    if "root" in message and os.geteuid() != 0:
        pytest.skip("the rule is for servers run as root")
    folder = root / f"tok-{len(extra)}-{len(token)}"
    folder.mkdir()
    (folder / "token").write_text(token + "\n")
    (folder / "token").chmod(0o600)
    socket = folder / "fgpu.sock"
    args = ["--listen", "127.0.0.1:0", "--token-file", str(folder / "token"), *extra]
    result = CliRunner().invoke(
        app, ["serve", "--socket", str(socket), "--state-dir", str(folder / "state"), *args]
    )
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert not socket.exists()


def test_serve_on_tcp_with_a_token_file_then_sigterm_stops_cleanly(root: Path) -> None:
    folder = root / "tcp"
    folder.mkdir()
    token = folder / "token"
    secret = "tcp-token-0123456789"
    token.write_text(secret + "\n")
    token.chmod(0o600)
    server = start_server(
        folder, "--listen", "127.0.0.1:0", "--token-file", str(token), "--token-user", "65534"
    )
    try:
        log = (folder / "serve.log").read_text()
        assert f"unix socket {server.socket}" in log
        port = int(log.split("http://127.0.0.1:")[1].split(" ")[0])
        with Client(base_url=f"http://127.0.0.1:{port}", token=secret) as client:
            assert client.nodes()[0].gpus[0].model == "A100-40GB"
            # a token caller acts as --token-user, not as the server's user
            view = client.submit(SubmitRequest(command=["true"], gpu="0.1", cwd="/"))
            assert view.owner_uid == 65534
        with (
            Client(base_url=f"http://127.0.0.1:{port}", token="nope") as client,
            pytest.raises(ClientError) as caught,
        ):
            client.nodes()
        assert caught.value.status == 401
    finally:
        code = stop_server(server)
    assert code == 0
    assert not server.socket.exists()
    assert list(server.socket.parent.iterdir()) == []
