"""The top-level ``fgpu`` group, loading each command's module only when it is used.

``fgpu --help`` lists the commands from :data:`COMMANDS` (names and the first paragraph of
each help, checked against the real commands by ``tests/integration/test_cli_start.py``)
without importing any command module; ``fgpu ls`` imports :mod:`fgpu.cli.workloads` and
builds that one command, not the simulators, the MIG planner or the Kubernetes adapters.
This is Click's lazily loading group (its documentation, "Complex Applications: Lazily
Loading Subcommands") on Typer's group class.

Each command module has ``register(app)``, which adds its commands to a Typer app under
explicit names; :func:`load` builds one of them, its options converted by
:mod:`fgpu.cli.coercion`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from gettext import gettext
from typing import TYPE_CHECKING, Any

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from fgpu.cli import coercion

if TYPE_CHECKING:
    from typer._click import Command, Context, HelpFormatter  # Typer's own copy of Click

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": (
        "fgpu.cli.service",
        "Run the GPU sharing service on this machine (API on a Unix socket).",
    ),
    "submit": (
        "fgpu.cli.workloads",
        "Submit a command to run on a share of a GPU, in your directory and environment.",
    ),
    "ls": (
        "fgpu.cli.workloads",
        "List workloads (active ones; --all for finished too), oldest first: yours and "
        "others' running ones (--all-users for everyone's).",
    ),
    "list": ("fgpu.cli.workloads", "Same as ls."),
    "describe": (
        "fgpu.cli.workloads",
        "Show a workload: request, placement, events, and why it waits while pending.",
    ),
    "cancel": (
        "fgpu.cli.workloads",
        "Cancel workloads (yours; admins any). A running one gets SIGTERM, then SIGKILL after "
        "its grace period (--now: at once). Each id is tried; the exit code is that of the "
        "first refusal.",
    ),
    "delete": ("fgpu.cli.workloads", "Same as cancel."),
    "top": (
        "fgpu.cli.workloads",
        "Each GPU with the shares it holds, by workload, and live use where known.",
    ),
    "nodes": ("fgpu.cli.workloads", "The machine's nodes: CPUs, memory and GPUs."),
    "run": (
        "fgpu.cli.output",
        "Submit a command, wait for it, stream its output, and exit with its exit code.",
    ),
    "logs": (
        "fgpu.cli.output",
        "Print a workload's output: stdout and stderr in the order written (--stdout or "
        "--stderr for one). With -f, the exit code is the workload's once it ends, as a shell "
        "gives it (128+N when killed by signal N); Ctrl-C exits 130.",
    ),
    "ui": (
        "fgpu.cli.ui",
        "Serve the server's read-only dashboard to this user's browser; prints the URL.",
    ),
    "sim": ("fgpu.cli.sim", "Trace simulators."),
    "mig": ("fgpu.cli.mig", "MIG: profiles, layouts, plans, and applying them."),
    "k8s": ("fgpu.cli.k8s", "Kubernetes: scheduler, admission webhook, node agent."),
    "queue": ("fgpu.cli.queues", "Queues (tenants): quota, limit, weight, priority."),
}
"""Command name -> (the module whose ``register`` adds it, the first paragraph of its help),
in the order ``fgpu --help`` lists them (Typer's: single commands, then groups)."""

SETTINGS: dict[str, Any] = {"rich_markup_mode": None, "pretty_exceptions_enable": False}
"""Typer settings of the ``fgpu`` app, also those its commands are built with: plain help
and errors (the Rich renderer alone takes longer to load than a command)."""


def load(name: str) -> Command:
    """Build the command ``name`` of :data:`COMMANDS` (and only it) from its module.

    Raises:
        KeyError: ``name`` is not a command, or its module does not register it.
    """
    module, _ = COMMANDS[name]
    app = typer.Typer(**SETTINGS)
    importlib.import_module(module).register(app)
    app.registered_commands = [c for c in app.registered_commands if c.name == name]
    app.registered_groups = [g for g in app.registered_groups if g.name == name]
    command = typer.main.get_group(app).commands[name]
    coercion.install(command)
    return command


class _Commands(MutableMapping[str, "Command"]):
    """The group's commands: every name of :data:`COMMANDS`, each built on first use."""

    def __init__(self) -> None:
        self._built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            if name not in COMMANDS:
                raise KeyError(name)
            self._built[name] = load(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        if name not in COMMANDS:
            raise TypeError(f"{name}: an fgpu command is added in fgpu.cli.lazy.COMMANDS")
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        raise TypeError("the fgpu commands are fixed (fgpu.cli.lazy.COMMANDS)")

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS


class LazyGroup(TyperGroup):
    """Typer's group over :data:`COMMANDS`: names, help and suggestions ("Did you mean")
    without importing a command's module; running, completing or asking a command's own
    help builds it (:func:`load`)."""

    def __init__(self, **attrs: Any) -> None:
        if attrs.get("commands"):
            raise TypeError("the fgpu app's commands are in fgpu.cli.lazy.COMMANDS")
        super().__init__(**attrs)
        self.commands = _Commands()

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        coercion.install(self, ctx, subcommands=False)  # the options of fgpu itself
        return super().parse_args(ctx, args)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        return self.commands.get(cmd_name)

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        """The command list of ``fgpu --help`` from the table, as Typer writes it: each
        help shortened by Click's rule to fit the width (``get_short_help_str`` of a stand-in
        command that carries the name and the help's first paragraph)."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, TyperCommand(name=name, help=help).get_short_help_str(limit))
            for name, (_, help) in COMMANDS.items()
        ]
        with formatter.section(gettext("Commands")):
            formatter.write_dl(rows)
