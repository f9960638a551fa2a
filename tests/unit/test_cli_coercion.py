"""The option values converted without pydantic (:mod:`fgpu.cli.coercion`) are what Typer's
own adapters make of them: for every parameter of every ``fgpu`` command and many values,
the same result (value and type) or the same error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from typer._click import Command
from typer._coercion import build_runtime_param
from typer.core import _TyperParameter

from fgpu.cli import coercion
from fgpu.cli.lazy import COMMANDS, load

SAMPLES: list[Any] = [
    "x",
    "",
    " a b ",
    "~/nowhere",
    "/",
    "/etc/hostname",
    "-1",
    "0",
    "0.1",
    "2.5",
    "5000",
    "nan",
    "1e400",
    "abc",
    "\udcff",
    ("a", "b"),
    ("",),
    (),
    ["q"],
    0,
    2,
    0.1,
    2.0,
    float("nan"),
    float("inf"),
    True,
]


def commands(command: Command, path: str) -> Iterator[tuple[str, Command]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, f"{path} {name}")


def parameters() -> Iterator[tuple[str, Command, _TyperParameter]]:
    for name in COMMANDS:
        for path, command in commands(load(name), name):
            ctx = command.context_class(command)
            for param in [*command.params, command.get_help_option(ctx)]:
                if isinstance(param, _TyperParameter):
                    yield f"{path} {param.name}", command, param


def converted(runtime: Any, value: Any, param: _TyperParameter, ctx: Any) -> tuple[str, Any]:
    """What a runtime parameter makes of ``value``: ("ok", value) or ("error", message)."""
    try:
        done = runtime._coerce_value(value, param, ctx)
    except Exception as exc:
        return ("error", f"{type(exc).__name__}: {exc}")
    return ("ok", done)


def same(ours: tuple[str, Any], typers: tuple[str, Any]) -> bool:
    """Equal results, of the same type (NaN is NaN), or equal errors."""
    if ours[0] != typers[0] or type(ours[1]) is not type(typers[1]):
        return False
    return bool(ours[1] == typers[1] or (ours[1] != ours[1] and typers[1] != typers[1]))


def test_every_parameter_converts_as_typer_converts_it() -> None:
    checked = plain = 0
    for where, command, param in parameters():
        assert isinstance(param._runtime_param, coercion._Plain), where
        ctx = command.context_class(command)
        descriptor = param.type_descriptor
        for value in SAMPLES:
            fresh = coercion._Plain(
                parameter_info=descriptor.parameter_info,
                annotation=descriptor.annotation,
                descriptor=descriptor,
            )
            param._runtime_param = fresh
            ours = converted(fresh, value, param, ctx)
            plain += param._runtime_param is fresh  # answered without Typer's adapter
            typers = converted(build_runtime_param(descriptor), value, param, ctx)
            assert same(ours, typers), (where, value, ours, typers)
            checked += 1
    assert checked > 1000
    assert plain > 300  # the plain cases are many, and were answered here


@pytest.mark.parametrize(
    "args",
    [
        ["ls"],
        ["ls", "-a", "-q", "a", "--phase", "running"],
        ["describe", "x"],
        ["submit", "--", "true"],
    ],
)
def test_parsing_plain_options_builds_no_adapter(args: list[str]) -> None:
    command = load(args[0])
    command.make_context(args[0], args[1:])
    ctx = command.context_class(command)
    params = [*command.params, command.get_help_option(ctx)]
    assert len(params) > 2
    built = [p.name for p in params if not isinstance(p._runtime_param, coercion._Plain)]
    assert built == []
