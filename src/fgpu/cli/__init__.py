"""The ``fgpu`` command line (Typer): one module per command group.

- :mod:`fgpu.cli.workloads`: ``submit``, ``ls``, ``describe``, ``logs``, ``cancel``, ``top``,
  ``nodes`` (clients of the service's API through :class:`fgpu.client.Client`);
- :mod:`fgpu.cli.queues`: ``queue create|ls|set|rm``;
- :mod:`fgpu.cli.sim`: ``sim fill|replay`` (the trace simulators);
- :mod:`fgpu.cli.mig`: ``mig profiles|layouts|plan|apply``;
- :mod:`fgpu.cli.k8s`: ``k8s scheduler|webhook|node-agent|kubelet|standin``;
- :mod:`fgpu.cli.ui`: ``ui`` (the dashboard over the socket, through
  :mod:`fgpu.cli.ui_proxy`);
- ``serve``: the service (:func:`fgpu.server.main.serve`).

The commands parse and render; the work is in the library.
"""

from __future__ import annotations

import typer

from fgpu.cli import mig, queues, ui, workloads
from fgpu.cli.k8s import k8s_app
from fgpu.cli.sim import sim_app
from fgpu.server.main import serve

app = typer.Typer(
    help="fgpu: fractional GPU sharing.",
    no_args_is_help=True,
    # plain help and errors: the Rich renderer alone takes longer to load than a command
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
app.add_typer(sim_app, name="sim")
app.add_typer(mig.mig_app, name="mig")
app.add_typer(k8s_app, name="k8s")
app.command(rich_help_panel="Service")(serve)
workloads.register(app)
queues.register(app)
ui.register(app)


def main() -> None:
    """Console-script entry point."""
    app()


__all__ = ["app", "main"]
