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

- text typed for an ``int`` or ``float`` parameter (or one that may be None): the number,
  or, for text that is not a number or a number outside ``min``/``max``, the project's error
  ``error: --grace 'abc': not a number`` (exit 2) instead of Click's generic one.

Everything else (a choice, a parser, files, an unbounded ``inf``/``nan``) goes to Typer's
adapter, built then, so that its conversions and its messages stay the rule. When
Typer's internals are not as expected (another version), :func:`install` leaves the
parameters alone; ``tests/integration/test_cli_start.py`` notices by pydantic being loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, get_args, get_origin

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
                number = _number_kind(kind)
                if number is not None and type(value) is str:
                    parsed = _number(value, number, info, param)
                    if parsed is not None:
                        return parsed
            typer = build_runtime_param(self.descriptor)
            param._runtime_param = typer
            return typer._coerce_value(value, param=param, ctx=ctx)


def _number_kind(kind: Any) -> type[int] | type[float] | None:
    """``int`` or ``float`` for a parameter of that type (or that type or None), else None."""
    if kind in (int, float):
        return kind  # type: ignore[no-any-return]
    args = [arg for arg in get_args(kind) if arg is not type(None)]
    if len(args) == 1 and len(get_args(kind)) == 2 and args[0] in (int, float):
        return args[0]  # type: ignore[no-any-return]
    return None


def _number(text: str, kind: type[int] | type[float], info: Any, param: Any) -> float | None:
    """``text`` typed for a numeric option as the number, or None for Typer's adapter to
    convert (an infinite or NaN float of an option without bounds, a clamped option).

    Text that is not a number, or a number outside the option's ``min``/``max``, ends the
    command as every other bad flag does: ``error: --grace 'abc': not a number`` (exit 2).
    """
    import math

    try:
        number: float = int(text) if kind is int else float(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        _refuse(param, text, f"not {what}")
    if info.clamp:
        return None
    low, high = info.min, info.max
    if not math.isfinite(number):
        if low is None and high is None:
            return None
        _refuse(param, text, "must be a finite number")
    if (low is not None and number < low) or (high is not None and number > high):
        if low is not None and high is not None:
            _refuse(param, text, f"must be between {low} and {high}")
        if low is not None:
            _refuse(param, text, f"must be at least {low}")
        _refuse(param, text, f"must be at most {high}")
    return number


def _refuse(param: Any, text: str, reason: str) -> NoReturn:
    """End the command with ``error: FLAG 'TEXT': reason`` (exit 2); the flag as typed."""
    from fgpu.cli.common import fail
    from fgpu.cli.flags import typed
    from fgpu.rules.names import shorten

    spellings = [o for o in [*param.opts, *param.secondary_opts] if o.startswith("-")]
    flag = typed(spellings) if spellings else param.human_readable_name
    fail(f"{flag} {shorten(text)}: {reason}")


def _within(value: float, info: Any) -> bool:
    """Whether a number is inside the parameter's bounds (NaN is not), unclamped."""
    if info.clamp:
        return False
    low, high = info.min, info.max
    return (low is None or value >= low) and (high is None or value <= high)
