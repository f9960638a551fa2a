"""Typer's conversion of option values without pydantic where the answer is known.

Typer (0.2x) converts each parameter's value with a pydantic ``TypeAdapter`` built when the
command parses its arguments: for ``fgpu ls`` that loads pydantic, longer than all the rest
of the command. :func:`install` gives each parameter of a built command a converter that
answers the plain cases itself, with what Typer's adapter returns for them:

- a ``str`` for a ``str`` parameter: the same string;
- a ``str`` or a ``Path`` for a ``Path`` parameter: Typer's own path checks
  (``typer._param_types.coerce_cli_path``) on ``Path(value)``, which is pydantic's ``Path``
  of a string;
- an ``int`` for an ``int`` parameter, a ``float`` for a ``float`` one (a default), inside
  its ``min``/``max`` and not clamped: the same number;
- strings for a ``list[str]`` parameter: the list of them.

Everything else (a number typed on the command line, a choice, a parser, files) goes to
Typer's adapter, built then, so that its conversions and its messages stay the rule. When
Typer's internals are not as expected (another version), :func:`install` leaves the
parameters alone; ``tests/integration/test_cli_start.py`` notices by pydantic being loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, get_origin

if TYPE_CHECKING:
    from typer._click import Command, Context

try:  # Typer's conversion layer (0.2x); absent in other versions
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_path, lenient_issubclass
    from typer.core import _TyperParameter
except ImportError:  # pragma: no cover - another Typer: its own conversion, unchanged
    RuntimeParam = None  # type: ignore[assignment,misc]


def install(command: Command, ctx: Context | None = None, subcommands: bool = True) -> None:
    """Give the parameters of ``command`` (its ``--help`` option too, made now as ``ctx``
    or a context of the command alone would make it) and of its subcommands (unless not
    ``subcommands``) the converter above."""
    if RuntimeParam is None:  # pragma: no cover
        return
    if ctx is None:
        ctx = command.context_class(command, **command.context_settings)
    for param in [*command.params, command.get_help_option(ctx)]:
        if isinstance(param, _TyperParameter) and getattr(param, "_runtime_param", 0) is None:
            descriptor = param.type_descriptor
            param._runtime_param = _Plain(
                parameter_info=descriptor.parameter_info,
                annotation=descriptor.annotation,
                descriptor=descriptor,
            )
    if subcommands:
        for sub in getattr(command, "commands", {}).values():
            install(sub)


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class _Plain(RuntimeParam):
        """A parameter's conversion: the plain cases here, the rest by Typer's adapter."""

        descriptor: Any

        def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
            info = self.parameter_info
            kind: Any = self.annotation
            if info.parser is None and self.descriptor.file_annotation is None:
                if kind is str and type(value) is str:
                    return value
                if kind in (int, float) and type(value) is kind and _within(value, info):
                    return value
                if (
                    get_origin(kind) is list
                    and get_args(kind) == (str,)
                    and type(value) in (list, tuple)
                    and all(type(item) is str for item in value)
                ):
                    return list(value)
                if lenient_issubclass(kind, Path) and type(value) is str:
                    path_type: Any = info.path_type or kind
                    if lenient_issubclass(path_type, Path):
                        return coerce_cli_path(
                            path_type(value), info, path_type=path_type, param=param, ctx=ctx
                        )
            typer = build_runtime_param(self.descriptor)
            param._runtime_param = typer
            return typer._coerce_value(value, param=param, ctx=ctx)


def _within(value: float, info: Any) -> bool:
    """Whether a number is inside the parameter's bounds (NaN is not), unclamped."""
    if info.clamp:
        return False
    low, high = info.min, info.max
    return (low is None or value >= low) and (high is None or value <= high)
