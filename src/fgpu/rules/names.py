"""Rules for the display names of workloads (``fgpu submit --name``, the API's ``name``).

A name is what ``fgpu ls`` prints and what ``describe``/``cancel`` accept in place of an id,
so it must be printable on one line and reachable from a command line:

- not empty and not only white space (such a name could never be typed back);
- no control characters (C0, DEL, C1), no Unicode format characters (category ``Cf``, e.g.
  U+202E RIGHT-TO-LEFT OVERRIDE, which reverses the rest of a terminal row) and no line or
  paragraph separators (``Zl``, ``Zp``);
- not starting with ``-`` (it would read as an option: ``fgpu describe --all``);
- no ``/``, and not ``.`` or ``..`` (a name goes into the API's paths,
  ``/v1/workloads/{name}``, where such a name never arrives whole);
- at most :data:`NAME_LENGTH` characters.
"""

from __future__ import annotations

import unicodedata

from fgpu.rules.errors import BadRequest
from fgpu.wire_limits import NAME_LENGTH as NAME_LENGTH  # the API's bound (one source)
from fgpu.wire_limits import REFUSED_NAME_CATEGORIES

ECHO_LENGTH = 40
"""How many characters of a long value an error message echoes."""

_REFUSED_CATEGORIES = REFUSED_NAME_CATEGORIES


def shorten(value: str, keep: int = ECHO_LENGTH) -> str:
    """``value`` as an error message may echo it: whole when at most ``keep`` characters,
    else its first ``keep`` characters, ``…`` and the length (``'abc…' (5000 characters)``)."""
    if len(value) <= keep:
        return repr(value)
    return f"{value[:keep]!r}… ({len(value)} characters)"


def unprintable(value: str) -> str | None:
    """Why ``value`` cannot be printed in a listing row, or None: the first control,
    format (``Cf``) or line/paragraph separator character, named with its code point."""
    for char in value:
        category = unicodedata.category(char)
        if category == "Cc":  # as the other text fields say it
            return f"contains the control character {char!r}"
        if category in _REFUSED_CATEGORIES:
            kind = "format" if category == "Cf" else "separator"
            label = unicodedata.name(char, "")
            named = f"U+{ord(char):04X}" + (f" {label}" if label else "")
            return f"contains the {kind} character {named}"
    return None


def check_name(field: str, value: str) -> None:
    """Refuse a workload name that could not be listed or typed back.

    Raises:
        BadRequest: ``field``: empty, only white space, a control/format/separator character,
            a leading ``-``, a ``/``, ``.`` or ``..``, or more than :data:`NAME_LENGTH`
            characters (the reason echoes a shortened value only where it helps).
    """
    if value == "":
        raise BadRequest(field, "empty (leave the option out for the command's name)")
    if not value.strip():
        raise BadRequest(field, f"{value!r} is only white space")
    if len(value) > NAME_LENGTH:
        raise BadRequest(field, f"{len(value)} characters; the limit is {NAME_LENGTH}")
    why = unprintable(value)
    if why is not None:
        raise BadRequest(field, why)
    if value.startswith("-"):
        raise BadRequest(field, f"{value!r} starts with '-' (it would read as an option)")
    if "/" in value:
        raise BadRequest(field, f"{shorten(value)} contains '/' (a name goes into URL paths)")
    if value in (".", ".."):
        raise BadRequest(field, f"{value!r} is a path step, not a name (it goes into URL paths)")


__all__ = ["ECHO_LENGTH", "NAME_LENGTH", "check_name", "shorten", "unprintable"]
