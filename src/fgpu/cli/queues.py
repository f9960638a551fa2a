"""``fgpu queue create|ls|set|rm``: queues (tenants) with quota, limit, over-quota weight
and priority (DESIGN.md section 5). GPU amounts are in GPUs, fractions allowed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from fgpu.cli.common import (
    EXIT_REFUSED,
    JsonOption,
    SocketOption,
    UrlOption,
    connect,
    err,
    fail,
    out,
    show,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from fgpu.client.client import ClientError
    from fgpu.wire import QueueView

queue_app = typer.Typer(
    rich_markup_mode=None,
    help="Queues (tenants): quota, limit, weight, priority.",
    no_args_is_help=True,
)

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="Queue name.")]
QuotaOption = Annotated[float | None, typer.Option(help="Guaranteed GPUs (fractions allowed).")]
LimitOption = Annotated[float | None, typer.Option(help="Most GPUs it may hold (default: none).")]
WeightOption = Annotated[
    float | None, typer.Option(help="Share of spare GPUs beyond quota, relative to others.")
]
PriorityOption = Annotated[
    int | None, typer.Option("--priority", help="Queue priority: higher gets spare GPUs first.")
]
ParentOption = Annotated[str | None, typer.Option(help="Parent queue.")]
MemberOption = Annotated[
    list[str] | None,
    typer.Option(
        "--member",
        help="Who may submit (repeat): a user name or uid, @group, or '*' for everyone "
        "(default: admins only).",
    ),
]
MaxPriorityOption = Annotated[
    str | None,
    typer.Option(
        "--max-priority",
        help="Highest workload priority members who are not admins may use (default normal).",
    ),
]
NonPreemptibleOption = Annotated[
    bool | None,
    typer.Option(
        "--nonpreemptible/--no-nonpreemptible",
        help="May members who are not admins submit non-preemptible work (default: no).",
    ),
]

DefaultForOption = Annotated[
    list[str] | None,
    typer.Option(
        "--default-for",
        help="Make it the default queue (for submissions without -q) of these users and "
        "@groups: alice,@team (comma-separated or repeated; replaces the list). A user or "
        "group has one default queue.",
        show_default=False,
    ),
]

SqueezeOption = Annotated[
    bool | None,
    typer.Option(
        "--squeeze/--no-squeeze",
        help="Squeeze before evict for preemption inside this queue, or evict (default: "
        "the service's setting).",
    ),
]

MaxActiveOption = Annotated[
    str | None,
    typer.Option(
        "--max-active-per-user",
        metavar="N",
        help="Most active workloads one user may have in this queue ('none': only the "
        "machine's --max-active-per-user).",
    ),
]
MaxRunningOption = Annotated[
    str | None,
    typer.Option(
        "--max-running-per-user",
        metavar="N",
        help="Most workloads one user may have running at once in this queue; more wait "
        "pending ('none': only the machine's --max-running-per-user).",
    ),
]
MaxStoredOption = Annotated[
    str | None,
    typer.Option(
        "--max-stored-bytes",
        metavar="SIZE",
        help="Most bytes of commands and environments one user's workloads of this queue "
        "may store, e.g. 64MiB ('none': only the machine's --max-stored-bytes).",
    ),
]
MaxOutputOption = Annotated[
    str | None,
    typer.Option(
        "--max-output-bytes",
        metavar="SIZE",
        help="Most bytes of output (logs) one user's workloads of this queue may keep, e.g. "
        "1GiB; past it their output is dropped and the logs say so ('none': only the "
        "machine's --max-output-bytes).",
    ),
]
PreemptDelayOption = Annotated[
    str | None,
    typer.Option(
        "--preempt-delay",
        metavar="DURATION",
        help="Wait before evict: how long a preemptor below priority high (100) waits for "
        "GPUs to free by themselves before it suspends or evicts work of lower priority: "
        "seconds (90) or 300s, 5m, 1h; 0: at once (default: the service's setting, "
        "fgpu serve --preempt-delay).",
    ),
]


def _per_user_limits(
    max_active: str | None,
    max_stored: str | None,
    current: QueueView | None = None,
    max_output: str | None = None,
    max_running: str | None = None,
) -> dict[str, int | None]:
    """The queue's per-user limits from their flags (None: kept from ``current``, or unset
    when creating; ``none``: unset). Fails naming the flag and echoing the value."""
    from fgpu.model.units import UnitError, parse_bytes

    limits: dict[str, int | None] = {
        "max_active_per_user": current.max_active_per_user if current else None,
        "max_stored_bytes": current.max_stored_bytes if current else None,
        "max_output_bytes": current.max_output_bytes if current else None,
        "max_running_per_user": current.max_running_per_user if current else None,
    }
    for field_name, flag, given in (
        ("max_active_per_user", "--max-active-per-user", max_active),
        ("max_running_per_user", "--max-running-per-user", max_running),
    ):
        if given is None:
            continue
        text = given.strip()
        if text.lower() == "none":
            limits[field_name] = None
        elif text.isdigit() and int(text) >= 1:
            limits[field_name] = int(text)
        else:
            fail(f"{flag} {given!r}: give a whole number >= 1, or none")
    if max_stored is not None:
        if max_stored.strip().lower() == "none":
            limits["max_stored_bytes"] = None
        else:
            try:
                limits["max_stored_bytes"] = parse_bytes(max_stored, "--max-stored-bytes")
            except UnitError as exc:
                fail(f"--max-stored-bytes {max_stored!r}: {exc.reason}")
    if max_output is not None:
        if max_output.strip().lower() == "none":
            limits["max_output_bytes"] = None
        else:
            try:
                limits["max_output_bytes"] = parse_bytes(max_output, "--max-output-bytes")
            except UnitError as exc:
                fail(f"--max-output-bytes {max_output!r}: {exc.reason}")
    return limits


DefaultTimeOption = Annotated[
    str | None,
    typer.Option(
        "--default-time",
        help="Time limit of its workloads submitted without --time, as Slurm writes it "
        "(90, 1:30:00, 2-00:00:00); 0 for none (default: none).",
        show_default=False,
    ),
]
MaxTimeOption = Annotated[
    str | None,
    typer.Option(
        "--max-time",
        help="The longest --time its workloads may ask for (a longer one is refused at "
        "submission; without --time they get the default, else this); 0 for none.",
        show_default=False,
    ),
]


def _preempt_delay(text: str, *, may_reset: bool = False) -> float | None:
    """``--preempt-delay`` in seconds (``default`` with ``may_reset``: None, the service's
    setting); a bad value ends the command naming the flag and echoing the value."""
    from fgpu.model.units import UnitError, parse_duration_s

    if may_reset and text.strip() == "default":
        return None
    try:
        return parse_duration_s(text, "--preempt-delay")
    except UnitError as exc:
        more = "; 'default' follows the service's setting" if may_reset else ""
        fail(f"--preempt-delay {text!r}: {exc.reason}{more}")


def _print_queue(view: QueueView, json_out: bool, verb: str) -> None:
    from fgpu.cli import render

    if json_out:
        print(render.to_json(view))
    else:
        err.print(escape(f"{verb} queue {view.name}"))
        out.print(render.queues_table([view]))
    for warning in view.warnings:
        err.print(f"[bold yellow]warning:[/] {escape(warning)}", markup=True)
    for hint in view.hints:
        err.print(f"[bold]hint:[/] {escape(hint)}", markup=True)


@queue_app.command("create")
def create(
    name: NameArgument,
    quota: QuotaOption = None,
    limit: LimitOption = None,
    over_quota_weight: WeightOption = None,
    priority: PriorityOption = None,
    parent: ParentOption = None,
    member: MemberOption = None,
    max_priority: MaxPriorityOption = None,
    nonpreemptible: NonPreemptibleOption = None,
    squeeze: SqueezeOption = None,
    default_time: DefaultTimeOption = None,
    max_time: MaxTimeOption = None,
    default_for: DefaultForOption = None,
    max_active_per_user: MaxActiveOption = None,
    max_running_per_user: MaxRunningOption = None,
    max_stored_bytes: MaxStoredOption = None,
    max_output_bytes: MaxOutputOption = None,
    preempt_delay: PreemptDelayOption = None,
    json_out: JsonOption = False,
    socket: SocketOption = None,
    url: UrlOption = None,
) -> None:
    """Create a queue (root and admins); only its members (--member) and admins submit to
    it."""
    from fgpu.wire import QueueBody

    fields: dict[str, object] = {"name": name, "parent": parent, "limit": limit}
    fields |= _per_user_limits(
        max_active_per_user,
        max_stored_bytes,
        max_output=max_output_bytes,
        max_running=max_running_per_user,
    )
    if preempt_delay is not None:
        fields["preempt_delay_s"] = _preempt_delay(preempt_delay)
    for key, value in (
        ("quota", quota),
        ("over_quota_weight", over_quota_weight),
        ("priority", priority),
        ("members", member),
        ("max_priority", max_priority),
        ("nonpreemptible", nonpreemptible),
        ("squeeze", squeeze),
        ("default_time", default_time),
        ("max_time", max_time),
        ("default_for", _split(default_for)),
    ):
        if value is not None:
            fields[key] = value
    body = QueueBody.model_validate(fields)
    with connect(socket, url, _explain(fields)) as client:
        view = client.create_queue(body)
    _print_queue(view, json_out, "created")


@queue_app.command("ls")
def list_queues(
    json_out: JsonOption = False,
    socket: SocketOption = None,
    url: UrlOption = None,
) -> None:
    """List queues with quota, limit, fair share and use."""
    from fgpu.cli import render

    with connect(socket, url) as client:
        views = client.list_queues()
    show(views, render.queues_table(views), json_out)


@queue_app.command("set")
def update(
    name: NameArgument,
    quota: QuotaOption = None,
    limit: LimitOption = None,
    no_limit: Annotated[bool, typer.Option("--no-limit", help="Remove the limit.")] = False,
    over_quota_weight: WeightOption = None,
    priority: PriorityOption = None,
    parent: ParentOption = None,
    member: Annotated[
        list[str] | None,
        typer.Option("--member", help="Replace the member list (repeat; see create)."),
    ] = None,
    add_member: Annotated[
        list[str] | None, typer.Option("--add-member", help="Add a member (repeat).")
    ] = None,
    remove_member: Annotated[
        list[str] | None, typer.Option("--remove-member", help="Remove a member (repeat).")
    ] = None,
    max_priority: MaxPriorityOption = None,
    nonpreemptible: NonPreemptibleOption = None,
    squeeze: SqueezeOption = None,
    default_time: DefaultTimeOption = None,
    max_time: MaxTimeOption = None,
    default_for: DefaultForOption = None,
    no_default_for: Annotated[
        bool, typer.Option("--no-default-for", help="Make it nobody's default queue.")
    ] = False,
    max_active_per_user: MaxActiveOption = None,
    max_running_per_user: MaxRunningOption = None,
    max_stored_bytes: MaxStoredOption = None,
    max_output_bytes: MaxOutputOption = None,
    preempt_delay: Annotated[
        str | None,
        typer.Option(
            "--preempt-delay",
            metavar="DURATION",
            help="Wait before evict (see create); 'default' follows the service's setting again.",
        ),
    ] = None,
    json_out: JsonOption = False,
    socket: SocketOption = None,
    url: UrlOption = None,
) -> None:
    """Change some of a queue's settings (root and admins); the others stay."""
    from fgpu.wire import QueueBody

    delay = None if preempt_delay is None else _preempt_delay(preempt_delay, may_reset=True)

    if limit is not None and no_limit:
        fail("--limit and --no-limit exclude each other")
    if default_for is not None and no_default_for:
        fail("--default-for and --no-default-for exclude each other")
    if member is not None and (add_member or remove_member):
        fail("--member replaces the list; --add-member and --remove-member change it")
    typed: dict[str, object] = {"name": name, "quota": quota, "limit": limit}
    typed |= {"over_quota_weight": over_quota_weight, "priority": priority, "parent": parent}
    typed |= {"members": member or add_member, "max_priority": max_priority}
    typed |= {"default_time": default_time, "max_time": max_time}
    typed |= {"default_for": default_for}
    typed |= {"preempt_delay_s": delay}
    with connect(socket, url, _explain(typed)) as client:
        current = next((q for q in client.list_queues() if q.name == name), None)
        if current is None:
            fail(f"NAME {name!r}: no such queue (fgpu queue ls lists them)", EXIT_REFUSED)
        kept_limit = None if current.limit_milli is None else current.limit_milli / 1000
        body = QueueBody(
            name=name,
            parent=parent if parent is not None else current.parent,
            quota=quota if quota is not None else current.quota_milli / 1000,
            limit=None if no_limit else (limit if limit is not None else kept_limit),
            over_quota_weight=(
                over_quota_weight if over_quota_weight is not None else current.over_quota_weight
            ),
            priority=priority if priority is not None else current.priority,
            members=_members(current.members, member, add_member or [], remove_member or []),
            max_priority=max_priority if max_priority is not None else current.max_priority,
            nonpreemptible=(
                nonpreemptible if nonpreemptible is not None else current.nonpreemptible
            ),
            squeeze=squeeze if squeeze is not None else current.squeeze,
            default_time=_kept_time(default_time, current.default_time_s),
            max_time=_kept_time(max_time, current.max_time_s),
            default_for=(
                []
                if no_default_for
                else _split(default_for) or []
                if default_for is not None
                else current.default_for
            ),
            **_per_user_limits(
                max_active_per_user,
                max_stored_bytes,
                current,
                max_output=max_output_bytes,
                max_running=max_running_per_user,
            ),
            preempt_delay_s=delay if preempt_delay is not None else current.preempt_delay_s,
        )
        view = client.update_queue(body)
    _print_queue(view, json_out, "updated")


def _kept_time(given: str | None, current_s: float | None) -> str | None:
    """A time option of ``queue set``: as given, else the queue's current value (as Slurm
    writes it), else none."""
    if given is not None:
        return given
    if current_s is None:
        return None
    from fgpu.rules.slurmtime import format_time

    return format_time(current_s)


def _explain(values: dict[str, object]) -> Callable[[ClientError], str]:
    """A refusal of a queue's settings naming the flag typed and its value as typed; a limit
    below the quota in GPUs, as given (``--limit 0.5 is below --quota 1``)."""
    from fgpu.cli.flags import QUEUE_FLAGS, flag_message, typed_value

    def explain(error: ClientError) -> str:
        if error.field.startswith("limit.") and "is below quota" in error.reason:
            limit = typed_value(("--limit",)) or str(values.get("limit"))
            quota = typed_value(("--quota",))
            quota_text = f"--quota {quota}" if quota is not None else "the queue's quota"
            return f"--limit {limit} is below {quota_text}"
        return flag_message(error.field, error.reason, values, QUEUE_FLAGS)

    return explain


def _split(values: list[str] | None) -> list[str] | None:
    """``--default-for alice,@team --default-for bob`` -> ``[alice, @team, bob]``."""
    if values is None:
        return None
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _members(
    current: list[str], replace: list[str] | None, add: list[str], remove: list[str]
) -> list[str]:
    """The member list after ``--member`` (replace) or ``--add-member``/``--remove-member``;
    removing someone who is not listed is an error (a typo would otherwise pass)."""
    if replace is not None:
        return list(replace)
    missing = [m for m in remove if m not in current]
    if missing:
        listed = ", ".join(current) or "none"
        fail(f"--remove-member: {', '.join(missing)} not listed (members: {listed})")
    kept = [m for m in current if m not in remove]
    return kept + [m for m in dict.fromkeys(add) if m not in kept]


@queue_app.command("rm")
def remove(
    name: NameArgument,
    socket: SocketOption = None,
    url: UrlOption = None,
) -> None:
    """Remove a queue that holds no workloads (root and admins)."""
    with connect(socket, url) as client:
        client.delete_queue(name)
    err.print(escape(f"removed queue {name}"))


def register(app: typer.Typer) -> None:
    """Add ``fgpu queue`` to the ``fgpu`` app."""
    app.add_typer(queue_app, name="queue")
