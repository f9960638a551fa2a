"""The wrapper every workload runs under: start the command, wait, record its exit code.

Usage (the launcher builds this line; it also works by hand)::

    python -m fgpu.agent.runner --exit-file F [--ready-fd N] [--spec-stdin] \
        [--output-log L] -- CMD ARGS...

Why it exists: the agent may be restarted (even with ``kill -9``) while workloads run. A
restarted agent is not the parent of the workloads any more and cannot learn their exit
status from the kernel. The wrapper stays the command's parent for the command's whole life
and writes the outcome to ``F`` (atomically: temporary file, fsync, rename), so whoever asks
later reads it from there.

Process layout: the launcher starts the wrapper as the leader of a new session. The wrapper
starts the command as the leader of its own process group inside that session, so the agent
can signal (and the governor can freeze) the whole workload -- the command and everything it
forks -- with the wrapper outside that group: a SIGKILL to the workload leaves the wrapper
alive to record ``-9``. Signals sent to the wrapper itself (TERM, INT, HUP, QUIT, USR1, USR2)
are passed on to the workload's group. When the command ends, whatever it left running in its
group is killed (SIGKILL), and so is everything in its cgroups (``cgroups`` below; also what
left the group with ``setsid``: :mod:`fgpu.agent.cgroupkill`), before the exit is recorded.
Without cgroups the wrapper's session (it leads it) is killed too; a process that left the
group and the session is then out of reach.

Options:

- ``--exit-file F``: where the outcome goes, as JSON ``{"code": int, "reason": str | null,
  "pid": int | null}``. ``code`` is the command's exit status, or ``-N`` when signal ``N``
  ended it (the :mod:`subprocess` convention). When the command cannot be started the code
  follows the shell and container conventions: ``127`` command or working directory not
  found, ``126`` found but not permitted (not executable, directory not accessible to the
  user), ``125`` the wrapper itself failed (bad settings, could not switch user); ``reason``
  says what happened and the same text goes to stderr (the workload's stderr log).
- ``--ready-fd N``: after starting the command, write ``ok PID`` (or ``fail`` when it could
  not start) and a newline to file descriptor ``N`` and close it. The launcher waits for this
  line.
- ``--spec-stdin``: read the command's settings from stdin as JSON: ``cwd`` (str or null),
  ``env`` (object or null: the command's whole environment), ``uid``, ``gid`` (int or null),
  ``groups`` (list of int or null: supplementary groups), ``cgroups`` (object or null:
  the workload's cgroups to start the command in, :meth:`fgpu.agent.hostlimits.LimitGroup.
  settings`: emptied and removed when it ends; when the memory limit killed the command the
  recorded reason is ``out of host memory (limit X)``). Without it the command inherits
  the wrapper's working directory and environment. The settings come through stdin rather
  than the wrapper's environment or command line so that the workload's environment (which
  may hold secrets) is neither visible in ``ps`` nor able to break the wrapper's own Python
  (``PYTHONPATH``, ``PYTHONHOME``).

- ``--output-log L``: the command's stdout and stderr come to the wrapper through two pipes;
  it copies each to its own stdout and stderr (the workload's ``stdout.log`` and
  ``stderr.log``) and appends it to ``L`` as one record per read, in the order read:
  :func:`fgpu.wire_logs.frame` (stream, wall-clock time, bytes). Within a stream the
  order is exact; between the streams it is the order in which the writes reached the
  wrapper, which wakes at each write: writes to the two streams closer together than that
  wake-up (tens of microseconds) may be recorded in either order. When the command ends the
  wrapper reads on until both pipes close (its group is killed, so they do) or for
  :data:`DRAIN_S`, then records the exit: once the exit record exists, the logs are whole. A
  process that left the group and still writes after that gets a broken pipe. Without this
  option the command writes to the wrapper's stdout and stderr directly.
- ``--only-output-log``: with ``--output-log``, the streams go to the framed log only (each
  byte is stored once; what the launcher asks for: the API reads one stream back from the
  framed log, :func:`fgpu.log_files.read_stream`); the wrapper's own stdout and stderr then
  carry only its own messages.
- ``--max-log-bytes N``: with ``--output-log``, each of the three logs keeps about ``N``
  bytes: its first half and its latest quarter to half, the rest between is dropped
  (:mod:`fgpu.log_files`; the API says the cut where it falls). 0 (the default): no cap.
- ``--disk-reserve SIZE,PERCENT``: with ``--output-log``, output is appended only while the
  log folder's disk has more free than the larger of ``SIZE`` bytes and ``PERCENT`` % of
  the disk; below it, and once a stop file appears in the log folder (the user's output
  limit), output is dropped and each log says so where the cut falls
  (:class:`fgpu.disk_room.OutputGate`). Without it only the stop file counts.

A full disk: at its start the wrapper prepares the exit record's file (a temporary file of
:data:`SLOT_BYTES` spaces beside ``F``); the record is later written over those spaces, which
takes no new disk space, and renamed to ``F`` (a JSON reader skips the trailing spaces). So
an exit on a disk filled meanwhile is still recorded. Where even that fails, the wrapper
says so on stderr and still exits with the command's status (below).

The wrapper's own exit status mirrors the command's (``128 + N`` for signal ``N``).
This module imports only the standard library (and :mod:`fgpu.wire_logs`, which imports
nothing else), so that it starts fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from fgpu.agent.cgroupkill import kill_cgroup, kill_session, remove_cgroup
from fgpu.disk_room import DiskReserve, OutputGate, parse_wrapper_reserve
from fgpu.log_files import CappedLog, write_all
from fgpu.wire_logs import CUT, frame

EXIT_WRAPPER_FAILED = 125
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127

DRAIN_S = 5.0
"""After the command's group is gone, how long the wrapper waits for its output pipes to
close (``--output-log``) before it records the exit anyway."""

READ_SIZE = 65536
"""Most bytes the wrapper reads from an output pipe at a time."""

FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


@dataclass(frozen=True, slots=True)
class ExitRecord:
    """The outcome the wrapper recorded.

    Attributes:
        code: exit status, ``-N`` for signal ``N``, or 125/126/127 when the command could not
            start (see the module docstring).
        reason: why it could not start or which signal ended it; None for a plain exit.
        pid: the command's pid, None when it never started.
    """

    code: int
    reason: str | None = None
    pid: int | None = None


def write_exit_record(path: Path, record: ExitRecord) -> None:
    """Write ``record`` to ``path`` atomically (temporary file in the same directory, fsync,
    rename, fsync of the directory): a reader sees the whole record or none."""
    payload = _payload(record)
    fd, tmp = tempfile.mkstemp(prefix=".exit-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


SLOT_BYTES = 4096
"""Size of the exit record's file prepared at the wrapper's start (one page)."""


def _payload(record: ExitRecord) -> bytes:
    return (
        json.dumps({"code": record.code, "reason": record.reason, "pid": record.pid}) + "\n"
    ).encode()


class ExitSlot:
    """The exit record's file, prepared before it is needed (see the module docstring).

    Args:
        path: where the record goes (``--exit-file``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp: str | None = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".exit-", suffix=".tmp", dir=path.parent)
        except OSError:
            return  # no room even now: write() tries the plain way
        try:
            write_all(fd, b" " * SLOT_BYTES)
            os.fsync(fd)
            self.tmp = tmp
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        finally:
            os.close(fd)

    def write(self, record: ExitRecord) -> None:
        """Write ``record`` to the path atomically, into the prepared file when there is
        one (no new space needed), else as :func:`write_exit_record` does.

        Raises:
            OSError: neither way worked.
        """
        payload = _payload(record)
        tmp, self.tmp = self.tmp, None
        if tmp is not None and len(payload) <= SLOT_BYTES:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
                try:
                    os.pwrite(fd, payload, 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.chmod(tmp, 0o644)
                os.replace(tmp, self.path)
                _fsync_dir(self.path.parent)
                return
            except OSError:
                pass
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # frees its space for the plain way
        write_exit_record(self.path, record)

    def discard(self) -> None:
        """Remove the prepared file (nothing to record)."""
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            self.tmp = None


def _fsync_dir(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_exit_record(path: Path) -> ExitRecord | None:
    """The record at ``path``, or None when there is none (yet) or it is unreadable."""
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("code"), int):
        return None
    reason = data.get("reason")
    pid = data.get("pid")
    return ExitRecord(
        code=data["code"],
        reason=reason if isinstance(reason, str) else None,
        pid=pid if isinstance(pid, int) else None,
    )


def _signal_reason(code: int) -> str | None:
    if code >= 0:
        return None
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"ended by {name}"


def _accessible_as(path: str, uid: int, gid: int, groups: list[int]) -> bool:
    """Whether ``uid`` (with ``gid`` and ``groups``) may enter directory ``path``; checked with
    the effective ids switched for the test, then switched back (needs root)."""
    saved_groups = os.getgroups()
    saved_egid = os.getegid()
    os.setgroups(groups)
    os.setegid(gid)
    os.seteuid(uid)
    try:
        return os.access(path, os.X_OK, effective_ids=True)
    finally:
        os.seteuid(0)
        os.setegid(saved_egid)
        os.setgroups(saved_groups)


def _start_failure(exc: OSError, program: str, cwd: str | None, uid: int | None) -> tuple[int, str]:
    """Exit code and reason for a failed start. :mod:`subprocess` names the program in
    ``exc.filename`` when ``exec`` failed; any other name means a step before ``exec``
    (entering the working directory, switching groups and user) failed."""
    detail = exc.strerror or str(exc)
    if exc.filename != program:
        if isinstance(exc, FileNotFoundError) and cwd is not None:
            return EXIT_NOT_FOUND, f"working directory not found: {cwd!r}"
        who = f" as uid {uid}" if uid is not None else ""
        return EXIT_WRAPPER_FAILED, f"could not prepare the process{who}: {detail}"
    if isinstance(exc, FileNotFoundError):
        return EXIT_NOT_FOUND, f"command not found: {program!r}"
    if isinstance(exc, PermissionError):
        return EXIT_CANNOT_RUN, f"permission denied: {program!r}"
    return EXIT_CANNOT_RUN, f"cannot run {program!r}: {detail}"


class _Relay:
    """Copies the command's two output pipes to the wrapper's stdout/stderr and to the
    framed output log, in the order read (see ``--output-log`` in the module docstring),
    each within its cap (:class:`fgpu.log_files.CappedLog`)."""

    def __init__(
        self,
        log: CappedLog,
        stdout: CappedLog | None,
        stderr: CappedLog | None,
        gate: OutputGate | None = None,
    ) -> None:
        self.log = log
        self.sinks = {fd: sink for fd, sink in ((1, stdout), (2, stderr)) if sink is not None}
        self.gate = gate
        self.pipes: dict[int, tuple[str, int]] = {}
        self.thread: threading.Thread | None = None

    def record(self, stream: str, data: bytes) -> None:
        # a full disk loses log lines, not the workload (CappedLog swallows write errors)
        self.log.write(frame(stream, time.time_ns(), data), whole=True)

    def notice(self, text: str) -> None:
        """Say ``text`` (the gate's notice of a cut) in all three logs, where it falls."""
        data = text.encode()
        self.log.write(frame(CUT, time.time_ns(), data), whole=True)
        for sink in self.sinks.values():
            sink.write(data)

    def keep(self, stream: str, size: int) -> bool:
        """Whether a chunk of ``size`` bytes of ``stream`` may be appended now (the gate:
        the disk's reserve and the stop file, :mod:`fgpu.disk_room`); writes the notices
        where a cut begins or ends."""
        if self.gate is None:
            return True
        began, ended = self.gate.check()
        if ended is not None:
            self.notice(ended)
        if began is not None:
            self.notice(began)
        if self.gate.dropping is None:
            return True
        self.gate.dropped[stream] += size
        return False

    def open(self) -> tuple[int, int]:
        """Two pipes; returns their write ends (the command's stdout and stderr)."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.pipes = {out_r: ("stdout", 1), err_r: ("stderr", 2)}
        return out_w, err_w

    def start(self) -> None:
        self.thread = threading.Thread(target=self._copy, name="fgpu-relay", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        import select

        poller = select.poll()
        for fd in self.pipes:
            poller.register(fd, select.POLLIN)
        open_fds = set(self.pipes)
        while open_fds:
            for fd, _ in poller.poll():
                data = os.read(fd, READ_SIZE)
                stream, target = self.pipes[fd]
                if not data:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    continue
                if self.keep(stream, len(data)):
                    sink = self.sinks.get(target)
                    if sink is not None:
                        sink.write(data)
                    self.record(stream, data)

    def finish(self) -> None:
        if self.thread is not None:
            self.thread.join(DRAIN_S)
        closing = self.gate.closing() if self.gate is not None else None
        if closing is not None:
            self.notice(closing)
        for sink in (self.log, *self.sinks.values()):
            with contextlib.suppress(OSError):
                sink.close()


class _Limits:
    """The host-limit cgroups of ``cgroups`` in the launch settings
    (:meth:`fgpu.agent.hostlimits.LimitGroup.settings`): the wrapper enters them before
    starting the command, so the command is limited from its first instruction, and leaves
    them right after; when the command has ended it reads the out-of-memory count and
    removes them."""

    def __init__(self, join: list[str], home: list[str], oom_file: str | None, limit: str) -> None:
        self.join = join
        self.home = home
        self.oom_file = oom_file
        self.limit = limit

    @classmethod
    def of(cls, value: Any) -> _Limits | None:
        if not isinstance(value, dict) or not value.get("join"):
            return None
        oom = value.get("oom_file")
        return cls(
            [str(d) for d in value["join"]],
            [str(d) for d in value.get("home") or []],
            str(oom) if oom else None,
            str(value.get("memory_limit") or "?"),
        )

    @staticmethod
    def _move(directory: str) -> None:
        with open(os.path.join(directory, "cgroup.procs"), "w", encoding="ascii") as handle:
            handle.write(str(os.getpid()))

    def enter(self) -> str | None:
        """Join every cgroup; the reason when one cannot be joined (then none is kept)."""
        for directory in self.join:
            try:
                self._move(directory)
            except OSError as exc:
                self.leave()
                return f"could not enter its host-limits cgroup {directory}: {exc.strerror or exc}"
        return None

    def leave(self) -> None:
        for directory in self.home:
            with contextlib.suppress(OSError):
                self._move(directory)

    def oom_kills(self) -> int:
        if self.oom_file is None:
            return 0
        try:
            with open(self.oom_file, encoding="ascii") as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill(self) -> list[int]:
        """SIGKILL whatever is still in the cgroups (what the command left, also outside its
        process group) and wait until they are empty (:mod:`fgpu.agent.cgroupkill`);
        the pids killed."""
        killed: list[int] = []
        for directory in self.join:
            killed += kill_cgroup(directory)
        return killed

    def finish(self, code: int) -> str | None:
        """The reason to record when the memory limit ended the command (None otherwise);
        removes the cgroups (those still holding exiting processes are retried for a
        second, then left to the agent's sweep)."""
        reason = None
        if code != 0 and self.oom_kills() > 0:
            reason = f"out of host memory (limit {self.limit})"
            if code != -signal.SIGKILL:
                reason += ": one of its processes was killed"
        for directory in self.join:
            remove_cgroup(directory)
        return reason


class _Wrapper:
    def __init__(self, exit_file: Path, ready_fd: int | None, relay: _Relay | None = None) -> None:
        self.exit_file = exit_file
        self.slot = ExitSlot(exit_file)
        self.ready_fd = ready_fd
        self.relay = relay
        self.child: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []
        self.finished = False

    def forward(self, signum: int, _frame: FrameType | None) -> None:
        if self.finished:
            return  # the command was reaped: its pid may already name another process
        if self.child is None:
            self.pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, signum)

    def ready(self, message: str) -> None:
        if self.ready_fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self.ready_fd, (message + "\n").encode())
        with contextlib.suppress(OSError):
            os.close(self.ready_fd)
        self.ready_fd = None

    def fail(self, code: int, reason: str) -> int:
        print(f"fgpu: {reason}", file=sys.stderr, flush=True)
        if self.relay is not None:
            self.relay.record("stderr", f"fgpu: {reason}\n".encode())
        self.record(ExitRecord(code, reason))
        self.ready("fail")
        return code

    def record(self, record: ExitRecord) -> None:
        """Write the exit record (:class:`ExitSlot`); where it cannot be written, say so on
        stderr (the exit status still tells the code to a parent that waits)."""
        try:
            self.slot.write(record)
        except OSError as exc:
            with contextlib.suppress(OSError):
                print(f"fgpu: cannot record the exit in {self.exit_file}: {exc}", file=sys.stderr)

    def run(self, command: list[str], settings: dict[str, Any]) -> int:
        cwd = settings.get("cwd")
        env = settings.get("env")
        uid = settings.get("uid")
        gid = settings.get("gid")
        groups = settings.get("groups")
        if not command:
            return self.fail(EXIT_WRAPPER_FAILED, "no command given")
        if cwd is not None:
            if not os.path.isdir(cwd):
                return self.fail(EXIT_NOT_FOUND, f"working directory not found: {cwd!r}")
            if (
                uid is not None
                and os.geteuid() == 0
                and not _accessible_as(cwd, uid, gid if gid is not None else uid, groups or [])
            ):
                return self.fail(
                    EXIT_CANNOT_RUN,
                    f"working directory {cwd!r} is not accessible to uid {uid}",
                )
        # Switching user, the working directory is entered as that user (after the switch,
        # in the child): entered as root, a directory swapped for a symbolic link between the
        # check above and the chdir could take the command where its user may not go.
        as_user = uid is not None and os.geteuid() == 0 and cwd is not None
        target = str(cwd)
        limits = _Limits.of(settings.get("cgroups"))
        if limits is not None:
            failed = limits.enter()
            if failed is not None:
                return self.fail(EXIT_WRAPPER_FAILED, failed)
        out_w, err_w = self.relay.open() if self.relay is not None else (None, None)
        try:
            self.child = subprocess.Popen(
                command,
                cwd=None if as_user else cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                process_group=0,
                user=uid,
                group=gid,
                extra_groups=groups,
                preexec_fn=(lambda: os.chdir(target)) if as_user else None,
            )
        except OSError as exc:
            return self.fail(*_start_failure(exc, command[0], cwd, uid))
        except subprocess.SubprocessError as exc:
            if as_user and "preexec_fn" in str(exc):
                return self.fail(
                    EXIT_CANNOT_RUN, f"working directory {cwd!r} is not accessible to uid {uid}"
                )
            return self.fail(EXIT_WRAPPER_FAILED, f"cannot start {command[0]!r}: {exc}")
        except ValueError as exc:
            return self.fail(EXIT_WRAPPER_FAILED, f"cannot start {command[0]!r}: {exc}")
        finally:
            for fd in (out_w, err_w):
                if fd is not None:
                    os.close(fd)
            if limits is not None:
                limits.leave()  # only the command and what it forks stay limited
                if self.child is None:  # it never started: nothing will use the cgroups
                    limits.finish(0)
        if self.relay is not None:
            self.relay.start()
        self.ready(f"ok {self.child.pid}")
        for signum in self.pending:
            self.forward(signum, None)
        self.pending.clear()
        # Wait for the command's end without reaping it: while it is a zombie its pid, and so
        # its process group's id, cannot be reused, so the group kill below reaches only what
        # the command left behind in its group (background jobs, helpers).
        with contextlib.suppress(ChildProcessError):  # (EINTR is retried: PEP 475)
            os.waitid(os.P_PID, self.child.pid, os.WEXITED | os.WNOWAIT)
        with contextlib.suppress(OSError):
            os.killpg(self.child.pid, signal.SIGKILL)
        code = self.child.wait()
        self.finished = True
        if limits is not None:
            # what it left running outside its group (setsid) is still in its cgroup(s):
            # killed now, before the exit is recorded and its share handed to anyone else
            limits.kill()
        elif os.getsid(0) == os.getpid():
            # no cgroup: what left the group but not the session, when the wrapper leads
            # its session (as the launcher starts it; never a session it was run from)
            kill_session(os.getpid(), spare=os.getpid())
        if self.relay is not None:
            self.relay.finish()
        reason = _signal_reason(code)
        if limits is not None:
            reason = limits.finish(code) or reason
        self.record(ExitRecord(code, reason, self.child.pid))
        return code if code >= 0 else 128 - code


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fgpu.agent.runner",
        description="Run a command and record its exit code in a file.",
    )
    parser.add_argument("--exit-file", required=True, type=Path)
    parser.add_argument("--ready-fd", type=int, default=None)
    parser.add_argument("--spec-stdin", action="store_true")
    parser.add_argument("--output-log", type=Path, default=None)
    parser.add_argument("--max-log-bytes", type=int, default=0)
    parser.add_argument("--disk-reserve", type=parse_wrapper_reserve, default=None)
    parser.add_argument("--only-output-log", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    return args


def _relay(
    output_log: Path, cap: int, reserve: DiskReserve | None = None, only_framed: bool = False
) -> _Relay:
    """The relay of ``--output-log``: the framed log, and (unless ``only_framed``) the plain
    ``stdout.log`` and ``stderr.log`` beside it, each capped at ``cap`` bytes (0: no cap).
    The plain logs are written through the wrapper's own stdout and stderr, where they are
    those files; where they are something else (a terminal, a pipe), the streams are passed
    on uncapped."""

    def plain(fd: int, name: str) -> CappedLog:
        path = output_log.with_name(name)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            same = False
        return CappedLog(path, cap if same else 0, fd=fd)

    if only_framed:
        return _Relay(
            CappedLog(output_log, cap), None, None, OutputGate(output_log.parent, reserve)
        )
    return _Relay(
        CappedLog(output_log, cap),
        plain(1, "stdout.log"),
        plain(2, "stderr.log"),
        OutputGate(output_log.parent, reserve),
    )


def _reset_realtime_policy() -> None:
    """Children of a real-time governor inherit SCHED_FIFO (governor-notes, pitfall 2);
    the wrapper drops back to the normal policy before starting the command."""
    with contextlib.suppress(AttributeError, OSError):
        if os.sched_getscheduler(0) in (os.SCHED_FIFO, os.SCHED_RR):
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the wrapper's exit status."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    wrapper = _Wrapper(args.exit_file, args.ready_fd, None)
    if args.output_log is not None:
        try:
            wrapper.relay = _relay(
                args.output_log, args.max_log_bytes, args.disk_reserve, args.only_output_log
            )
        except (OSError, ValueError) as exc:
            return wrapper.fail(EXIT_WRAPPER_FAILED, f"cannot open the output log: {exc}")
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, wrapper.forward)
    _reset_realtime_policy()
    settings: dict[str, Any] = {}
    if args.spec_stdin:
        try:
            loaded = json.loads(sys.stdin.buffer.read() or b"{}")
        except ValueError as exc:
            return wrapper.fail(EXIT_WRAPPER_FAILED, f"unreadable launch settings: {exc}")
        if not isinstance(loaded, dict):
            return wrapper.fail(EXIT_WRAPPER_FAILED, "launch settings are not a JSON object")
        settings = loaded
    return wrapper.run(list(args.command), settings)


if __name__ == "__main__":
    sys.exit(main())
