"""The bounds of the REST API's inputs, in one place: the server's checks
(:mod:`fgpu.rules.requests`, :mod:`fgpu.rules.names`, :mod:`fgpu.store.validate`, the
store's column sizes) and the OpenAPI document (:mod:`fgpu.wire`) both read them from here,
so the document never allows a value the server refuses for a bound (issue 27: the fuzzer
found five). ``tests/integration/test_openapi_limits.py`` walks the served document and
tries each bound, and one step past it, against the server.

Standard library only (the command line and the client read it without pydantic).
"""

from __future__ import annotations

import functools
import sys
import unicodedata
from typing import Any

NAME_LENGTH = 128
"""Longest queue, node or workload name (characters)."""
ID_LENGTH = 32
"""Longest workload id."""
MAX_GRACE_S = 3600.0
"""Longest SIGTERM-to-SIGKILL grace of a workload, seconds."""
MAX_PRIORITY = 1000
"""Highest numeric workload priority (the classes end at critical, 125)."""
MAX_ARGUMENT_BYTES = 131_072
"""Longest single argument or ``NAME=value``, with its NUL (Linux ``MAX_ARG_STRLEN``)."""
MAX_COMMAND_BYTES = 1_048_576
"""Command and environment together (half of Linux's default ``ARG_MAX`` of 2 MiB, which
also has to hold the wrapper's own arguments and pointers)."""
MAX_MEMBERS = 256
"""Most entries in a queue's member list."""
MAX_AMOUNT = 2**62 - 512
"""Largest amount the store keeps (fits a signed 64-bit column with room to spare). The
largest double below 2**62: the OpenAPI document's numbers are doubles, and 2**62 - 1 written
there rounds up to 2**62, a value the server refuses (one of the fuzzer's five)."""
MAX_QUOTA_GPUS = 1_000_000
"""Largest queue quota or limit, GPUs."""
MIN_STORED_BYTES = 1024
"""Smallest per-user stored-bytes limit a queue may set (a submission stores at least a few
dozen bytes; less would refuse everything)."""
MIN_OUTPUT_BYTES = 1 << 20
"""Smallest per-user output limit (machine or queue): room for a few lines of output and the
notice of the cut."""

MAX_CWD_CHARS = 4095
"""The longest working directory a submission may give (Linux's ``PATH_MAX`` of 4096 bytes
with its NUL)."""

QUEUE_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*"
"""Queue names: an ASCII letter or digit, then letters, digits, ``.``, ``_`` or ``-``."""
MEMBER_PATTERN = r"\*|@?[A-Za-z0-9_][A-Za-z0-9._-]{0,31}\$?"
"""A queue member: ``*``, a user name or uid, or ``@`` and a group name or gid (the
characters of portable Unix user and group names, at most 32 of them)."""
ENV_NAME_PATTERN = r"[^=\x00]+"
"""An environment variable's name: not empty, no ``=``, no NUL."""
TEXT_PATTERN = r"[^\x00]*"
"""Text passed to a process (arguments, environment values, the working directory): no
NUL."""

REFUSED_NAME_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
"""Unicode categories a workload name may not hold (control, format, line and paragraph
separators: :func:`fgpu.rules.names.check_name`)."""


def anchored(pattern: str) -> str:
    """``pattern`` matched whole (the OpenAPI document's ``pattern`` is searched, as
    ECMA-262 regular expressions are)."""
    return f"^(?:{pattern})$"


@functools.cache
def refused_name_characters() -> str:
    """A regular-expression character class body holding every code point of
    :data:`REFUSED_NAME_CATEGORIES`, as the characters themselves (none of them is special
    in a class, and both Python's and ECMA-262's expressions read them so); built from
    :mod:`unicodedata` once, when the OpenAPI document is first made."""
    ranges: list[tuple[int, int]] = []
    for code in range(sys.maxunicode + 1):
        if unicodedata.category(chr(code)) in REFUSED_NAME_CATEGORIES:
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1] = (ranges[-1][0], code)
            else:
                ranges.append((code, code))

    return "".join(chr(low) if low == high else f"{chr(low)}-{chr(high)}" for low, high in ranges)


def workload_name_pattern() -> str:
    """The rules of :func:`fgpu.rules.names.check_name` as one anchored pattern: not empty
    nor only white space, no leading ``-``, not ``.`` or ``..``, no ``/`` and no character of
    :data:`REFUSED_NAME_CATEGORIES`."""
    allowed = f"[^/{refused_name_characters()}]"
    return rf"^(?!-)(?!\.\.?$)(?=.*\S){allowed}+$"


def workload_name_schema(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a workload name: its bounds and pattern (the pattern is made
    only when the document is)."""
    schema.update(minLength=1, maxLength=NAME_LENGTH, pattern=workload_name_pattern())


__all__ = [
    "ENV_NAME_PATTERN",
    "ID_LENGTH",
    "MAX_AMOUNT",
    "MAX_ARGUMENT_BYTES",
    "MAX_COMMAND_BYTES",
    "MAX_CWD_CHARS",
    "MAX_GRACE_S",
    "MAX_MEMBERS",
    "MAX_PRIORITY",
    "MAX_QUOTA_GPUS",
    "MEMBER_PATTERN",
    "MIN_OUTPUT_BYTES",
    "MIN_STORED_BYTES",
    "NAME_LENGTH",
    "QUEUE_NAME_PATTERN",
    "REFUSED_NAME_CATEGORIES",
    "TEXT_PATTERN",
    "anchored",
    "refused_name_characters",
    "workload_name_pattern",
    "workload_name_schema",
]
