"""From the API's field names back to the flags a user typed, so that an error names
``--grace`` and the value given, not ``grace_s`` (issue "Everyday use", point 5)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

SUBMIT_FLAGS: Mapping[str, tuple[str, ...]] = {
    "command": ("the command after --",),
    "name": ("--name",),
    "gpu": ("-g", "--gpu"),
    "gpu_count": ("-g", "--gpu"),
    "gpu_milli": ("-g", "--gpu"),
    "gpu_fraction": ("--gpu-fraction",),
    "gpu_memory": ("--gpu-memory",),
    "gpu_memory_mib": ("--gpu-memory",),
    "gpu_model": ("--gpu-model",),
    "gpu_models": ("--gpu-model",),
    "mig_profile": ("--mig-profile",),
    "isolation": ("--isolation",),
    "cpu": ("--cpu",),
    "cpu_milli": ("--cpu",),
    "memory": ("--memory",),
    "memory_mib": ("--memory",),
    "priority": ("-p", "--priority"),
    "queue": ("-q", "--queue"),
    "grace_s": ("--grace",),
    "preemptible": ("--preemptible", "--non-preemptible"),
    "shell": ("--shell",),
}
"""API field -> the flags that set it, short first (``fgpu submit``)."""


def typed(spellings: Sequence[str], argv: Sequence[str] | None = None) -> str:
    """The spelling of a flag the user typed (``-g`` or ``--gpu``), from the command line
    before ``--``; the last spelling when none is there."""
    words = list(sys.argv[1:] if argv is None else argv)
    if "--" in words:
        words = words[: words.index("--")]
    for spelling in spellings:
        if spelling.startswith("-") and any(
            w == spelling or w.startswith(spelling + "=") for w in words
        ):
            return spelling
    return spellings[-1]


def flag_message(
    field: str,
    reason: str,
    values: Mapping[str, object],
    flags: Mapping[str, tuple[str, ...]] = SUBMIT_FLAGS,
    argv: Sequence[str] | None = None,
) -> str:
    """``--grace '-1': must be ...`` for the API's ``grace_s: must be ...``: the flag as
    typed and the value given (when the field is one the user set), else ``field: reason``."""
    spellings = flags.get(field)
    if spellings is None:
        return f"{field}: {reason}" if field else reason
    flag = typed(spellings, argv)
    value = values.get(field)
    if value is None or value == []:
        return f"{flag}: {reason}"
    shown = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    if shown in reason:  # the reason echoes it already
        return f"{flag}: {reason}"
    return f"{flag} {shown!r}: {reason}"


__all__ = ["SUBMIT_FLAGS", "flag_message", "typed"]
