"""What ``fgpu --help`` and ``fgpu ls`` load (issue "Everyday use", point 4: a fast start),
read from the real processes' ``-X importtime`` lists, and the lazily loading group's table
of commands against the real commands. The times themselves are measured by
``bench/cli_start.py``, not here."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from fgpu import cli
from fgpu.cli.lazy import COMMANDS, SETTINGS, load
from tests.serverproc import ServerProcess, started_server

FGPU = str(Path(sys.executable).parent / "fgpu")

NEVER = (
    "numpy",
    "scipy",
    "matplotlib",
    "sqlalchemy",
    "fastapi",
    "uvicorn",
    "httpx",
    "httpcore",
    "pydantic",
    "fgpu.wire",
    "fgpu.sim",
    "fgpu.sched",
    "fgpu.k8s",
    "fgpu_standin",
    "fgpu.mig",
    "fgpu.server",
    "fgpu.store",
    "fgpu.agent",
    "fgpu.model",
    "fgpu.cli.sim",
    "fgpu.cli.mig",
    "fgpu.cli.k8s",
    "fgpu.cli.ui",
    "fgpu.cli.queues",
    "fgpu.cli.service",
)
"""Modules neither command may load: the simulators, the cores, the service, the Kubernetes
adapters, the MIG planner, the other commands, httpx (the socket goes through the standard
library) and pydantic (the listing is read by :mod:`fgpu.client.plain`, the options are
converted by :mod:`fgpu.cli.coercion`)."""

NOT_FOR_HELP = ("rich", "fgpu.client", "fgpu.cli.workloads")
"""Modules ``fgpu --help`` does not need either: it lists the commands from the table."""


def loaded(*args: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules a real ``fgpu ARGS`` process holds when it exits (its ``sys.modules``,
    written at exit by the entry point's process itself)."""
    with tempfile.TemporaryDirectory(prefix="fgpu-modules-") as tmp:
        out = Path(tmp) / "modules.json"
        code = (
            "import atexit, json, pathlib, sys\n"
            f"out = pathlib.Path({str(out)!r})\n"
            "atexit.register(lambda: out.write_text(json.dumps(list(sys.modules))))\n"
            f"sys.argv = ['fgpu', *{list(args)!r}]\n"
            "from fgpu.cli import main\n"
            "main()\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return set(json.loads(out.read_text()))


def heavy(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden))


def test_help_loads_no_command_module() -> None:
    modules = loaded("--help")
    assert "fgpu.cli.lazy" in modules  # the list is real
    assert heavy(modules, NEVER + NOT_FOR_HELP) == []


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with started_server("fgpu-cli-start-", "1xA100-40GB") as proc:
        yield proc


def test_ls_on_the_socket_loads_only_the_listing(server: ServerProcess) -> None:
    server.submit("-g", "0.5", "--name", "listed", "--grace", "0", command=["sleep", "600"])
    env = {**os.environ, "FGPU_SOCKET": str(server.socket)}
    env.pop("FGPU_URL", None)
    listing = subprocess.run([FGPU, "ls"], capture_output=True, text=True, timeout=60, env=env)
    assert "listed" in listing.stdout, listing.stderr
    modules = loaded("ls", env=env)
    assert {"fgpu.cli.workloads", "fgpu.client.client", "http.client"} <= modules
    assert heavy(modules, NEVER) == []


@pytest.mark.parametrize(
    "command",
    [
        ["submit", "-g", "0.1", "--grace", "0", "--", "sleep", "600"],
        ["describe", "{job}"],
        ["logs", "{job}"],
        ["top"],
        ["nodes"],
        ["cancel", "{job}"],
    ],
    ids=lambda c: c[0],
)
def test_everyday_commands_load_what_ls_loads(server: ServerProcess, command: list[str]) -> None:
    # issue 25, point 8: the answers are read by fgpu.client.plain, the submission is
    # checked by the server: neither pydantic nor the wire models load
    job = f"everyday-{command[0]}"
    server.submit("-g", "0.1", "--name", job, "--grace", "0", command=["sleep", "600"])
    env = {**os.environ, "FGPU_SOCKET": str(server.socket)}
    env.pop("FGPU_URL", None)
    modules = loaded(*(part.format(job=job) for part in command), env=env)
    assert {"fgpu.client.client", "fgpu.client.plain", "http.client"} <= modules
    assert heavy(modules, NEVER) == []


def test_the_table_lists_every_command_with_its_help() -> None:
    # each module registers exactly the table's commands for it, under the table's names
    for module in sorted({module for module, _ in COMMANDS.values()}):
        app = typer.Typer(**SETTINGS)
        importlib.import_module(module).register(app)
        names = [c.name for c in app.registered_commands] + [g.name for g in app.registered_groups]
        assert sorted(names) == sorted(n for n, (m, _) in COMMANDS.items() if m == module)
    for name, (_, help) in COMMANDS.items():
        command = load(name)
        assert command.name == name
        assert not command.hidden
        assert " ".join((command.help or "").split("\n\n")[0].split()) == help


def eager_app() -> typer.Typer:
    """The ``fgpu`` app built the plain way: every command registered up front."""
    app = typer.Typer(help="fgpu: fractional GPU sharing.", no_args_is_help=True, **SETTINGS)
    app.callback()(cli._options)
    for module in dict.fromkeys(module for module, _ in COMMANDS.values()):
        importlib.import_module(module).register(app)
    return app


@pytest.mark.parametrize("width", [60, 80, 200])
def test_help_reads_as_with_every_command_loaded(width: int) -> None:
    runner = CliRunner()
    lazy = runner.invoke(cli.app, ["--help"], terminal_width=width)
    eager = runner.invoke(eager_app(), ["--help"], terminal_width=width)
    assert lazy.exit_code == eager.exit_code == 0
    assert lazy.output == eager.output
    assert [
        line.split()[0]
        for line in lazy.output.split("Commands:")[1].splitlines()
        if line.startswith("  ") and not line.startswith("    ")
    ] == list(COMMANDS)
    for args in (
        ["lss"],
        ["queue"],
        ["queue", "create", "--help"],
        ["ls", "--phase", "running,,x"],
        ["ls", "--bogus"],
        ["describe"],
        ["sim", "fill", "--nodes", "x"],
        ["mig", "profiles", "--bogus"],
    ):
        lazy = runner.invoke(cli.app, args, terminal_width=width)
        eager = runner.invoke(eager_app(), args, terminal_width=width)
        assert (lazy.exit_code, lazy.output) == (eager.exit_code, eager.output), args
    # a number that is none, or out of bounds: refused by both, the lazy app (what runs)
    # in the project's words (fgpu.cli.coercion), not Click's generic ones
    for args, message in (
        (["ls", "--interval", "0"], "--interval '0': must be between 0.2 and 3600"),
        (["ls", "--interval", "abc"], "--interval 'abc': not a number"),
        (["ls", "--interval", "nan"], "--interval 'nan': must be a finite number"),
        (["queue", "create", "q", "--quota", "abc"], "--quota 'abc': not a number"),
    ):
        lazy = runner.invoke(cli.app, args, terminal_width=width)
        eager = runner.invoke(eager_app(), args, terminal_width=width)
        assert lazy.exit_code == eager.exit_code == 2, (args, eager.output)
        assert lazy.output == f"error: {message}\n", args


def test_completion_names_the_commands() -> None:
    def complete(words: str) -> list[str]:
        env = {**os.environ, "_FGPU_COMPLETE": "complete_bash", "COMP_WORDS": words}
        env["COMP_CWORD"] = str(len(words.split()) - 1)
        done = subprocess.run([FGPU], capture_output=True, text=True, timeout=60, env=env)
        return done.stdout.split()

    assert complete("fgpu s") == ["serve", "submit", "sim"]
    assert complete("fgpu queue c") == ["create"]
    assert complete("fgpu ls --ph") == ["--phase"]
