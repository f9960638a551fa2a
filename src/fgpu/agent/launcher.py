"""Start workloads as real processes, signal them, and find them again after a restart.

Every workload runs under the wrapper :mod:`fgpu.agent.runner`, which the launcher starts as
the leader of a new session; the wrapper starts the command as the leader of its own process
group and records the command's exit code in a file. So:

- :attr:`ProcessHandle.pid` and :attr:`ProcessHandle.create_time` name the wrapper; it lives
  exactly as long as the workload's command, and its start time guards against pid reuse
  (:meth:`Launcher.is_same_process`, what re-adoption after a restart uses).
- :attr:`ProcessHandle.pgid` is the workload's process group (the command and what it
  forks, not the wrapper): :meth:`Launcher.signal`, :meth:`Launcher.terminate` and the
  governor's freeze/thaw act on it.
- The exit code survives the agent: :meth:`Launcher.read_exit` reads it from
  :attr:`ProcessHandle.exit_path`.

Failures, by whose they are:

- the workload's own command cannot start (executable missing or not executable, working
  directory missing or not accessible to the user): :meth:`Launcher.launch` still returns a
  handle; the workload has *exited* with code 127 (not found) or 126 (not permitted), the
  reason is in :attr:`ProcessState.reason` and the workload's stderr log. That is a result
  to show the user, not an error of the agent.
- the agent cannot start the wrapper (log directory not writable, invalid spec, user switch
  refused because the agent is not root, wrapper did not report): :class:`LaunchError`.

Files, per workload, under ``<log_dir>/<workload_id>/``: ``output.log``, both streams as
records in the order the wrapper read them (:mod:`fgpu.wire_logs`), appended to, so a
workload restarted after preemption keeps one log. Each byte of output is stored once, there:
:attr:`ProcessHandle.stdout_path` and :attr:`ProcessHandle.stderr_path` name the two streams
as the API serves them (read back from the framed log, :func:`fgpu.log_files.read_stream`;
:func:`fgpu.log_files.stream_text` reads one whole), not files the wrapper writes (a
workload started by an fgpu before issue 27 has them as files). ``wrapper.log``: the
wrapper's own messages. ``exit.json`` (the
outcome; removed at each launch, so launch a workload id again only after its previous run
has ended).

Blocking: :meth:`Launcher.launch` waits for the wrapper to start the command (tens of
milliseconds, at most ``ready_timeout_s``); :meth:`Launcher.poll` and
:meth:`Launcher.signal` do not wait; :meth:`Launcher.terminate` waits up to the grace period
(use :meth:`Launcher.terminate_async` from an event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

import fgpu
from fgpu.agent.cgroupkill import end_cgroups, kill_session
from fgpu.agent.hostlimits import LimitGroup
from fgpu.agent.process import (
    CREATE_TIME_TOLERANCE_S,
    ProcessHandle,
    ProcessState,
    ProcessStatus,
    boot_id,
    group_alive,
    group_pids,
    is_same_process,
    start_ticks,
)
from fgpu.agent.runner import ExitRecord, read_exit_record
from fgpu.disk_room import DiskReserve
from fgpu.log_files import DEFAULT_MAX_LOG_BYTES
from fgpu.sdk import PYTHONPATH_DIR

RECORD_WAIT_S = 5.0
"""After the workload's group is gone, how long :meth:`Launcher.terminate` waits for the
wrapper to write the exit record."""

OUTPUT_LOG = "output.log"
"""A workload's two output streams in one file, in order (:mod:`fgpu.wire_logs`)."""
WRAPPER_LOG = "wrapper.log"
"""The wrapper's own messages (its stdout and stderr): not the workload's output."""

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")

_RUNNER_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONHOME")


class LaunchError(RuntimeError):
    """The agent could not start a workload's wrapper; the message says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    """What to run and how.

    Attributes:
        workload_id: names the workload's log directory and goes into ``FGPU_WORKLOAD_ID``;
            letters, digits, ``.``, ``_``, ``-`` (not first), at most 200 characters.
        argv: the command. Run without a shell unless ``shell`` is set.
        shell: run ``/bin/sh -c`` with the argv items joined by single spaces (as ``ssh``
            does), so ``["echo $HOME | wc -c"]`` is one shell line.
        cwd: working directory (None: the agent's own).
        env: the workload's environment (the caller's), to which the launcher adds the fgpu
            variables (they win over same-named entries).
        uid, gid: run as this user/group. Honoured when the agent is root (supplementary
            groups are the user's groups from the user database; none when the uid has no
            entry); when the agent is not root they must be None or the agent's own ids.
            ``uid`` without ``gid`` uses the user's primary group.
        log_dir: directory for every workload's logs; created when missing.
        gpu_uuids: GPU or MIG instance uuids the workload may use (``CUDA_VISIBLE_DEVICES``,
            ``NVIDIA_VISIBLE_DEVICES``; empty string when none).
        compute_milli: compute share per GPU, milli-GPU (``FGPU_GPU_COMPUTE_MILLI``).
        memory_mib: memory quota per GPU, MiB (``FGPU_GPU_MEMORY_MIB``).
        agent_socket: path of the agent's activity-hint socket (``FGPU_AGENT_SOCKET``).
        limits: the workload's cgroup(s), with its ``--cpu``/``--memory`` limits if any
            (:meth:`fgpu.agent.hostlimits.HostLimiter.prepare`), which the wrapper starts
            the command in and empties and removes when it ends; None: no cgroup (only its
            process group and the wrapper's session are reached).
    """

    workload_id: str
    argv: list[str]
    log_dir: Path
    shell: bool = False
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    uid: int | None = None
    gid: int | None = None
    gpu_uuids: list[str] = field(default_factory=list)
    compute_milli: int = 0
    memory_mib: int = 0
    agent_socket: str = ""
    limits: LimitGroup | None = None


def _read_ready_line(fd: int, timeout_s: float) -> str:
    """Read from ``fd`` until EOF or ``timeout_s``; raise TimeoutError on timeout.

    Waits with ``poll`` (no limit on the descriptor's number, unlike ``select``, which
    cannot take one above 1023)."""
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        if not poller.poll(max(1, int(remaining * 1000))):
            continue
        data = os.read(fd, 4096)
        if not data:
            return b"".join(chunks).decode(errors="replace").strip()
        chunks.append(data)


def _open_log(path: Path) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
    return os.open(path, flags, 0o644)


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _ended_how(returncode: int) -> str:
    """A child's end as :attr:`subprocess.Popen.returncode` gives it, in words: ``killed by
    SIGKILL`` (negative: the signal), or ``exit status 1``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exit status {returncode}"


class Launcher:
    """Starts workloads under the wrapper and watches them (see the module docstring).

    Holds no state that matters across restarts: a new Launcher given a stored
    :class:`ProcessHandle` polls, signals and terminates the workload like the one that
    started it. It keeps the wrappers it started itself only to reap them.

    Args:
        python: interpreter that runs the wrapper (default: this one).
        ready_timeout_s: how long :meth:`launch` waits for the wrapper to report.
        max_log_bytes: each log of a workload keeps about this many bytes, its head and its
            latest tail (:mod:`fgpu.log_files`; 0: no cap).
        disk_reserve: free space of the log folder's disk that output never takes
            (:mod:`fgpu.disk_room`); None: none (the service sets ``fgpu serve
            --log-disk-reserve``).
    """

    def __init__(
        self,
        python: str | None = None,
        ready_timeout_s: float = 10.0,
        max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
        disk_reserve: DiskReserve | None = None,
    ) -> None:
        self._python = python or sys.executable
        self.max_log_bytes = max_log_bytes
        self.disk_reserve = disk_reserve
        self._ready_timeout_s = ready_timeout_s
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    # -- launching ---------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec) -> ProcessHandle:
        """Start ``spec``'s command under the wrapper; return once it has started (or has
        failed to, which shows as an exited workload, code 126/127, see the module doc).

        Raises:
            LaunchError: invalid spec (id, empty command, negative figures), user switch
                impossible, log directory not writable, the wrapper did not start or did
                not report within ``ready_timeout_s``, or any other failure once it was
                started; then whatever it started (its session, the workload's cgroups) has
                been killed first.
        """
        command = self._command(spec)
        settings = self._settings(spec)
        work_dir = spec.log_dir / spec.workload_id
        stdout_path = work_dir / "stdout.log"
        stderr_path = work_dir / "stderr.log"
        wrapper_log = work_dir / WRAPPER_LOG
        exit_path = work_dir / "exit.json"
        try:
            work_dir.mkdir(parents=True, exist_ok=True)
            exit_path.unlink(missing_ok=True)
            for stale in work_dir.glob(".exit-*.tmp"):  # prepared by a wrapper killed early
                stale.unlink(missing_ok=True)
            # the service tells a workload of an older fgpu (no framed log) by its absence
            os.close(_open_log(work_dir / OUTPUT_LOG))
            for plain in (stdout_path, stderr_path):  # an older fgpu's second copy, set aside
                if plain.exists():  # so the stream is read from the framed log from now on
                    plain.replace(plain.with_name(plain.name + ".old"))
            out_fd = _open_log(wrapper_log)
        except OSError as exc:
            raise LaunchError(f"cannot prepare logs in {work_dir}: {exc}") from exc
        err_fd = os.dup(out_fd)

        try:
            ready_r, ready_w = os.pipe()
        except OSError as exc:
            os.close(out_fd)
            os.close(err_fd)
            raise LaunchError(f"cannot start the wrapper: {exc}") from exc
        runner_argv = [
            self._python,
            "-m",
            "fgpu.agent.runner",
            "--exit-file",
            str(exit_path),
            "--ready-fd",
            str(ready_w),
            "--spec-stdin",
            "--output-log",
            str(work_dir / OUTPUT_LOG),
            "--only-output-log",
            "--max-log-bytes",
            str(self.max_log_bytes),
            *(self.disk_reserve.argv() if self.disk_reserve is not None else []),
            "--",
            *command,
        ]
        proc: subprocess.Popen[bytes] | None = None
        try:
            try:
                proc = subprocess.Popen(
                    runner_argv,
                    stdin=subprocess.PIPE,
                    stdout=out_fd,
                    stderr=err_fd,
                    cwd="/",
                    env=self._runner_env(),
                    start_new_session=True,
                    pass_fds=(ready_w,),
                )
            except OSError as exc:
                raise LaunchError(f"cannot start the wrapper {self._python}: {exc}") from exc
            finally:
                os.close(ready_w)
                os.close(out_fd)
                os.close(err_fd)
            with self._lock:
                self._children[proc.pid] = proc
            # The wrapper has not been reaped, so it exists (perhaps as a zombie) here.
            create_time = psutil.Process(proc.pid).create_time()
            ticks = start_ticks(proc.pid)
            self._send_settings(proc, settings, wrapper_log)
            try:
                line = _read_ready_line(ready_r, self._ready_timeout_s)
            except TimeoutError:
                raise LaunchError(
                    f"the wrapper of {spec.workload_id} did not report within "
                    f"{self._ready_timeout_s:g} s; it was killed",
                ) from None
            if line.startswith("ok "):
                pgid = int(line.split()[1])
            elif line == "fail":
                pgid = proc.pid
            else:
                proc.wait()
                raise LaunchError(
                    f"the wrapper of {spec.workload_id} ended without starting the command "
                    f"(status {proc.returncode}): {_tail(wrapper_log) or 'no output'}",
                )
        except BaseException as exc:
            # whatever it started must not run on untracked: the wrapper's session (the
            # command's process group is in it) and the workload's cgroups
            if proc is not None:
                self._abort(proc, spec)
            if isinstance(exc, LaunchError) or not isinstance(exc, Exception):
                raise
            raise LaunchError(
                f"the launch of {spec.workload_id} failed ({type(exc).__name__}: {exc}); "
                "what it had started was killed"
            ) from exc
        finally:
            os.close(ready_r)

        return ProcessHandle(
            workload_id=spec.workload_id,
            pid=proc.pid,
            create_time=create_time,
            pgid=pgid,
            stdout_path=stdout_path,
            stderr_path=stderr_path,
            exit_path=exit_path,
            start_ticks=ticks,
            boot_id=boot_id(),
        )

    def _abort(self, proc: subprocess.Popen[bytes], spec: LaunchSpec) -> None:
        """Kill everything a failed launch started: the wrapper's session (the wrapper leads
        it; the command's group is in it) and every process in the workload's cgroups, which
        are removed; then reap the wrapper."""
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        kill_session(proc.pid)
        if spec.limits is not None:
            end_cgroups(spec.limits.join)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=RECORD_WAIT_S)
        with self._lock:
            self._children.pop(proc.pid, None)

    @staticmethod
    def _command(spec: LaunchSpec) -> list[str]:
        if not _SAFE_ID.match(spec.workload_id):
            raise LaunchError(
                f"workload id {spec.workload_id!r} cannot name a log directory: use letters, "
                "digits, '.', '_', '-' (not first), at most 200 characters",
            )
        if not spec.argv or (spec.shell and not " ".join(spec.argv).strip()):
            raise LaunchError(f"workload {spec.workload_id}: empty command")
        if spec.compute_milli < 0 or spec.memory_mib < 0:
            raise LaunchError(
                f"workload {spec.workload_id}: compute_milli and memory_mib must be >= 0",
            )
        if spec.shell:
            return ["/bin/sh", "-c", " ".join(spec.argv)]
        return list(spec.argv)

    @staticmethod
    def _settings(spec: LaunchSpec) -> dict[str, Any]:
        env = dict(spec.env)
        # Python's print reaches the log as it is written, not at exit, unless the user
        # chose otherwise (any value of theirs, even empty, is kept)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # `import fgpu.sdk` in the workload's own Python (fgpu.sdk.PYTHONPATH_DIR)
        env["PYTHONPATH"] = os.pathsep.join(
            [PYTHONPATH_DIR, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        )
        visible = ",".join(spec.gpu_uuids)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": visible,
                "NVIDIA_VISIBLE_DEVICES": visible,
                "FGPU_WORKLOAD_ID": spec.workload_id,
                "FGPU_GPU_COMPUTE_MILLI": str(spec.compute_milli),
                "FGPU_GPU_MEMORY_MIB": str(spec.memory_mib),
                "FGPU_AGENT_SOCKET": spec.agent_socket,
            },
        )
        uid, gid, groups = _identity(spec)
        settings: dict[str, Any] = {
            "cwd": spec.cwd,
            "env": env,
            "uid": uid,
            "gid": gid,
            "groups": groups,
        }
        if spec.limits is not None:
            settings["cgroups"] = spec.limits.settings()
        return settings

    @staticmethod
    def _runner_env() -> dict[str, str]:
        """The wrapper's own environment: a few of the agent's variables, and a PYTHONPATH
        that finds this fgpu first (the workload's environment goes through stdin)."""
        env = {k: os.environ[k] for k in _RUNNER_ENV_KEYS if k in os.environ}
        package_root = str(Path(fgpu.__file__).resolve().parent.parent)
        paths = [package_root]
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
            if entry:
                paths.append(str(Path(entry).resolve()))
        env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    @staticmethod
    def _send_settings(
        proc: subprocess.Popen[bytes],
        settings: dict[str, Any],
        stderr_path: Path,
    ) -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(settings).encode())
            proc.stdin.close()
        except BrokenPipeError:
            proc.wait()
            raise LaunchError(
                f"the wrapper ended before reading its settings (status {proc.returncode}): "
                f"{_tail(stderr_path) or 'no output'}",
            ) from None

    # -- finding ----------------------------------------------------------------------------

    def find(self, workload_id: str, log_dir: Path) -> ProcessHandle | None:
        """The live wrapper of ``workload_id`` found by its command line, or None.

        For recovery when the handle was never saved: an agent killed between starting a
        wrapper and recording it leaves a workload whose process runs unrecorded. The
        wrapper is recognised by ``-m fgpu.agent.runner --exit-file
        LOG_DIR/WORKLOAD_ID/exit.json`` in its command line (a scan of ``/proc``). Its
        process group is that of its first child (the command); the wrapper's own pid when
        the command has not started.
        """
        exit_path = log_dir / workload_id / "exit.json"
        for handle in self.find_all(log_dir):
            if handle.exit_path == exit_path:
                return handle
        return None

    def find_all(self, log_dir: Path) -> list[ProcessHandle]:
        """Every live wrapper whose exit record goes under ``log_dir`` (``-m
        fgpu.agent.runner --exit-file LOG_DIR/ID/exit.json``), whatever the store knows:
        what a service finds running from its state folder (see :meth:`find`)."""
        wanted = ["-m", "fgpu.agent.runner", "--exit-file"]
        found = []
        for proc in psutil.process_iter(["pid", "cmdline", "create_time", "status"]):
            info = proc.info
            cmdline = info.get("cmdline") or []
            if cmdline[1:4] != wanted or len(cmdline) < 5:
                continue
            if info.get("status") in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                continue
            exit_path = Path(cmdline[4])
            if exit_path.name != "exit.json" or exit_path.parent.parent != log_dir:
                continue
            pid = int(info["pid"])
            try:
                children = proc.children()
            except psutil.Error:
                continue
            found.append(
                ProcessHandle(
                    workload_id=exit_path.parent.name,
                    pid=pid,
                    create_time=float(info["create_time"]),
                    pgid=min(c.pid for c in children) if children else pid,
                    stdout_path=exit_path.parent / "stdout.log",
                    stderr_path=exit_path.parent / "stderr.log",
                    exit_path=exit_path,
                    start_ticks=start_ticks(pid),
                    boot_id=boot_id(),
                )
            )
        return found

    # -- watching ----------------------------------------------------------------------------

    def is_same_process(self, handle: ProcessHandle) -> bool:
        """Whether the workload's wrapper still lives (same pid, same start; zombies count as
        gone). This is the re-adoption check; see :func:`fgpu.agent.process.is_same_process`."""
        return is_same_process(handle)

    def read_exit(self, handle: ProcessHandle) -> int | None:
        """The recorded exit code (``-N`` for signal ``N``, 125-127 for a failed start), or
        None while none is recorded."""
        record = read_exit_record(handle.exit_path)
        return record.code if record else None

    def exit_record(self, handle: ProcessHandle) -> ExitRecord | None:
        """The recorded outcome with its reason, or None while none is recorded."""
        return read_exit_record(handle.exit_path)

    def exit_record_at(self, path: Path) -> ExitRecord | None:
        """The outcome recorded at ``path`` (``LOG_DIR/WORKLOAD_ID/exit.json``), for a
        workload whose handle was never saved; None when there is none."""
        return read_exit_record(path)

    def poll(self, handle: ProcessHandle) -> ProcessState:
        """Running, exited (with code and reason) or lost; never blocks."""
        reaped = self._reap(handle.pid)
        record = read_exit_record(handle.exit_path)
        if record is None and is_same_process(handle):
            return ProcessState(ProcessStatus.RUNNING)
        if record is None:  # it may have finished between the two looks
            record = read_exit_record(handle.exit_path)
        if record is not None:
            return ProcessState(ProcessStatus.EXITED, record.code, record.reason)
        # our own wrapper is dead (not the same process any more): its status is a moment
        # away when the kernel has not made it a zombie yet
        reaped = reaped if reaped is not None else self._reap(handle.pid, wait_s=1.0)
        how = f" ({_ended_how(reaped)})" if reaped is not None else ""
        return ProcessState(
            ProcessStatus.LOST,
            reason=f"the wrapper (pid {handle.pid}) ended without recording an exit code{how}",
        )

    def _reap(self, pid: int, wait_s: float = 0.0) -> int | None:
        """Collect our own finished wrapper ``pid``; its status, or None. ``wait_s``: wait
        up to that long for one known to be dead (never for a running one)."""
        with self._lock:
            proc = self._children.get(pid)
        if proc is None:
            return None
        code = proc.poll()
        if code is None and wait_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=wait_s)
        if code is not None:
            with self._lock:
                self._children.pop(pid, None)
        return code

    # -- signalling --------------------------------------------------------------------------

    def signal(self, handle: ProcessHandle, sig: int) -> bool:
        """Send ``sig`` to the workload's whole process group. True when sent; False when the
        group is gone (or its id now belongs to processes that started before the workload,
        i.e. someone else's). Never blocks."""
        if not self._owns_group(handle):
            return False
        try:
            os.killpg(handle.pgid, sig)
        except ProcessLookupError:
            return False
        return True

    def pids(self, handle: ProcessHandle) -> list[int]:
        """Live processes of the workload's group (to attribute NVML's per-process memory to
        workloads); empty when the group is gone or no longer the workload's."""
        return group_pids(handle)

    def _owns_group(self, handle: ProcessHandle) -> bool:
        """Whether the group is still this workload's: the wrapper lives, or a live member
        of the group started no earlier than the wrapper (commands can outlive it)."""
        return is_same_process(handle) or group_alive(handle)

    def _terminate_steps(
        self,
        handle: ProcessHandle,
        grace_s: float,
        max_poll_interval_s: float,
    ) -> Generator[float, None, ProcessState]:
        """The terminate sequence; yields how long to sleep between looks. Looks start 10 ms
        apart and back off to ``max_poll_interval_s`` (a look may scan ``/proc``)."""
        interval = min(0.01, max_poll_interval_s)

        def pause() -> float:
            nonlocal interval
            current = interval
            interval = min(interval * 1.5, max_poll_interval_s)
            return current

        self.signal(handle, signal.SIGTERM)
        # A frozen (SIGSTOPped) workload must run to handle SIGTERM (governor-notes, 5).
        self.signal(handle, signal.SIGCONT)
        deadline = time.monotonic() + grace_s
        while group_alive(handle):
            left = deadline - time.monotonic()
            if left <= 0:
                self.signal(handle, signal.SIGKILL)
                break
            yield min(pause(), left)
        interval = min(0.01, max_poll_interval_s)
        give_up = time.monotonic() + RECORD_WAIT_S
        while True:
            state = self.poll(handle)
            if not state.running or time.monotonic() >= give_up:
                return state
            yield pause()

    def terminate(
        self,
        handle: ProcessHandle,
        grace_s: float = 30.0,
        *,
        max_poll_interval_s: float = 0.25,
    ) -> ProcessState:
        """SIGTERM (and SIGCONT) to the workload's group; SIGKILL if any of it is still there
        after ``grace_s`` seconds; then wait (up to :data:`RECORD_WAIT_S`) for the wrapper to
        record the outcome. Blocks; returns the final :meth:`poll` state (``-15`` when it
        obeyed SIGTERM, ``-9`` when it had to be killed, or its own code if it exited)."""
        steps = self._terminate_steps(handle, grace_s, max_poll_interval_s)
        try:
            while True:
                time.sleep(next(steps))
        except StopIteration as done:
            result: ProcessState = done.value
            return result

    async def terminate_async(
        self,
        handle: ProcessHandle,
        grace_s: float = 30.0,
        *,
        max_poll_interval_s: float = 0.25,
    ) -> ProcessState:
        """:meth:`terminate` for an event loop: the same steps, sleeping with asyncio."""
        steps = self._terminate_steps(handle, grace_s, max_poll_interval_s)
        try:
            while True:
                await asyncio.sleep(next(steps))
        except StopIteration as done:
            result: ProcessState = done.value
            return result


def _identity(spec: LaunchSpec) -> tuple[int | None, int | None, list[int] | None]:
    """(uid, gid, supplementary groups) to switch to; all None when no switch is needed.

    Raises:
        LaunchError: a switch is asked for but the agent is not root, or a uid without a user
            database entry comes without a gid.
    """
    if spec.uid is None and spec.gid is None:
        return None, None, None
    if os.geteuid() != 0:
        if spec.uid not in (None, os.geteuid()) or spec.gid not in (None, os.getegid()):
            raise LaunchError(
                f"workload {spec.workload_id}: cannot run as uid {spec.uid} gid {spec.gid}: "
                f"the agent runs as uid {os.geteuid()}, not root",
            )
        return None, None, None
    uid = spec.uid if spec.uid is not None else 0
    try:
        entry: pwd.struct_passwd | None = pwd.getpwuid(uid)
    except KeyError:
        entry = None
    gid = spec.gid
    if gid is None:
        if entry is None:
            raise LaunchError(
                f"workload {spec.workload_id}: uid {uid} has no user entry; give a gid",
            )
        gid = entry.pw_gid
    groups = sorted(set(os.getgrouplist(entry.pw_name, gid))) if entry is not None else [gid]
    return uid, gid, groups


__all__ = [
    "CREATE_TIME_TOLERANCE_S",
    "ExitRecord",
    "LaunchError",
    "LaunchSpec",
    "Launcher",
    "ProcessHandle",
    "ProcessState",
    "ProcessStatus",
]
