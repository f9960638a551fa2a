"""The ``fgpu`` command line (Typer): one module per command group.

- :mod:`fgpu.cli.workloads`: ``submit``, ``ls``, ``describe``, ``cancel``, ``top``, ``nodes``
  (clients of the service's API through :class:`fgpu.client.Client`);
- :mod:`fgpu.cli.output`: ``run`` (submit, stream, exit with the job's code) and ``logs``;
- :mod:`fgpu.cli.queues`: ``queue create|ls|set|rm``;
- :mod:`fgpu.cli.sim`: ``sim fill|replay`` (the trace simulators);
- :mod:`fgpu.cli.mig`: ``mig profiles|layouts|plan|apply``;
- :mod:`fgpu.cli.k8s`: ``k8s scheduler|webhook|node-agent|kubelet|standin``;
- :mod:`fgpu.cli.ui`: ``ui`` (the dashboard over the socket, through
  :mod:`fgpu.cli.ui_proxy`);
- :mod:`fgpu.cli.service`: ``serve``, the service (:func:`fgpu.server.main.serve`).

The commands parse and render; the work is in the library. A command's module is imported
only when that command runs (:mod:`fgpu.cli.lazy`), so that ``fgpu --help`` and ``fgpu ls``
start fast.
"""

from __future__ import annotations

import typer

from fgpu.cli.lazy import SETTINGS, LazyGroup

app = typer.Typer(
    cls=LazyGroup, help="fgpu: fractional GPU sharing.", no_args_is_help=True, **SETTINGS
)


def _version(shown: bool) -> None:
    if shown:
        from fgpu import __version__

        print(f"fgpu {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """fgpu: fractional GPU sharing."""


def main() -> None:
    """Console-script entry point."""
    app()


__all__ = ["app", "main"]
