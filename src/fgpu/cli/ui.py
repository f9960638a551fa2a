"""``fgpu ui``: open the server's dashboard from this user's browser (over the socket)."""

from __future__ import annotations

from typing import Annotated

import typer

from fgpu.cli.common import SocketOption, err, fail


def ui(
    socket: SocketOption = None,
    host: Annotated[
        str, typer.Option(help="Loopback address to serve the dashboard on.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free one).", min=0, max=65535)] = 0,
) -> None:
    """Serve the server's read-only dashboard to this user's browser; prints the URL."""
    from fgpu.cli.ui_proxy import serve_ui
    from fgpu.client.client import Client, ClientError, resolve_socket
    from fgpu.server.main import is_loopback

    if not is_loopback(host):
        fail(
            f"--host: {host!r} is not a loopback address; fgpu ui shows the dashboard as you "
            "see it, to this machine only (use fgpu serve --listen with a token for others)"
        )
    # as every other command: --socket/$FGPU_SOCKET, else this user's own server, else the
    # machine's shared one (fgpu.client.resolve_socket)
    path = resolve_socket(socket).absolute()
    try:
        with Client(path, timeout=10) as client:
            client.health()
    except ClientError as exc:
        fail(f"--socket: no fgpu server answers on {path}: {exc}", code=1)

    def announce(url: str) -> None:
        print(f"fgpu dashboard: {url}", flush=True)
        err.print(
            "(Ctrl-C stops it; the link works once, in your browser: its key is traded for a "
            "session cookie, and other users' connections are refused)"
        )

    try:
        serve_ui(path, host, port, announce)
    except OSError as exc:
        fail(f"--port: cannot listen on {host}:{port}: {exc}")


def register(app: typer.Typer) -> None:
    """Add ``fgpu ui`` to the ``fgpu`` app."""
    app.command("ui", rich_help_panel="Service")(ui)
