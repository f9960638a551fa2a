"""Rich tables and text for the CLI: shaping wire models for people, nothing else.

Units follow DESIGN.md section 3: compute shares print as GPUs (``0.5``), memory as GiB or
MiB, times as ages (``3m``).
"""

from __future__ import annotations

import dataclasses
import json
import pwd
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeAlias

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from fgpu.states import PRIORITY_CLASSES, priority_word
from fgpu.wire_basics import TERMINAL_PHASES

if TYPE_CHECKING:  # the wire models load when a command reads them (not fgpu ls's table)
    from pydantic import BaseModel

    from fgpu.cli.slurm import ArrayRow
    from fgpu.client.plain import (
        PlainEventView,
        PlainGpuHolder,
        PlainGpuView,
        PlainNodeView,
        PlainResourceRequest,
        PlainWorkloadDetail,
        PlainWorkloadView,
    )
    from fgpu.wire import (
        EventView,
        GpuHolder,
        GpuView,
        NodeView,
        QueueView,
        ResourceRequest,
        WorkloadDetail,
        WorkloadView,
    )

    JsonValue: TypeAlias = BaseModel | Sequence[BaseModel] | Sequence[dict[str, object]] | object
    """What :func:`to_json` prints: a wire model or its plain form (:mod:`fgpu.client.plain`),
    a list of them, or a list of plain rows."""
    Detail: TypeAlias = WorkloadDetail | PlainWorkloadDetail
    Node: TypeAlias = NodeView | PlainNodeView
    Gpu: TypeAlias = GpuView | PlainGpuView
    Holder: TypeAlias = GpuHolder | PlainGpuHolder
    Event: TypeAlias = EventView | PlainEventView

PRIORITY_NAMES = {value: name for name, value in PRIORITY_CLASSES.items()}
"""Priority classes of DESIGN.md section 5, by value (:mod:`fgpu.states`)."""

PHASE_STYLES = {
    "pending": "yellow",
    "running": "green",
    "paused": "cyan",
    "succeeded": "blue",
    "failed": "red",
    "cancelled": "dim",
    "stopping": "magenta",
}


def to_json(items: JsonValue) -> str:
    """Wire models or their plain forms (one or a list) as indented JSON: the same text for
    a model and its plain form (the same fields in the same order, JSON values)."""
    return json.dumps(_jsonable(items), indent=2)


def _jsonable(item: object) -> object:
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return dataclasses.asdict(item)
    if isinstance(item, list | tuple):
        return [_jsonable(i) for i in item]
    dump = getattr(item, "model_dump", None)
    if dump is not None:  # a wire model (pydantic is loaded: it made it)
        return dump(mode="json")
    return item


def gpus_text(milli: int) -> str:
    """Milli-GPU as GPUs: 500 -> ``0.5``, 1000 -> ``1``, 2250 -> ``2.25``."""
    return f"{milli / 1000:.3f}".rstrip("0").rstrip(".")


def memory_text(mib: int | None) -> str:
    """MiB as ``20GiB``, ``1.5GiB`` or ``512MiB``."""
    if mib is None:
        return "-"
    if mib >= 1024:
        return f"{mib / 1024:.2f}".rstrip("0").rstrip(".") + "GiB"
    return f"{mib}MiB"


def age_text(since: float | None, now: float | None = None) -> str:
    """Seconds since ``since`` as ``42s``, ``5m``, ``3h``, ``2d``."""
    if since is None:
        return "-"
    seconds = max(0.0, (time.time() if now is None else now) - since)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def clock_text(at: float | None) -> str:
    """A time as local ``YYYY-MM-DD HH:MM:SS``."""
    if at is None:
        return "-"
    return datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def priority_text(priority: int) -> str:
    """``high (100)``, or the number when it is not a class."""
    name = PRIORITY_NAMES.get(priority)
    return f"{name} ({priority})" if name else str(priority)


def user_text(uid: int) -> str:
    """The user name of ``uid``, or the number."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def request_text(request: ResourceRequest | PlainResourceRequest) -> str:
    """``0.5 GPU``, ``2 GPUs``, ``2 x 0.3 GPU``, with ``5GiB`` memory and models; ``MIG
    3g.40gb`` or ``MIG, 18GiB`` (the smallest profile with that much) for MIG requests."""
    if request.isolation == "mig":
        if request.mig_profile is not None:
            return f"MIG {request.mig_profile}"
        return f"MIG, {memory_text(request.gpu_memory_mib)}"
    if request.gpu_count == 0:
        text = "no GPU"
    elif request.gpu_milli is None and request.gpu_memory_mib is not None:
        # --gpu-memory alone: a share sized by memory (its compute share follows the GPU)
        many = request.gpu_count > 1
        where = f"each of {request.gpu_count} GPUs" if many else "a GPU"
        text = f"{memory_text(request.gpu_memory_mib)} share of {where}"
        if request.gpu_models:
            text += f" on {' or '.join(request.gpu_models)}"
        return text
    elif request.gpu_milli is None or request.gpu_milli >= 1000:
        text = f"{request.gpu_count} GPU" + ("s" if request.gpu_count > 1 else "")
    elif request.gpu_count == 1:
        text = f"{gpus_text(request.gpu_milli)} GPU"
    else:
        text = f"{request.gpu_count} x {gpus_text(request.gpu_milli)} GPU"
    if request.gpu_memory_mib is not None:
        text += (
            f", {memory_text(request.gpu_memory_mib)} each"
            if request.gpu_count > 1
            else (f", {memory_text(request.gpu_memory_mib)}")
        )
    if request.gpu_models:
        text += f" on {' or '.join(request.gpu_models)}"
    return text


def grants_text(view: WorkloadView | PlainWorkloadView) -> str:
    """GPUs held: ``node/0: 0.5 (20GiB)``, one per line; on a MIG instance
    ``node/mig/2: MIG 3g.40gb@4 (39.25GiB) MIG-...``."""
    return "\n".join(
        f"{g.node}/{g.index}: MIG {g.mig_profile}@{g.mig_start} ({memory_text(g.memory_mib)}) "
        f"{g.mig_uuid}"
        if g.mig_uuid
        else f"{g.node}/{g.index}: {gpus_text(g.compute_milli)} ({memory_text(g.memory_mib)})"
        for g in view.gpus
    )


def phase_text(phase: str) -> Text:
    """The phase in its colour (the same word as ``phase`` in the JSON)."""
    return Text(phase, style=PHASE_STYLES.get(phase, ""))


STATE_STYLES = {"stopping": PHASE_STYLES["stopping"], "preempted": "yellow", "reclaimed": "yellow"}
"""Colours of the STATE column by state word (others: as ``paused``)."""


def state_text(view: WorkloadView | PlainWorkloadView) -> Text:
    """What happens to a workload beyond its phase, as the service words it for every view
    (:mod:`fgpu.states`: ``preempted by NAME (restart n)``, ``paused-by-priority``...);
    empty when nothing."""
    if view.state is None:
        return Text("")
    style = STATE_STYLES.get(view.state, PHASE_STYLES["paused"])
    return Text(view.state_text or view.state, style=style)


def safe(text: str) -> str:
    """``text`` with control characters shown as escapes (``\\x1b``), so that names,
    commands and messages cannot move the cursor or recolour a user's terminal."""
    if all(" " <= c < "\x7f" or c >= "\xa0" for c in text):
        return text
    return "".join(c if " " <= c < "\x7f" or c >= "\xa0" else repr(c)[1:-1] for c in text)


NAME_WIDTH = 16
"""Widest NAME in ``fgpu ls`` (a longer one ends in an ellipsis; ``describe`` shows it)."""
USER_WIDTH = 10
"""Widest USER in ``fgpu ls`` where the width is short; where the table (with its REASON
column, when some row has a reason) fits with longer user names, up to :data:`USER_WIDE`."""
USER_WIDE = 32
"""Widest USER in ``fgpu ls`` on a wide console (the longest user name ``useradd`` takes)."""
QUEUE_WIDTH = 12
"""Widest QUEUE in ``fgpu ls``."""
REASON_WIDTH = 12
"""Narrowest free-text column (REASON, HOLDERS): it wraps at spaces instead."""


def workloads_table(
    views: Sequence[WorkloadView | PlainWorkloadView | ArrayRow],
    now: float | None = None,
) -> RenderableType:
    """``fgpu ls``: one row per workload. Words are never split: every column but REASON
    keeps its lines whole (long names, users and queues end in an ellipsis) and REASON wraps
    at spaces; where even a narrow REASON does not fit (80 columns), the reasons follow the
    table, one ``ID: reason`` line each. An array folded into one row
    (:class:`fgpu.cli.slurm.ArrayRow`) has its own cells."""
    from fgpu.cli.slurm import ArrayRow

    rows: list[tuple[str | Text, ...]] = []
    for v in views:
        if isinstance(v, ArrayRow):
            rows.append(v.cells(now))
            continue
        held = grants_text(v) or Text(f"wants {request_text(v.request)}", style="dim")
        if v.phase in TERMINAL_PHASES and v.gpus:
            held = Text(f"ran on {grants_text(v)}", style="dim")
        shown = v.phase not in ("running", "succeeded") or v.stopping
        reason = v.reason if shown else ""
        if v.squeezed:
            reason = squeezed_text(v.squeezed_by)
        rows.append(
            (
                v.id,
                safe(v.name),
                user_text(v.owner_uid),
                phase_text(v.phase),
                state_text(v),
                v.queue,
                PRIORITY_NAMES.get(v.priority) or str(v.priority),
                held,
                age_text(v.submitted_at, now),
                safe(reason),
            )
        )
    return _FittedTable(rows)


class _FittedTable:
    """The ``fgpu ls`` table laid out for the console's width at render time."""

    columns = ("ID", "NAME", "USER", "PHASE", "STATE", "QUEUE", "PRIORITY", "GPUS", "AGE")
    caps = (None, NAME_WIDTH, USER_WIDTH, None, None, QUEUE_WIDTH, None, None, None)

    def __init__(self, rows: Sequence[tuple[str | Text, ...]]) -> None:
        self.rows = rows
        self.widths = [
            min(widest, cap) if cap else widest
            for widest, cap in zip(
                (
                    max([len(column), *(_width(row[index]) for row in rows)])
                    for index, column in enumerate(self.columns)
                ),
                self.caps,
                strict=True,
            )
        ]
        user = self.columns.index("USER")
        widest_user = max([0, *(_width(row[user]) for row in rows)])
        self.wide = list(self.widths)
        self.wide[user] = max(self.widths[user], min(widest_user, USER_WIDE))

    def table(
        self,
        with_reason: bool,
        narrow: bool,
        widths: Sequence[int] | None = None,
        max_width: int = 80,
    ) -> Table:
        """The table; ``narrow``: GPUS and STATE wrap at spaces, in what ``max_width``
        leaves them, and an empty STATE is left out (so that every column keeps a place: Rich
        shrinks or drops whole columns of a table wider than the console); ``widths``: of
        the columns (default: the short ones)."""
        widths = self.widths if widths is None else widths
        table = Table(box=None, header_style="bold", pad_edge=False, collapse_padding=True)
        keep = [
            i
            for i, column in enumerate(self.columns)
            if not (narrow and column == "STATE" and not any(_width(r[i]) for r in self.rows))
        ]
        wrapped = {"GPUS", "STATE"} if narrow else set()
        folded: dict[int, int] = {}  # column -> width, for the wrapped ones
        if wrapped:
            fixed = sum(widths[i] for i in keep if self.columns[i] not in wrapped)
            spare = max_width - fixed - (len(keep) - 1) - (REASON_WIDTH + 1 if with_reason else 0)
            for i in keep:
                if self.columns[i] in wrapped:
                    cells = [_plain(r[i]) for r in self.rows]
                    longest = max(
                        [len(self.columns[i]), *(len(w) for c in cells for w in c.split())]
                    )
                    folded[i] = longest
                    spare -= longest
            # still short: long names and users end in an ellipsis sooner (not below 8)
            widths = list(widths)
            for column in ("NAME", "USER"):
                i = self.columns.index(column)
                take = max(0, min(-spare, widths[i] - 8))
                widths[i] -= take
                spare += take
            for i in sorted(folded, key=lambda i: self.columns[i] != "GPUS"):  # GPUS first
                give = max(0, min(spare, widths[i] - folded[i]))
                folded[i] += give
                spare -= give
        for i in keep:
            column, width = self.columns[i], widths[i]
            if i in folded:
                table.add_column(column, overflow="fold", width=folded[i])
                continue
            table.add_column(column, no_wrap=True, overflow="ellipsis", min_width=width)
            table.columns[-1].max_width = width
        if with_reason:
            table.add_column("REASON", overflow="fold", min_width=REASON_WIDTH)
        for row in self.rows:
            table.add_row(*(row[i] for i in keep), *((row[-1],) if with_reason else ()))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        needed = sum(self.widths) + len(self.widths)
        fits = needed + REASON_WIDTH <= options.max_width
        reasons = [(row[0], row[-1]) for row in self.rows if row[-1]]
        wide = sum(self.wide) + len(self.wide) + (REASON_WIDTH if reasons else 0)
        if self.wide != self.widths and wide <= options.max_width:
            yield self.table(with_reason=True, narrow=False, widths=self.wide)
            return
        narrow = needed - 1 > options.max_width
        yield self.table(with_reason=fits, narrow=narrow, max_width=options.max_width)
        if not fits and reasons:
            for workload_id, reason in reasons:
                yield Text(f"{workload_id}: {reason}", overflow="fold")


def _plain(cell: str | Text) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def _width(cell: str | Text) -> int:
    """The widest line of a cell."""
    return max((cell_len(line) for line in _plain(cell).split("\n")), default=0)


def suspended_text(host_mib: int) -> str:
    """``suspended (host 1.5 GiB)``: a workload suspended to host memory."""
    return f"suspended (host {host_mib / 1024:.1f} GiB)"


def squeezed_text(by: Sequence[str]) -> str:
    """``squeezed by ID, ID (paused while they are busy)`` for a squeezed workload."""
    who = ", ".join(by) if by else "nobody now (waiting for its compute)"
    return f"squeezed by {who} (keeps its memory; paused while they are busy)"


def _slurm_rows(detail: Detail) -> list[tuple[str, str | Text]]:
    """``describe``'s lines for a time limit, dependencies and an array, where set."""
    from fgpu.rules.slurmtime import format_time

    rows: list[tuple[str, str | Text]] = []
    if detail.time_limit_s is not None:
        rows.append(("Time limit", f"{format_time(detail.time_limit_s)} of running time"))
    if detail.dependency:
        rows.append(("Dependency", ", ".join(detail.dependency)))
    a = detail.array
    if a is not None:
        cap = f", at most {a.throttle} at once" if a.throttle else ""
        rows.append(("Array", f"task {a.index} of {safe(a.name)} ({a.id}, {a.size} tasks{cap})"))
    return rows


def detail_view(detail: Detail) -> RenderableType:
    """``fgpu describe``: request, placement, events, and why it waits while pending."""
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    r = detail.request
    rows: list[tuple[str, str | Text]] = [
        ("ID", detail.id),
        ("Name", safe(detail.name)),
        ("User", f"{user_text(detail.owner_uid)} (uid {detail.owner_uid})"),
        ("Phase", phase_text(detail.phase)),
        ("Queue", detail.queue),
        ("Priority", priority_text(detail.priority)),
        ("Preemptible", "yes" if detail.preemptible else "no"),
        ("Request", request_text(r)),
        ("CPU / memory", f"{r.cpu_milli / 1000:g} cores, {memory_text(r.memory_mib)}"),
        ("Command", safe(" ".join(detail.command))),
        ("Submitted", clock_text(detail.submitted_at)),
    ]
    if detail.started_at is not None:
        rows.append(("Started", clock_text(detail.started_at)))
    if detail.finished_at is not None:
        rows.append(("Finished", clock_text(detail.finished_at)))
    if detail.exit_code is not None:
        rows.append(("Exit code", str(detail.exit_code)))
    if detail.restarts:
        rows.append(("Restarts", str(detail.restarts)))
    rows.extend(_slurm_rows(detail))
    state = state_text(detail)
    if state.plain:
        rows.insert(4, ("State", state))
    placement = grants_text(detail) or "-"
    if detail.phase in TERMINAL_PHASES and detail.gpus:
        placement = f"ran on {placement}"
    rows.append(("Placement", placement))
    if detail.squeezed:
        rows.append(("Squeezed", squeezed_text(detail.squeezed_by)))
    if detail.reason:
        label = "Waiting because" if detail.phase == "pending" else "Reason"
        rows.append((label, safe(detail.reason)))
    if detail.enforcement:
        rows.append(("Enforcement", "\n".join(safe(line) for line in detail.enforcement)))
    for label, value in rows:
        facts.add_row(label, value)
    return Group(facts, Text(""), events_table(detail.events))


def events_table(events: Iterable[Event]) -> Table:
    """Events, oldest first."""
    table = Table(title="Events", title_justify="left", box=None, header_style="bold")
    for column in ("TIME", "KIND", "REASON", "MESSAGE"):
        table.add_column(column, overflow="fold")
    for e in events:
        table.add_row(clock_text(e.time), e.kind, safe(e.reason), safe(e.message) + repeats(e))
    return table


def repeats(event: EventView | PlainEventView) -> str:
    """`` (x 2,676 in 20 s)`` for an event that stands for several like ones (coalesced by
    the service), else empty."""
    if event.count <= 1:
        return ""
    span = max(0.0, (event.last_time or event.time) - event.time)
    return f" (x {event.count:,} in {span:.0f} s)"


def top_rows(nodes: Sequence[Node]) -> list[dict[str, object]]:
    """``fgpu top --json``: one object per GPU, with its node and what it holds."""
    rows: list[dict[str, object]] = []
    for n in nodes:
        for g in n.gpus:
            fields = _jsonable(g)
            assert isinstance(fields, dict)
            rows.append({"node": n.name, **fields})
    return rows


def _bar(milli: int, width: int = 10) -> str:
    filled = min(width, round(milli * width / 1000))
    return "█" * filled + "░" * (width - filled)


def top_table(nodes: Sequence[Node]) -> Table:
    """``fgpu top``: each GPU with the shares it holds, by workload, and live use."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("GPU", "MODEL", "COMPUTE", "MEMORY", "USED", "UTIL"):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    table.add_column("HOLDERS", overflow="fold", min_width=REASON_WIDTH, ratio=1)
    for n in nodes:
        for g in n.gpus:
            table.add_row(
                f"{n.name}/{g.index}",
                g.model,
                f"{_bar(g.allocated_milli)} {gpus_text(g.allocated_milli)}",
                f"{memory_text(g.allocated_memory_mib)} / {memory_text(g.memory_mib)}",
                memory_text(g.used_memory_mib),
                "-" if g.utilization_pct is None else f"{g.utilization_pct}%",
                _holders(g),
            )
    return table


def _holders(gpu: Gpu) -> str:
    if gpu.mig_enabled:
        return _instances(gpu)
    if not gpu.holders:
        return "-"
    return "\n".join(
        f"{h.workload_id} {safe(h.name)}: {gpus_text(h.compute_milli)} "
        f"({memory_text(h.memory_mib)}){_governed(h)}"
        + ("" if h.squeezed_by is None else f", squeezed by {', '.join(h.squeezed_by) or '-'}")
        for h in gpu.holders
    )


def _governed(holder: Holder) -> str:
    """`` fair, running, got 0.62`` (the governor's view, in the words of
    :mod:`fgpu.states`: running, paused-by-priority, waiting-for-share), or nothing when not
    governed."""
    if holder.state is None:
        return ""
    got = "" if holder.achieved_milli is None else f", got {gpus_text(holder.achieved_milli)}"
    idle = "" if holder.busy is not False else ", idle"
    return f" {holder.mode}, {holder.state}{idle}{got}"


def _instances(gpu: Gpu) -> str:
    """A MIG GPU's instances, one per line: ``3g.40gb@4 MIG-...: ID NAME`` (or ``free``)."""
    if not gpu.mig_instances:
        return "MIG, no instances"
    lines = []
    for i in gpu.mig_instances:
        if i.workload_id is not None:
            who = f"{i.workload_id} {safe(i.name or '')}"
        else:
            who = "in use outside fgpu" if i.in_use_outside else "free"
        lines.append(f"{i.profile}@{i.start} {i.uuid or '(no uuid)'}: {who}")
    return "\n".join(lines)


def nodes_view(nodes: Sequence[Node]) -> RenderableType:
    """``fgpu nodes``: the table, then each distinct set of enforcement layers with why."""
    parts: list[RenderableType] = [nodes_table(nodes)]
    seen: list[tuple[str, ...]] = []
    for n in nodes:
        layers = n.gpus[0].enforcement if n.gpus else []
        key = tuple(f"{la.name}:{la.active}:{la.why}" for la in layers)
        if not layers or key in seen:
            continue
        seen.append(key)
        names = [m.name for m in nodes if m.gpus and m.gpus[0].enforcement == layers]
        lines = Table.grid(padding=(0, 2))
        lines.add_column(style="bold")
        lines.add_column()
        lines.add_column(overflow="fold")
        for la in layers:
            lines.add_row(la.name, "on" if la.active else "off", safe(la.why))
        parts += [Text(""), Text(f"Enforcement on {', '.join(names)}:"), lines]
    shown: list[tuple[str, ...]] = []
    for n in nodes:
        key = tuple(f"{la.name}:{la.active}:{la.why}" for la in n.host_limits)
        if not n.host_limits or key in shown:
            continue
        shown.append(key)
        names = [m.name for m in nodes if m.host_limits == n.host_limits]
        lines = Table.grid(padding=(0, 2))
        lines.add_column(style="bold")
        lines.add_column()
        lines.add_column(overflow="fold")
        for la in n.host_limits:
            lines.add_row(la.name, "on" if la.active else "off", safe(la.why))
        parts += [Text(""), Text(f"Host limits (--cpu, --memory) on {', '.join(names)}:"), lines]
    return Group(*parts)


def _enforcing(node: Node) -> str:
    layers = node.gpus[0].enforcement if node.gpus else []
    return ", ".join(la.name for la in layers if la.active) or "-"


def nodes_table(nodes: Sequence[Node]) -> Table:
    """``fgpu nodes`` (the table part)."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("NODE", "BACKEND", "CPU", "MEMORY", "GPUS", "ALLOCATED", "ENFORCEMENT"):
        table.add_column(column, overflow="fold")
    for n in nodes:
        models: dict[str, int] = {}
        for g in n.gpus:
            models[g.model] = models.get(g.model, 0) + 1
        allocated = sum(g.allocated_milli for g in n.gpus)
        table.add_row(
            n.name,
            n.backend,
            f"{n.cpu_milli / 1000:g}",
            memory_text(n.memory_mib),
            ", ".join(f"{count}x{model}" for model, count in models.items()) or "-",
            f"{gpus_text(allocated)} / {len(n.gpus)}",
            _enforcing(n),
        )
    return table


def queues_table(queues: Sequence[QueueView]) -> Table:
    """``fgpu queue ls``: GPU amounts in GPUs."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in (
        "QUEUE",
        "PARENT",
        "QUOTA",
        "LIMIT",
        "WEIGHT",
        "PRIORITY",
        "ALLOCATED",
        "FAIR SHARE",
        "RUNNING",
        "PENDING",
        "MEMBERS",
        "MAX PRIORITY",
        "DEFAULT FOR",
        "PER USER",
        "PREEMPT DELAY",
    ):
        table.add_column(column, overflow="fold")
    timed = any(q.default_time_s is not None or q.max_time_s is not None for q in queues)
    if timed:
        table.add_column("TIME LIMIT", overflow="fold")
    for q in queues:
        times: tuple[str, ...] = ()
        if timed:
            from fgpu.rules.slurmtime import format_time

            parts = [
                f"{word} {format_time(value)}"
                for word, value in (("default", q.default_time_s), ("max", q.max_time_s))
                if value is not None
            ]
            times = (", ".join(parts) or "-",)
        table.add_row(
            q.name,
            q.parent or "-",
            gpus_text(q.quota_milli),
            "-" if q.limit_milli is None else gpus_text(q.limit_milli),
            f"{q.over_quota_weight:g}",
            str(q.priority),
            gpus_text(q.allocated_milli),
            gpus_text(q.fair_share_milli),
            str(q.running),
            str(q.pending),
            ", ".join(q.members) if q.members else "(admins)",
            f"{priority_word(q.max_priority)}{' +non-preemptible' if q.nonpreemptible else ''}",
            ", ".join(q.default_for) or "-",
            _per_user(q),
            preempt_delay_text(q),
            *times,
        )
    return table


def _per_user(queue: QueueView) -> str:
    """A queue's per-user limits: ``5 active, 2 running, 64 MiB``; ``-`` for the machine's only."""
    parts = []
    if queue.max_active_per_user is not None:
        parts.append(f"{queue.max_active_per_user} active")
    if queue.max_running_per_user is not None:
        parts.append(f"{queue.max_running_per_user} running")
    if queue.max_stored_bytes is not None:
        parts.append(_size(queue.max_stored_bytes))
    if queue.max_output_bytes is not None:
        parts.append(f"{_size(queue.max_output_bytes)} output")
    return ", ".join(parts) or "-"


def _size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} B"


def preempt_delay_text(q: QueueView) -> str:
    """``fgpu queue ls``'s wait before evict: ``2s``, ``5m (service)`` where the queue
    follows the service's setting, ``-`` where the service did not say."""
    from fgpu.model.units import format_duration_s

    if q.preempt_delay_s is not None:
        return format_duration_s(q.preempt_delay_s)
    if q.effective_preempt_delay_s is None:
        return "-"
    return f"{format_duration_s(q.effective_preempt_delay_s)} (service)"
