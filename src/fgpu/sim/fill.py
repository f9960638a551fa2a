"""One run of the FGD fill experiment (fgd-protocol.md, "One run").

Pods arrive one at a time, in a shuffled and inflated order, and are placed with no
departures and no retries until 130 % (``tune``) of the cluster's GPU capacity has arrived.
After every pod the run records the arrived and allocated GPU and the cluster's
fragmentation, which :mod:`fgpu.sim.report` buckets into the published curves.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fgpu.model.types import Allocation, Node, Request
from fgpu.plugins import create_policy
from fgpu.sched.frag import FragmentationMeasure, TargetWorkload
from fgpu.sched.placer import Placer, seeded_rank
from fgpu.sched.state import ClusterState, IntArray, check_invariants

FloatArray = npt.NDArray[np.float64]
DEFAULT_TUNE = 1.3
_DRAW_BLOCK = 1024


@dataclass(frozen=True, slots=True)
class FillResult:
    """Per-pod measurements of one run; P = number of pods that arrived.

    Attributes:
        policy: policy name.
        seed: the run's seed.
        capacity_milli: cluster GPU capacity in milli-GPU.
        arrived_milli: int64[P] cumulative GPU request of all pods so far (failed included).
        allocated_milli: int64[P] GPU compute allocated after each pod.
        fragment_milli: float64[P] cluster fragmentation (sum of F_n) after each pod.
        failed: bool[P] pods that fit nowhere.
        elapsed_s: wall time of the placement loop in seconds.
    """

    policy: str
    seed: int
    capacity_milli: int
    arrived_milli: IntArray
    allocated_milli: IntArray
    fragment_milli: FloatArray
    failed: npt.NDArray[np.bool_]
    elapsed_s: float

    @property
    def failed_pods(self) -> int:
        """Number of pods that could not be placed."""
        return int(self.failed.sum())

    def arrived_pct(self) -> FloatArray:
        """float64[P] arrived GPU as % of capacity."""
        return 100.0 * self.arrived_milli / self.capacity_milli

    def allocated_pct(self) -> FloatArray:
        """float64[P] allocated GPU as % of capacity."""
        return 100.0 * self.allocated_milli / self.capacity_milli

    def fragment_pct(self) -> FloatArray:
        """float64[P] fragmentation amount as % of capacity."""
        return 100.0 * self.fragment_milli / self.capacity_milli

    def fragmentation_rate_pct(self) -> FloatArray:
        """float64[P] fragmentation / idle GPU, % (0 when nothing is idle)."""
        idle = self.capacity_milli - self.allocated_milli
        return np.where(idle > 0, 100.0 * self.fragment_milli / np.maximum(idle, 1), 0.0)


def arrival_order(
    requests: Sequence[Request], capacity_milli: int, rng: np.random.Generator, tune: float
) -> IntArray:
    """Pod order of one run: shuffle, then inflate or trim to ``tune`` x capacity.

    Steps 2-3 of the protocol: shuffle the name-sorted pods; then draw pods uniformly with
    replacement from the name-sorted list and append them after the shuffled originals
    while ``total + gpu_milli <= tune * capacity`` (the published stop test compares the
    per-GPU share; the total grows by ``gpu_count * gpu_milli``). When the originals already
    exceed the target, random pods are removed until the total is within it.

    Args:
        requests: P pods in name order.
        capacity_milli: cluster GPU capacity in milli-GPU.
        rng: the run's generator (used for the shuffle, then the draws).
        tune: target as a multiple of capacity (> 0).

    Returns:
        int64[P'] indices into ``requests``. Without any GPU pod the shuffled originals are
        returned as they are (inflation by GPU request would never end).
    """
    share = np.array([r.gpu_milli or 0 for r in requests], dtype=np.int64)
    amount = share * np.array([r.gpu_count for r in requests], dtype=np.int64)
    order = rng.permutation(len(requests)).astype(np.int64)
    target = tune * capacity_milli
    total = int(amount.sum())
    if total > target:
        keep = np.ones(order.size, dtype=np.bool_)
        while total > target:
            alive = np.flatnonzero(keep)
            victim = alive[rng.integers(alive.size)]
            keep[victim] = False
            total -= int(amount[order[victim]])
        return order[keep]
    if not (share > 0).any():
        return order  # no pod asks for GPU: nothing to inflate towards the target
    extra: list[IntArray] = []
    while True:
        draws = rng.integers(len(requests), size=_DRAW_BLOCK)
        before = total + np.cumsum(amount[draws]) - amount[draws]
        over = np.flatnonzero(before + share[draws] > target)
        if over.size:
            stop = int(over[0])
            extra.append(draws[:stop])
            break
        extra.append(draws)
        total = int(before[-1] + amount[draws[-1]])
    return np.concatenate([order, *extra]).astype(np.int64)


def run_fill(
    nodes: Sequence[Node],
    requests: Sequence[Request],
    policy: str,
    seed: int,
    target: TargetWorkload,
    tune: float = DEFAULT_TUNE,
    check: bool = False,
) -> FillResult:
    """Run the fill experiment once.

    Args:
        nodes: the cluster.
        requests: the pods in name order (the protocol sorts by name before shuffling).
        policy: a registered policy name.
        seed: seeds the run's only random generator, used in this order: shuffle, inflation,
            node tie-break rank, then the random policy's draws.
        target: the target workload for the fragmentation measure (and for ``fgd``).
        tune: arrived GPU at the end, as a multiple of capacity.
        check: debug mode: check the state invariants and recompute the whole cluster's
            fragmentation from scratch after every pod (slow).

    Raises:
        UnknownPolicyError: ``policy`` is not registered.
    """
    rng = np.random.default_rng(seed)
    state = ClusterState(nodes)
    capacity = state.gpu_capacity_milli
    order = arrival_order(requests, capacity, rng, tune)
    rank = seeded_rank(state.node_names, rng)
    placer = Placer(state, create_policy(policy, rng=rng, target=target), rank)
    measure = FragmentationMeasure(state.model_names, target)
    node_frag = measure.node_fragment(state.gpu_free_milli, state.cpu_free, state.node_model)
    frag_total = int(node_frag.sum())

    count = order.size
    arrived = np.empty(count, dtype=np.int64)
    allocated = np.empty(count, dtype=np.int64)
    fragment = np.empty(count, dtype=np.int64)
    failed = np.zeros(count, dtype=np.bool_)
    arrived_total = 0
    allocated_total = 0
    start = time.perf_counter()
    for step, index in enumerate(order.tolist()):
        request = requests[index]
        arrived_total += request.total_gpu_milli
        result = placer.place(request, explain=False)
        if isinstance(result, Allocation):
            allocated_total += sum(result.gpu_milli)
            n = result.node
            fresh = int(
                measure.node_fragment(
                    state.gpu_free_milli[n], state.cpu_free[n], state.node_model[n]
                )
            )
            frag_total += fresh - int(node_frag[n])
            node_frag[n] = fresh
        else:
            failed[step] = True
        arrived[step] = arrived_total
        allocated[step] = allocated_total
        fragment[step] = frag_total
        if check:
            check_invariants(state)
            full = measure.node_fragment(state.gpu_free_milli, state.cpu_free, state.node_model)
            if int(full.sum()) != frag_total:
                raise AssertionError(f"step {step}: incremental fragmentation drifted")
            if state.gpu_allocated_milli != allocated_total:
                raise AssertionError(f"step {step}: allocated milli drifted")
    elapsed = time.perf_counter() - start
    return FillResult(
        policy=policy,
        seed=seed,
        capacity_milli=capacity,
        arrived_milli=arrived,
        allocated_milli=allocated,
        fragment_milli=fragment / measure.total_weight,
        failed=failed,
        elapsed_s=elapsed,
    )
