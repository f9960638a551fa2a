"""From a submission on the wire to a validated :class:`fgpu.model.types.Request`.

Every refusal is a :class:`BadRequest` naming the field and the reason (DESIGN.md section 4:
a fraction is in (0, 1), a count a positive integer, ``gpu-memory`` must fit the largest
eligible GPU, unknown models are refused), and nothing is stored.

A MIG request (``mig_profile``, or ``isolation: "mig"`` with ``gpu_memory``) is checked here
for its shape only; whether a MIG GPU of this machine can hold it is the service's check
(:meth:`fgpu.server.mig_pool.MigPool.request_for`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fgpu.model.catalog import UnknownGpuModelError, canonical_name
from fgpu.model.types import InvalidRequestError, Request
from fgpu.model.units import (
    UnitError,
    parse_cpu_milli,
    parse_gpu_fraction,
    parse_gpu_request,
    parse_memory_mib,
)
from fgpu.sched.workload import parse_priority
from fgpu.server.errors import BadRequest
from fgpu.store.records import StoredMigRequest
from fgpu.wire import SubmitRequest

ISOLATIONS = ("share", "mig")
"""``isolation`` values: a share of a GPU (the default) or a MIG instance."""

MAX_GRACE_S = 3600.0
MAX_PRIORITY = 1000
"""Highest numeric priority a submission may ask for (the classes end at critical, 125)."""
MAX_ARGUMENT_BYTES = 131_072
"""Longest single argument or ``NAME=value``, with its NUL (Linux ``MAX_ARG_STRLEN``)."""
MAX_COMMAND_BYTES = 1_048_576
"""Command and environment together (half of Linux's default ``ARG_MAX`` of 2 MiB, which
also has to hold the wrapper's own arguments and pointers)."""


@dataclass(frozen=True, slots=True)
class Submission:
    """A checked submission.

    Attributes:
        request: what it asks for; None for a MIG request (the service builds it from the
            machine's MIG profiles).
        priority: numeric priority.
        argv: the command.
        name: display name.
        mig_request: the MIG instance asked for, or None for a share of a GPU.
    """

    request: Request | None
    priority: int
    argv: list[str]
    name: str
    mig_request: StoredMigRequest | None = None


def _unit(field: str, parse: object, text: str) -> int:
    try:
        value = parse(text, field)  # type: ignore[operator]
    except UnitError as exc:
        raise BadRequest(field, exc.reason) from None
    return int(value)


def parse_submission(body: SubmitRequest) -> Submission:
    """Check a submission and build its request.

    Raises:
        BadRequest: naming the field and the reason.
    """
    if not body.command or not all(part for part in body.command):
        raise BadRequest("command", "give a command to run (non-empty arguments)")
    if body.shell and len(body.command) != 1:
        raise BadRequest(
            "command",
            f"with shell, give one command line (got {len(body.command)} arguments)",
        )
    _text("command", *body.command)
    _text("name", body.name or "")
    _printable("name", body.name or "")
    _sizes(body.command, body.env)
    _text("cwd", body.cwd)
    _text("env", *body.env, *body.env.values())
    if not body.cwd.startswith("/"):
        raise BadRequest("cwd", "must be an absolute path")
    mig_request = _mig(body)
    priority = _priority(body)
    name = body.name if body.name else body.command[0].rsplit("/", 1)[-1]
    if mig_request is not None:
        return Submission(None, priority, list(body.command), name[:200], mig_request)
    count = 0
    milli: int | None = None
    if body.gpu is not None:
        count, milli = _gpu(body.gpu)
    if body.gpu_fraction is not None:
        if body.gpu is None or count < 1 or milli != 1000:
            raise BadRequest(
                "gpu_fraction",
                "--gpu-fraction needs a whole GPU count, e.g. -g 2 --gpu-fraction 0.3",
            )
        milli = _unit("gpu_fraction", parse_gpu_fraction, body.gpu_fraction)
    memory: int | None = None
    if body.gpu_memory is not None:
        memory = _unit("gpu_memory", parse_memory_mib, body.gpu_memory)
        if count == 0:
            count = 1
        elif milli == 1000 and body.gpu_fraction is None:
            raise BadRequest("gpu_memory", "whole GPUs get all their memory; drop --gpu-memory")
    models: set[str] = set()
    for name in body.gpu_model:
        if not name.strip():
            raise BadRequest("gpu_model", "empty model name")
        for part in name.split(","):
            if not part.strip():
                continue
            try:
                models.add(canonical_name(part))
            except UnknownGpuModelError as exc:
                raise BadRequest("gpu_model", str(exc).removeprefix("gpu_model: ")) from None
    if models and count == 0:
        raise BadRequest("gpu_model", "--gpu-model needs a GPU request (-g or --gpu-memory)")
    cpu = _unit("cpu", parse_cpu_milli, body.cpu) if body.cpu else 0
    host_memory = _unit("memory", parse_memory_mib, body.memory) if body.memory else 0
    try:
        request = Request(cpu, host_memory, count, milli, memory, frozenset(models))
    except InvalidRequestError as exc:
        raise BadRequest(exc.field, exc.reason) from None
    return Submission(request, priority, list(body.command), name[:200])


def _priority(body: SubmitRequest) -> int:
    """The numeric priority, after checking it and the grace period.

    Raises:
        BadRequest: ``priority`` unknown or above :data:`MAX_PRIORITY`; ``grace_s`` outside
            0..:data:`MAX_GRACE_S`.
    """
    try:
        priority = parse_priority(body.priority)
    except InvalidRequestError as exc:
        raise BadRequest("priority", exc.reason) from None
    if priority > MAX_PRIORITY:
        raise BadRequest(
            "priority", f"{priority} is above {MAX_PRIORITY}; classes go up to critical (125)"
        )
    if not math.isfinite(body.grace_s) or not 0 <= body.grace_s <= MAX_GRACE_S:
        raise BadRequest("grace_s", f"must be between 0 and {MAX_GRACE_S:g} seconds")
    return priority


def _mig(body: SubmitRequest) -> StoredMigRequest | None:
    """The MIG instance a submission asks for, or None for a share of a GPU.

    ``mig_profile`` asks for that profile; ``isolation: "mig"`` with ``gpu_memory`` for the
    smallest profile with that much memory. A MIG request takes neither ``-g`` nor
    ``--gpu-fraction``, nor (for now) ``--gpu-model``, ``--cpu`` or ``--memory``.

    Raises:
        BadRequest: ``isolation`` not share or mig; ``isolation`` share with a profile;
            ``mig_profile`` with ``-g``, ``--gpu-memory`` or ``--gpu-fraction``, or empty;
            ``isolation`` mig without ``--gpu-memory`` or with ``-g``; a MIG request with
            ``gpu_model``, ``cpu`` or ``memory``.
    """
    isolation = body.isolation
    if isolation is not None and isolation not in ISOLATIONS:
        raise BadRequest("isolation", f"{isolation!r} is not one of {', '.join(ISOLATIONS)}")
    wanted: StoredMigRequest
    if body.mig_profile is not None:
        if isolation == "share":
            raise BadRequest(
                "isolation",
                "a MIG profile asks for a MIG instance; use --isolation mig or leave it out",
            )
        if body.gpu is not None or body.gpu_memory is not None or body.gpu_fraction is not None:
            raise BadRequest(
                "mig_profile", "--mig-profile cannot be combined with -g or --gpu-memory"
            )
        _text("mig_profile", body.mig_profile)
        _printable("mig_profile", body.mig_profile)
        profile = body.mig_profile.strip().lower()
        if not profile:
            raise BadRequest("mig_profile", "empty profile name")
        wanted = StoredMigRequest(profile=profile)
    elif isolation == "mig":
        if body.gpu is not None or body.gpu_fraction is not None:
            raise BadRequest(
                "isolation",
                "--isolation mig takes --gpu-memory (the smallest MIG profile with that much) "
                "or --mig-profile, not -g or --gpu-fraction",
            )
        if body.gpu_memory is None:
            raise BadRequest(
                "isolation", "--isolation mig needs --gpu-memory (e.g. 18GiB) or --mig-profile"
            )
        wanted = StoredMigRequest(memory_mib=_unit("gpu_memory", parse_memory_mib, body.gpu_memory))
    else:
        return None
    if body.gpu_model:
        raise BadRequest(
            "gpu_model", "a MIG request cannot name GPU models (the profile decides the model)"
        )
    for field in ("cpu", "memory"):
        if getattr(body, field):
            raise BadRequest(
                field,
                "a MIG request does not reserve host CPU or memory (not supported yet); "
                "leave out --cpu and --memory",
            )
    return wanted


def _text(field: str, *values: str) -> None:
    """Refuse text that cannot be passed to a process (lone surrogates, NUL)."""
    for value in values:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(field, "not valid UTF-8 text") from None
        if "\x00" in value:
            raise BadRequest(field, "contains a NUL character")


def _printable(field: str, value: str) -> None:
    """Refuse control characters in text that listings print (terminal escapes)."""
    for char in value:
        if ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0:
            raise BadRequest(field, f"contains the control character {char!r}")


def _sizes(command: list[str], env: dict[str, str]) -> None:
    """Refuse what the kernel would refuse at exec, before it is stored: one argument or
    ``NAME=value`` above :data:`MAX_ARGUMENT_BYTES`, or all of them above
    :data:`MAX_COMMAND_BYTES`."""
    total = 0
    for field, strings in (("command", command), ("env", [f"{k}={v}" for k, v in env.items()])):
        for text in strings:
            size = len(text.encode("utf-8", "surrogatepass")) + 1
            if size > MAX_ARGUMENT_BYTES:
                raise BadRequest(
                    field,
                    f"one {'argument' if field == 'command' else 'variable'} has {size} bytes; "
                    f"the limit is {MAX_ARGUMENT_BYTES}",
                )
            total += size
    if total > MAX_COMMAND_BYTES:
        raise BadRequest(
            "command",
            f"the command and its environment take {total} bytes; the limit is {MAX_COMMAND_BYTES}",
        )


def _gpu(text: str) -> tuple[int, int]:
    try:
        return parse_gpu_request(text, "gpu")
    except UnitError as exc:
        raise BadRequest("gpu", exc.reason) from None
