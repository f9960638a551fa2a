"""From a submission on the wire to a validated :class:`fgpu.model.types.Request`.

Every refusal is a :class:`BadRequest` naming the field and the reason (DESIGN.md section 4:
a fraction is in (0, 1), a count a positive integer, ``gpu-memory`` must fit the largest
eligible GPU, unknown models are refused), and nothing is stored.
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
from fgpu.wire import SubmitRequest

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
    """A checked submission."""

    request: Request
    priority: int
    argv: list[str]
    name: str


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
    if body.mig_profile is not None:
        if body.gpu is not None or body.gpu_memory is not None:
            raise BadRequest(
                "mig_profile", "--mig-profile cannot be combined with -g or --gpu-memory"
            )
        raise BadRequest("mig_profile", "MIG instances are not supported by this service yet")
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
        priority = parse_priority(body.priority)
    except InvalidRequestError as exc:
        raise BadRequest("priority", exc.reason) from None
    if priority > MAX_PRIORITY:
        raise BadRequest(
            "priority", f"{priority} is above {MAX_PRIORITY}; classes go up to critical (125)"
        )
    if not math.isfinite(body.grace_s) or not 0 <= body.grace_s <= MAX_GRACE_S:
        raise BadRequest("grace_s", f"must be between 0 and {MAX_GRACE_S:g} seconds")
    try:
        request = Request(cpu, host_memory, count, milli, memory, frozenset(models))
    except InvalidRequestError as exc:
        raise BadRequest(exc.field, exc.reason) from None
    name = body.name if body.name else body.command[0].rsplit("/", 1)[-1]
    return Submission(request, priority, list(body.command), name[:200])


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
