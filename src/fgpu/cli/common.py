"""What the client commands share: connection options, consoles, errors and exit codes.

Exit codes of every client command: 0 done; 1 the server refused (not allowed, not found,
conflict) or cannot be reached; 2 bad usage or input (also the server's 422 answers).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console, RenderableType
from rich.markup import escape

from fgpu.addresses import SOCKET_ENV, TOKEN_ENV, URL_ENV

if TYPE_CHECKING:
    from fgpu.cli.render import JsonValue
    from fgpu.client.client import Client, ClientError

EXIT_REFUSED = 1
EXIT_USAGE = 2

err = Console(stderr=True, highlight=False, soft_wrap=True)
# Tables keep their columns readable when stdout is a file or a pipe.
out = Console(width=None if Console().is_terminal else 160, highlight=False)

SocketOption = Annotated[
    Path | None,
    typer.Option(
        "--socket",
        envvar=SOCKET_ENV,
        help="The server's Unix socket (default: as `fgpu serve`).",
        show_default=False,
        rich_help_panel="Connection",
    ),
]
UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar=URL_ENV,
        help=f"http://HOST:PORT of a server's TCP listener instead (token from ${TOKEN_ENV}).",
        show_default=False,
        rich_help_panel="Connection",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")]


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    raise typer.Exit(code)


def exit_code(error: ClientError) -> int:
    """2 for invalid input (400/422), else 1."""
    return EXIT_USAGE if error.status in (400, 422) else EXIT_REFUSED


@contextmanager
def connect(
    socket: Path | None,
    url: str | None,
    explain: Callable[[ClientError], str] | None = None,
) -> Iterator[Client]:
    """A client for the command; a :class:`ClientError` inside ends the command with its
    message (``explain(error)`` when given: the flag or argument as typed) and exit code."""
    from fgpu.client.client import Client, ClientError, ServerUnavailable

    try:
        client = (
            Client(base_url=url, token=os.environ.get(TOKEN_ENV) or None) if url else Client(socket)
        )
    except ClientError as exc:
        if exc.field == "url" and url:
            from fgpu.cli.flags import typed_value
            from fgpu.rules.names import shorten

            flag = "--url" if typed_value(("--url",)) is not None else f"${URL_ENV}"
            fail(f"{flag} {shorten(url)}: {exc.reason}")
        fail(str(exc), exit_code(exc))
    try:
        with client:
            yield client
    except ClientError as exc:
        if explain is None or isinstance(exc, ServerUnavailable):
            fail(str(exc), exit_code(exc))
        fail(explain(exc), exit_code(exc))


def show(value: JsonValue, table: RenderableType, json_out: bool) -> None:
    """Print ``value`` as JSON with ``--json``, else the rendered ``table``."""
    from fgpu.cli import render

    if json_out:
        print(render.to_json(value))
    else:
        emit(table)


def emit(renderable: RenderableType) -> None:
    """Print on stdout; into a file or a pipe without the spaces that pad table rows."""
    if out.is_terminal:
        out.print(renderable)
        return
    with out.capture() as captured:
        out.print(renderable)
    for line in captured.get().splitlines():
        print(line.rstrip())


def uid_of(user: str) -> int:
    """A user name or uid as a uid (``--user``); fails naming the flag and the value."""
    import pwd

    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        fail(f"--user {user!r}: no such user on this machine (a name or a uid)")


def watch_loop(frame: Callable[[], RenderableType], interval: float) -> None:
    """Show ``frame()`` refreshed in place every ``interval`` seconds until Ctrl-C
    (``--watch``). A failed refresh ends the command with its error."""
    import time

    from rich.live import Live

    with Live(frame(), console=out, auto_refresh=False, transient=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(frame(), refresh=True)
        except KeyboardInterrupt:
            return
