"""Slurm's habits on a submission (issue 25, point 4): ``--time``, ``--dependency`` and
``--array`` as Slurm writes them, parsed into fgpu's values.

Forms (from Slurm's ``sbatch`` manual, read for the facts only):

- ``--time``: ``minutes``, ``minutes:seconds``, ``hours:minutes:seconds``, ``days-hours``,
  ``days-hours:minutes``, ``days-hours:minutes:seconds``; ``0``, ``UNLIMITED`` or
  ``infinite`` ask for no limit. Slurm rounds a limit up to whole minutes; fgpu keeps the
  seconds (fractional GPUs are for short sweeps, and tests use limits of seconds).
- ``--dependency``: ``TYPE:REF[:REF...]``, several joined by ``,`` (all must hold); TYPE is
  ``afterok`` (each REF succeeded), ``afterany`` (each REF ended, however), ``afternotok``
  (each REF failed or was cancelled). A REF is a workload id, an id prefix or a name (an
  array's name means every task of it). Slurm's ``?`` (any one of several) is refused.
- ``--array``: ``0-99``, ``1,3,5``, ``0-15:4`` (every 4th), mixed with commas, then
  ``%N`` for at most N tasks running at once.

Every refusal is a :class:`BadRequest` naming the field (``time``, ``dependency``,
``array``) and echoing the value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fgpu.rules.errors import BadRequest
from fgpu.rules.names import shorten
from fgpu.rules.slurmtime import format_time
from fgpu.store.records import StoredArrayTask

MAX_TIME_S = 365 * 86400.0
"""Longest time limit, one year (in seconds)."""

MAX_ARRAY_TASKS = 1000
"""Most tasks one array may have (Slurm's default ``MaxArraySize`` is 1001)."""

MAX_ARRAY_INDEX = 999_999
"""Largest array index."""

DEPENDENCY_TYPES = ("afterok", "afterany", "afternotok")
"""The dependency types fgpu knows (Slurm's names)."""

MAX_DEPENDENCIES = 1000
"""Most workloads one submission may depend on (an array counts each task)."""

_NUMBER = r"(\d{1,9})"
_TIME_FORMS = (
    # (pattern, the factors of its numbers in seconds)
    (re.compile(rf"^{_NUMBER}$"), (60,)),
    (re.compile(rf"^{_NUMBER}:{_NUMBER}$"), (60, 1)),
    (re.compile(rf"^{_NUMBER}:{_NUMBER}:{_NUMBER}$"), (3600, 60, 1)),
    (re.compile(rf"^{_NUMBER}-{_NUMBER}$"), (86400, 3600)),
    (re.compile(rf"^{_NUMBER}-{_NUMBER}:{_NUMBER}$"), (86400, 3600, 60)),
    (re.compile(rf"^{_NUMBER}-{_NUMBER}:{_NUMBER}:{_NUMBER}$"), (86400, 3600, 60, 1)),
)
_UNLIMITED = frozenset({"0", "unlimited", "infinite"})
_UNIT_WORDS = {3600: "hours", 60: "minutes", 1: "seconds"}
TIME_FORMS_TEXT = (
    "minutes (90), minutes:seconds (5:30), hours:minutes:seconds (1:30:00), days-hours "
    "(2-12), days-hours:minutes (2-12:30), days-hours:minutes:seconds (2-00:00:00); 0 or "
    "UNLIMITED for none"
)
"""The forms of ``--time``, for help texts and refusals."""


MAX_TIME_CHARS = 64
"""The longest ``--time`` text (the API's ``maxLength``)."""

MAX_ARRAY_CHARS = 4096
"""The longest ``--array`` text (the API's ``maxLength``)."""


def _not_too_long(text: str, field: str, most: int) -> None:
    if len(text) > most:
        raise BadRequest(field, f"{len(text)} characters; at most {most}")


def parse_time(text: str, field: str = "time") -> float | None:
    """A Slurm time limit as seconds; None for no limit (``0``, ``UNLIMITED``,
    ``infinite``).

    Raises:
        BadRequest: ``field``: not one of the forms, or above :data:`MAX_TIME_S`; over
            :data:`MAX_TIME_CHARS` characters.
    """
    _not_too_long(text, field, MAX_TIME_CHARS)
    value = text.strip()
    if value.lower() in _UNLIMITED or (value.isdigit() and int(value) == 0):
        return None
    for pattern, factors in _TIME_FORMS:
        match = pattern.match(value)
        if match is None:
            continue
        numbers = [int(n) for n in match.groups()]
        for number, factor, unit in zip(numbers[1:], factors[1:], factors[:-1], strict=True):
            if number * factor >= unit:  # 1:99:99: 99 minutes in an hour's place
                names = {86400: "a day", 3600: "an hour", 60: "a minute"}
                raise BadRequest(
                    field,
                    f"{text!r}: {number} {_UNIT_WORDS[factor]} is not less than "
                    f"{names[unit]}; the forms: {TIME_FORMS_TEXT}",
                )
        seconds = float(sum(n * f for n, f in zip(numbers, factors, strict=True)))
        if seconds <= 0:
            return None
        if seconds > MAX_TIME_S:
            raise BadRequest(
                field, f"{text!r} is {format_time(seconds)}, above the longest, 365-00:00:00"
            )
        return seconds
    raise BadRequest(field, f"{text!r} is not a time limit; the forms: {TIME_FORMS_TEXT}")


@dataclass(frozen=True, slots=True)
class Dependency:
    """One condition: ``kind`` (one of :data:`DEPENDENCY_TYPES`) on the workload ``ref``
    (as the user wrote it; the service resolves it to ids)."""

    kind: str
    ref: str


def parse_dependency(text: str, field: str = "dependency") -> list[Dependency]:
    """``afterok:ID[:ID...][,TYPE:ID...]`` as conditions, all of which must hold.

    A condition written twice is one (the first place it appears keeps its order).

    Raises:
        BadRequest: ``field``: empty, ``?`` (any of), an unknown type, a type without ids,
            an empty id; more than :data:`MAX_DEPENDENCIES` conditions as written.
    """
    value = text.strip()
    if not value:
        raise BadRequest(field, "empty; write TYPE:ID[:ID...], e.g. afterok:3f2a9c1b")
    if "?" in value:
        raise BadRequest(
            field,
            f"{text!r}: '?' (any one of several) is not supported; ',' joins conditions that "
            "must all hold",
        )
    conditions: list[Dependency] = []
    for part in value.split(","):
        kind, _, refs = part.strip().partition(":")
        kind = kind.strip().lower()
        if kind not in DEPENDENCY_TYPES:
            raise BadRequest(
                field,
                f"{text!r}: {kind or part!r} is not a dependency type; types: "
                + ", ".join(DEPENDENCY_TYPES),
            )
        names = refs.split(":") if refs else []
        if not names or any(not n.strip() for n in names):
            raise BadRequest(
                field, f"{text!r}: {kind} needs workload ids or names, e.g. {kind}:3f2a9c1b"
            )
        conditions.extend(Dependency(kind, n.strip()) for n in names)
        if len(conditions) > MAX_DEPENDENCIES:  # before the rest is even split
            raise BadRequest(
                field,
                f"{shorten(text)}: more than {MAX_DEPENDENCIES} conditions; at most "
                f"{MAX_DEPENDENCIES} workloads (an array counts each task)",
            )
    return list(dict.fromkeys(conditions))  # a repeated condition is one


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """An array: its task indices (ascending, distinct) and how many may run at once
    (None: no cap)."""

    indices: tuple[int, ...]
    throttle: int | None = None


_RANGE = re.compile(r"^(\d{1,9})(?:-(\d{1,9})(?::(\d{1,9}))?)?$")


def parse_array(text: str, field: str = "array") -> ArraySpec:
    """``0-99``, ``1,3,5``, ``0-15:4`` (step), mixed with commas, then ``%N``.

    Raises:
        BadRequest: ``field``: a malformed item, a range whose end is below its start, a
            step or ``%N`` of 0, an index above :data:`MAX_ARRAY_INDEX`, more than
            :data:`MAX_ARRAY_TASKS` tasks; over :data:`MAX_ARRAY_CHARS` characters.
    """
    _not_too_long(text, field, MAX_ARRAY_CHARS)
    value = text.strip()
    items, percent, throttle_text = value.partition("%")
    throttle: int | None = None
    if percent:
        if not throttle_text.strip().isdigit() or int(throttle_text) < 1:
            raise BadRequest(field, f"{text!r}: %N needs N of at least 1 (tasks running at once)")
        throttle = int(throttle_text)
    indices: set[int] = set()
    for item in items.split(","):
        match = _RANGE.match(item.strip())
        if match is None:
            raise BadRequest(
                field, f"{text!r}: {item.strip()!r} is not an index or a range (0-99, 0-15:4)"
            )
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        step = int(match.group(3)) if match.group(3) is not None else 1
        if end < start:
            raise BadRequest(field, f"{text!r}: the range {item.strip()} ends below its start")
        if step < 1:
            raise BadRequest(field, f"{text!r}: the step of {item.strip()} must be at least 1")
        if end > MAX_ARRAY_INDEX:
            raise BadRequest(field, f"{text!r}: index {end} is above {MAX_ARRAY_INDEX}")
        if (end - start) // step + 1 + len(indices) > MAX_ARRAY_TASKS:
            raise BadRequest(field, f"{text!r}: more than {MAX_ARRAY_TASKS} tasks")
        indices.update(range(start, end + 1, step))
    if len(indices) > MAX_ARRAY_TASKS:
        raise BadRequest(field, f"{text!r}: more than {MAX_ARRAY_TASKS} tasks")
    return ArraySpec(tuple(sorted(indices)), throttle)


def task_name(array_name: str, index: int) -> str:
    """The name of task ``index`` of the array ``array_name``: ``NAME_INDEX`` (Slurm's
    ``%A_%a``), e.g. ``sweep_7``."""
    return f"{array_name}_{index}"


def array_task_env(a: StoredArrayTask | None) -> dict[str, str]:
    """The environment a task of an array gets besides its submitter's: its index as
    ``FGPU_ARRAY_INDEX`` and Slurm's ``SLURM_ARRAY_TASK_ID``, the array's id
    (``FGPU_ARRAY_ID``, ``SLURM_ARRAY_JOB_ID``), name (``FGPU_ARRAY_NAME``) and task count
    (``SLURM_ARRAY_TASK_COUNT``); empty for a plain workload."""
    if a is None:
        return {}
    return {
        "FGPU_ARRAY_INDEX": str(a.index),
        "FGPU_ARRAY_ID": a.id,
        "FGPU_ARRAY_NAME": a.name,
        "SLURM_ARRAY_TASK_ID": str(a.index),
        "SLURM_ARRAY_JOB_ID": a.id,
        "SLURM_ARRAY_TASK_COUNT": str(a.size),
    }


__all__ = [
    "DEPENDENCY_TYPES",
    "MAX_ARRAY_CHARS",
    "MAX_ARRAY_INDEX",
    "MAX_ARRAY_TASKS",
    "MAX_TIME_CHARS",
    "MAX_TIME_S",
    "TIME_FORMS_TEXT",
    "ArraySpec",
    "Dependency",
    "array_task_env",
    "format_time",
    "parse_array",
    "parse_dependency",
    "parse_time",
    "task_name",
]
