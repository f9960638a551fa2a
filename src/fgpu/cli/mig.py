"""``fgpu mig profiles|layouts|plan|apply``: MIG profiles, maximal layouts, plans and applying
them. Parses and renders; the work is in :mod:`fgpu.mig` (and :mod:`fgpu.agent.mig_nvml` for
real GPUs). Exit codes: 0 done; 1 a device failed during apply; 2 bad input (nothing was
applied).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from fgpu.cli.common import EXIT_REFUSED, JsonOption, err, fail, out

if TYPE_CHECKING:
    from fgpu.mig.catalog import MigProfileTable
    from fgpu.mig.planner import MigPlan

mig_app = typer.Typer(
    rich_markup_mode=None,
    help="MIG: profiles, layouts, plans, and applying them.",
    no_args_is_help=True,
)

ModelArgument = Annotated[str, typer.Argument(metavar="MODEL", help="GPU model, e.g. A100-80GB.")]


def _table(model: str) -> MigProfileTable:
    from fgpu.mig.catalog import NotMigCapableError, UnknownGpuModelError, mig_profiles

    try:
        return mig_profiles(model, "MODEL")
    except (UnknownGpuModelError, NotMigCapableError) as exc:
        fail(str(exc))


def _gib(mib: int) -> str:
    return f"{mib / 1024:.2f}".rstrip("0").rstrip(".") + " GiB"


@mig_app.command("profiles")
def profiles(model: ModelArgument, json_out: JsonOption = False) -> None:
    """The MIG profiles of a GPU model: id, slices, memory, SMs, most per GPU, allowed starts."""
    from rich.table import Table

    table = _table(model)
    rows = [
        {
            "profile": p.name,
            "id": p.profile_id,
            "compute_slices": p.compute_slices,
            "memory_slices": p.memory_slices,
            "memory_mib": p.memory_mib,
            "sm_count": p.sm_count,
            "max_count": p.max_count,
            "starts": list(p.starts),
        }
        for p in table.profiles
    ]
    if json_out:
        print(
            json.dumps(
                {
                    "model": table.model,
                    "compute_slices": table.compute_slices,
                    "memory_slices": table.memory_slices,
                    "profiles": rows,
                },
                indent=2,
            )
        )
        return
    view = Table(
        box=None,
        header_style="bold",
        pad_edge=False,
        title=f"{table.model}: {table.compute_slices} compute and "
        f"{table.memory_slices} memory slices",
        title_justify="left",
    )
    for column in ("PROFILE", "ID", "COMPUTE", "MEMORY SLICES", "MEMORY", "SMS", "MAX", "STARTS"):
        view.add_column(column, justify="left" if column in ("PROFILE", "STARTS") else "right")
    for p in table.profiles:
        view.add_row(
            p.name,
            str(p.profile_id),
            str(p.compute_slices),
            str(p.memory_slices),
            _gib(p.memory_mib),
            str(p.sm_count),
            str(p.max_count),
            ",".join(str(s) for s in p.starts),
        )
    out.print(view)


@mig_app.command("layouts")
def layouts(
    model: ModelArgument,
    media: Annotated[bool, typer.Option("--media", help="Include +me profiles.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Every maximal layout of a GPU model (nothing more fits), with its unused memory
    slices."""
    from rich.table import Table

    from fgpu.mig.layout import layout_text, maximal_layouts, used_memory_slices

    table = _table(model)
    found = maximal_layouts(table, media=media)
    rows = [
        {
            "layout": [{"profile": p.profile, "start": p.start} for p in layout],
            "instances": len(layout),
            "unused_memory_slices": table.memory_slices - used_memory_slices(table, layout),
        }
        for layout in found
    ]
    if json_out:
        print(json.dumps({"model": table.model, "layouts": rows}, indent=2))
        return
    view = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("#", "LAYOUT", "INSTANCES", "UNUSED SLICES"):
        view.add_column(column)
    for number, (layout, row) in enumerate(zip(found, rows, strict=True), 1):
        view.add_row(
            str(number),
            layout_text(layout),
            str(row["instances"]),
            str(row["unused_memory_slices"]),
        )
    out.print(view)
    err.print(
        f"{len(found)} maximal layouts on {table.model}"
        + ("" if media else " (without +me profiles; --media adds them)")
    )


def _read(path: Path, option: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"{option}: cannot read {path}: {exc.strerror or exc}")
    except UnicodeDecodeError:
        fail(f"{option}: {path} is not text (UTF-8); give a plan JSON or a mig-parted YAML")


@mig_app.command("plan")
def plan_command(
    demand: Annotated[
        str,
        typer.Option(
            "--demand",
            help="Requests: 3x1g.10gb,2x3g.40gb, fractions (0.25), memory (20GiB).",
            show_default=False,
        ),
    ],
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus", help="Empty GPUs with MIG on: 2xA100-80GB,1xH100-80GB.", show_default=False
        ),
    ] = None,
    inventory: Annotated[
        Path | None,
        typer.Option(
            "--inventory",
            help="JSON/YAML inventory: GPUs with their instances and use.",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOption = False,
    output_format: Annotated[
        str, typer.Option("--format", help="table, json or mig-parted (a mig-parted v1 config).")
    ] = "table",
    config_name: Annotated[
        str, typer.Option("--config-name", help="Config name in the mig-parted file.")
    ] = "fgpu",
    output: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Write the plan (json or mig-parted) to this file.", show_default=False
        ),
    ] = None,
) -> None:
    """Plan MIG instances for a demand: per GPU what to destroy and create (with starts),
    serving the most requests, changing the fewest GPUs, wasting the fewest slices."""
    import yaml

    from fgpu.mig.demand import parse_demand
    from fgpu.mig.export import plan_to_data, to_mig_parted
    from fgpu.mig.inventory import MigInputError, inventory_from_data, parse_gpu_spec
    from fgpu.mig.planner import plan

    kind = "json" if json_out else output_format
    if kind not in ("table", "json", "mig-parted"):
        fail(f"--format: expected table, json or mig-parted, got {output_format!r}")
    if (gpus is None) == (inventory is None):
        fail("--gpus or --inventory: give exactly one")
    try:
        if inventory is not None:
            try:
                data = yaml.safe_load(_read(inventory, "--inventory"))
            except yaml.YAMLError as exc:
                fail(f"--inventory: {inventory} is not YAML or JSON: {exc}")
            machine = inventory_from_data(data, "inventory")
        else:
            assert gpus is not None
            machine = parse_gpu_spec(gpus)
        result = plan(machine, parse_demand(demand))
    except MigInputError as exc:
        fail(str(exc))
    if kind == "json":
        text = json.dumps(plan_to_data(result), indent=2) + "\n"
    elif kind == "mig-parted":
        text = to_mig_parted(result, config_name)
    else:
        text = ""
    if output is not None:
        if kind == "table":
            fail("--out: needs --format json or mig-parted")
        try:
            output.write_text(text)
        except OSError as exc:
            fail(f"--out: cannot write {output}: {exc.strerror or exc}")
        err.print(escape(f"wrote {output}"))
    elif kind == "table":
        _print_plan(result)
    else:
        print(text, end="")
    if result.unserved:
        left = ", ".join(f"{u.count} x {u.request}" for u in result.unserved)
        err.print(f"[bold yellow]warning:[/] not served: {escape(left)}")
    if kind == "mig-parted":
        busy = [g.index for g in result.gpus if g.changed and any(b.in_use for b in g.before)]
        if busy:
            err.print(
                "[bold yellow]warning:[/] nvidia-mig-parted rebuilds changed GPUs whole; GPU "
                f"{', '.join(map(str, busy))} have instances in use: use `fgpu mig apply` instead"
            )


def _print_plan(result: MigPlan) -> None:
    from rich.table import Table

    from fgpu.mig.layout import layout_text

    view = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("GPU", "MODEL", "DESTROY", "CREATE", "AFTER", "SERVES"):
        view.add_column(column, overflow="fold")
    for g in result.gpus:
        serves = "\n".join(
            f"{a.request} -> {a.profile}@{a.start}" + ("" if a.new else " (existing)")
            for a in g.assignments
        )
        view.add_row(
            str(g.index),
            g.model + (" (enable MIG)" if g.enable_mig else ""),
            "\n".join(f"{d.profile}@{d.start}" for d in g.destroy) or "-",
            "\n".join(str(c) for c in g.create) or "-",
            layout_text(g.after) if g.mig_enabled_after else "MIG off",
            serves or "-",
        )
    out.print(view)
    for line in result.explanation:
        err.print(escape(line))


@mig_app.command("apply")
def apply_command(
    file: Annotated[
        Path,
        typer.Argument(
            metavar="PLAN_OR_CONFIG",
            help="A plan from `fgpu mig plan --json`, or a mig-parted v1 config.",
        ),
    ],
    yes: Annotated[bool, typer.Option("--yes", help="Apply (default: a dry run).")] = False,
    config_name: Annotated[
        str | None,
        typer.Option(
            "--config-name",
            help="Which config of a mig-parted file (if it has several).",
            show_default=False,
        ),
    ] = None,
    simulate_gpus: Annotated[
        str | None,
        typer.Option(
            "--simulate-gpus",
            help="Apply to empty simulated GPUs (2xA100-80GB) instead of NVML.",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """Apply a plan or a mig-parted config through NVML: destroy idle instances and create
    new ones with explicit starts. Checks everything first; a dry run unless --yes, and
    --yes needs root. Never changes MIG modes or instances in use."""
    from fgpu.mig.device import MigDevice, apply_plan, simulated_devices
    from fgpu.mig.export import (
        describe,
        gpu_plans_from_data,
        parse_mig_parted,
        plans_from_mig_parted,
    )
    from fgpu.mig.inventory import MigInputError

    if yes and simulate_gpus is None and os.geteuid() != 0:
        fail(
            "--yes: creating and destroying MIG instances needs root; run as root "
            "(or without --yes for a dry run)"
        )
    kind, data = _load(file)
    session = None
    devices: list[MigDevice]
    if simulate_gpus is not None:
        try:
            devices = list(simulated_devices(simulate_gpus))
        except MigInputError as exc:
            fail(str(exc))
    else:
        from fgpu.agent.mig_nvml import open_mig_devices
        from fgpu.agent.nvml import NvmlUnavailableError

        try:
            session = open_mig_devices()
        except NvmlUnavailableError as exc:
            fail(f"NVML is unavailable ({exc}); --simulate-gpus applies to simulated GPUs")
        for note in session.notes:
            err.print(escape(f"note: {note}"))
        devices = list(session.devices)
    try:
        try:
            if kind == "plan":
                plans = gpu_plans_from_data(data, "plan")
            else:
                plans = plans_from_mig_parted(
                    parse_mig_parted(data, config_name, "config"), devices, "config"
                )
            report = apply_plan(plans, devices, dry_run=not yes)
        except MigInputError as exc:
            fail(f"{exc}; nothing was applied")
    finally:
        if session is not None:
            session.close()
    if json_out:
        print(
            json.dumps(
                {
                    "dry_run": report.dry_run,
                    "steps": [vars_of(s) for s in report.steps],
                    "pending": [vars_of(s) for s in report.pending],
                    "error": report.error,
                },
                indent=2,
            )
        )
    else:
        head = "dry run, would" if report.dry_run else "done"
        for line in describe(plans):
            out.print(escape(line))
        for step in report.steps:
            out.print(escape(f"{head}: {step}"))
        if not report.steps:
            out.print("nothing to do: every GPU already has its layout")
        if report.dry_run and report.steps:
            err.print("dry run: nothing changed; run again with --yes (as root) to apply")
    if not report.ok:
        err.print(f"[bold red]error:[/] {escape(report.error or '')}")
        for step in report.pending:
            err.print(escape(f"not done: {step}"))
        raise typer.Exit(EXIT_REFUSED)


def vars_of(step: Any) -> dict[str, Any]:
    return {
        "gpu": step.gpu_index,
        "action": step.action,
        "profile": step.profile,
        "start": step.start,
        "uuid": step.uuid or None,
    }


def _load(file: Path) -> tuple[str, Any]:
    from fgpu.mig.export import load_plan_file
    from fgpu.mig.inventory import MigInputError

    try:
        return load_plan_file(_read(file, "PLAN_OR_CONFIG"), str(file))
    except MigInputError as exc:
        fail(str(exc))


def register(app: typer.Typer) -> None:
    """Add ``fgpu mig`` to the ``fgpu`` app."""
    app.add_typer(mig_app, name="mig")
