"""The fill experiment: (policy, seed) runs in parallel processes, then the report.

``fgpu sim fill`` is a thin shell over this module: it checks the options with
:func:`parse_seeds`, :func:`resolve_policies`, :func:`check_tune`, :func:`resolve_workers`
and :func:`prepare_out_dir` before anything is loaded, loads the CSVs with
:meth:`Trace.load`, warns with :func:`trace_warnings`, then calls :func:`run_experiment`.
"""

from __future__ import annotations

import difflib
import multiprocessing
import os
import re
import signal
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fgpu.model.types import Node, Request
from fgpu.plugins import PUBLISHED_POLICIES, create_policy, policy_names
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.state import ClusterState
from fgpu.sim.fill import DEFAULT_TUNE, run_fill
from fgpu.sim.report import PUBLISHED_NODES_FILE, PUBLISHED_PODS_FILE, RunCurve
from fgpu.sim.trace import load_nodes, load_pods
from fgpu.sim.trace_source import TraceChecksumError, check_published

TRACE_SUBDIR = Path("traces") / "alibaba-gpu-v2023" / "csv"
TRACE_ENV = "FGPU_TRACE_DIR"
"""Environment variable naming the trace's ``csv`` folder (the one holding the CSVs)."""
DEFAULT_NODES = PUBLISHED_NODES_FILE
DEFAULT_PODS = PUBLISHED_PODS_FILE
MAX_TUNE = 10.0
_SEED_PART = re.compile(r"^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?$")
_GROUPS = ("all", "published")
_SLOW_POLICIES = ("fgd", "fgd-exact", "fgd-pattern", "fgd-pattern-lookahead")


class ExperimentError(ValueError):
    """Bad experiment input (seeds, policies, tune, trace location); names the option."""


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded trace: nodes, pods in name order, and the protocol's target workload."""

    nodes: tuple[Node, ...]
    requests: tuple[Request, ...]
    target: TargetWorkload

    @classmethod
    def load(cls, nodes_path: str | os.PathLike[str], pods_path: str | os.PathLike[str]) -> Trace:
        """Load and validate both CSVs; pods are sorted by name (protocol step 2).

        Raises:
            TraceFormatError: a malformed file (file, line and reason in the message).
            ExperimentError: the node list has no GPU at all (nothing to fill).
        """
        nodes = load_nodes(nodes_path)
        if not any(node.gpu_count for node in nodes):
            raise ExperimentError(
                f"--nodes: the cluster has no GPUs ({os.fspath(nodes_path)}: {len(nodes)} "
                "node(s), all with gpu 0)"
            )
        pods = load_pods(pods_path)
        order = sorted(range(len(pods.names)), key=pods.names.__getitem__)
        requests = tuple(pods.requests[i] for i in order)
        return cls(tuple(nodes), requests, TargetWorkload.from_requests(requests))


# ----------------------------------------------------------------------------- inputs
def find_trace_dir(start: Path | None = None) -> Path | None:
    """Locate the Alibaba trace CSVs: ``$FGPU_TRACE_DIR`` (the trace's ``csv`` folder) when
    set, else ``shared/traces/alibaba-gpu-v2023/csv`` beside the current folder or any of
    its parents, or beside the installed source tree; None when neither exists."""
    env = os.environ.get(TRACE_ENV)
    if env:
        return Path(env)
    roots = [start or Path.cwd(), Path(__file__).resolve()]
    for root in roots:
        for folder in [root, *root.parents]:
            candidate = folder / "shared" / TRACE_SUBDIR
            if candidate.is_dir():
                return candidate
    return None


def default_trace_file(name: str, option: str) -> Path:
    """The trace file ``name`` for an option given no file (``--nodes``, ``--pods``); the
    paper's files are checked against their published SHA-256
    (:func:`fgpu.sim.trace_source.check_published`).

    Raises:
        ExperimentError: the trace was not found, ``$FGPU_TRACE_DIR`` is set but does not
            hold ``name`` (the message names the variable and what it should point to), or
            the file found differs from the published one.
    """
    folder = find_trace_dir()
    if folder is None:
        raise ExperimentError(
            f"{option}: no file given and the Alibaba trace was not found (looked for "
            f"shared/{TRACE_SUBDIR.as_posix()} beside this folder and its parents; set "
            f"{TRACE_ENV} to the trace's csv folder or pass the file)"
        )
    path = folder / name
    env = os.environ.get(TRACE_ENV)
    if env and not path.is_file():
        raise ExperimentError(
            f"{option}: no file given and {TRACE_ENV}={env} has no {name}; {TRACE_ENV} must "
            f"point to the trace's csv folder (.../{TRACE_SUBDIR.as_posix()}, the folder "
            f"holding {DEFAULT_NODES} and {DEFAULT_PODS})"
        )
    if path.is_file():
        try:
            check_published(path)
        except TraceChecksumError as exc:
            raise ExperimentError(f"{option}: {exc} (with {option} FILE)") from None
    return path


def parse_seeds(text: str) -> list[int]:
    """Parse ``--seeds``: ``"42-51"``, ``"1,5,9"``, ``"1-3,10"`` -> sorted distinct seeds.

    Raises:
        ExperimentError: empty, malformed, negative, or a range whose end is below its start.
    """
    seeds: set[int] = set()
    if not text.strip():
        raise ExperimentError("--seeds: empty; give e.g. 42-51 or 1,2,3")
    for part in text.split(","):
        match = _SEED_PART.match(part)
        if match is None:
            raise ExperimentError(
                f"--seeds: {part.strip()!r} is not a seed or a range; use e.g. 42-51 or 1,2,3"
            )
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        if lo < 0 or hi < 0:
            raise ExperimentError(f"--seeds: {part.strip()!r}: seeds must not be negative")
        if hi < lo:
            raise ExperimentError(
                f"--seeds: range {part.strip()!r} ends before it starts; write {hi}-{lo}"
            )
        if hi - lo >= 10_000:
            raise ExperimentError(f"--seeds: range {part.strip()!r} has over 10000 seeds")
        seeds.update(range(lo, hi + 1))
    return sorted(seeds)


def resolve_policies(names: Sequence[str]) -> list[str]:
    """Expand ``all`` (every registered policy) and ``published`` (the paper's six), keep
    order, drop repeats. Each given text may hold several names separated by commas
    (``published,fgd-pattern``). Names match case-insensitively (``FGD`` is ``fgd``). No
    names means the published six.

    Raises:
        ExperimentError: an unknown name; the message suggests the closest valid names
            (``difflib``) and lists all of them.
    """
    out: list[str] = []
    valid = policy_names()
    split = [part for text in names for part in text.split(",") if part.strip()]
    for given in split or ["published"]:
        name = given.strip().lower()
        group = {"all": valid, "published": list(PUBLISHED_POLICIES)}.get(name, [name])
        for item in group:
            if item not in valid:
                close = difflib.get_close_matches(name, [*valid, *_GROUPS], n=3, cutoff=0.6)
                hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
                raise ExperimentError(
                    f"--policy: unknown policy {given!r}; {hint}valid: {', '.join(valid)}, "
                    f"or {', '.join(_GROUPS)}"
                )
            if item not in out:
                out.append(item)
    return out


def check_tune(tune: float) -> None:
    """Check ``--tune`` (arrived GPU at the end, x capacity).

    Raises:
        ExperimentError: not a number in (0, 10].
    """
    if not 0 < tune <= MAX_TUNE:  # also catches NaN
        raise ExperimentError(f"--tune: {tune} is outside (0, {MAX_TUNE:g}]")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def resolve_workers(workers: int | None) -> int:
    """Worker processes for ``--workers``: the CPU count when None, else the value capped at
    the CPU count (more processes than CPUs only add switching).

    Raises:
        ExperimentError: below 1.
    """
    if workers is None:
        return usable_cpus()
    if workers < 1:
        raise ExperimentError(f"--workers: {workers} must be at least 1")
    return min(workers, usable_cpus())


def uses_published_inputs(
    nodes_path: str | os.PathLike[str], pods_path: str | os.PathLike[str]
) -> bool:
    """True when both files are the ones the paper's values were measured on (by name)."""
    return Path(nodes_path).name == DEFAULT_NODES and Path(pods_path).name == DEFAULT_PODS


# ----------------------------------------------------------------------------- output folder
@dataclass(frozen=True, slots=True)
class OutputFolder:
    """An output folder checked to be writable; ``created`` lists the folders that
    :func:`prepare_out_dir` made, deepest first, so :meth:`discard` can take them away."""

    path: Path
    created: tuple[Path, ...]

    def discard(self) -> None:
        """Remove the folders this run created, if they are still empty (a failed run)."""
        for folder in self.created:
            try:
                folder.rmdir()
            except OSError:
                return


def check_out_name(text: str) -> None:
    """Check that ``--out`` names a folder at all (an empty string would mean the current
    folder by accident).

    Raises:
        ExperimentError: empty or blank.
    """
    if not text.strip():
        raise ExperimentError("--out: empty folder name; give a folder, e.g. --out fill-results")


def prepare_out_dir(text: str) -> OutputFolder:
    """Check ``--out`` before any run: create the folder if missing and write and remove a
    probe file in it, so a bad folder fails in a second instead of after all runs.

    Raises:
        ExperimentError: empty name, an existing non-folder, a folder that cannot be
            created or written (whatever this function created is removed again).
    """
    check_out_name(text)
    path = Path(text)
    try:
        if path.exists() and not path.is_dir():
            raise ExperimentError(f"--out: {path} exists and is not a folder")
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for parent in path.parents:
            if parent.exists() and not parent.is_dir():
                raise ExperimentError(
                    f"--out: cannot create {path}: {parent} exists and is not a folder"
                )
    except OSError as exc:  # e.g. a parent folder we may not look into
        raise ExperimentError(f"--out: cannot use {path}: {exc.strerror or exc}") from None
    folder = OutputFolder(path, tuple(missing))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        folder.discard()
        reason = exc.strerror or str(exc)
        if isinstance(exc, FileNotFoundError) and missing:
            # mkdir of a name whose parent exists: that file system refuses new folders
            reason = f"{missing[-1].parent} does not allow new folders ({reason})"
        raise ExperimentError(f"--out: cannot create {path}: {reason}") from None
    probe = path / f".fgpu-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        try:
            probe.write_bytes(b"")
        finally:
            probe.unlink(missing_ok=True)
    except OSError as exc:
        folder.discard()
        raise ExperimentError(f"--out: cannot write in {path}: {exc.strerror or exc}") from None
    return folder


# ----------------------------------------------------------------------------- warnings
def never_fit(trace: Trace) -> dict[str, int]:
    """Pods that no node could take even on the empty cluster, counted by reason.

    Reasons, first match: ``"gpu model"`` (the pod's ``gpu_spec`` names no model of any
    node), ``"gpu count"`` (more GPUs than the largest allowed node has), ``"size"``
    (CPU, memory or GPU memory above every allowed node's). Such pods count as arrived GPU
    and always fail.
    """
    state = ClusterState(trace.nodes)
    counts: dict[Request, int] = {}
    for request in trace.requests:
        counts[request] = counts.get(request, 0) + 1
    reasons: dict[str, int] = {}
    for request, count in counts.items():
        ok, _ = state.feasible(request)
        if ok.any():
            continue
        if request.gpu_count and request.gpu_models:
            allowed = state.model_mask(request.gpu_models)
        else:
            allowed = np.ones(state.num_nodes, dtype=np.bool_)
        if request.gpu_count and not allowed.any():
            reason = "gpu model"
        elif request.gpu_count > int(state.gpu_count[allowed].max(initial=0)):
            reason = "gpu count"
        else:
            reason = "size"
        reasons[reason] = reasons.get(reason, 0) + count
    return reasons


def trace_warnings(trace: Trace, tune: float) -> list[str]:
    """Warnings about a run that would produce little or nothing of use, in words.

    - pods that can never fit on any node (:func:`never_fit`), with their count;
    - no pod asks for a GPU (nothing arrives, every bucket above 0 % stays empty);
    - ``tune`` below 1: arrivals stop below 100 %, so higher buckets stay empty.
    """
    warnings: list[str] = []
    reasons = never_fit(trace)
    total = sum(reasons.values())
    if total:
        largest = max(node.gpu_count for node in trace.nodes)
        words = {
            "gpu model": "ask for GPU models no node has",
            "gpu count": f"ask for more GPUs than any allowed node has (largest node: {largest})",
            "size": "need more CPU, memory or GPU memory than any node has",
        }
        detail = ", ".join(f"{n} {words[r]}" for r, n in reasons.items())
        lead = (
            f"none of the {total} pods can ever fit on any node"
            if total == len(trace.requests)
            else f"{total} of {len(trace.requests)} pods can never fit on any node"
        )
        warnings.append(f"{lead} ({detail}); they count as arrived and always fail")
    if not any(r.gpu_count for r in trace.requests):
        warnings.append("no pod asks for a GPU: no GPU arrives, so every bucket stays empty")
    if tune < 1:
        warnings.append(
            f"--tune {tune:g}: pods stop arriving at {tune * 100:g} % of GPU capacity, so "
            f"buckets above {tune * 100:g} % (the comparison at 100 % included) stay empty"
        )
    return warnings


# ----------------------------------------------------------------------------- runs
_WORKER_TRACE: Trace | None = None


def _init_worker(trace: Trace) -> None:
    """Pool initializer: keep the trace, and leave Ctrl-C to the parent (which stops the
    pool), so an interrupt prints no traceback per worker."""
    global _WORKER_TRACE
    _WORKER_TRACE = trace
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_one(policy: str, seed: int, tune: float, trace: Trace | None = None) -> RunCurve:
    data = trace if trace is not None else _WORKER_TRACE
    assert data is not None, "worker started without a trace"
    result = run_fill(data.nodes, data.requests, policy, seed, data.target, tune)
    return RunCurve(
        policy=policy,
        seed=seed,
        arrived_pct=result.arrived_pct(),
        allocated_pct=result.allocated_pct(),
        frag_rate_pct=result.fragmentation_rate_pct(),
        frag_pct=result.fragment_pct(),
        failed_pods=result.failed_pods,
        elapsed_s=result.elapsed_s,
    )


def _run_job(job: tuple[str, int, float]) -> RunCurve:
    policy, seed, tune = job
    return _run_one(policy, seed, tune)


def run_experiment(
    trace: Trace,
    policies: Sequence[str],
    seeds: Sequence[int],
    tune: float = DEFAULT_TUNE,
    workers: int | None = None,
    on_done: Callable[[RunCurve], None] | None = None,
) -> list[RunCurve]:
    """Run every (policy, seed) pair; in ``workers`` processes when more than one.

    The processes form a ``multiprocessing`` pool that ignores SIGINT; on Ctrl-C (or any
    other exception) in this process the pool is terminated at once and the exception
    propagates, so an interrupt stops every run within moments.

    Args:
        trace: the loaded trace.
        policies: registered policy names.
        seeds: seeds (one run each per policy).
        tune: arrived GPU at the end as a multiple of capacity, in (0, 10].
        workers: processes (default: CPU count; capped at it); 1 runs in this process.
        on_done: called with each finished run (progress display), in this process.

    Returns:
        The runs ordered by policy (as given), then seed, whatever order they finished in.

    Raises:
        ExperimentError: bad ``tune`` or ``workers``.
        UnknownPolicyError: an unregistered policy.
        KeyboardInterrupt: interrupted; no run keeps going.
    """
    check_tune(tune)
    workers = resolve_workers(workers)
    for name in policies:  # fail before starting any process
        create_policy(name, target=trace.target)
    jobs = [(p, s) for p in policies for s in seeds]
    results: dict[tuple[str, int], RunCurve] = {}

    def record(curve: RunCurve) -> None:
        results[curve.policy, curve.seed] = curve
        if on_done:
            on_done(curve)

    if workers == 1 or len(jobs) <= 1:
        for policy, seed in jobs:
            record(_run_one(policy, seed, tune, trace))
    else:
        # Slow policies first, so the pool does not end on one long straggler.
        ordered = sorted(jobs, key=lambda j: j[0] not in _SLOW_POLICIES)
        pool = multiprocessing.Pool(
            processes=min(workers, len(jobs)), initializer=_init_worker, initargs=(trace,)
        )
        try:
            for curve in pool.imap_unordered(_run_job, [(p, s, tune) for p, s in ordered]):
                record(curve)
            pool.close()
        except BaseException:
            pool.terminate()
            raise
        finally:
            pool.join()
    return [results[job] for job in jobs]
