"""``fgpu serve``: the service, :func:`fgpu.server.main.serve`."""

from __future__ import annotations

import typer

from fgpu.server.main import serve


def register(app: typer.Typer) -> None:
    """Add ``fgpu serve`` to the ``fgpu`` app."""
    app.command("serve", rich_help_panel="Service")(serve)
