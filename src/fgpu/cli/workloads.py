"""Workload and machine commands: ``submit``, ``ls``, ``describe``, ``cancel``, ``top``,
``nodes`` (``run`` and ``logs`` are in :mod:`fgpu.cli.output`). Each parses its options,
calls the API once or a few times and renders; the server decides everything (DESIGN.md
section 2: the CLI has no business logic)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import RenderableType
from rich.markup import escape
from rich.text import Text

from fgpu.cli.common import (
    EXIT_REFUSED,
    JsonOption,
    SocketOption,
    UrlOption,
    connect,
    emit,
    err,
    exit_code,
    fail,
    out,
    show,
    uid_of,
    watch_loop,
)
from fgpu.cli.slurm import ArrayOption, DependencyOption, ExpandOption, TimeOption

if TYPE_CHECKING:
    from collections.abc import Callable

    from fgpu.client.client import Client, ClientError
    from fgpu.client.plain import PlainWorkloadView
    from fgpu.wire import WorkloadView


def submit(
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The command and its arguments, after --.", show_default=False),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            "-g", "--gpu", help="A fraction of one GPU (0.5) or a count of whole GPUs (2)."
        ),
    ] = None,
    gpu_fraction: Annotated[
        str | None, typer.Option(help="With -g N: this share on each of N GPUs (0.3).")
    ] = None,
    gpu_memory: Annotated[
        str | None,
        typer.Option(
            help="GPU memory per GPU: 5GiB, 5120MiB, 5G. Binary units: G and GB mean GiB, "
            "M and MB mean MiB; a bare number is MiB."
        ),
    ] = None,
    gpu_model: Annotated[
        list[str] | None,
        typer.Option(
            help="Only on these GPU models (A100-80GB); a family name means each of its "
            "models (A100: A100-40GB and A100-80GB); repeatable or comma-separated."
        ),
    ] = None,
    mig_profile: Annotated[
        str | None, typer.Option(help="A MIG instance of this profile (3g.40gb).")
    ] = None,
    isolation: Annotated[
        str | None,
        typer.Option(
            help="share (default: a share of a GPU) or mig (a MIG instance; with --gpu-memory "
            "the smallest profile that has that much).",
            show_default=False,
        ),
    ] = None,
    cpu: Annotated[str | None, typer.Option(help="CPU cores: 2 or 500m.")] = None,
    memory: Annotated[
        str | None, typer.Option(help="Host memory: 8GiB (8G and 8GB mean the same).")
    ] = None,
    priority: Annotated[
        str,
        typer.Option("-p", "--priority", help="very-low, low, normal, high, critical or a number."),
    ] = "normal",
    queue: Annotated[
        str | None,
        typer.Option(
            "-q",
            "--queue",
            help="The queue (tenant); default: your default queue (fgpu queue ls shows whose "
            "default each is), else the queue named default.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="A name to show (default: the command).")] = None,
    preemptible: Annotated[
        bool | None,
        typer.Option(
            "--preemptible/--non-preemptible",
            help="May it be stopped for higher-priority work (default: below priority high).",
            show_default=False,
        ),
    ] = None,
    grace: Annotated[
        float | None,
        typer.Option(
            help="Seconds from SIGTERM to SIGKILL when stopped (default: 30).", show_default=False
        ),
    ] = None,
    shell: Annotated[
        bool, typer.Option("--shell", help="Run the command line through /bin/sh -c.")
    ] = False,
    time: TimeOption = None,
    dependency: DependencyOption = None,
    array: ArrayOption = None,
    json_out: JsonOption = False,
    socket: SocketOption = None,
    url: UrlOption = None,
) -> None:
    """Submit a command to run on a share of a GPU, in your directory and environment.

    Example: fgpu submit -g 0.5 -- python train.py --epochs 3
    """
    from fgpu.cli import render

    with connect(socket, url) as client:
        view = submit_with(client, **{k: v for k, v in locals().items() if k in SUBMIT_FIELDS})
    if json_out:
        print(render.to_json(view))
        return
    if view.array is not None:
        from fgpu.cli.slurm import submitted_lines

        array_id, said = submitted_lines(view)
        print(array_id)
        err.print(escape(said))
        return
    print(view.id)
    if queue is not None:
        used = view.queue
    elif view.queue == "default":  # nobody made another queue this user's default
        used = f"{view.queue} (no -q given; -q to choose)"
    else:
        used = f"{view.queue} (your default; -q to choose)"
    line = f"submitted {view.id} ({view.name}) to queue {used}: {view.phase}"
    if view.phase == "pending" and view.reason and view.reason != "submitted":
        line += f" ({view.reason})"
    err.print(escape(line))


SUBMIT_FIELDS = (
    "command",
    "gpu",
    "gpu_fraction",
    "gpu_memory",
    "gpu_model",
    "mig_profile",
    "isolation",
    "cpu",
    "memory",
    "priority",
    "queue",
    "name",
    "preemptible",
    "grace",
    "shell",
    "time",
    "dependency",
    "array",
)
"""The options of ``submit`` that make the request (``run`` takes them too, but
``--array``)."""


def submit_with(
    client: Client,
    command: list[str] | None,
    gpu: str | None,
    gpu_fraction: str | None,
    gpu_memory: str | None,
    gpu_model: list[str] | None,
    mig_profile: str | None,
    isolation: str | None,
    cpu: str | None,
    memory: str | None,
    priority: str,
    queue: str | None,
    name: str | None,
    preemptible: bool | None,
    grace: float | None,
    shell: bool,
    time: str | None = None,
    dependency: str | None = None,
    array: str | None = None,
    verb: str = "submit",
) -> PlainWorkloadView:
    """Submit what ``submit``'s options (:data:`SUBMIT_FIELDS`) ask for, in this directory
    and environment; a refusal ends the command naming the flag as typed (``verb``: the
    command that asks, for the examples in messages)."""
    from fgpu.cli.flags import flag_message, request_field
    from fgpu.client.client import ClientError, ServerUnavailable

    argv = list(command or [])
    if not argv:
        fail(f"give the command to run after --, e.g. fgpu {verb} -g 0.5 -- python train.py")
    for position, part in enumerate(argv):
        if not _is_text(part):
            fail(f"command: argument {position} is not valid UTF-8 text")
    if name is not None and not _is_text(name):
        fail("--name: not valid UTF-8 text")
    if shell:
        argv = [" ".join(argv)]
    try:
        cwd = os.getcwd()
    except OSError as exc:
        fail(f"the current directory is gone: {exc.strerror}")
    if not _is_text(cwd):
        fail("the current directory's name is not valid UTF-8 text")
    if any(not item.strip() for item in gpu_model or []):
        fail("--gpu-model: empty model name")
    models = [m.strip() for item in gpu_model or [] for m in item.split(",") if m.strip()]
    fields: dict[str, object] = {
        "command": argv,
        "shell": shell,
        "name": name,
        "gpu": gpu,
        "gpu_fraction": gpu_fraction,
        "gpu_memory": gpu_memory,
        "gpu_model": models,
        "mig_profile": mig_profile,
        "isolation": isolation,
        "cpu": cpu,
        "memory": memory,
        "priority": priority,
        "queue": queue,
        "preemptible": preemptible,
        "cwd": cwd,
        # variables that are not UTF-8 text cannot travel as JSON; they are left out
        "env": {k: v for k, v in os.environ.items() if _is_text(k) and _is_text(v)},
    }
    if grace is not None:
        fields["grace_s"] = grace
    for key, value in (("time", time), ("dependency", dependency), ("array", array)):
        if value is not None:
            fields[key] = value
    typed_values = {
        "name": name,
        "gpu": gpu,
        "gpu_count": gpu,
        "gpu_milli": gpu_fraction or gpu,
        "gpu_fraction": gpu_fraction,
        "gpu_memory": gpu_memory,
        "gpu_memory_mib": gpu_memory,
        "gpu_model": models,
        "gpu_models": models,
        "mig_profile": mig_profile,
        "isolation": isolation,
        "cpu": cpu,
        "cpu_milli": cpu,
        "memory": memory,
        "memory_mib": memory,
        "priority": priority,
        "queue": queue,
        "grace_s": grace,
        "time": time,
        "dependency": dependency,
        "array": array,
    }
    try:  # the server checks the fields (pydantic is not loaded here: a faster submit)
        return client.submit_plain(fields)
    except ServerUnavailable:
        raise
    except ClientError as exc:  # name the flag as typed, with the value given
        field = request_field(exc.reason, typed_values) if exc.field == "request" else exc.field
        fail(flag_message(field, exc.reason, typed_values), exit_code(exc))


PHASES = ("pending", "running", "paused", "succeeded", "failed", "cancelled")
WatchOption = Annotated[bool, typer.Option("--watch", "-w", help="Refresh in place until Ctrl-C.")]
IntervalOption = Annotated[
    float, typer.Option(help="Seconds between refreshes with --watch.", min=0.2, max=3600)
]


def ls(
    include_done: Annotated[
        bool, typer.Option("--all", "-a", help="Also finished workloads.")
    ] = False,
    queue: Annotated[
        list[str] | None, typer.Option("--queue", "-q", help="Only in these queues (repeatable).")
    ] = None,
    user: Annotated[
        list[str] | None,
        typer.Option("--user", "-u", help="Only of these users, names or uids (repeatable)."),
    ] = None,
    phase: Annotated[
        list[str] | None,
        typer.Option(
            help="Only in these phases (repeatable or comma-separated): "
            + ", ".join(PHASES)
            + "; a finished phase implies --all."
        ),
    ] = None,
    expand: ExpandOption = False,
    all_users: Annotated[
        bool,
        typer.Option(
            "--all-users",
            help="Every user's workloads; by default yours and others' running ones "
            "(others' pending work is left out; --user picks users).",
        ),
    ] = False,
    watch: WatchOption = False,
    interval: IntervalOption = 2.0,
    json_out: JsonOption = False,
    socket: SocketOption = None,
    url: UrlOption = None,
) -> None:
    """List workloads (active ones; --all for finished too), oldest first: yours and
    others' running ones (--all-users for everyone's).

    An array is one row with its tasks counted by phase (--expand: a row per task; --json:
    always each task)."""
    from fgpu.cli import render
    from fgpu.cli.flags import typed

    for item in phase or []:
        if not all(p.strip() for p in item.split(",")):
            fail(f"--phase {item!r}: an empty phase; phases: {', '.join(PHASES)}")
    for item in queue or []:
        if not item.strip():
            fail(f"{typed(('-q', '--queue'))} {item!r}: an empty queue name")
    phases = {p.strip() for item in phase or [] for p in item.split(",")}
    unknown = sorted(phases - set(PHASES))
    if unknown:
        fail(f"--phase {', '.join(unknown)!r}: not a phase; phases: {', '.join(PHASES)}")
    include_done = include_done or any(p in ("succeeded", "failed", "cancelled") for p in phases)
    uids = {uid_of(u) for u in user or []}
    queues = set(queue or [])
    if watch and json_out:
        fail("--watch: not with --json (scripts poll `fgpu ls --json` themselves)")
    mine = not all_users and not uids

    def kept(view: WorkloadView | PlainWorkloadView) -> bool:
        return (
            (not queues or view.queue in queues)
            and (not uids or view.owner_uid in uids)
            and (not phases or view.phase in phases)
        )

    def listing(client: Client) -> RenderableType:
        if json_out:  # the wire models' JSON, as every --json prints
            listed = client.list_workloads(include_done, mine=mine)
            warn_skipped(client)
            print(render.to_json([v for v in listed if kept(v)]))
            return ""
        # the table reads the same fields without loading pydantic (a fast `fgpu ls`), and
        # shows no command: the server sends each cut short (brief)
        views = [
            v for v in client.list_workloads_plain(include_done, mine=mine, brief=True) if kept(v)
        ]
        if not watch:
            warn_skipped(client)
        if not views:
            filtered = queues or uids or phases
            hint = "" if include_done or filtered else " (--all shows finished ones)"
            if mine:
                hint += " (--all-users shows others' pending work)"
            return Text("no workloads" + (" match" if filtered else "") + hint)
        from fgpu.cli.slurm import by_index, fold_arrays

        if expand:
            return render.workloads_table(by_index(views))
        return render.workloads_table(fold_arrays(views))

    with connect(socket, url) as client:
        missing = sorted(queues - {q.name for q in client.list_queues()}) if queues else []
        if missing:
            flag = typed(("-q", "--queue"))
            fail(f"{flag} {', '.join(missing)!r}: no such queue (fgpu queue ls lists them)")
        if watch:
            watch_loop(lambda: listing(client), interval)
            return
        shown = listing(client)
    if isinstance(shown, Text):
        err.print(shown)
    elif shown:
        emit(shown)


def warn_skipped(client: Client) -> None:
    """One warning line on stderr when the listing left out damaged rows of the store."""
    if not client.skipped_count:
        return
    ids = list(client.skipped_rows)
    shown = ", ".join(ids[:10]) + (" ..." if len(ids) > 10 else "")
    err.print(
        f"warning: {client.skipped_count} damaged row(s) of the store left out ({shown}); "
        "the server log says what is wrong; an admin ends one with `fgpu cancel ID`",
        markup=False,
    )


def describe(
    workload_id: Annotated[
        str, typer.Argument(metavar="ID", help="Workload id, unique id prefix, or name.")
    ],
    json_out: JsonOption = False,
    socket: SocketOption = None,
    url: UrlOption = None,
) -> None:
    """Show a workload: request, placement, events, and why it waits while pending."""
    from fgpu.cli import render

    with connect(socket, url, _about(workload_id)) as client:
        detail = client.get_workload_plain(workload_id)
    show(detail, render.detail_view(detail), json_out)


def cancel(
    workload_ids: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[ID...]",
            help="Workloads: ids, unique id prefixes or names.",
            show_default=False,
        ),
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", help="All your active workloads (with --user: theirs).")
    ] = False,
    user: Annotated[
        str | None,
        typer.Option("--user", "-u", help="With --all: this user's (admins), a name or uid."),
    ] = None,
    now: Annotated[
        bool,
        typer.Option(
            "--now",
            help="SIGKILL a running one at once, without its grace period (also one already "
            "stopping: work that ignores SIGTERM).",
        ),
    ] = False,
    json_out: JsonOption = False,
    socket: SocketOption = None,
    url: UrlOption = None,
) -> None:
    """Cancel workloads (yours; admins any). A running one gets SIGTERM, then SIGKILL after
    its grace period (--now: at once). Each id is tried; the exit code is that of the first
    refusal."""
    from fgpu.cli import render
    from fgpu.client.client import ClientError, ServerUnavailable
    from fgpu.wire_basics import TERMINAL_PHASES

    if every == bool(workload_ids):
        fail("give workload ids or names, or --all (not both)")
    if user is not None and not every:
        fail(f"--user {user!r}: only with --all")
    views: list[PlainWorkloadView] = []
    first_error: ClientError | None = None
    with connect(socket, url) as client:
        if every:
            caller_uid, caller_admin = _caller(client, url)
            owner = uid_of(user) if user is not None else caller_uid
            if owner != caller_uid and caller_admin is False:
                fail(
                    f"--user {user!r}: only admins may cancel another user's work",
                    EXIT_REFUSED,
                )
            if owner is None:
                fail("--all: name the user with --user (over --url the server does not say who)")
            workload_ids = [w.id for w in client.list_workloads_plain() if w.owner_uid == owner]
            if not workload_ids:
                err.print(f"no active workloads of {render.user_text(owner)}")
                return
        assert workload_ids is not None
        ended = 0  # with --all: listed active, finished before their cancel came
        unrecorded: list[str] = []  # with --all: the disk had no room for their cancel
        for workload_id in workload_ids:
            try:
                views.append(client.cancel_plain(workload_id, now=now))
            except ServerUnavailable:
                raise
            except ClientError as exc:
                if every and exc.status == 409:
                    ended += 1
                    continue
                if every and exc.status == 507:
                    unrecorded.append(workload_id)
                    first_error = first_error or exc
                    continue
                message = _about(workload_id)(exc)
                err.print(f"[bold red]error:[/] {escape(message)}", markup=True)
                first_error = first_error or exc
    if ended:
        err.print(
            f"{ended} of the {len(workload_ids)} workloads listed had finished before their "
            "cancel came (left as they are)"
        )
    if unrecorded and first_error is not None:
        err.print(
            f"[bold red]error:[/] {len(unrecorded)} of the {len(workload_ids)} cancels could "
            f"not be recorded, the state disk is full ({escape(first_error.reason)}): "
            f"{escape(' '.join(unrecorded))}",
            markup=True,
        )
    if json_out:
        if len(workload_ids) > 1 or every:
            print(render.to_json(views))  # a list, as many as were cancelled
        elif views:
            print(render.to_json(views[0]))
    else:
        for view in views:
            if view.cancelled_tasks:  # an array, by its id or name
                from fgpu.cli.slurm import cancelled_line

                out.print(escape(render.safe(cancelled_line(view))))
                continue
            phase = view.phase if view.phase in TERMINAL_PHASES else "stopping"
            line = f"{view.id}: {phase}"
            if view.reason:
                line += f" ({view.reason})"
            out.print(escape(render.safe(line)))
    if first_error is not None:
        raise typer.Exit(exit_code(first_error))


def _caller(client: Client, url: str | None) -> tuple[int | None, bool | None]:
    """Who the server sees calling, and whether an admin (None: not said): from
    ``/v1/healthz``; when that refuses because the service cannot store (503/507: a full
    state disk, where cancels still go through, issue 27), on a Unix socket the caller is
    this process's user (the server reads the same from the socket) and the server checks
    each cancel's rights itself.

    Raises:
        ClientError: health refused otherwise, or over ``url`` (the server says who).
    """
    from fgpu.client.client import ClientError

    try:
        health = client.health()
    except ClientError as exc:
        if exc.status not in (503, 507) or url is not None:
            raise
        return os.geteuid(), None
    return health.caller_uid, health.caller_admin


def top(
    watch: WatchOption = False,
    interval: IntervalOption = 2.0,
    json_out: JsonOption = False,
    socket: SocketOption = None,
    url: UrlOption = None,
) -> None:
    """Each GPU with the shares it holds, by workload, and live use where known."""
    from fgpu.cli import render

    if watch and json_out:
        fail("--watch: not with --json (scripts poll `fgpu top --json` themselves)")
    with connect(socket, url) as client:
        if watch:
            watch_loop(lambda: render.top_table(client.nodes_plain()), interval)
            return
        nodes = client.nodes_plain()
    show(render.top_rows(nodes), render.top_table(nodes), json_out)


def nodes(
    json_out: JsonOption = False,
    socket: SocketOption = None,
    url: UrlOption = None,
) -> None:
    """The machine's nodes: CPUs, memory and GPUs."""
    from fgpu.cli import render

    with connect(socket, url) as client:
        views = client.nodes_plain()
    show(views, render.nodes_view(views), json_out)


def register(app: typer.Typer) -> None:
    """Add the commands to the ``fgpu`` app."""
    app.command("submit", context_settings={"allow_interspersed_args": False})(submit)
    app.command("ls")(ls)
    app.command("list", help="Same as ls.")(ls)
    app.command("describe")(describe)
    app.command("cancel")(cancel)
    app.command("delete", help="Same as cancel.")(cancel)
    app.command("top")(top)
    app.command("nodes")(nodes)


def _about(workload_id: str) -> Callable[[ClientError], str]:
    """An error about the workload argument, named as the help names it (``ID``) with the
    value typed (shortened when long)."""
    from fgpu.cli.flags import WORKLOAD_ARGUMENT, flag_message

    values = {"id": workload_id, "workload_id": workload_id}

    def explain(error: ClientError) -> str:
        if error.field in WORKLOAD_ARGUMENT:
            return flag_message(error.field, error.reason, values, WORKLOAD_ARGUMENT)
        return f"ID {workload_id!r}: {error}" if len(workload_id) < 60 else str(error)

    return explain


def _is_text(value: str) -> bool:
    """Whether ``value`` is UTF-8 text (undecodable bytes arrive as lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
