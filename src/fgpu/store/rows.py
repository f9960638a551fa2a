"""Workload rows read one at a time, so that one damaged row costs only itself (issue 27).

A row is *damaged* when a column holds what fgpu never writes: JSON text that does not
parse (SQLite keeps JSON as text and checks nothing), JSON of the wrong shape (PostgreSQL's
``json`` type checks the syntax only), a phase or preemption kind that is not one of the
words, text where a number belongs (SQLite's type affinity allows it), a NULL where the
record needs a value. The ORM would raise on such a row in the middle of a listing (the
whole answer a 500, for every user); here the JSON columns are read as text
(:func:`workload_select`) and each row is decoded by :func:`decode_workload`, which names
every bad column. Listings skip what does not decode and say which ids they skipped
(:class:`DamagedRow`); a lookup of such a row raises :class:`fgpu.store.errors.RowDamaged`.

:func:`neutral_values` is the repair :meth:`fgpu.store.store.Store.end_damaged` writes when
an admin ends a damaged row (``fgpu cancel ID`` as root): each bad column gets an empty
value, so the row lists again, as cancelled, with the problems in its reason and event.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, Select, Text, cast, select

from fgpu.store import convert
from fgpu.store.errors import RowDamaged
from fgpu.store.records import WorkloadRecord
from fgpu.store.schema import PHASES, Base, WorkloadRow

_TABLE = Base.metadata.tables[WorkloadRow.__tablename__]

JSON_COLUMNS = tuple(c.key for c in _TABLE.columns if isinstance(c.type, JSON))
"""The workload columns stored as JSON (read as text, decoded here)."""

PREEMPTED_KINDS = frozenset({"preemption", "reclaim"})
"""Values of ``workloads.preempted_kind`` besides NULL."""


@dataclass(frozen=True, slots=True)
class DamagedRow:
    """A workload row that could not be decoded, with what could be read of it.

    Attributes:
        id: the row's id (the primary key: always readable).
        problems: ``column: what is wrong`` for each bad column.
        name, owner_uid, phase, submitted_at: those columns where they read as the right
            type (None otherwise): enough to find it by name and list it in its place.
    """

    id: str
    problems: tuple[str, ...]
    name: str | None = None
    owner_uid: int | None = None
    phase: str | None = None
    submitted_at: float | None = None

    @property
    def problem(self) -> str:
        """The problems in one line."""
        return "; ".join(self.problems)

    def error(self) -> RowDamaged:
        """The error a lookup of this row raises."""
        return RowDamaged(self.id, self.problem)


def workload_select() -> Select[Any]:
    """``SELECT`` of every workload column, the JSON ones cast to text (so the driver
    decodes none of them; :func:`decode_workload` does, one row at a time)."""
    columns = [cast(c, Text).label(c.key) if c.key in JSON_COLUMNS else c for c in _TABLE.columns]
    return select(*columns)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _is_bool(value: object) -> bool:
    return isinstance(value, bool) or value in (0, 1)


def _str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _str_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _pairs(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(v, str) for v in p) for p in value
    )


def _object(value: object) -> bool:
    return isinstance(value, dict)


_Check = Callable[[object], bool]

# column -> (check of a present value, may it be NULL, what it should be)
_SCALARS: dict[str, tuple[_Check, bool, str]] = {
    "name": (lambda v: isinstance(v, str), False, "text"),
    "owner_uid": (_is_int, False, "an integer"),
    "queue": (lambda v: isinstance(v, str), False, "text"),
    "phase": (lambda v: v in PHASES, False, f"one of {', '.join(PHASES)}"),
    "priority": (_is_int, False, "an integer"),
    "preemptible": (_is_bool, True, "a boolean"),
    "cpu_milli": (_is_int, False, "an integer"),
    "memory_mib": (_is_int, False, "an integer"),
    "gpu_count": (_is_int, False, "an integer"),
    "gpu_milli": (_is_int, True, "an integer"),
    "gpu_memory_mib": (_is_int, True, "an integer"),
    "gpu_models": (lambda v: isinstance(v, str), False, "text"),
    "shell": (_is_bool, False, "a boolean"),
    "cwd": (lambda v: isinstance(v, str), False, "text"),
    "grace_s": (_is_number, False, "a number"),
    "submitted_at": (_is_number, False, "a number"),
    "started_at": (_is_number, True, "a number"),
    "finished_at": (_is_number, True, "a number"),
    "exit_code": (_is_int, True, "an integer"),
    "reason": (lambda v: isinstance(v, str), False, "text"),
    "restarts": (_is_int, False, "an integer"),
    "stop_requested_at": (_is_number, True, "a number"),
    "cancelled_by": (_is_int, True, "an integer"),
    "pid": (_is_int, True, "an integer"),
    "create_time": (_is_number, True, "a number"),
    "stdout_path": (lambda v: isinstance(v, str), True, "text"),
    "stderr_path": (lambda v: isinstance(v, str), True, "text"),
    "node_name": (lambda v: isinstance(v, str), True, "text"),
    "suspended_on": (lambda v: isinstance(v, str), True, "text"),
    "suspended_host_mib": (_is_int, True, "an integer"),
    "time_limit_s": (_is_number, True, "a number"),
    "array_id": (lambda v: isinstance(v, str), True, "text"),
    "array_name": (lambda v: isinstance(v, str), True, "text"),
    "array_index": (_is_int, True, "an integer"),
    "array_size": (_is_int, True, "an integer"),
    "array_throttle": (_is_int, True, "an integer"),
    "preempted_by": (lambda v: isinstance(v, str), True, "text"),
    "preempted_kind": (lambda v: v in PREEMPTED_KINDS, True, "preemption or reclaim"),
    "stored_bytes": (_is_int, True, "an integer"),
}

_JSONS: dict[str, tuple[_Check, bool, str]] = {
    "argv": (_str_list, False, "a JSON list of strings"),
    "env": (_str_map, False, "a JSON object of strings"),
    "allocation": (_object, True, "a JSON object"),
    "mig_request": (_object, True, "a JSON object"),
    "squeezed_by": (_str_list, True, "a JSON list of strings"),
    "dependency": (_pairs, True, "a JSON list of [type, id] pairs"),
}

# what a bad column becomes when an admin ends the row (neutral_values)
_EMPTY: dict[str, object] = {
    "name": "",
    "owner_uid": 0,
    "queue": "",
    "priority": 0,
    "cpu_milli": 0,
    "memory_mib": 0,
    "gpu_count": 0,
    "gpu_models": "",
    "shell": False,
    "cwd": "/",
    "grace_s": 0.0,
    "submitted_at": 0.0,
    "reason": "",
    "restarts": 0,
    "argv": [],
    "env": {},
}


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}..."


def _decode(values: dict[str, Any]) -> list[str]:
    """Check ``values`` (a row, JSON columns as text) in place: JSON parsed, each bad
    column a ``column: problem`` line in the answer."""
    problems = []
    for column, (ok, nullable, wanted) in _SCALARS.items():
        value = values.get(column)
        if value is None:
            if not nullable:
                problems.append(f"{column}: NULL, expected {wanted}")
        elif not ok(value):
            problems.append(f"{column}: {_shown(value)} is not {wanted}")
    for column, (ok, nullable, wanted) in _JSONS.items():
        raw = values.get(column)
        if isinstance(raw, bytes):
            try:
                raw = raw.decode()
            except UnicodeDecodeError:
                problems.append(f"{column}: bytes that are not UTF-8 text")
                continue
        if raw is None:
            if not nullable:
                problems.append(f"{column}: NULL, expected {wanted}")
            continue
        try:
            value = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as exc:
            problems.append(f"{column}: not JSON ({exc.msg} at character {exc.pos})")
            continue
        except ValueError as exc:
            problems.append(f"{column}: not JSON ({exc})")
            continue
        if value is None and nullable:
            values[column] = None
        elif not ok(value):
            problems.append(f"{column}: {_shown(value)} is not {wanted}")
        else:
            values[column] = value
    return problems


def decode_workload(row: Mapping[Any, Any]) -> WorkloadRecord:
    """The record of one row of :func:`workload_select`.

    Raises:
        RowDamaged: some column does not hold what fgpu writes (every bad column named).
    """
    damaged = examine(row)
    if isinstance(damaged, DamagedRow):
        raise damaged.error()
    return damaged


def examine(row: Mapping[Any, Any]) -> WorkloadRecord | DamagedRow:
    """The record of one row of :func:`workload_select`, or what is wrong with it."""
    values = dict(row)
    problems = _decode(values)
    record: WorkloadRecord | None = None
    if not problems:
        try:
            record = convert.workload_record(WorkloadRow(**values))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            problems.append(f"allocation or request: {type(exc).__name__}: {exc}")
    if record is not None:
        return record
    name, owner, phase = values.get("name"), values.get("owner_uid"), values.get("phase")
    submitted: Any = values.get("submitted_at")
    return DamagedRow(
        id=str(values.get("id")),
        problems=tuple(problems),
        name=name if isinstance(name, str) else None,
        owner_uid=owner if _is_int(owner) else None,
        phase=phase if phase in PHASES else None,
        submitted_at=float(submitted) if _is_number(submitted) else None,
    )


def neutral_values(row: Mapping[Any, Any]) -> dict[str, object]:
    """The columns of a damaged row (of :func:`workload_select`) that do not decode, each
    with an empty value: NULL where the column may be NULL, else an empty text, list or
    object, 0 or false. The caller sets the phase and reason itself."""
    values = dict(row)
    _decode(values)
    changes: dict[str, object] = {}
    for column, (ok, nullable, _) in _SCALARS.items():
        value = values.get(column)
        if value is None and nullable:
            continue
        if value is None or not ok(value):
            changes[column] = None if nullable else _EMPTY.get(column)
    for column, (ok, nullable, _) in _JSONS.items():
        value = values.get(column)
        if value is None and nullable:
            continue
        if value is None or isinstance(value, (str, bytes)) or not ok(value):
            changes[column] = None if nullable else _EMPTY.get(column)
    if "allocation" not in changes and values.get("allocation") is not None:
        try:
            convert.workload_record(WorkloadRow(**{**values, **changes}))
        except (KeyError, TypeError, ValueError, AttributeError):
            changes["allocation"] = None
    changes.pop("phase", None)
    return changes


__all__ = [
    "JSON_COLUMNS",
    "DamagedRow",
    "decode_workload",
    "examine",
    "neutral_values",
    "workload_select",
]
