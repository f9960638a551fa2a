"""``fgpu sim fill|replay``: the trace simulators. Parses and renders; the work is in
:mod:`fgpu.sim`."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from fgpu.sim.experiment import OutputFolder


sim_app = typer.Typer(rich_markup_mode=None, help="Trace simulators.", no_args_is_help=True)
err = Console(stderr=True)
# Tables keep their columns readable when stdout is a file or a pipe (CI logs).
out = Console(width=None if Console().is_terminal else 120)


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _default_trace_file(name: str, option: str) -> Path:
    from fgpu.sim.experiment import ExperimentError, default_trace_file

    try:
        return default_trace_file(name, option)
    except ExperimentError as exc:
        raise _fail(str(exc)) from None


def _warn(message: str) -> None:
    err.print(f"[bold yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


@sim_app.command("fill")
def sim_fill(
    nodes: Annotated[
        Path | None, typer.Option(help="Node CSV: sn, cpu_milli, memory_mib, gpu, model.")
    ] = None,
    pods: Annotated[
        Path | None,
        typer.Option(help="Pod CSV: name, cpu_milli, memory_mib, num_gpu, gpu_milli[, gpu_spec]."),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            "-p",
            help="Policy names, repeatable or comma-separated; 'all' or 'published' (default).",
        ),
    ] = None,
    seeds: Annotated[str, typer.Option(help="Seeds: 42-51, 1,2,3 or 1-3,10.")] = "42-51",
    tune: Annotated[
        float, typer.Option(help="Arrived GPU at the end, x capacity (protocol: 1.3).")
    ] = 1.3,  # fgpu.sim.fill.DEFAULT_TUNE, spelled out: --help loads no simulator
    workers: Annotated[
        int | None, typer.Option(help="Parallel processes (default and cap: CPU count).")
    ] = None,
    out_text: Annotated[
        str, typer.Option("--out", help="Output folder for summary.json, curves.csv, plots.")
    ] = "fill-results",
) -> None:
    """Fill experiment of the FGD paper: place pods until 130 % of the GPUs have arrived,
    and report unallocated GPU and fragmentation per policy (median over seeds)."""
    from fgpu.sim.experiment import (
        DEFAULT_NODES,
        DEFAULT_PODS,
        ExperimentError,
        check_out_name,
        check_tune,
        default_trace_file,
        parse_seeds,
        prepare_out_dir,
        resolve_policies,
        resolve_workers,
    )

    started = time.perf_counter()
    # Every option is checked before a CSV is read or a folder is made.
    try:
        seed_list = parse_seeds(seeds)
        names = resolve_policies(policy or [])
        check_tune(tune)
        worker_count = resolve_workers(workers)
        check_out_name(out_text)
        nodes_path = nodes or default_trace_file(DEFAULT_NODES, "--nodes")
        pods_path = pods or default_trace_file(DEFAULT_PODS, "--pods")
    except ExperimentError as exc:
        raise _fail(str(exc)) from None
    if workers is not None and worker_count < workers:
        err.print(
            f"note: --workers {workers} is more than the {worker_count} CPUs here; "
            f"using {worker_count}",
            highlight=False,
        )
    try:
        folder = prepare_out_dir(out_text)
    except ExperimentError as exc:
        raise _fail(str(exc)) from None
    try:
        _fill(folder, nodes_path, pods_path, names, seed_list, tune, worker_count, started)
    except KeyboardInterrupt:
        folder.discard()
        err.print("interrupted: no report written", highlight=False)
        raise typer.Exit(code=130) from None
    except BaseException:
        folder.discard()
        raise


def _fill(
    folder: OutputFolder,
    nodes_path: Path,
    pods_path: Path,
    names: list[str],
    seed_list: list[int],
    tune: float,
    workers: int,
    started: float,
) -> None:
    """The body of ``fgpu sim fill`` once the options are checked and the folder exists."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fgpu.model.types import InvalidRequestError
    from fgpu.plugins import UnknownPolicyError
    from fgpu.sim.experiment import ExperimentError, Trace, run_experiment, trace_warnings
    from fgpu.sim.report import RunCurve, comparison_table, write_report
    from fgpu.sim.trace import TraceFormatError

    try:
        trace = Trace.load(nodes_path, pods_path)
    except (ExperimentError, TraceFormatError, InvalidRequestError) as exc:
        raise _fail(str(exc)) from None
    for warning in trace_warnings(trace, tune):
        _warn(warning)

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
        except (ExperimentError, UnknownPolicyError) as exc:
            raise _fail(str(exc)) from None
    inputs = {"nodes": str(nodes_path.resolve()), "pods": str(pods_path.resolve())}
    elapsed = round(time.perf_counter() - started, 3)
    out_dir = folder.path
    try:
        summary = write_report(out_dir, runs, seed_list, tune, elapsed, inputs)
    except OSError as exc:
        raise _fail(
            f"--out: cannot write the report into {out_dir}: {exc.strerror or exc}"
        ) from None
    out.print(comparison_table(summary))
    out.print(f"wrote {out_dir}/summary.json, curves.csv, unallocated.png, fragmentation.png")


def _check_number(option: str, value: float | None, minimum: float, strict: bool) -> None:
    if value is None:
        return
    low = value <= minimum if strict else value < minimum
    if not math.isfinite(value) or low:
        relation = "above" if strict else "at least"
        raise _fail(f"{option}: must be a number {relation} {minimum:g}, got {value:g}")


def _memory_ratio(text: str) -> tuple[float, float]:
    """``--memory-ratio LOW,HIGH`` -> (low, high), 0 < low <= high <= 1."""
    parts = text.split(",")
    try:
        low, high = (float(p) for p in parts) if len(parts) == 2 else (math.nan, math.nan)
    except ValueError:
        low = high = math.nan
    if not (0 < low <= high <= 1):
        raise _fail(f"--memory-ratio: {text!r} is not LOW,HIGH with 0 < LOW <= HIGH <= 1")
    return low, high


@sim_app.command("replay")
def sim_replay(
    pods: Annotated[
        Path | None,
        typer.Option(help="Pod CSV whose shapes generated workloads draw from (default trace)."),
    ] = None,
    gpus: Annotated[
        str, typer.Option(help="Cluster: COUNTxMODEL[,COUNTxMODEL...], 8 GPUs per node.")
    ] = "64xA100-80GB",
    tenants: Annotated[
        int | None, typer.Option(help="Tenant queues with equal quotas (default 3).")
    ] = None,
    load: Annotated[
        float | None, typer.Option(help="Offered GPU load, x capacity (default 0.9).")
    ] = None,
    hours: Annotated[float, typer.Option(help="Simulated hours.")] = 24.0,
    seed: Annotated[int, typer.Option(help="Random seed (workloads, tie-break rank).")] = 1,
    workloads_file: Annotated[
        Path | None,
        typer.Option(
            "--workloads",
            help="Workload CSV (id,submit_s,duration_s,queue,priority,gpu,gpu_memory,cpu,"
            "memory) instead of generated ones; its queues become the tenants.",
        ),
    ] = None,
    policy: Annotated[
        str, typer.Option("--policy", "-p", help="Placement policy.")
    ] = "fgd-pattern",  # fgpu.plugins.DEFAULT_POLICY, spelled out
    grace: Annotated[float, typer.Option(help="Seconds a victim takes to exit.")] = 30.0,
    min_runtime: Annotated[
        float, typer.Option(help="Seconds a workload runs before it can be reclaimed.")
    ] = 0.0,
    aging_interval: Annotated[
        float | None, typer.Option(help="Waiting seconds per priority step of aging (off).")
    ] = None,
    reservation_after: Annotated[
        float | None,
        typer.Option(help="Seconds a large workload waits before capacity is reserved (off)."),
    ] = None,
    tick: Annotated[
        float, typer.Option(help="A decision round at least every S seconds while work waits.")
    ] = 60.0,
    debug: Annotated[
        bool, typer.Option("--debug", help="Check invariants after every round (slower).")
    ] = False,
    squeeze: Annotated[
        bool,
        typer.Option(
            "--squeeze/--no-squeeze", help="Squeeze before evict (--no-squeeze: evict only)."
        ),
    ] = True,
    preempt_delay: Annotated[
        float,
        typer.Option(
            help="Seconds a preemptor below priority 100 waits for capacity to free before "
            "it preempts (0: at once)."
        ),
    ] = 300.0,
    suspend_host_memory: Annotated[
        str,
        typer.Option(
            help="Host memory per node for suspended work, e.g. 256GiB: victims are "
            "suspended to host memory while it has room (0: suspend off, victims evicted)."
        ),
    ] = "0",
    host_link: Annotated[
        float, typer.Option(help="GB/s of the suspend and restore copies to host memory.")
    ] = 25.0,
    restore_other_gpus: Annotated[
        bool,
        typer.Option(
            "--restore-other-gpus/--restore-own-gpus",
            help="Where suspended work comes back: by default on any GPU of its node (a "
            "CUDA 13 driver, version >= 13000, restores a checkpoint onto another GPU of the "
            "same model); --restore-own-gpus: only on the GPUs it was suspended from (CUDA "
            "12.8-12.9 drivers, r570-r575, restore onto those alone).",
        ),
    ] = True,
    inference_duty: Annotated[
        float,
        typer.Option(help="Fraction of the time the inference class (critical) is busy."),
    ] = 0.3,
    training_duty: Annotated[
        float, typer.Option(help="Fraction of the time the other classes are busy.")
    ] = 1.0,
    memory_ratio: Annotated[
        str,
        typer.Option(
            help="LOW,HIGH: a generated fractional workload's GPU memory is its share of the "
            "GPU's memory times a ratio drawn uniformly in this range (1,1: in proportion)."
        ),
    ] = "0.25,1",
    out_dir: Annotated[
        Path, typer.Option("--out", help="Output folder for summary.json, timeline.csv, plots.")
    ] = Path("replay-results"),
) -> None:
    """Dynamic simulator: arrivals and departures on a virtual clock, driving the decision
    core with queues, fair share, preemption and reclaim; reports allocation, delays and
    fairness."""
    import numpy as np
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from fgpu.plugins import UnknownPolicyError
    from fgpu.sched.decide import SchedulerConfig
    from fgpu.sim.experiment import DEFAULT_PODS
    from fgpu.sim.replay import (
        DutyCycles,
        GpuSpecError,
        ReplayError,
        build_scheduler,
        parse_gpus,
        run_replay,
        tenant_queues,
    )
    from fgpu.sim.replay_report import replay_table, write_replay_report
    from fgpu.sim.trace import TraceFormatError, load_pods
    from fgpu.sim.workloads import generate, load_workloads

    _check_number("--hours", hours, 0, strict=True)
    _check_number("--load", load, 0, strict=True)
    _check_number("--grace", grace, 0, strict=False)
    _check_number("--min-runtime", min_runtime, 0, strict=False)
    _check_number("--aging-interval", aging_interval, 0, strict=True)
    _check_number("--reservation-after", reservation_after, 0, strict=False)
    _check_number("--tick", tick, 0, strict=False)
    _check_number("--preempt-delay", preempt_delay, 0, strict=False)
    _check_number("--host-link", host_link, 0, strict=True)
    from dataclasses import replace

    from fgpu.model.units import parse_memory_mib

    try:
        suspend_pool_mib = (
            0
            if suspend_host_memory.strip() == "0"
            else parse_memory_mib(suspend_host_memory, "--suspend-host-memory")
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    for duty_option, duty_value in (
        ("--inference-duty", inference_duty),
        ("--training-duty", training_duty),
    ):
        if not (math.isfinite(duty_value) and 0.0 <= duty_value <= 1.0):
            raise _fail(f"{duty_option}: must be a number in 0..1, got {duty_value:g}")
    ratio = _memory_ratio(memory_ratio)
    if tenants is not None and tenants < 1:
        raise _fail(f"--tenants: must be at least 1, got {tenants}")
    if workloads_file is not None:
        for option, value in (("--pods", pods), ("--tenants", tenants), ("--load", load)):
            if value is not None:
                raise _fail(
                    f"{option}: not used with --workloads (the file gives the workloads "
                    "and their queues)"
                )
    if out_dir.exists() and not out_dir.is_dir():
        raise _fail(f"--out: {out_dir} exists and is not a folder")
    try:
        nodes = parse_gpus(gpus)
    except GpuSpecError as exc:
        raise _fail(str(exc)) from None
    if suspend_pool_mib:
        nodes = [replace(n, suspend_host_memory_mib=suspend_pool_mib) for n in nodes]
    if restore_other_gpus:
        nodes = [replace(n, restore_other_gpus=True) for n in nodes]
    capacity = sum(n.gpu_count for n in nodes) * 1000
    workload_seed, scheduler_seed = np.random.SeedSequence(seed).spawn(2)
    try:
        if workloads_file is not None:
            workloads = load_workloads(workloads_file)
            queue_names = sorted({w.queue for w in workloads})
            shapes = [w.request for w in workloads]
        else:
            pods_path = pods or _default_trace_file(DEFAULT_PODS, "--pods")
            shapes = list(load_pods(pods_path).requests)
            n_tenants = 3 if tenants is None else tenants
            workloads = generate(
                shapes,
                capacity,
                n_tenants,
                0.9 if load is None else load,
                hours,
                np.random.default_rng(workload_seed),
                gpu_memory_mib=min(n.gpu_memory_mib for n in nodes),
                memory_ratio=ratio,
            )
            queue_names = [f"tenant-{i + 1}" for i in range(n_tenants)]
    except TraceFormatError as exc:
        raise _fail(str(exc)) from None
    except ValueError as exc:
        raise _fail(f"{'--workloads' if workloads_file else '--pods'}: {exc}") from None
    config = SchedulerConfig(
        min_runtime_s=min_runtime,
        aging_interval_s=aging_interval,
        reservation_after_s=reservation_after,
        squeeze=squeeze,
        suspend=suspend_pool_mib > 0,
        preempt_delay_s=preempt_delay,
    )
    try:
        scheduler = build_scheduler(
            policy, nodes, shapes, config, np.random.default_rng(scheduler_seed)
        )
    except UnknownPolicyError as exc:
        raise _fail(f"--policy: {exc}") from None
    except ValueError as exc:
        raise _fail(f"--policy: {exc}") from None
    queues = tenant_queues(queue_names, nodes)
    err.print(
        f"replay: {len(nodes)} nodes, {capacity // 1000} GPUs, {len(queue_names)} queues, "
        f"{len(workloads)} workloads over {hours:g} h, policy {policy}",
        highlight=False,
    )
    horizon = hours * 3600.0
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as progress:
        task = progress.add_task("simulated time", total=horizon)
        rounds = 0

        def advance(now: float) -> None:
            nonlocal rounds
            rounds += 1
            if rounds % 64 == 0:
                progress.update(task, completed=now)

        started = time.perf_counter()
        try:
            result = run_replay(
                nodes,
                queues,
                workloads,
                scheduler,
                hours,
                grace,
                tick_s=tick or None,
                debug=debug,
                on_round=advance,
                duty=DutyCycles(inference_duty, training_duty),
                suspendable=suspend_pool_mib > 0,
                host_link_mib_s=host_link * 1e9 / 2**20,
            )
        except ReplayError as exc:  # a broken contract of the decision core: a bug, not input
            err.print(f"[bold red]replay stopped:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=1) from None
        wall = time.perf_counter() - started
        progress.update(task, completed=horizon)
    echo = {
        "gpus": gpus,
        "nodes": len(nodes),
        "capacity_gpus": capacity // 1000,
        "queues": queue_names,
        "workloads": str(workloads_file) if workloads_file else None,
        "pods": None if workloads_file else str(pods or DEFAULT_PODS),
        "load": None if workloads_file else (0.9 if load is None else load),
        "hours": hours,
        "seed": seed,
        "policy": policy,
        "grace_s": grace,
        "min_runtime_s": min_runtime,
        "aging_interval_s": aging_interval,
        "reservation_after_s": reservation_after,
        "tick_s": tick,
        "squeeze": squeeze,
        "restore_other_gpus": restore_other_gpus,
        "inference_duty": inference_duty,
        "training_duty": training_duty,
        "memory_ratio": list(ratio) if workloads_file is None else None,
        "submitted": len(workloads),
    }
    try:
        summary = write_replay_report(
            out_dir,
            result,
            wall,
            echo,
            workloads=None if workloads_file else workloads,
        )
    except OSError as exc:
        raise _fail(f"--out: cannot write {out_dir}: {exc}") from None
    out.print(replay_table(summary))
    files = "summary.json, timeline.csv, allocation.png, delays.png"
    if workloads_file is None:
        files += ", workloads.csv"
    out.print(f"wrote {out_dir}/{{{files}}}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``fgpu sim`` to the ``fgpu`` app."""
    app.add_typer(sim_app, name="sim")
