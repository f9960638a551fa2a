"""From the API's field names back to the flags a user typed, so that an error names
``--grace`` and the value given, not ``grace_s`` (issue "Everyday use", point 5)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from fgpu.rules.names import shorten

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
    "time": ("-t", "--time"),
    "dependency": ("-d", "--dependency"),
    "array": ("-a", "--array"),
}
"""API field -> the flags that set it, short first (``fgpu submit``)."""


CHOSEN_BY_DEFAULT: frozenset[str] = frozenset({"preemptible"})
"""Fields that take a default from other flags when neither of their flags is typed
(``preemptible`` from ``-p``): a refusal of such a default names no flag."""


def was_typed(spellings: Sequence[str], argv: Sequence[str] | None = None) -> bool:
    """Whether any of the flag's spellings is on the command line (before ``--``)."""
    words = list(sys.argv[1:] if argv is None else argv)
    if "--" in words:
        words = words[: words.index("--")]
    return any(
        w == spelling or w.startswith(spelling + "=")
        for spelling in spellings
        if spelling.startswith("-")
        for w in words
    )


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


def typed_value(spellings: Sequence[str], argv: Sequence[str] | None = None) -> str | None:
    """The text the user typed after a flag (``--grace -1`` -> ``'-1'``, ``--quota=2`` ->
    ``'2'``), the last when repeated; None when the flag is not on the command line."""
    words = list(sys.argv[1:] if argv is None else argv)
    if "--" in words:
        words = words[: words.index("--")]
    found = None
    for index, word in enumerate(words):
        for spelling in spellings:
            if not spelling.startswith("-"):
                continue
            if word == spelling and index + 1 < len(words):
                found = words[index + 1]
            elif spelling.startswith("--") and word.startswith(spelling + "="):
                found = word[len(spelling) + 1 :]
    return found


def flag_message(
    field: str,
    reason: str,
    values: Mapping[str, object],
    flags: Mapping[str, tuple[str, ...]] = SUBMIT_FLAGS,
    argv: Sequence[str] | None = None,
) -> str:
    """``--grace '-1': must be ...`` for the API's ``grace_s: must be ...``: the flag as
    typed and the value as typed (a long one shortened), when the field is one the user set,
    else ``field: reason``. An argument (a spelling without ``-``, e.g. ``ID``) is named as
    the help names it, with the value given."""
    spellings = flags.get(field)
    if spellings is None:
        return f"{field}: {reason}" if field else reason
    if field in CHOSEN_BY_DEFAULT and not was_typed(spellings, argv):
        return reason  # the reason says which default it was
    flag = typed(spellings, argv)
    value = values.get(field)
    if value is None or value == []:
        return f"{flag}: {reason}"
    raw = None if isinstance(value, list) else typed_value(spellings, argv)
    if raw is not None and _same(raw, value):
        shown = raw
    else:
        shown = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    if shown and _echoes(reason, shown):
        return f"{flag}: {reason}"
    return f"{flag} {shorten(shown)}: {reason}"


REQUEST_CAUSES: tuple[tuple[str, str], ...] = (
    ("insufficient CPU", "cpu"),
    ("insufficient memory", "memory"),
    ("GPU memory too small", "gpu_memory"),
    ("GPU model not allowed", "gpu_model"),
    ("have fewer than", "gpu"),
    ("insufficient GPU", "gpu"),
)
"""Words of a refusal of the whole request (field ``request``) -> the field that caused it."""


def request_field(reason: str, values: Mapping[str, object]) -> str:
    """The submit field a refusal of the whole ``request`` is about (``--cpu`` for
    ``insufficient CPU``), when exactly one such cause is named and the user set it; else
    ``request``."""
    causes = {field for words, field in REQUEST_CAUSES if words in reason}
    if len(causes) == 1:
        (field,) = causes
        if values.get(field) not in (None, []):
            return field
    return "request"


def _echoes(reason: str, shown: str) -> bool:
    """Whether the reason already names the value, as a whole word (``'1000000'`` is not
    echoed by ``1000000000m``)."""
    import re

    return re.search(rf"(?<![\w.]){re.escape(shown)}(?![\w.])", reason) is not None


def _same(raw: str, value: object) -> bool:
    """Whether ``raw`` (read from the command line) is the text of ``value`` (as parsed)."""
    if raw == str(value):
        return True
    try:
        return isinstance(value, int | float) and float(raw) == value
    except ValueError:
        return False


QUEUE_FLAGS: Mapping[str, tuple[str, ...]] = {
    "name": ("NAME",),
    "parent": ("--parent",),
    "quota": ("--quota",),
    "limit": ("--limit",),
    "over_quota_weight": ("--over-quota-weight",),
    "priority": ("--priority",),
    "members": ("--member", "--add-member"),
    "max_priority": ("--max-priority",),
    "default_time": ("--default-time",),
    "max_time": ("--max-time",),
    "default_for": ("--default-for",),
    "max_active_per_user": ("--max-active-per-user",),
    "max_running_per_user": ("--max-running-per-user",),
    "max_stored_bytes": ("--max-stored-bytes",),
    "max_output_bytes": ("--max-output-bytes",),
    "preempt_delay_s": ("--preempt-delay",),
}
"""API field -> the flags that set it (``fgpu queue create|set``)."""

WORKLOAD_ARGUMENT: Mapping[str, tuple[str, ...]] = {"id": ("ID",), "workload_id": ("ID",)}
"""The workload argument of ``describe``, ``logs`` and ``cancel``, as their help names it."""

__all__ = [
    "CHOSEN_BY_DEFAULT",
    "QUEUE_FLAGS",
    "REQUEST_CAUSES",
    "SUBMIT_FLAGS",
    "WORKLOAD_ARGUMENT",
    "flag_message",
    "request_field",
    "typed",
    "typed_value",
    "was_typed",
]
