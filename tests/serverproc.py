"""A real ``fgpu serve`` process for end-to-end tests, driven through the real command line.

:class:`ServerProcess` starts ``python -m fgpu serve`` on a socket in a temporary folder with
simulated GPUs (its ``state`` folder is the state dir: the database, the logs and each
workload's ``handle.json``), runs ``python -m fgpu ...`` commands against it
with ``FGPU_SOCKET`` set, and cleans up after itself: :meth:`ServerProcess.cleanup` cancels
what is active, stops the server with SIGTERM and kills any workload process group that is
still left (from the ``handle.json`` files), so no test leaves processes behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

FGPU = [sys.executable, "-m", "fgpu"]
TIMEOUT_S = 30.0
CLI_TIMEOUT_S = 60.0
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def sleeper(seconds: float) -> list[str]:
    """A real workload: a Python process that sleeps."""
    return [sys.executable, "-c", f"import time; time.sleep({seconds})"]


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    """Poll ``check`` until it is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.1)


class CliError(AssertionError):
    """An ``fgpu`` command that should have succeeded did not."""


class ServerProcess:
    """``fgpu serve`` as a subprocess on ``root/s.sock`` with state in ``root/state``.

    The state dir is the server's own (it makes it private, 0700), so the socket lives beside
    it, where other users can reach it when ``root`` is open to them.

    Args:
        root: the temporary folder (socket, server log, state dir).
        gpus: the ``--simulate-gpus`` spec.
        extra: more ``fgpu serve`` options (``--fake-driver``, ``--db postgresql://...``).
        preempt_delay: ``--preempt-delay`` (default ``0``: these tests are about whom
            preemption picks, not when; the wait before evict, 5 minutes by default, has its
            own tests in test_e2e_preempt_delay.py); None: the flag is not given (the
            service's default).
    """

    def __init__(
        self,
        root: Path,
        gpus: str,
        extra: Sequence[str] = (),
        preempt_delay: str | None = "0",
    ) -> None:
        self.root = root
        self.gpus = gpus
        self.extra = list(extra)
        if preempt_delay is not None:
            self.extra += ["--preempt-delay", preempt_delay]
        self.socket = root / "s.sock"
        self.state_dir = root / "state"
        self.log = root / "serve.log"
        self.tcp_port = 0
        """The TCP port it serves besides its socket (0: none; :func:`started_server`)."""
        self.process: subprocess.Popen[bytes] | None = None
        self.env = {**os.environ, "FGPU_SOCKET": str(self.socket)}
        self.env.pop("FGPU_URL", None)

    # ---------------------------------------------------------------- the server
    def start(self) -> None:
        """Start the server and wait until it answers ``/v1/healthz``."""
        assert self.process is None or self.process.poll() is not None, "already running"
        command = [*FGPU, "serve", "--socket", str(self.socket), "--state-dir", str(self.state_dir)]
        command += ["--simulate-gpus", self.gpus, "--log-level", "info", *self.extra]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, cwd=self.root
            )
        process = self.process

        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(
                    f"fgpu serve exited {process.returncode}:\n{self.server_log()}"
                )
            return self.socket.exists() and self._healthy()

        wait_for(up, "fgpu serve to answer")

    def _healthy(self) -> bool:
        """The server answers ``GET /v1/healthz`` (a cheap readiness probe for the harness;
        the tests themselves use the command line)."""
        from fgpu.client import Client, ClientError

        try:
            with Client(self.socket, timeout=5) as client:
                client.health()
        except ClientError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the server (no cleanup on its side) and reap it."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(TIMEOUT_S)

    def stop(self) -> int:
        """SIGTERM the server; its exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(TIMEOUT_S)

    def server_log(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    # ---------------------------------------------------------------- the CLI
    def cli(
        self,
        *args: str,
        user: Sequence[str] = (),
        check: bool = True,
        env_extra: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``fgpu ARGS`` as a user would (``user``: a prefix such as :data:`AS_NOBODY`;
        ``env_extra``: variables of the caller, which a submission carries to the workload)."""
        env = {**self.env, **(env_extra or {})}
        cwd: Path | str = self.root
        if user:
            env["HOME"] = "/"
            cwd = "/"
        result = subprocess.run(
            [*user, *FGPU, *args],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            env=env,
            cwd=cwd,
        )
        if check and result.returncode != 0:
            raise CliError(
                f"fgpu {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result

    def json(self, *args: str) -> Any:
        """``fgpu ARGS --json``, parsed."""
        return json.loads(self.cli(*args, "--json").stdout)

    def submit(self, *options: str, command: Sequence[str]) -> str:
        """``fgpu submit OPTIONS --json -- COMMAND``; the new workload's id."""
        result = self.cli("submit", *options, "--json", "--", *command)
        return str(json.loads(result.stdout)["id"])

    def submit_many(self, count: int, *options: str, command: Sequence[str]) -> list[str]:
        """``count`` submissions run as concurrent CLI processes; ids in submission order
        of the processes' start (not necessarily the server's order)."""
        argv = [*FGPU, "submit", *options, "--json", "--", *command]
        procs = [
            subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=self.env,
                cwd=self.root,
            )
            for _ in range(count)
        ]
        ids = []
        for proc in procs:
            out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
            if proc.returncode != 0:
                raise CliError(f"fgpu submit exited {proc.returncode}:\n{out}\n{err}")
            ids.append(str(json.loads(out)["id"]))
        return ids

    def workloads(self, *, all_: bool = True) -> dict[str, dict[str, Any]]:
        """``fgpu ls --json --all-users [--all]`` by id (fails on a duplicated id)."""
        listed = self.json("ls", "--all-users", *(["--all"] if all_ else []))
        ids = [w["id"] for w in listed]
        assert len(ids) == len(set(ids)), f"duplicated ids in fgpu ls: {ids}"
        return {w["id"]: w for w in listed}

    def describe(self, workload_id: str) -> dict[str, Any]:
        return dict(self.json("describe", workload_id))

    def phase(self, workload_id: str) -> str:
        return str(self.describe(workload_id)["phase"])

    def wait_phase(
        self, workload_id: str, *phases: str, timeout_s: float = TIMEOUT_S
    ) -> dict[str, Any]:
        """Poll ``fgpu describe --json`` until the workload is in one of ``phases``; the
        last answer."""
        seen: dict[str, Any] = {}

        def check() -> bool:
            seen.update(self.describe(workload_id))
            return seen["phase"] in phases

        wait_for(check, f"{workload_id} to be {' or '.join(phases)}", timeout_s)
        return seen

    def wait_listing(
        self,
        check: Callable[[dict[str, dict[str, Any]]], bool],
        what: str,
        timeout_s: float = TIMEOUT_S,
    ) -> dict[str, dict[str, Any]]:
        """Poll ``fgpu ls --json --all`` until ``check`` accepts it; the last listing."""
        seen: dict[str, dict[str, Any]] = {}

        def look() -> bool:
            seen.clear()
            seen.update(self.workloads())
            return check(seen)

        wait_for(look, what, timeout_s)
        return seen

    # ---------------------------------------------------------------- what the node knows
    def handle(self, workload_id: str) -> dict[str, Any]:
        """The launcher's record of the workload's process (``logs/ID/handle.json``)."""
        path = self.state_dir / "logs" / workload_id / "handle.json"
        return dict(json.loads(path.read_text()))

    def handles(self) -> list[dict[str, Any]]:
        found = []
        for path in sorted((self.state_dir / "logs").glob("*/handle.json")):
            with contextlib.suppress(OSError, ValueError):
                found.append(json.loads(path.read_text()))
        return found

    # ---------------------------------------------------------------- cleanup
    def cleanup(self) -> None:
        """Cancel what is active, stop the server (SIGTERM), kill any workload left."""
        try:
            if self.process is not None and self.process.poll() is None:
                self._cancel_all()
        finally:
            if self.process is not None and self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(TIMEOUT_S)
            for handle in self.handles():
                kill_workload(handle)

    def _cancel_all(self) -> None:
        from fgpu.client import Client, ClientError

        with contextlib.suppress(ClientError), Client(self.socket, timeout=10) as client:
            for view in client.list_workloads():
                with contextlib.suppress(ClientError):
                    client.cancel(view.id)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: not client.list_workloads(), "workloads to end", 15)


def kill_workload(handle: dict[str, Any]) -> None:
    """SIGKILL a workload's wrapper and its process group, if they are still the ones the
    handle names (same start time), so a reused pid is never hit."""
    from fgpu.agent.process import ProcessHandle, group_alive, is_same_process

    try:
        h = ProcessHandle.from_dict(handle)
    except (KeyError, TypeError, ValueError):
        return
    if is_same_process(h):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(h.pid, signal.SIGKILL)
    if group_alive(h):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(h.pgid, signal.SIGKILL)


@contextlib.contextmanager
def started_server(
    prefix: str,
    gpus: str,
    *,
    for_local_users: bool = False,
    token: str | None = None,
    token_user: str | None = None,
    extra: Sequence[str] = (),
) -> Iterator[ServerProcess]:
    """A started server in a fresh folder under /tmp, stopped and removed after.

    Args:
        prefix: the folder's name prefix.
        gpus: ``--simulate-gpus``.
        for_local_users: the folder is opened (0755) so that other local users (the test
            users of :mod:`tests.localusers`) reach the socket.
        token: also serve TCP on a free loopback port (``server.tcp_port``) with this
            bearer token (a 0600 token file in the folder).
        token_user: ``--token-user`` with ``token``.
        extra: more ``fgpu serve`` options.
    """
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    if for_local_users:
        root.chmod(0o755)  # alice and bob reach the socket
    options: list[str] = list(extra)
    port = 0
    if token is not None:
        token_file = root / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        port = free_port()
        options += ["--listen", f"127.0.0.1:{port}", "--token-file", str(token_file)]
        if token_user is not None:
            options += ["--token-user", token_user]
    proc = ServerProcess(root, gpus, options)
    proc.tcp_port = port
    try:
        proc.start()
        yield proc
    finally:
        proc.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def free_port() -> int:
    """A loopback TCP port free now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
