"""Checks of what callers hand the store, before anything is written.

Each raises :class:`fgpu.model.types.InvalidRequestError` naming the field, so the server can
answer with a 4xx carrying the message as it is.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence

from fgpu import wire_limits
from fgpu.model.types import Allocation, InvalidRequestError, Request
from fgpu.model.units import MAX_DURATION_S
from fgpu.store.records import EVERYONE, UNCAPPED, NodeRecord, QueueConfig, StoredMigRequest
from fgpu.store.schema import ID_LENGTH, NAME_LENGTH

QUEUE_NAME = re.compile(wire_limits.QUEUE_NAME_PATTERN)
"""Queue names (:data:`fgpu.wire_limits.QUEUE_NAME_PATTERN`)."""
MEMBER = re.compile(wire_limits.MEMBER_PATTERN)
"""A queue member (:data:`fgpu.wire_limits.MEMBER_PATTERN`)."""
MAX_MEMBERS = wire_limits.MAX_MEMBERS
MAX_WORKLOAD_PRIORITY = wire_limits.MAX_PRIORITY
"""Highest workload priority there is (submissions above it are refused)."""
MIN_STORED_BYTES = wire_limits.MIN_STORED_BYTES
MIN_OUTPUT_BYTES = wire_limits.MIN_OUTPUT_BYTES
MAX_AMOUNT = wire_limits.MAX_AMOUNT
"""Largest amount the store keeps (below :data:`fgpu.store.records.UNCAPPED`)."""
assert MAX_AMOUNT < UNCAPPED


def integer(field_name: str, value: object, *, minimum: int = 0, maximum: int = MAX_AMOUNT) -> int:
    """``value`` as an ``int`` in ``minimum..maximum`` (``bool`` and ``float`` refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(field_name, f"must be an integer (got {value!r})")
    if value < minimum:
        raise InvalidRequestError(field_name, f"must be at least {minimum} (got {value})")
    if value > maximum:
        raise InvalidRequestError(field_name, f"must be at most {maximum} (got {value})")
    return int(value)


def seconds(field_name: str, value: object) -> float:
    """A finite, non-negative number of seconds as a ``float``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(field_name, f"must be a number of seconds (got {value!r})")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise InvalidRequestError(field_name, f"must be a finite number >= 0 (got {value!r})")
    return number


def text(field_name: str, value: object, *, max_length: int | None = None) -> str:
    """A string without NUL characters, at most ``max_length`` characters long."""
    if not isinstance(value, str):
        raise InvalidRequestError(field_name, f"must be a string (got {value!r})")
    if "\x00" in value:
        raise InvalidRequestError(field_name, "must not contain NUL characters")
    if max_length is not None and len(value) > max_length:
        raise InvalidRequestError(field_name, f"longer than {max_length} characters")
    return value


def name(field_name: str, value: object) -> str:
    """A non-empty name of at most :data:`NAME_LENGTH` characters."""
    result = text(field_name, value, max_length=NAME_LENGTH)
    if not result.strip():
        raise InvalidRequestError(field_name, "must not be empty")
    return result


def workload_id(value: object) -> str:
    """A workload id as made by an id generator: 1..32 characters, no spaces."""
    result = text("id", value, max_length=ID_LENGTH)
    if not result or any(c.isspace() for c in result):
        raise InvalidRequestError("id", f"not a valid workload id: {value!r}")
    return result


def queue_config(config: QueueConfig) -> None:
    """Check one queue's configuration on its own (the tree is checked by ``QueueTree``).

    Raises:
        InvalidRequestError: a malformed name, a non-integer or negative amount, a limit below
            the quota, a weight that is not a finite number >= 0, a negative priority, a
            ``preempt_delay_s`` that is not a number of seconds in 0..1e9.
    """
    if not isinstance(config, QueueConfig):
        raise InvalidRequestError("queue", f"expected a QueueConfig (got {config!r})")
    queue_name = name("name", config.name)
    if not QUEUE_NAME.fullmatch(queue_name):
        raise InvalidRequestError(
            "name",
            f"queue name {queue_name!r} must start with an ASCII letter or digit and hold "
            "only ASCII letters, digits, '.', '_' and '-'",
        )
    if config.parent is not None:
        name("parent", config.parent)
    quota = config.quota.as_tuple()
    for dim, amount in zip(("gpu_milli", "cpu_milli", "memory_mib"), quota, strict=True):
        integer(f"quota.{dim}", amount)
    for dim, cap, floor in zip(
        ("gpu_milli", "cpu_milli", "memory_mib"), config.limit.as_tuple(), quota, strict=True
    ):
        if cap is None:
            continue
        integer(f"limit.{dim}", cap)
        if cap < floor:
            raise InvalidRequestError(
                f"limit.{dim}", f"queue {queue_name}: limit {cap} is below quota {floor}"
            )
    weight = config.over_quota_weight
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise InvalidRequestError("over_quota_weight", f"must be a number (got {weight!r})")
    if not math.isfinite(weight) or weight < 0:
        raise InvalidRequestError(
            "over_quota_weight", f"must be a finite number >= 0 (got {weight})"
        )
    integer("priority", config.priority)
    members(config.members)
    default_for(config.default_for)
    integer("max_priority", config.max_priority, maximum=MAX_WORKLOAD_PRIORITY)
    if not isinstance(config.nonpreemptible, bool):
        raise InvalidRequestError(
            "nonpreemptible", f"must be true or false (got {config.nonpreemptible!r})"
        )
    time_limits(config.default_time_s, config.max_time_s, queue_name)
    if config.max_active_per_user is not None:
        integer("max_active_per_user", config.max_active_per_user, minimum=1)
    if config.max_running_per_user is not None:
        integer("max_running_per_user", config.max_running_per_user, minimum=1)
    if config.max_stored_bytes is not None:
        integer("max_stored_bytes", config.max_stored_bytes, minimum=MIN_STORED_BYTES)
    if config.max_output_bytes is not None:
        integer("max_output_bytes", config.max_output_bytes, minimum=MIN_OUTPUT_BYTES)
    if config.preempt_delay_s is not None:
        delay = seconds("preempt_delay_s", config.preempt_delay_s)
        if delay > MAX_DURATION_S:
            raise InvalidRequestError(
                "preempt_delay_s", f"must be at most {MAX_DURATION_S:.0e} seconds (got {delay:g})"
            )


def time_limits(default_s: object, maximum_s: object, queue_name: str) -> None:
    """Check a queue's default and maximum time limit (seconds, above 0, or None).

    Raises:
        InvalidRequestError: field ``default_time`` or ``max_time``: not a positive number
            of seconds; a default above the maximum.
    """
    for field_name, value in (("default_time", default_s), ("max_time", maximum_s)):
        if value is not None and (seconds(field_name, value) <= 0):
            raise InvalidRequestError(field_name, f"must be above 0 seconds (got {value!r})")
    if (
        isinstance(default_s, int | float)
        and isinstance(maximum_s, int | float)
        and default_s > maximum_s
    ):
        raise InvalidRequestError(
            "default_time",
            f"queue {queue_name}: default time {default_s:g} s is above its maximum "
            f"{maximum_s:g} s",
        )


def stored_bytes(argv: Sequence[str], env: Mapping[str, str], cwd: str = "") -> int:
    """Bytes a command, an environment and a working directory take in the store (compact
    UTF-8 JSON of ``[argv, env]``, plus the directory's UTF-8 bytes): what the per-submission
    and per-user byte limits count."""
    dump = json.dumps([list(argv), dict(env)], ensure_ascii=False, separators=(",", ":"))
    size = len(dump.encode("utf-8", errors="surrogatepass"))
    return size + len(cwd.encode("utf-8", errors="surrogatepass"))


def members(entries: object) -> tuple[str, ...]:
    """Check a queue's member list (see :data:`MEMBER`); duplicates are refused.

    Raises:
        InvalidRequestError: field ``members``: not a list of strings, too many entries, a
            malformed or repeated entry (the entry is named).
    """
    if isinstance(entries, str) or not isinstance(entries, Sequence):
        raise InvalidRequestError("members", f"must be a list of names (got {entries!r})")
    if len(entries) > MAX_MEMBERS:
        raise InvalidRequestError(
            "members", f"{len(entries)} entries; a queue lists at most {MAX_MEMBERS}"
        )
    seen: set[str] = set()
    for entry in entries:
        if not isinstance(entry, str) or not MEMBER.fullmatch(entry):
            shown = repr(entry) if len(repr(entry)) <= 40 else f"{repr(entry)[:40]}..."
            raise InvalidRequestError(
                "members",
                f"{shown} is not a member: give a user name or uid, @group (name or gid), "
                "or * for everyone",
            )
        if entry in seen:
            raise InvalidRequestError("members", f"{entry!r} is listed twice")
        seen.add(entry)
    return tuple(entries)


def default_for(entries: object) -> tuple[str, ...]:
    """Check whose default a queue is: entries as in :func:`members`, but not ``*`` (plain
    submissions of everyone else go to ``default``).

    Raises:
        InvalidRequestError: field ``default_for``: as :func:`members`, or ``*``.
    """
    try:
        checked = members(entries)
    except InvalidRequestError as exc:
        raise InvalidRequestError("default_for", exc.reason) from None
    if EVERYONE in checked:
        raise InvalidRequestError(
            "default_for",
            "'*' cannot be a default: name users or @groups (submissions of everyone else "
            "without a queue go to the queue named default)",
        )
    return checked


def submission(
    *,
    workload_name: str,
    owner_uid: int,
    request: Request,
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str],
    grace_s: float,
    preemptible: bool | None,
    shell: bool,
) -> tuple[tuple[str, ...], dict[str, str], float]:
    """Check a submission's fields; return argv, env and grace as stored.

    Raises:
        InvalidRequestError: the field that is wrong and why (an empty command, a plain
            string as argv, a negative uid, a non-string environment entry, ...).
    """
    text("name", workload_name, max_length=NAME_LENGTH)
    integer("owner_uid", owner_uid)
    if not isinstance(request, Request):
        raise InvalidRequestError("request", f"expected a Request (got {request!r})")
    if isinstance(argv, str | bytes) or not isinstance(argv, Sequence):
        raise InvalidRequestError("argv", f"must be a list of strings (got {argv!r})")
    command = tuple(text("argv", a) for a in argv)
    if not command or not command[0].strip():
        raise InvalidRequestError("argv", "the command is empty")
    text("cwd", cwd, max_length=wire_limits.MAX_CWD_CHARS)
    if not isinstance(env, Mapping):
        raise InvalidRequestError("env", f"must be a mapping of strings (got {env!r})")
    environment = {text("env", k): text(f"env[{k}]", v) for k, v in env.items()}
    if any(not k or "=" in k for k in environment):
        raise InvalidRequestError("env", "variable names must be non-empty and without '='")
    if preemptible is not None and not isinstance(preemptible, bool):
        raise InvalidRequestError("preemptible", f"must be true, false or null ({preemptible!r})")
    if not isinstance(shell, bool):
        raise InvalidRequestError("shell", f"must be true or false (got {shell!r})")
    return command, environment, seconds("grace_s", grace_s)


def allocation(request: Request, placed: Allocation, gpu_uuids: Sequence[str]) -> None:
    """Check that an allocation matches the request it was made for.

    Raises:
        InvalidRequestError: a GPU count that differs from the request's, per-GPU lists of
            different lengths, UUIDs given for some GPUs only.
    """
    if not isinstance(placed, Allocation):
        raise InvalidRequestError("allocation", f"expected an Allocation (got {placed!r})")
    name("allocation.node_name", placed.node_name)
    count = len(placed.gpus)
    if count != request.gpu_count:
        raise InvalidRequestError(
            "allocation.gpus", f"{count} GPU(s) given for a request of {request.gpu_count}"
        )
    if len(placed.gpu_milli) != count or len(placed.gpu_memory_mib) != count:
        raise InvalidRequestError("allocation", "per-GPU lists must have one entry per GPU")
    if gpu_uuids and len(gpu_uuids) != count:
        raise InvalidRequestError("gpu_uuids", f"{len(gpu_uuids)} UUID(s) for {count} GPU(s)")
    for u in gpu_uuids:
        text("gpu_uuids", u)


def mig_request(wanted: StoredMigRequest, request: Request) -> None:
    """Check a MIG workload's request.

    Raises:
        InvalidRequestError: not a :class:`StoredMigRequest`, not exactly one of a profile
            name and a positive memory size, or a ``request`` that is not one GPU.
    """
    if not isinstance(wanted, StoredMigRequest):
        raise InvalidRequestError("mig_request", f"expected a StoredMigRequest (got {wanted!r})")
    if (wanted.profile is None) == (wanted.memory_mib is None):
        raise InvalidRequestError("mig_request", "give exactly one of a profile and a memory size")
    if wanted.profile is not None:
        text("mig_request.profile", wanted.profile, max_length=NAME_LENGTH)
        if not wanted.profile.strip():
            raise InvalidRequestError("mig_request.profile", "empty profile name")
    else:
        integer("mig_request.memory_mib", wanted.memory_mib, minimum=1)
    if request.gpu_count != 1:
        raise InvalidRequestError(
            "request.gpu_count", f"a MIG workload asks for one GPU (got {request.gpu_count})"
        )


def node(record: NodeRecord) -> None:
    """Check an inventory node.

    Raises:
        InvalidRequestError: a bad name or amount, duplicate GPU indices or UUIDs.
    """
    if not isinstance(record, NodeRecord):
        raise InvalidRequestError("node", f"expected a NodeRecord (got {record!r})")
    name("name", record.name)
    integer("cpu_milli", record.cpu_milli)
    integer("memory_mib", record.memory_mib)
    indices = [integer("gpus.index", g.index, maximum=2**31 - 1) for g in record.gpus]
    if len(set(indices)) != len(indices):
        raise InvalidRequestError("gpus.index", f"node {record.name}: duplicate GPU index")
    uuids = [text("gpus.uuid", g.uuid, max_length=96) for g in record.gpus]
    if any(not u for u in uuids) or len(set(uuids)) != len(uuids):
        raise InvalidRequestError("gpus.uuid", f"node {record.name}: empty or duplicate UUID")
    for g in record.gpus:
        name("gpus.model", g.model)
        integer("gpus.memory_mib", g.memory_mib)
