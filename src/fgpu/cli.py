"""The ``fgpu`` command line (Typer). Renders and parses; the work is in the library."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fgpu.model.types import InvalidRequestError
from fgpu.plugins import UnknownPolicyError
from fgpu.sim.experiment import (
    DEFAULT_NODES,
    DEFAULT_PODS,
    ExperimentError,
    Trace,
    find_trace_dir,
    parse_seeds,
    resolve_policies,
    run_experiment,
)
from fgpu.sim.fill import DEFAULT_TUNE
from fgpu.sim.report import RunCurve, comparison_table, write_report
from fgpu.sim.trace import TraceFormatError

app = typer.Typer(help="fgpu: fractional GPU sharing.", no_args_is_help=True)
sim_app = typer.Typer(help="Trace simulators.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")
err = Console(stderr=True)
# Tables keep their columns readable when stdout is a file or a pipe (CI logs).
out = Console(width=None if Console().is_terminal else 120)


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _default_trace_file(name: str, option: str) -> Path:
    folder = find_trace_dir()
    if folder is None:
        raise _fail(
            f"{option}: no file given and the Alibaba trace was not found "
            "(looked for shared/traces/alibaba-gpu-v2023/csv beside this folder and its "
            "parents; set FGPU_TRACE_DIR or pass the file)"
        )
    return folder / name


@sim_app.command("fill")
def sim_fill(
    nodes: Annotated[
        Path | None, typer.Option(help="Node CSV (sn,cpu_milli,memory_mib,gpu,model).")
    ] = None,
    pods: Annotated[
        Path | None,
        typer.Option(help="Pod CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec])."),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy", "-p", help="Policy name, repeatable; 'all' or 'published' (default)."
        ),
    ] = None,
    seeds: Annotated[str, typer.Option(help="Seeds: 42-51, 1,2,3 or 1-3,10.")] = "42-51",
    tune: Annotated[
        float, typer.Option(help="Arrived GPU at the end, x capacity (protocol: 1.3).")
    ] = DEFAULT_TUNE,
    workers: Annotated[
        int | None, typer.Option(help="Parallel processes (default: CPU count).")
    ] = None,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Output folder for summary.json, curves.csv, plots.")
    ] = Path("fill-results"),
) -> None:
    """Fill experiment of the FGD paper: place pods until 130 % of the GPUs have arrived,
    and report unallocated GPU and fragmentation per policy (median over seeds)."""
    started = time.perf_counter()
    try:
        seed_list = parse_seeds(seeds)
        names = resolve_policies(policy or [])
        nodes_path = nodes or _default_trace_file(DEFAULT_NODES, "--nodes")
        pods_path = pods or _default_trace_file(DEFAULT_PODS, "--pods")
        if out_dir.exists() and not out_dir.is_dir():
            raise ExperimentError(f"--out: {out_dir} exists and is not a folder")
        trace = Trace.load(nodes_path, pods_path)
    except (ExperimentError, TraceFormatError, InvalidRequestError, UnknownPolicyError) as exc:
        raise _fail(str(exc)) from None

    total = len(names) * len(seed_list)
    err.print(
        f"fill: {len(trace.nodes)} nodes, {len(trace.requests)} pods, "
        f"{len(names)} policies x {len(seed_list)} seeds = {total} runs",
        highlight=False,
    )
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as progress:
        task = progress.add_task("runs", total=total)

        def done(curve: RunCurve) -> None:
            progress.update(task, advance=1, description=f"{curve.policy} seed {curve.seed}")

        try:
            runs = run_experiment(trace, names, seed_list, tune, workers, on_done=done)
        except ExperimentError as exc:
            raise _fail(str(exc)) from None
    summary = write_report(out_dir, runs, seed_list, tune, round(time.perf_counter() - started, 3))
    out.print(comparison_table(summary))
    out.print(f"wrote {out_dir}/summary.json, curves.csv, unallocated.png, fragmentation.png")


def main() -> None:
    """Console-script entry point."""
    app()
