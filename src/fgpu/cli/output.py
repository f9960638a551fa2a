"""A workload's output: ``run`` (submit, wait, stream, exit with its code, like Slurm's
``srun``) and ``logs``.

Both read the ordered log of both streams (``GET .../logs?stream=all``, records of
:mod:`fgpu.wire_logs`): ``run`` writes each record to its own stream (the job's stdout to
stdout, its stderr to stderr), ``logs`` writes the streams it shows to stdout, in the order
the job wrote them. Exit codes, as a shell gives them (:func:`shell_status`): the job's own
(0..255), 128+N when signal N ended it; ``run`` adds :data:`EXIT_NOT_STARTED`,
:data:`EXIT_CANCELLED` and :data:`EXIT_INTERRUPTED`.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import signal
import sys
import threading
import time
import typing
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar, cast

import typer
from rich.markup import escape

from fgpu.cli.common import SocketOption, UrlOption, connect, err, fail
from fgpu.cli.workloads import SUBMIT_FIELDS, _about, submit, submit_with

if TYPE_CHECKING:
    from types import FrameType

    from fgpu.client.client import Client
    from fgpu.client.plain import PlainWorkloadDetail
    from fgpu.wire_logs import Chunk

FOLLOW_INTERVAL_S = 0.5
"""Seconds between looks at the log and the workload while following."""

EXIT_NOT_STARTED = 125
"""``run``: the workload failed without an exit code of its own (it could not be started)."""
EXIT_CANCELLED = 143
"""``run``: the workload was cancelled by someone else or by the service (128 + SIGTERM,
what a cancel sends first) and has no exit code of its own."""
EXIT_INTERRUPTED = 130
"""``run`` and ``logs -f``: ended by Ctrl-C (128 + SIGINT)."""

DEFAULT_GRACE_S = 30.0
"""The grace period a workload gets when ``--grace`` is not given (the API's default)."""

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def shell_status(exit_code: int | None) -> int:
    """A workload's exit code as a shell's ``$?``: 0..255, 128+N for a signal N (negative),
    0 when it has none (it never ran)."""
    if exit_code is None:
        return 0
    return 128 - exit_code if exit_code < 0 else exit_code & 0xFF


def parse_since(value: str, now_s: float) -> int:
    """``--since``: a duration back from ``now_s`` (``90s``, ``10m``, ``2h``, ``1d``) or an
    ISO 8601 time (``2026-12-06T11:00:00``, local time unless it names a zone), as Unix
    time in nanoseconds.

    Raises:
        typer.Exit: (after the message) neither form.
    """
    text = value.strip()
    match = _DURATION.match(text)
    if match:
        return int((now_s - float(match.group(1)) * _UNIT_S[match.group(2)]) * 1e9)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(
            f"--since {value!r}: not a duration (30s, 10m, 2h, 1d) or a time "
            "(2026-12-06T11:00:00, local unless it names a zone)"
        )
    return int(moment.timestamp() * 1e9)


class _Follower:
    """Reads a workload's ordered log from where it left off.

    A workload started by an fgpu before the ordered log has only the two plain logs: when
    one stream is asked for (``only``), that plain log is read instead, as records without a
    time (``time_ns`` -1; :attr:`plain` is then true)."""

    def __init__(self, client: Client, workload_id: str, only: str | None = None) -> None:
        from fgpu.wire_logs import FrameReader

        self.client = client
        self.workload_id = workload_id
        self.only = only
        self.plain = False
        self.offset = 0
        self.reader = FrameReader()

    def read(self) -> list[Chunk]:
        """Every record written since the last call (none while it has written nothing)."""
        from fgpu.client.client import ClientError
        from fgpu.wire_logs import Chunk

        chunks: list[Chunk] = []
        while True:
            if self.plain:
                assert self.only is not None
                data, self.offset = self.client.logs(self.workload_id, self.only, self.offset)
                if not data:
                    return chunks
                chunks.append(Chunk(self.only, -1, data))
                continue
            try:
                data, self.offset = self.client.logs(self.workload_id, "all", self.offset)
            except ClientError as exc:
                if exc.field != "stream" or self.only is None or self.offset:
                    raise
                self.plain = True
                continue
            if not data:
                return chunks
            chunks.extend(self.reader.feed(data))


def _pending_line(detail: PlainWorkloadDetail) -> str:
    reason = detail.reason or "waiting to be placed"
    again = f" (restart {detail.restarts})" if detail.restarts else ""
    return f"{detail.id} is pending{again}: {reason}"


def _say(message: str) -> None:
    err.print(escape(f"fgpu: {message}"))


T = TypeVar("T")

OUTAGE_S = 120.0
"""How long ``logs -f`` and ``run`` wait for a server that stopped answering (a restart
leaves running work running) before they give up."""

_AWAY = object()


class _Outage:
    """A follow loop's calls through a restart of the server: while it does not answer, a
    call gives :data:`_AWAY` (said once on stderr) and the loop looks again; after
    :data:`OUTAGE_S` without an answer the error is raised."""

    def __init__(self) -> None:
        self.since: float | None = None

    def call(self, read: Callable[[], T]) -> T | object:
        from fgpu.client.client import ServerUnavailable

        try:
            result = read()
        except ServerUnavailable as exc:
            now = time.monotonic()
            if self.since is None:
                self.since = now
                _say(
                    f"{exc.reason}; waiting up to {OUTAGE_S:g} s for it to answer again (the "
                    "workload goes on meanwhile)"
                )
            elif now - self.since > OUTAGE_S:
                _say(f"no answer for {OUTAGE_S:g} s: stopped waiting (the workload goes on)")
                raise
            return _AWAY
        if self.since is not None:
            self.since = None
            _say("the fgpu server answers again")
        return result


def logs(
    workload_id: Annotated[
        str, typer.Argument(metavar="ID", help="Workload id, unique id prefix, or name.")
    ],
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing until the workload ends.")
    ] = False,
    stdout_only: Annotated[bool, typer.Option("--stdout", help="Only its stdout.")] = False,
    stderr_only: Annotated[bool, typer.Option("--stderr", help="Only its stderr.")] = False,
    tail: Annotated[
        int | None,
        typer.Option(help="Only the last N lines (then new ones with -f).", min=0, metavar="N"),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Only output written since: a duration back from now (30s, 10m, 2h, 1d) or a "
            "time (2026-12-06T11:00:00, local unless it names a zone).",
            show_default=False,
        ),
    ] = None,
    socket: SocketOption = None,
    url: UrlOption = None,
) -> None:
    """Print a workload's output: stdout and stderr in the order written (--stdout or
    --stderr for one). With -f, the exit code is the workload's once it ends, as a shell gives
    it (128+N when killed by signal N); Ctrl-C exits 130."""
    from fgpu.wire_basics import TERMINAL_PHASES

    streams = {"stdout", "stderr", "cut"}  # cut: where a capped log dropped bytes
    if stdout_only != stderr_only:
        streams = {"stdout", "cut"} if stdout_only else {"stderr", "cut"}
    cutoff = parse_since(since, time.time()) if since is not None else None
    sink = sys.stdout.buffer

    def shown(chunks: list[Chunk]) -> bytes:
        return b"".join(
            c.data
            for c in chunks
            if c.stream in streams and (cutoff is None or c.time_ns >= cutoff)
        )

    def write(data: bytes) -> None:
        if data:
            sink.write(data)
            sink.flush()

    with connect(socket, url, _about(workload_id)) as client:
        # a name or prefix is resolved once: a later namesake is not followed
        detail = client.get_workload_plain(workload_id)
        only = sorted(streams - {"cut"})
        follower = _Follower(client, detail.id, only[0] if len(only) == 1 else None)
        try:
            first = shown(follower.read())
            if follower.plain and cutoff is not None:
                fail(f"--since: {detail.id} was started by an older fgpu, which kept no times")
            if tail is not None:
                first = _last_lines(first, tail)
            write(first)
            said = ""
            if detail.phase == "pending" and not first:
                said = _pending_line(detail)
                _say(said)
            if not follow:
                return
            outage = _Outage()
            followed = detail.id
            while True:
                got = outage.call(lambda: shown(follower.read()))
                if got is not _AWAY and got:
                    write(cast(bytes, got))
                    continue
                looked = (
                    _AWAY
                    if got is _AWAY
                    else outage.call(lambda: client.get_workload_plain(followed))
                )
                if looked is _AWAY:
                    time.sleep(FOLLOW_INTERVAL_S)
                    continue
                detail = cast("PlainWorkloadDetail", looked)
                if detail.phase in TERMINAL_PHASES:
                    write(shown(follower.read()))
                    raise typer.Exit(shell_status(detail.exit_code))
                if detail.phase == "pending" and _pending_line(detail) != said:
                    said = _pending_line(detail)
                    _say(said)
                time.sleep(FOLLOW_INTERVAL_S)
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:  # `fgpu logs ID | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return


def _last_lines(data: bytes, count: int) -> bytes:
    """The last ``count`` lines of ``data`` (a last line without a newline counts)."""
    if count == 0:
        return b""
    lines = deque(data.splitlines(keepends=True), maxlen=count)
    return b"".join(lines)


class _Detach(Exception):
    """The second Ctrl-C of ``run``."""


class _Interrupts:
    """Ctrl-C during ``run``: the first asks for a cancel (done by the loop, which it
    wakes), the second detaches (raised from the handler)."""

    def __init__(self) -> None:
        self.count = 0
        self.wake = threading.Event()

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:  # the terminal is gone: what would go there goes nowhere
            devnull = os.open(os.devnull, os.O_WRONLY)
            for fd in (1, 2):
                with contextlib.suppress(OSError):
                    os.dup2(devnull, fd)
            os.close(devnull)
        self.count += 1
        if self.count > 1:
            raise _Detach
        self.wake.set()


def run(**options: Any) -> None:
    """Submit a command, wait for it, stream its output, and exit with its exit code.

    Takes the options of submit. While it waits, the pending reason shows on stderr; then
    the job's stdout and stderr stream to this stdout and stderr as written. The exit code is
    the job's (128+N when signal N killed it; 125 when it could not start; 143 when it was
    cancelled by someone else). Ctrl-C cancels it (SIGTERM, then SIGKILL after its grace)
    and exits 130; a second Ctrl-C leaves it cancelling and exits 130 at once. A closed
    terminal (SIGHUP) or a SIGTERM to ``fgpu run`` cancels it too, as srun does.

    Example: fgpu run -g 0.5 -- python train.py --epochs 3
    """
    socket = options.pop("socket")
    url = options.pop("url")
    # every option of submit but --array (one job runs in the foreground)
    fields: dict[str, Any] = {k: options.get(k) for k in SUBMIT_FIELDS}
    interrupts = _Interrupts()
    with connect(socket, url) as client:
        try:
            view = submit_with(client, **fields, verb="run")
        except KeyboardInterrupt:
            _say("interrupted while submitting; `fgpu ls` shows whether it was submitted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        _say(f"submitted {view.id} ({view.name}) to queue {view.queue}")
        caught = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, interrupts) for sig in caught}
        try:
            grace = fields["grace"]
            _follow_run(client, view.id, interrupts, DEFAULT_GRACE_S if grace is None else grace)
        except _Detach:
            _say(f"detached; {view.id} goes on being cancelled (fgpu describe {view.id} shows it)")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _follow_run(
    client: Client, workload_id: str, interrupts: _Interrupts, grace_s: float
) -> NoReturn:
    from fgpu.client.client import ClientError, ServerUnavailable
    from fgpu.wire_basics import TERMINAL_PHASES

    follower = _Follower(client, workload_id)
    # "cut": the notice of a capped log's dropped bytes, not the workload's output
    sinks = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer, "cut": sys.stderr.buffer}
    said = ""
    cancelled = False

    outage = _Outage()

    def copy() -> bool | None:
        """Write what came; whether anything did (None: the server does not answer)."""
        got = outage.call(follower.read)
        if got is _AWAY:
            return None
        chunks = cast("list[Chunk]", got)
        for chunk in chunks:
            sink = sinks[chunk.stream]
            try:
                sink.write(chunk.data)
                sink.flush()
            except BrokenPipeError:  # `fgpu run ... | head`: the job goes on, unread
                os.dup2(os.open(os.devnull, os.O_WRONLY), sink.fileno())
        return bool(chunks)

    while True:
        if interrupts.count and not cancelled:
            cancelled = True
            try:
                client.cancel_plain(workload_id)
            except ServerUnavailable as exc:  # the server is away: it cannot be cancelled now
                _say(
                    f"cannot cancel {workload_id}: {exc.reason}; it goes on: `fgpu cancel "
                    f"{workload_id}` once the server answers"
                )
                raise typer.Exit(EXIT_INTERRUPTED) from None
            except ClientError as exc:  # it ended meanwhile: the loop shows how
                _say(f"cannot cancel {workload_id}: {exc}")
            else:
                _say(
                    f"cancelling {workload_id} (SIGTERM, then SIGKILL after {grace_s:g} s); "
                    "Ctrl-C again to detach"
                )
        copied = copy()
        if copied:
            continue
        looked = (
            _AWAY if copied is None else outage.call(lambda: client.get_workload_plain(workload_id))
        )
        if looked is _AWAY:
            interrupts.wake.wait(FOLLOW_INTERVAL_S)
            interrupts.wake.clear()
            continue
        detail = cast("PlainWorkloadDetail", looked)
        if detail.phase in TERMINAL_PHASES:
            copy()
            raise typer.Exit(_run_status(detail, cancelled))
        if detail.phase == "pending" and detail.reason != "submitted":  # (not looked at yet)
            line = _pending_line(detail)
            if line != said:
                said = line
                _say(line)
        elif said:
            said = ""
            _say(f"{workload_id} is {detail.phase}")
        interrupts.wake.wait(FOLLOW_INTERVAL_S)
        interrupts.wake.clear()


def _run_status(detail: PlainWorkloadDetail, cancelled_here: bool) -> int:
    """``run``'s exit code for a workload that ended, saying why on stderr unless it
    succeeded."""
    if cancelled_here:
        _say(f"{detail.id} {detail.phase}: {detail.reason or 'cancelled'}")
        return EXIT_INTERRUPTED
    if detail.phase == "succeeded":
        return shell_status(detail.exit_code)
    _say(f"{detail.id} {detail.phase}: {detail.reason or 'no reason given'}")
    if detail.exit_code is not None:
        return shell_status(detail.exit_code)
    return EXIT_CANCELLED if detail.phase == "cancelled" else EXIT_NOT_STARTED


def _run_signature() -> None:
    """``run`` takes ``submit``'s options (but ``--json`` and ``--array``): Typer reads them
    from the function's signature and annotations."""
    signature = inspect.signature(submit, eval_str=True)
    left_out = ("json_out", "array")  # one job runs in the foreground, not an array
    parameters = [p for p in signature.parameters.values() if p.name not in left_out]
    run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    hints = typing.get_type_hints(submit, include_extras=True)  # evaluated where written
    run.__annotations__ = {k: v for k, v in hints.items() if k not in (*left_out, "return")}


def register(app: typer.Typer) -> None:
    """Add the commands to the ``fgpu`` app."""
    _run_signature()
    app.command("run", context_settings={"allow_interspersed_args": False})(run)
    app.command("logs")(logs)
