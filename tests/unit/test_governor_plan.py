"""The governor's planner, step by step: exact freeze/thaw sequences on a virtual clock."""

from __future__ import annotations

import pytest

from fgpu.agent.governor.plan import (
    ComputeMode,
    Freeze,
    GpuPolicy,
    Lease,
    NodeState,
    PlannerConfig,
    PriorityPolicy,
    RunState,
    Thaw,
    WorkloadState,
    plan,
)
from fgpu.agent.governor.virtual import Activity, VirtualRun, run_virtual

MS = 1_000_000
CONFIG = PlannerConfig(
    period_ns=100 * MS,
    lease_ns=10 * MS,
    min_lease_ns=1 * MS,
    resume_after_ns=50 * MS,
)
SHARE = RunState.FROZEN_BY_SHARE
PRIO = RunState.FROZEN_BY_PRIORITY


def wl(name: str, shares: dict[str, int], **kw: object) -> WorkloadState:
    return WorkloadState(workload_id=name, shares=shares, **kw)  # type: ignore[arg-type]


def steps(run: VirtualRun, until_ms: int | None = None) -> list[tuple[float, list[str]]]:
    """Steps as ``(ms, ["freeze b (frozen-by-share)", "thaw a"])`` for readable asserts."""
    out: list[tuple[float, list[str]]] = []
    for step in run.steps:
        if until_ms is not None and step.at_ns >= until_ms * MS:
            break
        words = [
            f"freeze {a.workload_id} ({a.reason})"
            if isinstance(a, Freeze)
            else f"thaw {a.workload_id}"
            for a in step.actions
        ]
        out.append((step.at_ns / MS, words))
    return out


def used_ms(run: VirtualRun, period_ms: int) -> dict[str, float]:
    return {w: ns / MS for w, ns in run.used[period_ms * MS].items()}


def test_strict_700_300_exact_sequence() -> None:
    gpus = {"g0": GpuPolicy(mode=ComputeMode.STRICT)}
    run = run_virtual(CONFIG, gpus, [wl("a", {"g0": 700}), wl("b", {"g0": 300})], 200 * MS)

    assert steps(run, until_ms=100) == [
        (0.0, ["freeze b (frozen-by-share)"]),
        (10.0, ["freeze a (frozen-by-share)", "thaw b"]),
        (20.0, ["freeze b (frozen-by-share)", "thaw a"]),
        (40.0, ["freeze a (frozen-by-share)", "thaw b"]),
        (50.0, ["freeze b (frozen-by-share)", "thaw a"]),
        (70.0, ["freeze a (frozen-by-share)", "thaw b"]),
        (80.0, ["freeze b (frozen-by-share)", "thaw a"]),
    ]
    assert used_ms(run, 0) == {"a": 70.0, "b": 30.0}
    assert used_ms(run, 100) == {"a": 70.0, "b": 30.0}


def test_strict_alone_is_held_to_its_share() -> None:
    gpus = {"g0": GpuPolicy(mode=ComputeMode.STRICT)}
    run = run_virtual(CONFIG, gpus, [wl("a", {"g0": 400})], 200 * MS)

    assert steps(run) == [
        (40.0, ["freeze a (frozen-by-share)"]),
        (100.0, ["thaw a"]),
        (140.0, ["freeze a (frozen-by-share)"]),
    ]
    assert used_ms(run, 100) == {"a": 40.0}


def test_fair_500_300_200_with_one_idle() -> None:
    gpus = {"g0": GpuPolicy(mode=ComputeMode.FAIR)}
    workloads = [
        wl("a", {"g0": 500}),
        wl("b", {"g0": 300}),
        wl("c", {"g0": 200}, busy=False),
    ]
    run = run_virtual(CONFIG, gpus, workloads, 200 * MS)

    # The idle workload's 200 goes to a and b as 5:3: 62.5 ms and 37.5 ms per period.
    assert steps(run, until_ms=100) == [
        (0.0, ["freeze b (frozen-by-share)"]),
        (10.0, ["freeze a (frozen-by-share)", "thaw b"]),
        (20.0, ["freeze b (frozen-by-share)", "thaw a"]),
        (30.0, ["freeze a (frozen-by-share)", "thaw b"]),
        (40.0, ["freeze b (frozen-by-share)", "thaw a"]),
        (60.0, ["freeze a (frozen-by-share)", "thaw b"]),
        (70.0, ["freeze b (frozen-by-share)", "thaw a"]),
        (90.0, ["freeze a (frozen-by-share)", "thaw b"]),
        (97.5, ["freeze b (frozen-by-share)", "thaw a"]),
    ]
    assert used_ms(run, 0) == {"a": 62.5, "b": 37.5, "c": 0.0}
    assert used_ms(run, 100) == {"a": 62.5, "b": 37.5, "c": 0.0}
    assert all(a.workload_id != "c" for s in run.steps for a in s.actions)


def test_fair_alone_is_never_frozen() -> None:
    gpus = {"g0": GpuPolicy(mode=ComputeMode.FAIR)}
    run = run_virtual(
        CONFIG,
        gpus,
        [wl("a", {"g0": 100})],
        500 * MS,
        [Activity(120 * MS, "a", False), Activity(260 * MS, "a", True)],
    )

    assert run.steps == []
    assert used_ms(run, 0) == {"a": 100.0}
    assert used_ms(run, 100) == {"a": 20.0}


def test_priority_pause_and_resume_after_hysteresis() -> None:
    gpus = {"g0": GpuPolicy(priority_policy=PriorityPolicy.PAUSE)}
    workloads = [
        wl("low", {"g0": 500}),
        wl("high", {"g0": 500}, priority=125, busy=False),
    ]
    activity = [
        Activity(30 * MS, "high", True),
        Activity(60 * MS, "high", False),  # idle from 60: low resumes at 60 + 50
        Activity(200 * MS, "high", True),
        Activity(205 * MS, "high", False),
    ]
    run = run_virtual(CONFIG, gpus, workloads, 300 * MS, activity)

    assert steps(run) == [
        (30.0, ["freeze low (frozen-by-priority)"]),
        (110.0, ["thaw low"]),
        (200.0, ["freeze low (frozen-by-priority)"]),
        (255.0, ["thaw low"]),
    ]
    pause = run.steps[0].actions[0]
    assert isinstance(pause, Freeze)
    assert pause.message == "paused: high (priority 125) is busy on g0"
    resume = run.steps[1].actions[0]
    assert isinstance(resume, Thaw)
    assert resume.message.startswith("resumed")
    assert used_ms(run, 0) == {"low": 30.0, "high": 30.0}


def test_pause_freezes_an_idle_lower_priority_workload_too() -> None:
    gpus = {"g0": GpuPolicy()}
    workloads = [wl("low", {"g0": 500}, busy=False), wl("high", {"g0": 500}, priority=100)]
    decided = plan(0, NodeState(config=CONFIG, gpus=gpus, workloads=workloads, period_start_ns=0))

    assert decided.actions == (Freeze("low", PRIO, "paused: high (priority 100) is busy on g0"),)


def test_compress_holds_lower_priority_to_the_floor() -> None:
    gpus = {"g0": GpuPolicy(priority_policy=PriorityPolicy.COMPRESS, floor_milli=100)}
    workloads = [wl("low", {"g0": 600}), wl("high", {"g0": 400}, priority=125)]
    run = run_virtual(CONFIG, gpus, workloads, 200 * MS)

    assert steps(run) == [
        (0.0, ["freeze low (frozen-by-priority)"]),
        (90.0, ["freeze high (frozen-by-share)", "thaw low"]),
        (100.0, ["freeze low (frozen-by-priority)", "thaw high"]),
        (190.0, ["freeze high (frozen-by-share)", "thaw low"]),
    ]
    assert used_ms(run, 0) == {"low": 10.0, "high": 90.0}
    first = run.steps[0].actions[0]
    assert isinstance(first, Freeze)
    assert first.message == "compressed to 100 milli: high (priority 125) is busy on g0"


def test_two_gpu_workload_is_frozen_as_a_unit() -> None:
    gpus = {"g0": GpuPolicy(), "g1": GpuPolicy()}
    workloads = [
        wl("a", {"g0": 500}),
        wl("gang", {"g0": 500, "g1": 500}),
        wl("h", {"g1": 500}, priority=125, busy=False),
    ]
    activity = [Activity(35 * MS, "h", True), Activity(75 * MS, "h", False)]
    run = run_virtual(CONFIG, gpus, workloads, 200 * MS, activity)

    assert steps(run, until_ms=140) == [
        # gang needs g0 and g1 at once; a holds g0, so gang waits (g1 stays unused).
        (0.0, ["freeze gang (frozen-by-share)"]),
        (10.0, ["freeze a (frozen-by-share)", "thaw gang"]),
        (20.0, ["freeze gang (frozen-by-share)", "thaw a"]),
        (30.0, ["freeze a (frozen-by-share)", "thaw gang"]),
        # h is busy on g1 only, yet gang stops on both GPUs; a gets g0 at once.
        (35.0, ["freeze gang (frozen-by-priority)", "thaw a"]),
        # h idle from 75: gang resumes at 125 but waits for a's lease on g0 to end.
        (125.0, ["freeze gang (frozen-by-share)"]),
        (130.0, ["freeze a (frozen-by-share)", "thaw gang"]),
    ]
    assert used_ms(run, 0) == {"a": 85.0, "gang": 15.0, "h": 40.0}
    assert used_ms(run, 100) == {"a": 50.0, "gang": 50.0, "h": 0.0}


def test_a_gang_lease_covers_all_its_gpus() -> None:
    gpus = {"g0": GpuPolicy(), "g1": GpuPolicy()}
    workloads = [wl("gang", {"g0": 300, "g1": 300})]
    decided = plan(0, NodeState(config=CONFIG, gpus=gpus, workloads=workloads, period_start_ns=0))

    assert decided.leases == {"g0": Lease("gang", 10 * MS), "g1": Lease("gang", 10 * MS)}
    assert decided.actions == ()


def test_higher_priority_ends_a_lower_lease_at_once() -> None:
    gpus = {"g0": GpuPolicy(priority_policy=PriorityPolicy.COMPRESS)}
    workloads = [
        wl("low", {"g0": 500}, state=RunState.RUNNING, used_ns=2 * MS),
        wl("high", {"g0": 500}, priority=125, state=RunState.FROZEN_BY_SHARE),
    ]
    state = NodeState(
        config=CONFIG,
        gpus=gpus,
        workloads=workloads,
        period_start_ns=0,
        leases={"g0": Lease("low", 10 * MS)},
    )
    decided = plan(3 * MS, state)

    assert [type(a).__name__ for a in decided.actions] == ["Freeze", "Thaw"]
    assert decided.leases["g0"].workload_id == "high"
    assert decided.states == {"low": PRIO, "high": RunState.RUNNING}


def test_wake_is_the_earliest_of_lease_end_period_end_and_hysteresis() -> None:
    gpus = {"g0": GpuPolicy(mode=ComputeMode.STRICT)}
    alone = NodeState(config=CONFIG, gpus=gpus, workloads=[wl("a", {"g0": 30})], period_start_ns=0)
    assert plan(0, alone).wake_ns == 3 * MS  # a's budget of 3 ms ends its lease
    spent = NodeState(
        config=CONFIG, gpus=gpus, workloads=[wl("a", {"g0": 30}, used_ns=3 * MS)], period_start_ns=0
    )
    assert plan(5 * MS, spent).wake_ns == 100 * MS  # budget used: next period

    paused = NodeState(
        config=CONFIG,
        gpus=gpus,
        workloads=[
            wl("a", {"g0": 30}),
            wl("h", {"g0": 10}, priority=125, busy=False, idle_since_ns=0),
        ],
        period_start_ns=0,
    )
    decided = plan(0, paused)
    assert decided.states["a"] is PRIO  # h went idle at 0: hysteresis until 50 ms
    assert decided.wake_ns == 50 * MS
    assert decided.blockers["a"] == "paused: h (priority 125) was busy on g0 less than 50 ms ago"
    assert plan(50 * MS, paused).states["a"] is RunState.RUNNING


def test_a_new_period_starts_counting_afresh() -> None:
    gpus = {"g0": GpuPolicy(mode=ComputeMode.STRICT)}
    spent = wl("a", {"g0": 500}, used_ns=50 * MS, state=SHARE)
    state = NodeState(config=CONFIG, gpus=gpus, workloads=[spent], period_start_ns=0)

    assert plan(99 * MS, state).states["a"] is SHARE
    fresh = plan(230 * MS, state)
    assert fresh.period_start_ns == 200 * MS
    assert fresh.actions == (Thaw("a", "lease granted"),)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"period_ns": 0}, "positive"),
        ({"period_ns": 100, "lease_ns": 30}, "divide"),
        ({"min_lease_ns": 20 * MS}, "min_lease_ns"),
        ({"resume_after_ns": -1}, "negative"),
    ],
    ids=["zero-period", "lease-not-dividing", "min-lease-too-long", "negative-hysteresis"],
)
def test_config_rejects_bad_constants(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlannerConfig(**kwargs)


def test_plan_rejects_unknown_gpu_and_duplicate_ids() -> None:
    gpus = {"g0": GpuPolicy()}
    with pytest.raises(ValueError, match="unknown GPU"):
        plan(
            0,
            NodeState(config=CONFIG, gpus=gpus, workloads=[wl("a", {"gX": 1})], period_start_ns=0),
        )
    twice = [wl("a", {"g0": 1}), wl("a", {"g0": 2})]
    with pytest.raises(ValueError, match="twice"):
        plan(0, NodeState(config=CONFIG, gpus=gpus, workloads=twice, period_start_ns=0))
    with pytest.raises(ValueError, match="share"):
        wl("a", {"g0": 0})


def test_a_squeezed_workload_is_paused_while_its_squeezer_is_busy() -> None:
    # the trial's case: two low jobs at 500, one squeezed by a critical 500 (1500 in all)
    gpus = {"g0": GpuPolicy()}
    workloads = [
        wl("low1", {"g0": 500}, priority=25),
        wl("low2", {"g0": 500}, priority=25, squeezed_by=frozenset({"crit"})),
        wl("crit", {"g0": 500}, priority=125),
    ]
    activity = [Activity(40 * MS, "crit", False), Activity(300 * MS, "crit", True)]
    run = run_virtual(CONFIG, gpus, workloads, 400 * MS, activity)

    first = run.steps[0]
    assert first.at_ns == 0
    assert first.actions == (
        Freeze("low1", PRIO, "paused: crit (priority 125) is busy on g0"),
        Freeze("low2", PRIO, "paused: squeezed by crit, which is busy on g0"),
    )
    # crit idle from 40 ms: both run after the 50 ms hysteresis, taking turns on their
    # shares (the squeezed one's 500 is its own again), until crit is busy again at 300 ms
    assert steps(run)[1:3] == [
        (90.0, ["freeze low2 (frozen-by-share)", "thaw low1"]),
        (110.0, ["freeze low1 (frozen-by-share)", "thaw low2"]),
    ]
    assert steps(run)[-1] == (
        300.0,
        ["freeze low1 (frozen-by-priority)", "freeze low2 (frozen-by-priority)"],
    )
    assert used_ms(run, 0) == {"low1": 10.0, "low2": 0.0, "crit": 40.0}
    assert used_ms(run, 100) == used_ms(run, 200) == {"low1": 50.0, "low2": 50.0, "crit": 0.0}
    assert used_ms(run, 300) == {"low1": 0.0, "low2": 0.0, "crit": 100.0}


def test_a_squeeze_pauses_whatever_the_priorities_and_only_the_squeezed() -> None:
    # the squeezer is not of a higher priority here: only the squeeze holds "v" back
    gpus = {"g0": GpuPolicy()}
    workloads = [
        wl("v", {"g0": 600}, squeezed_by=frozenset({"s", "gone"})),
        wl("other", {"g0": 400}),
        wl("s", {"g0": 600}),
    ]
    decided = plan(0, NodeState(config=CONFIG, gpus=gpus, workloads=workloads, period_start_ns=0))
    assert decided.states["v"] is PRIO
    assert decided.blockers == {"v": "paused: squeezed by s, which is busy on g0"}
    assert decided.states["other"] is not PRIO
    # the squeezer idle past the hysteresis: the squeezed one runs on its share again
    idle = [
        workloads[0],
        workloads[1],
        wl("s", {"g0": 600}, busy=False, idle_since_ns=0),
    ]
    later = NodeState(config=CONFIG, gpus=gpus, workloads=idle, period_start_ns=0)
    assert plan(10 * MS, later).blockers == {
        "v": "paused: squeezed by s, which was busy on g0 less than 50 ms ago"
    }
    assert plan(50 * MS, later).states["v"] is not PRIO
    assert "v" not in plan(50 * MS, later).blockers


def test_compress_holds_a_squeezed_workload_to_the_floor() -> None:
    gpus = {"g0": GpuPolicy(priority_policy=PriorityPolicy.COMPRESS, floor_milli=100)}
    workloads = [
        wl("v", {"g0": 500}, squeezed_by=frozenset({"s"})),
        wl("keep", {"g0": 500}),
        wl("s", {"g0": 500}),
    ]
    run = run_virtual(CONFIG, gpus, workloads, 100 * MS)
    used = used_ms(run, 0)
    assert used["v"] == 10.0  # the floor: 100 milli of the period
    assert used["keep"] + used["s"] == 90.0
    assert (
        Freeze("v", PRIO, "compressed to 100 milli: squeezed by s, which is busy on g0")
        in run.steps[0].actions
    )


# -- borrowed work never outranks work within its quota (issue 25) ----------------------


def test_borrowed_higher_priority_does_not_pause_in_quota_work() -> None:
    # the case: bob's low-priority work within team-a's quota, alice's normal work
    # on capacity team-b borrows; both busy on one GPU in fair mode with pause
    gpus = {"g0": GpuPolicy(priority_policy=PriorityPolicy.PAUSE)}
    workloads = [
        wl("bob", {"g0": 500}, priority=25),
        wl("alice", {"g0": 500}, priority=50, borrowed=True),
    ]
    run = run_virtual(CONFIG, gpus, workloads, 200 * MS)

    assert all(
        not (isinstance(a, Freeze) and a.reason is PRIO) for step in run.steps for a in step.actions
    )
    assert used_ms(run, 0) == {"bob": 50.0, "alice": 50.0}
    assert used_ms(run, 100) == {"bob": 50.0, "alice": 50.0}
    decided = plan(0, NodeState(config=CONFIG, gpus=gpus, workloads=workloads, period_start_ns=0))
    assert decided.blockers == {}


def test_the_same_pair_without_borrowing_pauses_the_lower_priority() -> None:
    # the control: the very same workloads, alice within quota, keep the priority rule
    gpus = {"g0": GpuPolicy(priority_policy=PriorityPolicy.PAUSE)}
    workloads = [wl("bob", {"g0": 500}, priority=25), wl("alice", {"g0": 500}, priority=50)]
    decided = plan(0, NodeState(config=CONFIG, gpus=gpus, workloads=workloads, period_start_ns=0))

    assert decided.states == {"bob": PRIO, "alice": RunState.RUNNING}
    assert decided.blockers == {"bob": "paused: alice (priority 50) is busy on g0"}


def test_borrowed_higher_priority_does_not_compress_in_quota_work() -> None:
    gpus = {"g0": GpuPolicy(priority_policy=PriorityPolicy.COMPRESS, floor_milli=100)}
    workloads = [
        wl("low", {"g0": 600}, priority=25),
        wl("high", {"g0": 400}, priority=125, borrowed=True),
    ]
    run = run_virtual(CONFIG, gpus, workloads, 100 * MS)

    assert used_ms(run, 0) == {"low": 60.0, "high": 40.0}
    assert all(
        not (isinstance(a, Freeze) and a.reason is PRIO) for step in run.steps for a in step.actions
    )


def test_borrowed_work_is_still_paused_by_higher_in_quota_work() -> None:
    gpus = {"g0": GpuPolicy()}
    workloads = [
        wl("lent", {"g0": 500}, priority=50, borrowed=True),
        wl("own", {"g0": 500}, priority=100),
    ]
    decided = plan(0, NodeState(config=CONFIG, gpus=gpus, workloads=workloads, period_start_ns=0))

    assert decided.states == {"lent": PRIO, "own": RunState.RUNNING}
    assert decided.blockers == {"lent": "paused: own (priority 100) is busy on g0"}


def test_a_fair_holder_alone_on_its_gpu_wakes_the_loop_only_at_the_period_end() -> None:
    """Its lease renewal changes nothing, so the loop sleeps to the period's end (a loop
    that woke at every 10 ms lease end cost ~4 % of a core per node for one workload);
    a strict holder alone still wakes at its budget's end, a fair one with a neighbour
    at its lease's end."""
    fair = {"g0": GpuPolicy(mode=ComputeMode.FAIR)}
    alone = NodeState(config=CONFIG, gpus=fair, workloads=[wl("a", {"g0": 300})], period_start_ns=0)
    decided = plan(0, alone)
    assert decided.leases["g0"].workload_id == "a"
    assert decided.leases["g0"].until_ns == 10 * MS  # it still holds a lease
    assert decided.wake_ns == 100 * MS
    # the lease ran out while the loop slept: the next plan gives it again, nothing frozen
    later = NodeState(
        config=CONFIG,
        gpus=fair,
        workloads=[wl("a", {"g0": 300}, used_ns=40 * MS)],
        period_start_ns=0,
        leases=dict(decided.leases),
    )
    again = plan(60 * MS, later)
    assert again.actions == ()
    assert again.leases["g0"].workload_id == "a"
    assert again.wake_ns == 100 * MS

    strict = {"g0": GpuPolicy(mode=ComputeMode.STRICT)}
    held = NodeState(
        config=CONFIG, gpus=strict, workloads=[wl("a", {"g0": 300})], period_start_ns=0
    )
    assert plan(0, held).wake_ns == 10 * MS
    shared = NodeState(
        config=CONFIG,
        gpus=fair,
        workloads=[wl("a", {"g0": 300}), wl("b", {"g0": 700}, busy=False)],
        period_start_ns=0,
    )
    assert plan(0, shared).wake_ns == 10 * MS


def test_among_borrowed_work_the_priority_rule_is_unchanged() -> None:
    gpus = {"g0": GpuPolicy()}
    workloads = [
        wl("low", {"g0": 500}, priority=25, borrowed=True),
        wl("high", {"g0": 500}, priority=50, borrowed=True),
    ]
    decided = plan(0, NodeState(config=CONFIG, gpus=gpus, workloads=workloads, period_start_ns=0))

    assert decided.states == {"low": PRIO, "high": RunState.RUNNING}
    assert decided.blockers == {"low": "paused: high (priority 50) is busy on g0"}


def test_in_quota_work_is_blocked_by_the_highest_in_quota_holder_only() -> None:
    # "mid" is within quota; the borrowed "top" does not count for it, "high" does
    gpus = {"g0": GpuPolicy()}
    workloads = [
        wl("mid", {"g0": 300}, priority=50),
        wl("high", {"g0": 300}, priority=100),
        wl("top", {"g0": 300}, priority=125, borrowed=True),
    ]
    decided = plan(0, NodeState(config=CONFIG, gpus=gpus, workloads=workloads, period_start_ns=0))

    assert decided.blockers == {"mid": "paused: high (priority 100) is busy on g0"}
    assert decided.states["top"] is not PRIO
    assert decided.states["high"] is not PRIO


def test_borrowed_higher_priority_does_not_end_an_in_quota_lease() -> None:
    gpus = {"g0": GpuPolicy()}
    workloads = [
        wl("low", {"g0": 500}, priority=25, state=RunState.RUNNING, used_ns=2 * MS),
        wl("high", {"g0": 500}, priority=125, borrowed=True, state=SHARE),
    ]
    state = NodeState(
        config=CONFIG,
        gpus=gpus,
        workloads=workloads,
        period_start_ns=0,
        leases={"g0": Lease("low", 10 * MS)},
    )
    decided = plan(3 * MS, state)

    assert decided.actions == ()
    assert decided.leases["g0"] == Lease("low", 10 * MS)
    assert decided.states == {"low": RunState.RUNNING, "high": SHARE}
