"""Workloads for the dynamic simulator: generated days and workload files.

A simulated workload is a request with a queue, a priority, a submission time and a run
time (:class:`SimWorkload`). Two sources:

* :func:`generate`: shapes drawn from a pod list (the openb trace), run times from a
  log-normal fitted to the trace's lifetimes (:func:`lognormal_from_quantiles`), Poisson
  arrivals at a chosen offered load, queues and priorities drawn uniformly / by fixed
  shares;
* :func:`load_workloads`: a CSV file with one workload per row (``id, submit_s,
  duration_s, queue, priority, gpu, gpu_memory, cpu, memory``); :func:`write_workloads`
  writes the same layout, so a generated day can be saved and replayed as it was.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

import numpy as np

from fgpu.model.types import InvalidRequestError, Request
from fgpu.model.units import (
    MILLI_PER_GPU,
    UnitError,
    format_mib,
    parse_cpu_milli,
    parse_gpu_request,
    parse_memory_mib,
)
from fgpu.sched.workload import PRIORITY_CLASSES, parse_priority
from fgpu.sim.trace import TraceFormatError, _read_text, _rows

Z_90 = 1.2815515655446004
"""The 0.9 quantile of the standard normal distribution."""

TRACE_MEDIAN_LIFETIME_S = 540.0
"""Median pod lifetime of the openb trace, 9 minutes (``deletion_time - creation_time``;
``shared/traces/alibaba-gpu-v2023/README.md``, "Times")."""

TRACE_P90_LIFETIME_S = 6480.0
"""90th percentile of the openb trace's pod lifetimes, 1.8 hours (same source)."""

PRIORITY_MIX: tuple[tuple[int, float], ...] = (
    (PRIORITY_CLASSES["normal"], 0.63),
    (PRIORITY_CLASSES["low"], 0.18),
    (PRIORITY_CLASSES["high"], 0.09),
    (PRIORITY_CLASSES["critical"], 0.10),
)
"""Priorities of generated workloads and their shares: the inference class (``critical``,
10 %) and the training classes in the proportions 70 : 20 : 10 (normal, low, high)."""

INFERENCE_PRIORITY = PRIORITY_CLASSES["critical"]
"""Generated workloads of this priority are the latency-critical inference class: their
shapes are drawn from the single-GPU fractional pods only (a service on part of a GPU)."""

MEMORY_RATIO = (0.25, 1.0)
"""With a GPU memory size given to :func:`generate`, a single-GPU fractional workload asks
for ``share x GPU memory x r`` of GPU memory, ``r`` uniform in this range (a job's memory
and compute needs differ; 1, 1 is memory in proportion to the share, as in the trace)."""

WORKLOAD_COLUMNS: tuple[str, ...] = (
    "id",
    "submit_s",
    "duration_s",
    "queue",
    "priority",
    "gpu",
    "gpu_memory",
    "cpu",
    "memory",
)
"""Columns of a workload file, in the order :func:`write_workloads` writes them."""

OPTIONAL_COLUMNS: tuple[str, ...] = ("user",)
"""Columns a workload file may have besides :data:`WORKLOAD_COLUMNS` (written last when
any workload has a user)."""

TIME_DECIMALS = 3
"""Generated submission and run times are rounded to the millisecond, so that a saved file
(:func:`write_workloads`) reads back to the same values."""


@dataclass(frozen=True, slots=True)
class SimWorkload:
    """One workload of a simulated day.

    Attributes:
        id: unique id.
        queue: leaf queue (tenant) it is submitted to.
        request: what it asks for.
        priority: numeric priority (:data:`fgpu.sched.workload.PRIORITY_CLASSES`).
        submit_s: submission time, seconds from the start of the simulation (>= 0).
        duration_s: run time in seconds once started (> 0); a workload stopped by
            preemption starts over and needs the whole run time again.
        user: who submitted it ("" when the file has no ``user`` column); inside a queue
            the user with less allocated goes first (:mod:`fgpu.sched.queueorder`).
    """

    id: str
    queue: str
    request: Request
    priority: int
    submit_s: float
    duration_s: float
    user: str = ""


class WorkloadFileError(TraceFormatError):
    """A workload file that cannot be loaded; ``str(err)`` is ``"{path}:{line}: {reason}"``.

    ``line`` is the 1-based physical line (1 is the header; 0 when the file could not be
    read at all).
    """


# ----------------------------------------------------------------------------- generation
def lognormal_from_quantiles(
    median_s: float = TRACE_MEDIAN_LIFETIME_S, p90_s: float = TRACE_P90_LIFETIME_S
) -> tuple[float, float]:
    """Parameters ``(mu, sigma)`` of the log-normal with the given median and 90th percentile.

    For ``X = exp(mu + sigma * Z)``: median = ``exp(mu)``, p90 = ``exp(mu + sigma * z_0.9)``,
    so ``mu = ln(median)`` and ``sigma = ln(p90 / median) / z_0.9`` with ``z_0.9 =``
    :data:`Z_90`. The defaults are the openb trace's lifetimes (median 9 min, p90 1.8 h;
    ``shared/traces/alibaba-gpu-v2023/README.md``), giving mu = 6.29, sigma = 1.94 and a
    mean of ``exp(mu + sigma**2 / 2)`` = 3538 s.

    Raises:
        ValueError: a non-positive median, or a p90 not above the median.
    """
    if not (math.isfinite(median_s) and median_s > 0):
        raise ValueError(f"median_s must be a positive number, got {median_s}")
    if not (math.isfinite(p90_s) and p90_s > median_s):
        raise ValueError(f"p90_s must be above the median ({median_s}), got {p90_s}")
    return math.log(median_s), math.log(p90_s / median_s) / Z_90


def lognormal_mean(mu: float, sigma: float) -> float:
    """Mean of the log-normal with parameters ``mu``, ``sigma``: ``exp(mu + sigma**2 / 2)``."""
    return math.exp(mu + sigma * sigma / 2)


def arrival_rate(
    pods: Sequence[Request],
    capacity_gpu_milli: int,
    load: float,
    mean_duration_s: float,
    mean_gpu_milli: float | None = None,
) -> float:
    """Arrivals per second that offer ``load`` x the cluster's GPU capacity.

    Offered load = rate x E[GPU milli x duration] / capacity. Shapes and run times are
    drawn independently, so E[GPU milli x duration] = (mean GPU request of ``pods``, milli,
    summed over a pod's GPUs, or ``mean_gpu_milli`` when given) x ``mean_duration_s``.

    Raises:
        ValueError: no pods, no GPU in any pod, or a non-positive capacity, load or mean.
    """
    if not pods:
        raise ValueError("the pod list is empty")
    if capacity_gpu_milli <= 0:
        raise ValueError(f"GPU capacity must be positive, got {capacity_gpu_milli} milli")
    if not (math.isfinite(load) and load > 0):
        raise ValueError(f"load must be a positive number, got {load}")
    if not (math.isfinite(mean_duration_s) and mean_duration_s > 0):
        raise ValueError(f"mean duration must be positive, got {mean_duration_s}")
    mean_gpu = (
        sum(p.total_gpu_milli for p in pods) / len(pods)
        if mean_gpu_milli is None
        else mean_gpu_milli
    )
    if mean_gpu <= 0:
        raise ValueError("the pod list asks for no GPU share, so no GPU load can be offered")
    return load * capacity_gpu_milli / (mean_gpu * mean_duration_s)


def generate(
    pods: Sequence[Request],
    capacity_gpu_milli: int,
    tenants: int,
    load: float,
    hours: float,
    rng: np.random.Generator,
    *,
    median_s: float = TRACE_MEDIAN_LIFETIME_S,
    p90_s: float = TRACE_P90_LIFETIME_S,
    gpu_memory_mib: int | None = None,
    memory_ratio: tuple[float, float] = MEMORY_RATIO,
    whole_gpu_memory: bool = False,
) -> list[SimWorkload]:
    """A simulated stretch of ``hours``: Poisson arrivals offering ``load`` x capacity.

    Each workload gets, independently:

    - a shape drawn uniformly from ``pods`` (CPU-only pods included, as in the trace),
      with its GPU-model constraint dropped (the simulated cluster's models differ);
    - a run time from the log-normal with ``median_s`` and ``p90_s``
      (:func:`lognormal_from_quantiles`);
    - a queue ``tenant-1 .. tenant-{tenants}``, uniformly;
    - a priority from :data:`PRIORITY_MIX`; the inference class
      (:data:`INFERENCE_PRIORITY`) draws its shape from the single-GPU fractional pods only
      (from all pods when there are none);
    - with ``gpu_memory_mib`` (the cluster's GPU memory), a single-GPU fractional shape
      asks for explicit GPU memory ``share x gpu_memory_mib x r``, ``r`` uniform in
      ``memory_ratio`` (:data:`MEMORY_RATIO`), rounded up to 256 MiB; without it memory
      stays in proportion to the share. With ``whole_gpu_memory`` as well, a whole
      single-GPU shape declares its memory the same way (``-g 1 --gpu-memory ...``: it holds
      only that memory, so it can be squeezed); the draws do not change.

    Arrivals form a Poisson process of rate :func:`arrival_rate` (analytic log-normal mean,
    the mean GPU request of the mix) on ``[0, hours)``: a Poisson number of arrivals,
    placed uniformly and sorted. Times are rounded to :data:`TIME_DECIMALS`. Ids are
    ``w000001``, ... in submission order. The result depends only on the arguments and
    the state of ``rng``.

    Raises:
        ValueError: ``tenants`` below 1, non-positive ``hours``, or as in
            :func:`arrival_rate` and :func:`lognormal_from_quantiles`.
    """
    if tenants < 1:
        raise ValueError(f"tenants must be at least 1, got {tenants}")
    if not (math.isfinite(hours) and hours > 0):
        raise ValueError(f"hours must be a positive number, got {hours}")
    lo, hi = memory_ratio
    if not (0 < lo <= hi <= 1):
        raise ValueError(f"memory_ratio must satisfy 0 < low <= high <= 1, got {memory_ratio}")
    mu, sigma = lognormal_from_quantiles(median_s, p90_s)
    shapes = [replace(p, gpu_models=frozenset()) if p.gpu_models else p for p in pods]
    fractional = [
        p for p in shapes if p.gpu_count == 1 and p.gpu_milli is not None and p.gpu_milli < 1000
    ] or shapes
    inference_share = sum(s for p, s in PRIORITY_MIX if p == INFERENCE_PRIORITY) / sum(
        s for _, s in PRIORITY_MIX
    )
    mean_gpu = (1 - inference_share) * sum(p.total_gpu_milli for p in shapes) / max(
        len(shapes), 1
    ) + inference_share * sum(p.total_gpu_milli for p in fractional) / max(len(fractional), 1)
    if not pods:
        raise ValueError("the pod list is empty")
    rate = arrival_rate(
        pods, capacity_gpu_milli, load, lognormal_mean(mu, sigma), mean_gpu_milli=mean_gpu
    )
    horizon_s = hours * 3600.0
    count = int(rng.poisson(rate * horizon_s))
    submit = np.sort(rng.uniform(0.0, horizon_s, size=count))
    shape_index = rng.integers(len(shapes), size=count)
    durations = rng.lognormal(mu, sigma, size=count)
    queue_index = rng.integers(tenants, size=count)
    levels = np.array([p for p, _ in PRIORITY_MIX], dtype=np.int64)
    shares = np.array([s for _, s in PRIORITY_MIX], dtype=np.float64)
    priorities = levels[rng.choice(len(levels), size=count, p=shares / shares.sum())]
    inference_index = rng.integers(len(fractional), size=count)
    ratios = rng.uniform(lo, hi, size=count)

    def shape(i: int) -> Request:
        r = (
            fractional[int(inference_index[i])]
            if priorities[i] == INFERENCE_PRIORITY
            else shapes[int(shape_index[i])]
        )
        if gpu_memory_mib is None or r.gpu_count != 1 or r.gpu_milli is None:
            return r
        if r.gpu_milli >= 1000 and not whole_gpu_memory:
            return r
        mib = r.gpu_milli * gpu_memory_mib / 1000 * float(ratios[i])
        mib = min(gpu_memory_mib, max(256, -(-math.ceil(mib) // 256) * 256))
        return replace(r, gpu_memory_mib=mib)

    submit = np.round(submit, TIME_DECIMALS)
    # A run time never rounds to 0: the file layout and the engine need it positive.
    durations = np.maximum(np.round(durations, TIME_DECIMALS), 10.0**-TIME_DECIMALS)
    width = max(6, len(str(count)))
    queues = [f"tenant-{i + 1}" for i in range(tenants)]
    return [
        SimWorkload(
            id=f"w{i + 1:0{width}d}",
            queue=queues[int(queue_index[i])],
            request=shape(i),
            priority=int(priorities[i]),
            submit_s=float(submit[i]),
            duration_s=float(durations[i]),
        )
        for i in range(count)
    ]


def offered_load(workloads: Sequence[SimWorkload], capacity_gpu_milli: int, hours: float) -> float:
    """Realized offered load: sum of GPU milli x run time over capacity x ``hours``."""
    work = sum(w.request.total_gpu_milli * w.duration_s for w in workloads)
    return work / (capacity_gpu_milli * hours * 3600.0)


# ----------------------------------------------------------------------------- files
def _gpu_text(request: Request) -> str:
    if request.gpu_count == 0 or request.gpu_milli is None:
        return ""
    if request.gpu_milli == MILLI_PER_GPU:
        return str(request.gpu_count)
    return str(Decimal(request.gpu_milli) / MILLI_PER_GPU)


def write_workloads(path: str | os.PathLike[str], workloads: Sequence[SimWorkload]) -> None:
    """Write ``workloads`` as a workload file (:data:`WORKLOAD_COLUMNS`).

    GPU as ``0.47`` / ``2`` (empty for CPU-only or memory-only requests), GPU memory as
    ``5GiB`` / ``5120MiB`` (empty when derived from the share), CPU as milli-cores
    (``4000m``), host memory as ``16GiB`` (``0`` when none), times as Python floats, so
    :func:`load_workloads` reads back the same values. Requests with several fractional
    GPUs or GPU-model constraints cannot be written in this layout.

    Raises:
        ValueError: a request the layout cannot express.
        OSError: the file cannot be written.
    """
    rows: list[list[str]] = []
    for w in workloads:
        r = w.request
        if r.gpu_models:
            raise ValueError(f"workload {w.id}: GPU-model constraints are not in the file layout")
        if r.gpu_count > 1 and r.gpu_milli != MILLI_PER_GPU:
            raise ValueError(f"workload {w.id}: fractions of several GPUs are not in the layout")
        if r.gpu_count > 1 and r.gpu_memory_mib is not None:
            raise ValueError(f"workload {w.id}: GPU memory with whole GPUs is not in the layout")
        rows.append(
            [
                w.id,
                repr(w.submit_s),
                repr(w.duration_s),
                w.queue,
                str(w.priority),
                _gpu_text(r),
                format_mib(r.gpu_memory_mib) if r.gpu_memory_mib is not None else "",
                f"{r.cpu_milli}m" if r.cpu_milli else "0",
                format_mib(r.memory_mib) if r.memory_mib else "0",
            ]
        )
    with_user = any(w.user for w in workloads)
    if with_user:
        for row, w in zip(rows, workloads, strict=True):
            row.append(w.user)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow((*WORKLOAD_COLUMNS, "user") if with_user else WORKLOAD_COLUMNS)
        writer.writerows(rows)


def _time(path: str, line: int, column: str, text: str, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        what = "empty value" if not text.strip() else f"not a number (got {text!r})"
        raise WorkloadFileError(path, line, f"column {column!r}: {what}") from None
    if not math.isfinite(value):
        raise WorkloadFileError(path, line, f"column {column!r}: must be finite (got {text})")
    if positive and value <= 0:
        raise WorkloadFileError(path, line, f"column {column!r}: must be positive (got {text})")
    if value < 0:
        raise WorkloadFileError(path, line, f"column {column!r}: must not be negative (got {text})")
    return value


def _request(path: str, line: int, gpu: str, gpu_memory: str, cpu: str, memory: str) -> Request:
    """The request of one row; every unit error names the row and the column."""
    try:
        count, milli = 0, None
        if gpu.strip() and gpu.strip() != "0":
            count, milli = parse_gpu_request(gpu, "column 'gpu'")
        gpu_mib = None
        if gpu_memory.strip():
            gpu_mib = parse_memory_mib(gpu_memory, "column 'gpu_memory'")
            if count > 1 or (count == 1 and milli == MILLI_PER_GPU):
                raise WorkloadFileError(
                    path,
                    line,
                    f"column 'gpu_memory': not allowed with whole GPUs (gpu {gpu}); a whole "
                    "GPU comes with all of its memory",
                )
            count = 1
        cpu_milli = 0
        if cpu.strip() and cpu.strip() != "0":
            cpu_milli = parse_cpu_milli(cpu, "column 'cpu'")
        memory_mib = 0
        if memory.strip() and memory.strip() != "0":
            memory_mib = parse_memory_mib(memory, "column 'memory'")
        return Request(
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            gpu_count=count,
            gpu_milli=milli,
            gpu_memory_mib=gpu_mib,
        )
    except (UnitError, InvalidRequestError) as exc:
        raise WorkloadFileError(path, line, str(exc)) from None


def _header(path: str, header: list[str]) -> dict[str, int]:
    expected = f"expected columns {', '.join(WORKLOAD_COLUMNS)}"
    index: dict[str, int] = {}
    for position, name in enumerate(header):
        if name in index:
            raise WorkloadFileError(path, 1, f"duplicate column {name!r} in the header")
        index[name] = position
    unknown = [
        name for name in header if name not in WORKLOAD_COLUMNS and name not in OPTIONAL_COLUMNS
    ]
    missing = [name for name in WORKLOAD_COLUMNS if name not in index]
    problems = []
    if unknown:
        problems.append(f"unknown column(s) {', '.join(repr(n) for n in unknown)}")
    if missing:
        problems.append(f"missing column(s) {', '.join(missing)}")
    if problems:
        raise WorkloadFileError(path, 1, f"{'; '.join(problems)}; {expected}")
    return index


def load_workloads(path: str | os.PathLike[str]) -> list[SimWorkload]:
    """Load a workload file: a CSV with a header and one workload per row.

    Columns (all required but ``user``, in any order; no others):
        ``id``: unique, not empty.
        ``submit_s``: submission time in seconds, a finite number >= 0.
        ``duration_s``: run time in seconds, a finite number > 0.
        ``queue``: the leaf queue, not empty.
        ``priority``: a number (``50``) or a class name (``normal``, ``high``, ...);
            empty means ``normal``.
        ``user`` (optional, the only optional column): who submitted it; empty or absent
            means no user (every such workload shares the empty user).
        ``gpu``: ``-g`` syntax: ``0.5`` (a fraction of one GPU), ``1``, ``2`` (whole GPUs);
            empty or ``0`` for no GPU share (CPU-only, or a share derived from
            ``gpu_memory``).
        ``gpu_memory``: GPU memory quota (``5GiB``, ``5120MiB``); empty: proportional to
            the share. Alone it asks for one GPU with that memory; not allowed with whole
            GPUs.
        ``cpu``: CPU cores (``4``, ``0.5``, ``250m``); empty or ``0`` for none.
        ``memory``: host memory (``16GiB``); empty or ``0`` for none.

    Blank lines are skipped (they still count for line numbers); a leading BOM is dropped.

    Returns:
        The workloads sorted by submission time (file order among equal times).

    Raises:
        WorkloadFileError: the first problem: file missing or unreadable (line 0); empty
            file, header only, unknown, missing or duplicate columns (line 1); a row with
            the wrong number of fields, an empty or duplicate id, a bad time, priority,
            size or an empty queue (that row's line). Nothing is returned on error.
    """
    where = os.fspath(path)
    try:
        text = _read_text(where)
        rows = _rows(where, text)
        first = next(rows, None)
        if first is None:
            raise WorkloadFileError(
                where, 1, f"empty file: no header; expected columns {', '.join(WORKLOAD_COLUMNS)}"
            )
        header_line, header = first
        if header_line != 1:
            raise WorkloadFileError(where, 1, "blank line before the header")
        index = _header(where, header)
        width = len(header)
        seen: dict[str, int] = {}
        loaded: list[SimWorkload] = []
        for line, fields in rows:
            if len(fields) != width:
                raise WorkloadFileError(
                    where, line, f"expected {width} fields as in the header, got {len(fields)}"
                )
            value = {name: fields[index[name]] for name in WORKLOAD_COLUMNS}
            wid = value["id"]
            if not wid.strip():
                raise WorkloadFileError(where, line, "column 'id': empty workload id")
            first_line = seen.setdefault(wid, line)
            if first_line != line:
                raise WorkloadFileError(
                    where, line, f"duplicate workload id {wid!r} (first on line {first_line})"
                )
            submit_s = _time(where, line, "submit_s", value["submit_s"], positive=False)
            duration_s = _time(where, line, "duration_s", value["duration_s"], positive=True)
            queue = value["queue"].strip()
            if not queue:
                raise WorkloadFileError(where, line, "column 'queue': empty queue name")
            try:
                priority = parse_priority(
                    value["priority"].strip() or "normal", "column 'priority'"
                )
            except InvalidRequestError as exc:
                raise WorkloadFileError(where, line, str(exc)) from None
            request = _request(
                where, line, value["gpu"], value["gpu_memory"], value["cpu"], value["memory"]
            )
            user = fields[index["user"]].strip() if "user" in index else ""
            loaded.append(SimWorkload(wid, queue, request, priority, submit_s, duration_s, user))
    except WorkloadFileError:
        raise
    except TraceFormatError as exc:  # from the shared CSV reader
        raise WorkloadFileError(exc.path, exc.line, exc.reason) from None
    if not loaded:
        raise WorkloadFileError(where, 1, "no data rows after the header")
    loaded.sort(key=lambda w: w.submit_s)
    return loaded
