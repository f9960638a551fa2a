"""Properties of the governor's planner over whole periods, on a virtual clock.

- strict: no strict workload receives more than its share of any period;
- fair: a workload busy for a whole period in which nobody changes activity receives at
  least its share of it, and the GPU is never left idle while a workload is busy;
- idle workloads are never frozen unless paused by priority.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fgpu.agent.governor.plan import (
    ComputeMode,
    GpuPolicy,
    PlannerConfig,
    PriorityPolicy,
    WorkloadState,
)
from fgpu.agent.governor.virtual import Activity, VirtualRun, run_virtual

MS = 1_000_000
PERIODS = 6


@st.composite
def configs(draw: st.DrawFn) -> PlannerConfig:
    lease = draw(st.sampled_from([1, 2, 5, 10, 25])) * MS
    period = lease * draw(st.integers(1, 10))
    min_lease = draw(st.sampled_from([0, MS // 2, MS]))
    return PlannerConfig(
        period_ns=period,
        lease_ns=lease,
        min_lease_ns=min(min_lease, lease),
        resume_after_ns=draw(st.sampled_from([0, 5, 30])) * MS,
    )


@st.composite
def share_sets(draw: st.DrawFn) -> list[int]:
    """1-4 shares (milli) adding up to at most 1000."""
    count = draw(st.integers(1, 4))
    shares: list[int] = []
    left = 1000
    for i in range(count):
        if left < 1:
            break
        low = 1
        high = left - (count - i - 1) if i < count - 1 else left
        shares.append(draw(st.integers(low, max(low, high))))
        left -= shares[-1]
    return shares


def names(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


@settings(max_examples=150, deadline=None)
@given(
    config=configs(),
    shares=share_sets(),
    priorities=st.lists(st.sampled_from([25, 50, 125]), min_size=4, max_size=4),
    policy=st.sampled_from(list(PriorityPolicy)),
    changes=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.booleans()), max_size=12
    ),
)
def test_strict_never_exceeds_its_share_of_a_period(
    config: PlannerConfig,
    shares: list[int],
    priorities: list[int],
    policy: PriorityPolicy,
    changes: list[tuple[int, int, bool]],
) -> None:
    ids = names(len(shares))
    gpus = {"g0": GpuPolicy(mode=ComputeMode.STRICT, priority_policy=policy)}
    workloads = [
        WorkloadState(workload_id=w, shares={"g0": s}, priority=p)
        for w, s, p in zip(ids, shares, priorities, strict=False)
    ]
    horizon = config.period_ns * PERIODS
    activity = [
        Activity(at * horizon // 10_000, ids[i % len(ids)], busy) for i, at, busy in changes
    ]
    run = run_virtual(config, gpus, workloads, horizon, activity)

    for period, used in run.used.items():
        for w, s in zip(ids, shares, strict=False):
            assert used[w] <= s * config.period_ns // 1000, (period, w)
    _assert_no_overlap(run)


@settings(max_examples=150, deadline=None)
@given(
    config=configs(),
    shares=share_sets(),
    busy_per_period=st.lists(
        st.lists(st.booleans(), min_size=4, max_size=4), min_size=PERIODS, max_size=PERIODS
    ),
)
def test_fair_gives_each_busy_workload_at_least_its_share(
    config: PlannerConfig,
    shares: list[int],
    busy_per_period: list[list[bool]],
) -> None:
    ids = names(len(shares))
    gpus = {"g0": GpuPolicy(mode=ComputeMode.FAIR)}
    workloads = [
        WorkloadState(workload_id=w, shares={"g0": s}, busy=busy_per_period[0][i])
        for i, (w, s) in enumerate(zip(ids, shares, strict=False))
    ]
    activity = [
        Activity(k * config.period_ns, w, busy_per_period[k][i])
        for k in range(1, PERIODS)
        for i, w in enumerate(ids)
    ]
    run = run_virtual(config, gpus, workloads, config.period_ns * PERIODS, activity)

    for k in range(PERIODS):
        used = run.used[k * config.period_ns]
        busy = [w for i, w in enumerate(ids) if busy_per_period[k][i]]
        for w, s in zip(ids, shares, strict=False):
            if w in busy:
                # A budget remainder under min_lease_ns may go to another workload.
                floor = s * config.period_ns // 1000 - config.min_lease_ns
                assert used[w] >= floor, (k, w, used)
        if busy:
            assert sum(used.values()) == config.period_ns, (k, used)
    _assert_work_conserving(run)
    _assert_no_overlap(run)


@settings(max_examples=150, deadline=None)
@given(
    config=configs(),
    shares=share_sets(),
    changes=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.booleans()), max_size=16
    ),
)
def test_fair_never_idles_while_someone_is_busy(
    config: PlannerConfig,
    shares: list[int],
    changes: list[tuple[int, int, bool]],
) -> None:
    ids = names(len(shares))
    gpus = {"g0": GpuPolicy(mode=ComputeMode.FAIR)}
    workloads = [
        WorkloadState(workload_id=w, shares={"g0": s}) for w, s in zip(ids, shares, strict=False)
    ]
    horizon = config.period_ns * PERIODS
    activity = [
        Activity(at * horizon // 10_000, ids[i % len(ids)], busy) for i, at, busy in changes
    ]
    run = run_virtual(config, gpus, workloads, horizon, activity)

    _assert_work_conserving(run)
    _assert_no_overlap(run)
    if len(ids) == 1:
        assert run.steps == []  # alone in fair mode: never frozen


def _assert_work_conserving(run: VirtualRun) -> None:
    for piece in run.slices:
        if piece.active:
            assert piece.running, piece


def _assert_no_overlap(run: VirtualRun) -> None:
    """Exclusive leases: at most one busy workload runs on the GPU at a time."""
    for piece in run.slices:
        assert len(piece.running) <= 1, piece
