"""``fgpu serve``: options, startup and shutdown of the single-machine service.

Order of startup: every option is checked first; then the socket is claimed (so a second
server stops before it opens the database or touches a process); then the service is built
(:meth:`fgpu.server.service.Service.create`: store, GPU backend, launcher) and served by
:class:`fgpu.server.uds.ApiServer`, whose lifespan runs the service's recovery and scheduling
loop. Logs go to stderr. SIGINT and SIGTERM stop the server cleanly; running workloads keep
running and are re-adopted by the next start (DESIGN.md section 8).

Exit codes: 0 after a clean stop, 2 for a bad option or a socket already served, 1 when the
service cannot start (database, GPU backend), 3 when its startup fails inside the server, 4
when the database is damaged (SQLite ``PRAGMA quick_check``; the message names the file and
says how to recover).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import pwd
import socket
import ssl
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fgpu.addresses import SOCKET_ENV, default_socket_path
from fgpu.server.connlimit import ConnectionLimits, LimitError
from fgpu.server.quotas import DEFAULT_MAX_RUNNING, SubmissionLimits
from fgpu.server.retention import RetentionPolicy, parse_duration

if TYPE_CHECKING:
    from fgpu.disk_room import DiskReserve
    from fgpu.store.errors import StoreDamaged

TOKEN_ENV = "FGPU_TOKEN"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
MIN_TOKEN_LENGTH = 16
"""Shortest bearer token ``--listen`` accepts."""
DEFAULT_PREEMPT_DELAY = "5m"
"""``fgpu serve --preempt-delay`` by default: :data:`fgpu.sched.decide.PREEMPT_DELAY_S`
(300 s, issue 28's wait before evict), spelled as a user would (this module loads the
decision core lazily)."""

log = logging.getLogger("fgpu.server")

LimitFlags = tuple[int, int, str] | tuple[int, int, str, int]
"""``(--max-active-per-user, --max-submission-bytes, --max-stored-bytes[,
--max-running-per-user])`` as given."""


class ServeOptionError(ValueError):
    """A ``fgpu serve`` option is wrong; the message names it."""


def resolve_user(option: str, value: str) -> int:
    """A uid or user name given to ``option`` -> uid.

    Raises:
        ServeOptionError: an unknown user name, naming ``option``.
    """
    text = value.strip()
    if text.isdigit():
        return int(text)
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise ServeOptionError(f"{option}: no user {text!r} (give a uid or a user name)") from None


def resolve_admins(values: list[str]) -> frozenset[int]:
    """``--admin`` values (uids or user names) -> uids.

    Raises:
        ServeOptionError: an unknown user name.
    """
    return frozenset(resolve_user("--admin", value) for value in values)


def read_token(token_file: Path | None, env: dict[str, str]) -> str | None:
    """The bearer token for ``--listen``: the file's first line, else ``$FGPU_TOKEN``.

    Raises:
        ServeOptionError: the file cannot be read, is a symbolic link, is empty, belongs to
            another user than root or the server's own, or is open to group or others (the
            message gives the ``chmod`` to run).
    """
    if token_file is not None:
        try:
            fd = os.open(token_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                info = os.fstat(fd)
                with os.fdopen(fd, encoding="utf-8", closefd=False) as handle:
                    text = handle.read()
            finally:
                os.close(fd)
            mode = info.st_mode
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
                reason = "it is a symbolic link (name the file itself)"
            raise ServeOptionError(f"--token-file: cannot read {token_file}: {reason}") from None
        if info.st_uid not in (0, os.geteuid()):
            owner = info.st_uid
            raise ServeOptionError(
                f"--token-file: {token_file} belongs to uid {owner}, who could then act as the "
                f"token's user; use a file owned by root or by the server's own user "
                f"(uid {os.geteuid()})"
            )
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ServeOptionError(
                f"--token-file: {token_file} is open to group or others (mode "
                f"{stat.S_IMODE(mode):04o}); anyone who reads it acts as the token's user: "
                f"run chmod 600 {token_file}"
            )
        lines = text.strip().splitlines()
        token = lines[0].strip() if lines else ""
        if not token:
            raise ServeOptionError(f"--token-file: {token_file} is empty")
        return token
    token = env.get(TOKEN_ENV, "").strip()
    return token or None


def serve(
    socket_path: Annotated[
        Path | None,
        typer.Option(
            "--socket",
            envvar=SOCKET_ENV,
            help="Unix socket to serve on (default: /run/fgpu/fgpu.sock as root, else "
            "$XDG_RUNTIME_DIR/fgpu/fgpu.sock, else /tmp/fgpu-$UID/fgpu.sock).",
            show_default=False,
        ),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option(
            help="Also serve HTTP on HOST:PORT; needs --token-file or $FGPU_TOKEN.",
        ),
    ] = None,
    token_file: Annotated[
        Path | None, typer.Option(help="File whose first line is the bearer token for --listen.")
    ] = None,
    metrics_listen: Annotated[
        str | None,
        typer.Option(
            help="Also serve Prometheus metrics (only /metrics, no token) on HOST:PORT.",
            show_default=False,
        ),
    ] = None,
    token_user: Annotated[
        str | None,
        typer.Option(
            help="The uid or user name a token caller acts as (workloads run as that user); "
            "required with --listen when the server runs as root.",
            show_default=False,
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(help="PEM certificate (chain) for HTTPS on --listen; with --tls-key."),
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")] = None,
    tokens_in_clear: Annotated[
        bool,
        typer.Option(
            "--tokens-in-clear",
            help="Serve --listen on an address other than loopback without TLS: the bearer "
            "token then crosses the network in clear text.",
        ),
    ] = False,
    db: Annotated[
        str | None,
        typer.Option(
            help="SQLite file or database URL (postgresql://...) (default: STATE_DIR/fgpu.db)."
        ),
    ] = None,
    simulate_gpus: Annotated[
        str | None,
        typer.Option(
            help="Simulated GPUs instead of NVML, e.g. 2xA100-40GB,1xH100-80GB; "
            "2xA100-80GB:mig puts GPUs in MIG mode."
        ),
    ] = None,
    # fgpu.plugins.DEFAULT_POLICY, spelled out: this module loads the service lazily
    policy: Annotated[
        str, typer.Option(help="Placement policy (see `fgpu sim fill`).")
    ] = "fgd-pattern",
    admin: Annotated[
        list[str] | None,
        typer.Option(help="A uid or user name that may manage queues and all work; repeatable."),
    ] = None,
    squeeze: Annotated[
        bool,
        typer.Option(
            "--squeeze/--no-squeeze",
            help="Squeeze before evict: higher-priority work shares a GPU with lower work of "
            "its queue (which pauses while it is busy) where memory allows, instead of "
            "evicting it; --no-squeeze evicts. Queues may choose for themselves.",
        ),
    ] = True,
    preempt_delay: Annotated[
        str,
        typer.Option(
            "--preempt-delay",
            metavar="DURATION",
            help="Wait before evict: a preemptor below priority high (100) waits this long "
            "for GPUs to free by themselves before it suspends or evicts lower-priority work "
            "(seconds, or 300s, 5m, 1h; 0: at once). Queues may set their own "
            "(fgpu queue set --preempt-delay).",
        ),
    ] = DEFAULT_PREEMPT_DELAY,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder for logs and process records "
            "(default: $XDG_STATE_HOME/fgpu; /var/lib/fgpu as root).",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help=f"Log level: {', '.join(LOG_LEVELS)}.")] = "info",
    compute_mode: Annotated[
        str,
        typer.Option(
            help="How a shared GPU's time is divided: fair (shares are minimums, idle time "
            "goes to busy workloads; a lone one runs freely) or strict (each gets its share, no "
            "more, alone or not).",
            rich_help_panel="On the GPU",
        ),
    ] = "fair",
    priority_policy: Annotated[
        str,
        typer.Option(
            help="While a higher-priority workload on a GPU is busy, lower ones pause, or "
            "compress to a 10% floor.",
            rich_help_panel="On the GPU",
        ),
    ] = "pause",
    memory_policy: Annotated[
        str,
        typer.Option(
            help="A workload over its GPU memory quota is killed, or only warned about.",
            rich_help_panel="On the GPU",
        ),
    ] = "kill",
    no_governor: Annotated[
        bool,
        typer.Option(
            "--no-governor",
            help="Place only: no time slicing on shared GPUs. The memory guard stays on NVML "
            "GPUs; on simulated GPUs the pretend memory reports come through the governor's "
            "hint socket, so there it is off too.",
            rich_help_panel="On the GPU",
        ),
    ] = False,
    interposer: Annotated[
        str,
        typer.Option(
            help="Preload the CUDA interposer (memory caps as CUDA out-of-memory errors, "
            "holds at kernel launch): auto (real GPUs and --fake-driver), on, off.",
            rich_help_panel="On the GPU",
        ),
    ] = "auto",
    fake_driver: Annotated[
        bool,
        typer.Option(
            "--fake-driver",
            help="With --simulate-gpus: workloads run against fgpu's fake CUDA driver and "
            "NVML (a stand-in for trying the interposer without a GPU).",
            rich_help_panel="On the GPU",
        ),
    ] = False,
    max_connections_per_user: Annotated[
        int,
        typer.Option(
            help="Open API connections per uid (Unix socket) or per address (TCP); one more "
            "gets HTTP 429.",
            rich_help_panel="Limits",
        ),
    ] = 64,
    max_connections: Annotated[
        int | None,
        typer.Option(
            help="Open API connections in all; one more gets HTTP 503 (default: the file "
            "limit, ulimit -n, less --connection-reserve).",
            rich_help_panel="Limits",
            show_default=False,
        ),
    ] = None,
    connection_reserve: Annotated[
        int,
        typer.Option(
            help="File descriptors kept from API connections for the store, the governor "
            "and the workloads' logs.",
            rich_help_panel="Limits",
        ),
    ] = 256,
    request_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a request may take to arrive from its first byte (a connection's "
            "first request: from the connection); later ones get HTTP 408 and are closed.",
            rich_help_panel="Limits",
        ),
    ] = 10.0,
    idle_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds an idle keep-alive API connection stays open.",
            rich_help_panel="Limits",
        ),
    ] = 5.0,
    max_active_per_user: Annotated[
        int,
        typer.Option(
            help="Active (pending, running, paused) workloads per user; one more gets HTTP 429.",
            rich_help_panel="Limits",
        ),
    ] = 10_000,
    max_running_per_user: Annotated[
        int,
        typer.Option(
            help="Workloads one user may have running (or paused) at once, all queues; more "
            "wait pending (each running one holds a runner process of the server, about "
            "10 MB of host memory); a queue may set less (fgpu queue set "
            "--max-running-per-user).",
            rich_help_panel="Limits",
        ),
    ] = DEFAULT_MAX_RUNNING,
    max_submission_bytes: Annotated[
        int,
        typer.Option(
            help="Bytes of command and environment one submission may store; more gets HTTP 422.",
            rich_help_panel="Limits",
        ),
    ] = 256 * 1024,
    max_stored_bytes: Annotated[
        str,
        typer.Option(
            help="Bytes of commands and environments one user's stored workloads (active, "
            "and finished until pruned) may take, all queues (a size: 256MiB); a queue may "
            "set less for its own (fgpu queue set --max-stored-bytes); more gets HTTP 429.",
            rich_help_panel="Limits",
        ),
    ] = "256MiB",
    max_output_bytes: Annotated[
        str,
        typer.Option(
            help="Bytes of output (logs) one user's stored workloads (active, and finished "
            "until pruned) may keep, all queues (a size: 4GiB); a queue may set less for its "
            "own (fgpu queue set --max-output-bytes); past it the user's running workloads' "
            "output is dropped and `fgpu logs` says so, naming the limit.",
            rich_help_panel="Limits",
        ),
    ] = "4GiB",
    retention: Annotated[
        str,
        typer.Option(
            help="How long finished workloads, their events and logs are kept (7d, 12h, "
            "30m, 90s); older ones are deleted in the background.",
            rich_help_panel="Limits",
        ),
    ] = "7d",
    max_log_bytes: Annotated[
        str,
        typer.Option(
            help="Each log of a workload (stdout, stderr, both in order) keeps about this many "
            "bytes: its first half and its latest quarter to half; what is between is "
            "dropped and `fgpu logs` says where and how much (a size; 0: no cap).",
            rich_help_panel="Limits",
        ),
    ] = "64MiB",
    log_disk_reserve: Annotated[
        str,
        typer.Option(
            help="Free space of the state disk that workloads' output and new submissions "
            "never take: a size (256MiB), a share of the disk (5%), or both (the larger), "
            "at most a quarter of the disk's size; below it output is dropped and `fgpu "
            "logs` says so where it was cut, and a submission that would go below it gets "
            "507 (0: no reserve).",
            rich_help_panel="Limits",
        ),
    ] = "256MiB,5%",
    disk_ballast: Annotated[
        str,
        typer.Option(
            help="Space held in the state folder (a file) and released when the disk is "
            "full, so that cancels and workloads' ends are still recorded (a size; 0: none).",
            rich_help_panel="Limits",
        ),
    ] = "16MiB",
    event_interval: Annotated[
        str,
        typer.Option(
            help="Like events of one workload (same kind) within this interval are kept as "
            "one with a count (60s; 0 keeps each).",
            rich_help_panel="Limits",
        ),
    ] = "60s",
    listing_max_bytes: Annotated[
        str,
        typer.Option(
            help="Most bytes of JSON one listing answer (GET /v1/workloads) holds; a page "
            "stops early and its cursor goes on (a size, at least 64KiB).",
            rich_help_panel="Limits",
        ),
    ] = "8MiB",
    listings_at_once: Annotated[
        int,
        typer.Option(
            help="Listing answers made at once, at most 1 of them one user's; 16 more wait "
            "(at most 2 of one user), beyond that HTTP 503 with Retry-After.",
            rich_help_panel="Limits",
        ),
    ] = 2,
    suspend_host_memory: Annotated[
        str,
        typer.Option(
            "--suspend-host-memory",
            help="Host memory for work suspended to make room (its GPU memory copied out "
            "through the CUDA checkpoint API, driver r570+): a percentage of the RAM, a size "
            "(64GiB) or 0 (off: victims are evicted).",
            rich_help_panel="On the GPU",
        ),
    ] = "25%",
) -> None:
    """Run the GPU sharing service on this machine (API on a Unix socket)."""
    raise typer.Exit(
        run_serve(
            socket_path=socket_path,
            listen=listen,
            token_file=token_file,
            token_user=token_user,
            tls_files=(tls_cert, tls_key),
            tokens_in_clear=tokens_in_clear,
            enforcement=(compute_mode, priority_policy, memory_policy, not no_governor),
            db=db,
            simulate_gpus=simulate_gpus,
            policy=policy,
            admins=admin or [],
            state_dir=state_dir,
            log_level=log_level,
            interposer=interposer,
            fake_driver=fake_driver,
            metrics_listen=metrics_listen,
            squeeze=squeeze,
            preempt_delay=preempt_delay,
            connection_limits=ConnectionLimits(
                per_peer=max_connections_per_user,
                total=max_connections,
                reserve=connection_reserve,
                request_timeout_s=request_timeout,
                idle_timeout_s=idle_timeout,
            ),
            submission_limits=(
                max_active_per_user,
                max_submission_bytes,
                max_stored_bytes,
                max_running_per_user,
            ),
            retention=(retention, event_interval),
            max_log_bytes=max_log_bytes,
            suspend_host_memory=suspend_host_memory,
            listing=(listing_max_bytes, listings_at_once),
            disk=(log_disk_reserve, disk_ballast, max_output_bytes),
        )
    )


def _error(message: str) -> None:
    print(f"fgpu serve: error: {message}", file=sys.stderr, flush=True)


def run_serve(
    *,
    socket_path: Path | None,
    listen: str | None,
    token_file: Path | None,
    db: str | None,
    simulate_gpus: str | None,
    policy: str,
    admins: list[str],
    state_dir: Path | None,
    log_level: str,
    token_user: str | None = None,
    enforcement: tuple[str, str, str, bool] = ("fair", "pause", "kill", True),
    interposer: str = "auto",
    fake_driver: bool = False,
    tls_files: tuple[Path | None, Path | None] = (None, None),
    tokens_in_clear: bool = False,
    metrics_listen: str | None = None,
    squeeze: bool = True,
    connection_limits: ConnectionLimits | None = None,
    submission_limits: SubmissionLimits | LimitFlags | None = None,
    retention: RetentionPolicy | tuple[str, str] | None = None,
    suspend_host_memory: str = "25%",
    max_log_bytes: str = "64MiB",
    preempt_delay: str = DEFAULT_PREEMPT_DELAY,
    listing: tuple[str, int] = ("8MiB", 2),
    disk: tuple[str, str, str] = ("256MiB,5%", "16MiB", "4GiB"),
) -> int:
    """Check the options, claim the socket, build the service and serve until stopped.

    Returns the exit code (see the module docstring).
    """
    from fgpu.server.uds import parse_listen

    level = log_level.lower()
    try:
        if level not in LOG_LEVELS:
            raise ServeOptionError(
                f"--log-level: {log_level!r} is not one of {', '.join(LOG_LEVELS)}"
            )
        logging.basicConfig(
            level=level.upper(),
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        address = None
        token = None
        token_uid = None
        tls = None
        if listen is not None:
            try:
                address = parse_listen(listen)
            except ValueError as exc:
                raise ServeOptionError(f"--listen: {exc}") from None
            token = read_token(token_file, dict(os.environ))
            if token is None:
                raise ServeOptionError(f"--listen needs a token: --token-file or ${TOKEN_ENV}")
            if len(token) < MIN_TOKEN_LENGTH:
                raise ServeOptionError(
                    f"--token-file: the token has {len(token)} characters; use at least "
                    f"{MIN_TOKEN_LENGTH} (e.g. `openssl rand -hex 32`)"
                )
            if token_user is not None:
                token_uid = resolve_user("--token-user", token_user)
                if token_uid == 0:
                    raise ServeOptionError(
                        f"--token-user: {token_user!r} is root (uid 0): whoever holds the "
                        "token would run commands as root; name an unprivileged user"
                    )
            elif os.geteuid() == 0:
                raise ServeOptionError(
                    "--listen as root needs --token-user: token callers would otherwise run "
                    "their commands as root"
                )
            tls = tcp_security(address, tls_files, tokens_in_clear)
        elif token_file is not None:
            raise ServeOptionError("--token-file is only used with --listen")
        elif tls_files != (None, None):
            raise ServeOptionError("--tls-cert and --tls-key are only used with --listen")
        elif tokens_in_clear:
            raise ServeOptionError("--tokens-in-clear is only used with --listen")
        elif token_user is not None:
            raise ServeOptionError("--token-user is only used with --listen")
        metrics_address = None
        if metrics_listen is not None:
            from fgpu.metrics.http import parse_address

            try:
                metrics_address = parse_address(metrics_listen)
            except ValueError as exc:
                raise ServeOptionError(f"--metrics-listen: {exc}") from None
            if address is not None and metrics_address == address:
                raise ServeOptionError(
                    f"--metrics-listen: {metrics_listen!r} is the --listen address; give "
                    "another port (the API serves /metrics itself, with the token)"
                )
        admin_uids = resolve_admins(admins)
        enforcement = (
            enforcement[0].strip().lower(),
            enforcement[1].strip().lower(),
            enforcement[2].strip().lower(),
            enforcement[3],
        )
        for option, value, allowed in (
            ("--compute-mode", enforcement[0], ("fair", "strict")),
            ("--priority-policy", enforcement[1], ("pause", "compress")),
            ("--memory-policy", enforcement[2], ("kill", "warn")),
        ):
            if value not in allowed:
                raise ServeOptionError(f"{option}: {value!r} is not one of {', '.join(allowed)}")
        interposer = interposer.strip().lower()
        if interposer not in ("auto", "on", "off"):
            raise ServeOptionError(f"--interposer: {interposer!r} is not one of auto, on, off")
        if fake_driver and simulate_gpus is None:
            raise ServeOptionError("--fake-driver: needs --simulate-gpus (the GPUs it pretends)")
        if fake_driver and interposer == "off":
            raise ServeOptionError(
                "--fake-driver: it exists to try the interposer; drop --interposer off"
            )
        if policy.strip() == "":
            raise ServeOptionError("--policy: give a policy name")
        connection_limits = connection_limits or ConnectionLimits()
        from fgpu.server.fdbudget import raise_file_limit

        raise_file_limit()  # workloads hold descriptors too (fgpu.server.fdbudget)
        try:
            connection_limits.check()
        except LimitError as exc:
            raise ServeOptionError(str(exc)) from None
        submission_limits, retention = _limits(submission_limits, retention)
        log_cap = _log_cap(max_log_bytes)
        listing_limits = _listing_limits(*listing)
        disk_room = _disk_room(*disk)
        from fgpu.model.units import UnitError, parse_duration_s

        try:
            preempt_delay_s = parse_duration_s(preempt_delay, "--preempt-delay")
        except UnitError as exc:
            raise ServeOptionError(f"--preempt-delay {preempt_delay!r}: {exc.reason}") from None
        import psutil

        from fgpu.server.suspending import suspend_budget_mib

        try:
            suspend_mib = suspend_budget_mib(
                suspend_host_memory, psutil.virtual_memory().total // 2**20
            )
        except ValueError as exc:
            raise ServeOptionError(str(exc)) from None
    except ServeOptionError as exc:
        _error(str(exc))
        return 2
    path = (socket_path or default_socket_path()).absolute()
    return _start(
        path,
        address,
        token,
        db,
        simulate_gpus,
        policy,
        admin_uids,
        state_dir,
        level,
        token_uid,
        enforcement,
        interposer,
        fake_driver,
        tls,
        metrics_address,
        squeeze,
        connection_limits,
        submission_limits,
        suspend_mib,
        retention,
        log_cap,
        preempt_delay_s,
        listing_limits,
        disk_room,
    )


EXIT_STORE_DAMAGED = 4
"""``fgpu serve``'s exit code when the database is damaged."""


def damaged_message(exc: StoreDamaged) -> str:
    """What ``fgpu serve`` says about a damaged database: the file, the problems, the
    recovery steps (:data:`fgpu.store.engine.RECOVERY_STEPS`)."""
    from fgpu.store.engine import RECOVERY_STEPS

    problems = "; ".join(exc.problems[:5])
    steps = RECOVERY_STEPS.format(db=exc.database)
    return (
        f"the database {exc.database} is damaged ({problems}); fgpu will not serve from it. "
        f"To recover: {steps}"
    )


def _size_option(flag: str, text: str, minimum: int, why: str, *, zero: str = "") -> int:
    """A size flag's value in bytes (``parse_bytes``), at least ``minimum`` (``why`` says
    why); with ``zero`` (what 0 means, e.g. "no cap"), 0 is allowed too.

    Raises:
        ServeOptionError: naming the flag, echoing the value and saying what is wrong.
    """
    from fgpu.model.units import UnitError, parse_bytes

    if zero and text.strip() in ("0", "0B", "0b"):
        return 0
    try:
        size = parse_bytes(text, flag)
    except UnitError as exc:
        raise ServeOptionError(f"{flag}: {text!r}: {exc.reason}") from None
    if size < minimum:
        floor = f"give 0 ({zero}) or at least" if zero else "give at least"
        raise ServeOptionError(f"{flag}: {text!r} is {size} bytes; {floor} {minimum} ({why})")
    return size


def _log_cap(text: str) -> int:
    """``--max-log-bytes`` in bytes (0: no cap).

    Raises:
        ServeOptionError: not a size, or a cap below the smallest.
    """
    from fgpu.log_files import MIN_LOG_BYTES

    why = "a log keeps whole records of up to 64 KiB"
    return _size_option("--max-log-bytes", text, MIN_LOG_BYTES, why, zero="no cap")


MIN_LISTING_BYTES = 64 * 1024
"""Smallest ``--listing-max-bytes``."""


def _listing_limits(size_text: str, at_once: int) -> tuple[int, int]:
    """``--listing-max-bytes`` in bytes and ``--listings-at-once``, checked.

    Raises:
        ServeOptionError: naming the flag and echoing the value.
    """
    size = _size_option("--listing-max-bytes", size_text, MIN_LISTING_BYTES, "64KiB")
    if at_once < 1:
        raise ServeOptionError(f"--listings-at-once: {at_once} must be at least 1")
    return size, at_once


def _disk_room(
    reserve_text: str, ballast_text: str, output_text: str
) -> tuple[DiskReserve, int, int]:
    """``--log-disk-reserve``, ``--disk-ballast`` (bytes) and ``--max-output-bytes``
    (bytes), checked.

    Raises:
        ServeOptionError: naming the flag, echoing the value and saying what is wrong.
    """
    from fgpu.disk_room import parse_reserve
    from fgpu.wire_limits import MIN_OUTPUT_BYTES

    try:
        reserve = parse_reserve(reserve_text, "--log-disk-reserve")
    except ValueError as exc:
        raise ServeOptionError(str(exc)) from None
    output = _size_option("--max-output-bytes", output_text, MIN_OUTPUT_BYTES, "1 MiB")
    why = "room for a few of the store's writes"
    ballast = _size_option("--disk-ballast", ballast_text, MIN_BALLAST_BYTES, why, zero="none")
    return reserve, ballast, output


MIN_BALLAST_BYTES = 256 * 1024
"""Smallest ``--disk-ballast`` other than 0."""


def _limits(
    submission: SubmissionLimits | LimitFlags | None,
    retention: RetentionPolicy | tuple[str, str] | None,
) -> tuple[SubmissionLimits, RetentionPolicy]:
    """The per-user limits and the retention from their flags (``--max-active-per-user``,
    ``--max-running-per-user``,
    ``--max-submission-bytes``, ``--max-stored-bytes``; ``--retention``,
    ``--event-interval``), checked.

    Raises:
        ServeOptionError: naming the flag and echoing the value.
    """
    from fgpu.model.units import UnitError, parse_bytes

    try:
        if isinstance(submission, tuple):
            active, per_submission, stored_text, *running = submission
            try:
                stored = parse_bytes(stored_text, "--max-stored-bytes")
            except UnitError as exc:
                raise ValueError(f"--max-stored-bytes: {stored_text!r}: {exc.reason}") from None
            submission = SubmissionLimits(
                active, per_submission, stored, *(running[:1] or [DEFAULT_MAX_RUNNING])
            )
        submission = submission or SubmissionLimits()
        submission.check()
        if isinstance(retention, tuple):
            keep_text, interval_text = retention
            interval = (
                0.0
                if interval_text.strip() in ("0", "0s")
                else parse_duration("--event-interval", interval_text)
            )
            retention = RetentionPolicy(parse_duration("--retention", keep_text), interval)
        retention = retention or RetentionPolicy()
        retention.check()
    except ValueError as exc:
        raise ServeOptionError(str(exc)) from None
    return submission, retention


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback address (127.0.0.0/8, ::1);
    False for names that do not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return False
    addresses = {str(info[4][0]).split("%")[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def tcp_security(
    address: tuple[str, int],
    tls_files: tuple[Path | None, Path | None],
    tokens_in_clear: bool,
) -> ssl.SSLContext | None:
    """TLS for ``--listen``: a context from ``--tls-cert``/``--tls-key``, or None for plain
    HTTP, which only a loopback address gets without ``--tokens-in-clear`` (a bearer token
    sent in clear over a network is anyone's who can see the traffic; DESIGN.md section 9:
    "TCP needs a token (TLS off loopback)").

    Raises:
        ServeOptionError: one of the two TLS files without the other, files that do not load
            as a certificate and its key, or an address beyond loopback with neither TLS nor
            ``--tokens-in-clear``.
    """
    cert, key = tls_files
    host = address[0]
    if cert is not None or key is not None:
        if cert is None or key is None:
            raise ServeOptionError("--tls-cert and --tls-key go together; give both")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ServeOptionError(
                f"--tls-cert/--tls-key: cannot load {cert} with {key}: {exc}"
            ) from None
        return context
    if is_loopback(host):
        return None
    if not tokens_in_clear:
        raise ServeOptionError(
            f"--listen: {host} is not a loopback address, and without TLS the bearer token "
            "would cross the network in clear text: give --tls-cert and --tls-key, or "
            "--tokens-in-clear to accept that"
        )
    log.warning("serving %s without TLS: bearer tokens cross the network in clear text", host)
    return None


def _start(
    path: Path,
    address: tuple[str, int] | None,
    token: str | None,
    db: str | None,
    simulate_gpus: str | None,
    policy: str,
    admins: frozenset[int],
    state_dir: Path | None,
    level: str,
    token_uid: int | None,
    enforcement: tuple[str, str, str, bool],
    interposer: str = "auto",
    fake_driver: bool = False,
    tls: ssl.SSLContext | None = None,
    metrics_address: tuple[str, int] | None = None,
    squeeze: bool = True,
    connection_limits: ConnectionLimits | None = None,
    submission_limits: SubmissionLimits | None = None,
    suspend_mib: int = 0,
    retention: RetentionPolicy | None = None,
    max_log_bytes: int | None = None,
    preempt_delay_s: float = 0.0,
    listing_limits: tuple[int, int] | None = None,
    disk_room: tuple[DiskReserve, int, int] | None = None,
) -> int:
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from fgpu.agent.governor.plan import ComputeMode, PriorityPolicy
    from fgpu.agent.memguard import MemoryPolicy
    from fgpu.log_files import DEFAULT_MAX_LOG_BYTES
    from fgpu.sched.decide import SchedulerConfig
    from fgpu.server.allocator import tune_allocator
    from fgpu.server.app import create_app
    from fgpu.server.enforcement import EnforcementConfig
    from fgpu.server.interposing import InterposerMode
    from fgpu.server.service import Service
    from fgpu.server.storage import DEFAULT_BALLAST_BYTES
    from fgpu.server.uds import ApiServer, SocketInUse
    from fgpu.store.errors import StoreDamaged

    tune_allocator()  # before any thread starts (fgpu.server.allocator says why)
    server = ApiServer(path, address, log_level=level, tls=tls, limits=connection_limits)
    try:
        server.bind()
    except SocketInUse as exc:
        _error(str(exc))
        return 2
    except OSError as exc:
        _error(f"cannot listen on {path}{' or ' + str(address) if address else ''}: {exc}")
        return 2
    try:
        service = Service.create(
            db=db,
            simulate_gpus=simulate_gpus,
            policy=policy,
            state_dir=state_dir,
            admins=admins,
            # beside the API socket: reachable by every user's workloads (0666; senders are
            # authenticated by pid), unlike the private state folder
            # named after the API socket, which is locked: two servers never share one
            agent_socket=str(path.with_name(f"{path.stem}-agent.sock")),
            enforcement=EnforcementConfig(
                compute_mode=ComputeMode(enforcement[0]),
                priority_policy=PriorityPolicy(enforcement[1]),
                memory_policy=MemoryPolicy(enforcement[2]),
                governor=enforcement[3],
                interposer=InterposerMode(interposer),
            ),
            fake_driver=fake_driver,
            config=SchedulerConfig(squeeze=squeeze, preempt_delay_s=preempt_delay_s),
            suspend_host_memory_mib=suspend_mib,
            max_log_bytes=DEFAULT_MAX_LOG_BYTES if max_log_bytes is None else max_log_bytes,
            disk_reserve=disk_room[0] if disk_room is not None else None,
            disk_ballast=disk_room[1] if disk_room is not None else DEFAULT_BALLAST_BYTES,
        )
    except StoreDamaged as exc:
        server.release()
        _error(damaged_message(exc))
        return EXIT_STORE_DAMAGED
    except (ValueError, ArgumentError) as exc:
        server.release()
        _error(str(exc))
        return 2
    except (OSError, SQLAlchemyError) as exc:
        server.release()
        _error(f"cannot start the service: {exc}")
        return 1
    except BaseException:
        server.release()
        raise
    if submission_limits is not None:
        service.submission_limits = submission_limits
    if retention is not None:
        service.retention = retention
    if listing_limits is not None:
        from fgpu.server.listing import ListingGate

        service.listing_max_bytes = listing_limits[0]
        service.listing_gate = ListingGate(concurrent=listing_limits[1])
    if disk_room is not None:
        service.output.max_bytes = disk_room[2]
    metrics_server = None
    if metrics_address is not None:
        from fgpu.metrics.http import serve_metrics

        try:
            metrics_server, _ = serve_metrics(service.metrics.exposition, metrics_address)
        except OSError as exc:
            server.release()
            host, port = metrics_address
            _error(f"--metrics-listen: cannot listen on {host}:{port}: {exc}")
            return 2
        log.info("serving metrics on http://%s:%d/metrics", *metrics_address)
    log.info("serving the API on %s (pid %d)", path, os.getpid())
    try:
        from fgpu.server.fdbudget import FDS_PER_WORKLOAD

        server.workload_fds = lambda: FDS_PER_WORKLOAD * service.running_processes
        server.run(create_app(service, token=token, token_uid=token_uid))
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
    log.info("stopped")
    return 0
