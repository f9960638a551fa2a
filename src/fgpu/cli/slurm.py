"""Slurm's habits on the command line (issue 25, point 4): the ``--time``, ``--dependency``
and ``--array`` options of ``submit`` (``run`` takes the first two), and how ``fgpu ls``
folds an array into one row. The server parses and checks the values
(:mod:`fgpu.rules.slurm`); here are only the options and the rendering."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

if TYPE_CHECKING:
    from fgpu.client.plain import PlainWorkloadView
    from fgpu.wire import WorkloadView

    AnyView = WorkloadView | PlainWorkloadView

TimeOption = Annotated[
    str | None,
    typer.Option(
        "-t",
        "--time",
        help="Time limit of a run, as Slurm writes it: minutes (90), MM:SS, HH:MM:SS "
        "(1:30:00), D-HH, D-HH:MM, D-HH:MM:SS (2-00:00:00); 0 or UNLIMITED for none. It "
        "counts running time only (not time pending); at the limit the job is cancelled, "
        "reason 'time limit' (SIGTERM, SIGKILL after --grace). Default: the queue's.",
        show_default=False,
    ),
]
DependencyOption = Annotated[
    str | None,
    typer.Option(
        "-d",
        "--dependency",
        help="Start only after other work: afterok:ID[:ID...] (they succeeded), afterany:ID "
        "(they ended), afternotok:ID (they failed or were cancelled); join several with ','. "
        "An ID is a workload id, id prefix or name, or an array's id or name (all its "
        "tasks). One that can never hold ends the job (cancelled, with the reason).",
        show_default=False,
    ),
]
ArrayOption = Annotated[
    str | None,
    typer.Option(
        "-a",
        "--array",
        help="One task per index: 0-99, 1,3,5, 0-15:4 (step); add %N for at most N running "
        "at once (0-99%4). Task i is named NAME_i and gets FGPU_ARRAY_INDEX=i (and "
        "SLURM_ARRAY_TASK_ID); 'fgpu cancel NAME' cancels every task.",
        show_default=False,
    ),
]
ExpandOption = Annotated[
    bool, typer.Option("--expand", "-e", help="Show each task of an array on its own row.")
]

PHASE_ORDER = ("running", "paused", "pending", "failed", "cancelled", "succeeded")
"""The phase an array's row shows: the first of these that some task is in."""


@dataclass
class ArrayRow:
    """An array as one row of ``fgpu ls``: its tasks' phases counted.

    Attributes:
        tasks: the listed tasks of the array, in listing order.
    """

    tasks: list[AnyView] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        """Tasks per phase, in :data:`PHASE_ORDER`."""
        found: dict[str, int] = {}
        for task in self.tasks:
            found[task.phase] = found.get(task.phase, 0) + 1
        return {p: found[p] for p in PHASE_ORDER if p in found}

    def cells(self, now: float | None = None) -> tuple[str | Text, ...]:
        """The row's cells, as :func:`fgpu.cli.render.workloads_table` lays them out: ID (the
        array's), NAME (``NAME[N]``: N tasks), USER, PHASE (the leading one), STATE (tasks per
        phase), QUEUE, PRIORITY, GPUS (held by its tasks, or what each wants), AGE, REASON
        (why its first pending task waits; else, for an array that ended failed or cancelled,
        why its first such task did)."""
        from fgpu.cli import render

        first = self.tasks[0]
        array = first.array
        assert array is not None
        counts = self.counts
        phase = next(iter(counts))
        state = ", ".join(f"{n} {p}" for p, n in counts.items())
        if len(self.tasks) < array.size:
            state += f" (of {array.size})"
        held = sum(
            g.compute_milli for t in self.tasks if t.gpus and t.phase in _HOLDING for g in t.gpus
        )
        each = render.request_text(first.request)
        if held:
            gpus: str | Text = f"{render.gpus_text(held)} GPU held"
        elif all(t.phase in _ENDED for t in self.tasks):
            gpus = Text(f"{each} each", style="dim")
        else:
            gpus = Text(f"wants {each} each", style="dim")
        # why its first pending task waits, else why its first task in the leading phase ended
        shown = next((t for t in self.tasks if t.phase == "pending"), None)
        if shown is None and phase in ("failed", "cancelled"):
            shown = next(t for t in self.tasks if t.phase == phase)
        return (
            array.id,
            render.safe(f"{array.name}[{array.size}]"),
            render.user_text(first.owner_uid),
            render.phase_text(phase),
            Text(state),
            first.queue,
            render.PRIORITY_NAMES.get(first.priority) or str(first.priority),
            gpus,
            render.age_text(min(t.submitted_at for t in self.tasks), now),
            render.safe(shown.reason) if shown is not None else "",
        )


_HOLDING = ("running", "paused")
_ENDED = ("succeeded", "failed", "cancelled")


def by_index(views: Sequence[AnyView]) -> list[AnyView]:
    """The listing with each array's tasks in index order (they share a submission time,
    after which the server orders by id); the rest as listed."""
    return sorted(
        views,
        key=lambda v: (
            (v.submitted_at, v.array.id, v.array.index) if v.array else (v.submitted_at, "", 0)
        ),
    )


def fold_arrays(views: Sequence[AnyView]) -> list[AnyView | ArrayRow]:
    """The listing with each array's tasks folded into one :class:`ArrayRow`, at the place
    of its first listed task; plain workloads as they are."""
    rows: list[AnyView | ArrayRow] = []
    arrays: dict[str, ArrayRow] = {}
    for view in views:
        array = view.array
        if array is None:
            rows.append(view)
            continue
        row = arrays.get(array.id)
        if row is None:
            row = arrays[array.id] = ArrayRow()
            rows.append(row)
        row.tasks.append(view)
    return rows


def submitted_lines(view: AnyView) -> tuple[str, str]:
    """What ``submit`` prints for an array: the array's id (stdout) and a line for stderr."""
    array = view.array
    assert array is not None
    cap = f", at most {array.throttle} at once" if array.throttle else ""
    return (
        array.id,
        f"submitted array {array.name} ({array.id}) to queue {view.queue}: {array.size} "
        f"tasks named {array.name}_INDEX{cap}; 'fgpu cancel {array.name}' cancels them all",
    )


def cancelled_line(view: AnyView) -> str:
    """What ``cancel`` prints for an array cancelled by its id or name."""
    array = view.array
    name = array.name if array is not None else view.name
    array_id = array.id if array is not None else view.id
    count = len(view.cancelled_tasks)
    return f"array {name} ({array_id}): {count} task{'s' if count != 1 else ''} cancelled"


__all__ = [
    "ArrayOption",
    "ArrayRow",
    "DependencyOption",
    "ExpandOption",
    "TimeOption",
    "by_index",
    "cancelled_line",
    "fold_arrays",
    "submitted_lines",
]
