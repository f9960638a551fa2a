"""The fill experiment: (policy, seed) runs in parallel processes, then the report.

``fgpu sim fill`` is a thin shell over :func:`run_experiment`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from fgpu.model.types import Node, Request
from fgpu.plugins import PUBLISHED_POLICIES, create_policy, policy_names
from fgpu.sched.frag import TargetWorkload
from fgpu.sim.fill import DEFAULT_TUNE, run_fill
from fgpu.sim.report import RunCurve
from fgpu.sim.trace import load_nodes, load_pods

TRACE_SUBDIR = Path("traces") / "alibaba-gpu-v2023" / "csv"
DEFAULT_NODES = "openb_node_list_gpu_node.csv"
DEFAULT_PODS = "openb_pod_list_default.csv"
_SEED_PART = re.compile(r"^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?$")


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
        """
        nodes = load_nodes(nodes_path)
        pods = load_pods(pods_path)
        order = sorted(range(len(pods.names)), key=pods.names.__getitem__)
        requests = tuple(pods.requests[i] for i in order)
        return cls(tuple(nodes), requests, TargetWorkload.from_requests(requests))


def find_trace_dir(start: Path | None = None) -> Path | None:
    """Locate the Alibaba trace CSVs: ``$FGPU_TRACE_DIR``, else ``shared/traces/...`` beside
    the current folder or any of its parents, or beside the installed source tree."""
    env = os.environ.get("FGPU_TRACE_DIR")
    if env:
        return Path(env)
    roots = [start or Path.cwd(), Path(__file__).resolve()]
    for root in roots:
        for folder in [root, *root.parents]:
            candidate = folder / "shared" / TRACE_SUBDIR
            if candidate.is_dir():
                return candidate
    return None


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
    order, drop repeats. No names means the published six.

    Raises:
        ExperimentError: an unknown name (the message lists the valid ones).
    """
    out: list[str] = []
    valid = policy_names()
    for name in names or ["published"]:
        group = {"all": valid, "published": list(PUBLISHED_POLICIES)}.get(name, [name])
        for item in group:
            if item not in valid:
                raise ExperimentError(
                    f"--policy: unknown policy {item!r}; valid: {', '.join(valid)}, "
                    "or all, published"
                )
            if item not in out:
                out.append(item)
    return out


_WORKER_TRACE: Trace | None = None


def _init_worker(trace: Trace) -> None:
    global _WORKER_TRACE
    _WORKER_TRACE = trace


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


def run_experiment(
    trace: Trace,
    policies: Sequence[str],
    seeds: Sequence[int],
    tune: float = DEFAULT_TUNE,
    workers: int | None = None,
    on_done: Callable[[RunCurve], None] | None = None,
) -> list[RunCurve]:
    """Run every (policy, seed) pair; in ``workers`` processes when more than one.

    Args:
        trace: the loaded trace.
        policies: registered policy names.
        seeds: seeds (one run each per policy).
        tune: arrived GPU at the end as a multiple of capacity, in (0, 10].
        workers: processes (default: CPU count); 1 runs in this process.
        on_done: called with each finished run (progress display).

    Returns:
        The runs ordered by policy (as given), then seed.

    Raises:
        ExperimentError: bad ``tune`` or ``workers``.
        UnknownPolicyError: an unregistered policy.
    """
    if not 0 < tune <= 10:
        raise ExperimentError(f"--tune: {tune} is outside (0, 10]")
    workers = workers if workers is not None else (os.cpu_count() or 1)
    if workers < 1:
        raise ExperimentError(f"--workers: {workers} must be at least 1")
    for name in policies:  # fail before starting any process
        create_policy(name, target=trace.target)
    jobs = [(p, s) for p in policies for s in seeds]
    results: dict[tuple[str, int], RunCurve] = {}
    if workers == 1 or len(jobs) <= 1:
        for policy, seed in jobs:
            curve = _run_one(policy, seed, tune, trace)
            results[policy, seed] = curve
            if on_done:
                on_done(curve)
    else:
        with ProcessPoolExecutor(
            max_workers=min(workers, len(jobs)), initializer=_init_worker, initargs=(trace,)
        ) as pool:
            # Slow policies first, so the pool does not end on one long straggler.
            ordered = sorted(jobs, key=lambda j: j[0] not in ("fgd", "fgd-exact"))
            pending: set[Future[RunCurve]] = {pool.submit(_run_one, p, s, tune) for p, s in ordered}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    curve = future.result()
                    results[curve.policy, curve.seed] = curve
                    if on_done:
                        on_done(curve)
    return [results[job] for job in jobs]
