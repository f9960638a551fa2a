"""From a submission on the wire to a validated :class:`fgpu.model.types.Request`.

Every refusal is a :class:`BadRequest` naming the field and the reason (DESIGN.md section 4:
a fraction is in (0, 1), a count a positive integer, ``gpu-memory`` must fit the largest
eligible GPU, unknown models are refused), and nothing is stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fgpu.model.catalog import UnknownGpuModelError, models_named
from fgpu.model.types import InvalidRequestError, Request
from fgpu.model.units import (
    MAX_DURATION_S,
    UnitError,
    parse_cpu_milli,
    parse_gpu_fraction,
    parse_gpu_request,
    parse_memory_mib,
)
from fgpu.rules.errors import BadRequest
from fgpu.rules.names import check_name
from fgpu.rules.slurm import format_time, parse_time
from fgpu.sched.workload import Resources, parse_priority
from fgpu.store import validate
from fgpu.store.records import QueueConfig, QueueLimit, StoredMigRequest
from fgpu.store.schema import NAME_LENGTH
from fgpu.wire import QueueBody, SubmitRequest

# the bounds the OpenAPI document states too (one source: fgpu.wire_limits)
from fgpu.wire_limits import MAX_ARGUMENT_BYTES as MAX_ARGUMENT_BYTES
from fgpu.wire_limits import MAX_COMMAND_BYTES as MAX_COMMAND_BYTES
from fgpu.wire_limits import MAX_GRACE_S as MAX_GRACE_S
from fgpu.wire_limits import MAX_PRIORITY as MAX_PRIORITY
from fgpu.wire_limits import MAX_QUOTA_GPUS

ISOLATIONS = ("share", "mig")
"""``isolation`` values: a share of a GPU (the default) or a MIG instance."""


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


@dataclass(frozen=True, slots=True)
class ResourceAsk:
    """What a submission asks for, as the user wrote it (CLI flags, API fields, or the
    ``fgpu.io/*`` annotations of a Kubernetes pod).

    Attributes:
        gpu: ``-g``: a fraction ``"0.5"`` or a count ``"2"``.
        gpu_fraction: share on each of several GPUs (``-g 2 --gpu-fraction 0.3``).
        gpu_memory: memory quota per GPU, e.g. ``"5GiB"``.
        gpu_model: allowed GPU models (each entry may hold comma-separated names).
        mig_profile: a MIG profile name.
        cpu: CPU cores, e.g. ``"2"`` or ``"500m"``.
        memory: host memory, e.g. ``"8GiB"``.
        priority: a priority number or class name.
    """

    gpu: str | None = None
    gpu_fraction: str | None = None
    gpu_memory: str | None = None
    gpu_model: tuple[str, ...] = ()
    mig_profile: str | None = None
    cpu: str | None = None
    memory: str | None = None
    priority: str = "normal"


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
    if body.name is not None:
        check_name("name", body.name)
    _sizes(body.command, body.env)
    _text("cwd", body.cwd)
    _text("env", *body.env, *body.env.values())
    if not body.cwd.startswith("/"):
        raise BadRequest("cwd", "must be an absolute path")
    mig_request = _mig(body)
    # without a name, the command's base name (cut to the limit)
    name = body.name if body.name else body.command[0].rsplit("/", 1)[-1]
    if mig_request is not None:
        priority = _priority(body)
        return Submission(None, priority, list(body.command), name[:NAME_LENGTH], mig_request)
    ask = ResourceAsk(
        gpu=body.gpu,
        gpu_fraction=body.gpu_fraction,
        gpu_memory=body.gpu_memory,
        gpu_model=tuple(body.gpu_model),
        mig_profile=body.mig_profile,
        cpu=body.cpu,
        memory=body.memory,
        priority=body.priority,
    )
    request, _ = parse_resources(ask)
    priority = _priority(body)
    return Submission(request, priority, list(body.command), name[:NAME_LENGTH])


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
    isolation = body.isolation.strip().lower() if body.isolation is not None else None
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
            raise BadRequest("mig_profile", MIG_COMBINED)
        wanted = StoredMigRequest(profile=mig_profile_name(body.mig_profile))
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
        raise BadRequest("gpu_model", MIG_NO_MODEL)
    for field in ("cpu", "memory"):
        if getattr(body, field):
            raise BadRequest(
                field,
                "a MIG request does not reserve host CPU or memory (not supported yet); "
                "leave out --cpu and --memory",
            )
    return wanted


MIG_COMBINED = "--mig-profile cannot be combined with -g or --gpu-memory"
MIG_NO_MODEL = "a MIG request cannot name GPU models (the profile decides the model)"


def mig_profile_name(text: str) -> str:
    """A ``--mig-profile`` value checked as text and put in lower case (whether a model has
    it is for the caller, who knows the models).

    Raises:
        BadRequest: field ``mig_profile``: not UTF-8, a NUL or control character, or empty.
    """
    _text("mig_profile", text)
    _printable("mig_profile", text)
    profile = text.strip().lower()
    if not profile:
        raise BadRequest("mig_profile", "empty profile name")
    return profile


def parse_resources(ask: ResourceAsk) -> tuple[Request, int]:
    """Check what a submission asks for; the rules of DESIGN.md section 4, shared by the
    CLI, the API and the Kubernetes admission webhook.

    Returns:
        ``(request, priority)``.

    Raises:
        BadRequest: naming the field (``gpu``, ``gpu_fraction``, ``gpu_memory``,
            ``gpu_model``, ``mig_profile``, ``cpu``, ``memory``, ``priority``, or a
            :class:`Request` field) and the reason.
    """
    if ask.mig_profile is not None:
        if ask.gpu is not None or ask.gpu_memory is not None:
            raise BadRequest("mig_profile", MIG_COMBINED)
        raise BadRequest("mig_profile", "MIG instances are not supported by this scheduler yet")
    count = 0
    milli: int | None = None
    if ask.gpu is not None:
        count, milli = _gpu(ask.gpu)
    if ask.gpu_fraction is not None:
        if ask.gpu is None or count < 1 or milli != 1000:
            raise BadRequest(
                "gpu_fraction",
                "--gpu-fraction needs a whole GPU count, e.g. -g 2 --gpu-fraction 0.3",
            )
        milli = _unit("gpu_fraction", parse_gpu_fraction, ask.gpu_fraction)
    memory: int | None = None
    if ask.gpu_memory is not None:
        memory = _unit("gpu_memory", parse_memory_mib, ask.gpu_memory)
        if count == 0:
            count = 1
        elif milli == 1000 and ask.gpu_fraction is None:
            raise BadRequest("gpu_memory", "whole GPUs get all their memory; drop --gpu-memory")
    models: set[str] = set()
    for name in ask.gpu_model:
        if not name.strip():
            raise BadRequest("gpu_model", "empty model name")
        for part in name.split(","):
            if not part.strip():
                continue
            try:
                models.update(models_named(part))
            except UnknownGpuModelError as exc:
                raise BadRequest("gpu_model", str(exc).removeprefix("gpu_model: ")) from None
    if models and count == 0:
        raise BadRequest("gpu_model", "--gpu-model needs a GPU request (-g or --gpu-memory)")
    cpu = _unit("cpu", parse_cpu_milli, ask.cpu) if ask.cpu else 0
    host_memory = _unit("memory", parse_memory_mib, ask.memory) if ask.memory else 0
    try:
        priority = parse_priority(ask.priority)
    except InvalidRequestError as exc:
        raise BadRequest("priority", exc.reason) from None
    try:
        request = Request(cpu, host_memory, count, milli, memory, frozenset(models))
    except InvalidRequestError as exc:
        raise BadRequest(exc.field, exc.reason) from None
    return request, priority


def queue_config(body: QueueBody, name: str | None = None) -> QueueConfig:
    """A queue as configured through the API (``fgpu queue create|set``) or a Kubernetes
    ``Queue`` object: GPU amounts in GPUs (fractions allowed) become milli-GPU.

    Args:
        body: the queue's fields.
        name: the queue's name when it is not ``body.name`` (a rename is not allowed).

    Raises:
        BadRequest: ``quota`` or ``limit`` not a number of GPUs in 0..1000000, or above 0
            but below one milli-GPU; ``max_priority`` not a priority up to
            :data:`MAX_PRIORITY`; ``members`` malformed or repeated; ``default_time`` or
            ``max_time`` not a Slurm time (:func:`fgpu.rules.slurm.parse_time`), the default
            above the maximum; ``default_for`` malformed or repeated (it may not hold
            ``*``); ``max_active_per_user`` or ``max_running_per_user`` below 1,
            ``max_stored_bytes`` below :data:`fgpu.store.validate.MIN_STORED_BYTES` (either
            above the largest amount); ``preempt_delay_s``
            not a number of seconds in 0..1e9.
    """
    for field_name, value in (("quota", body.quota), ("limit", body.limit)):
        if value is not None and (value != value or value < 0 or value > MAX_QUOTA_GPUS):
            raise BadRequest(field_name, f"must be a number of GPUs between 0 and {MAX_QUOTA_GPUS}")
        if value is not None and value > 0 and round(value * 1000) == 0:
            raise BadRequest(
                field_name, f"{value:g} GPUs is below the smallest amount, 0.001 (one milli-GPU)"
            )
    limit = (
        QueueLimit(gpu_milli=round(body.limit * 1000)) if body.limit is not None else QueueLimit()
    )
    try:
        max_priority = parse_priority(body.max_priority, "max_priority")
    except InvalidRequestError as exc:
        raise BadRequest("max_priority", exc.reason) from None
    if max_priority > MAX_PRIORITY:
        raise BadRequest("max_priority", f"{max_priority} is above {MAX_PRIORITY}")
    try:
        members = validate.members(body.members)
        default_for = validate.default_for(body.default_for)
    except InvalidRequestError as exc:
        raise BadRequest(exc.field, exc.reason) from None
    for field_name, text in (("default_time", body.default_time), ("max_time", body.max_time)):
        if text is not None and not text.strip():
            raise BadRequest(field_name, "empty; give a time limit (90, 1:30:00) or 0 for none")
    default_time = parse_time(body.default_time, "default_time") if body.default_time else None
    max_time = parse_time(body.max_time, "max_time") if body.max_time else None
    if default_time is not None and max_time is not None and default_time > max_time:
        raise BadRequest(
            "default_time",
            f"{body.default_time!r} ({format_time(default_time)}) is above the queue's maximum "
            f"{body.max_time!r} ({format_time(max_time)})",
        )
    for field_name, value, least in (
        ("max_active_per_user", body.max_active_per_user, 1),
        ("max_running_per_user", body.max_running_per_user, 1),
        ("max_stored_bytes", body.max_stored_bytes, validate.MIN_STORED_BYTES),
        ("max_output_bytes", body.max_output_bytes, validate.MIN_OUTPUT_BYTES),
    ):
        if value is not None and not least <= value <= validate.MAX_AMOUNT:
            raise BadRequest(
                field_name,
                f"{value} is out of range: give {least} to {validate.MAX_AMOUNT}, or null for "
                "the machine's limit",
            )
    return QueueConfig(
        name or body.name,
        parent=body.parent,
        quota=Resources(gpu_milli=round(body.quota * 1000)),
        limit=limit,
        over_quota_weight=body.over_quota_weight,
        priority=body.priority,
        members=members,
        max_priority=max_priority,
        nonpreemptible=body.nonpreemptible,
        squeeze=body.squeeze,
        default_time_s=default_time,
        max_time_s=max_time,
        default_for=default_for,
        max_active_per_user=body.max_active_per_user,
        max_running_per_user=body.max_running_per_user,
        max_stored_bytes=body.max_stored_bytes,
        max_output_bytes=body.max_output_bytes,
        preempt_delay_s=_preempt_delay(body.preempt_delay_s),
    )


def _preempt_delay(value: float | None) -> float | None:
    """A queue's ``preempt_delay_s``: None, or seconds in 0..1e9.

    Raises:
        BadRequest: field ``preempt_delay_s``, echoing the value.
    """
    if value is None:
        return None
    if not (0 <= value <= MAX_DURATION_S):  # also refuses NaN
        raise BadRequest(
            "preempt_delay_s", f"{value!r} is not a number of seconds in 0..{MAX_DURATION_S:.0e}"
        )
    return float(value)


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
