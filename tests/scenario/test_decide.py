"""The decision core's rules as readable scenarios: cluster, queues, running and pending
work -> the exact actions (DESIGN.md section 5, issue "Queues, fair share, preemption")."""

from __future__ import annotations

from fgpu.sched.decide import OutsideUse, SchedulerConfig
from fgpu.sched.workload import Place, Preempt, QueueSpec, QueueTree, Resources, Wait
from tests.builders import cluster, node, pod
from tests.shell import Shell


def gpus(n: float) -> Resources:
    return Resources(gpu_milli=round(n * 1000))


def two_queues(**kw: object) -> QueueTree:
    return QueueTree([QueueSpec("a", **kw), QueueSpec("b", **kw)])  # type: ignore[arg-type]


def actions(decision) -> list[tuple[str, ...]]:  # type: ignore[no-untyped-def]
    out: list[tuple[str, ...]] = []
    for a in decision.actions:
        if isinstance(a, Place):
            out.append(("place", a.workload, a.allocation.node_name, str(a.allocation.gpus)))
        elif isinstance(a, Preempt):
            out.append(("preempt", a.victim, a.preemptor, a.kind))
        else:
            out.append(("wait", a.workload))
    return out


def test_equal_weights_converge_to_half_each_after_one_queue_was_idle() -> None:
    # a borrowed all four GPUs while b was idle; b now wants four.
    sh = Shell(cluster(node("n1").gpus(4)), two_queues())
    for i in range(4):
        sh.run(f"a{i}", "a", pod().gpu(1).build(), 0, [i], started=float(i))
        sh.submit(f"b{i}", "b", pod().gpu(1).build(), at=10.0 + i)
    first = sh.round()
    assert first.fair_share["a"] == gpus(2)
    assert first.fair_share["b"] == gpus(2)
    # the two most recently started of a make room, for b0 and b1 (one hold each)
    assert actions(first) == [
        ("preempt", "a3", "b0", "reclaim"),
        ("wait", "b0"),
        ("preempt", "a2", "b1", "reclaim"),
        ("wait", "b1"),
        ("wait", "b2"),
        ("wait", "b3"),
    ]
    for _ in range(10):
        sh.round()
    assert sh.running("a") == ["a0", "a1"]
    assert sh.running("b") == ["b0", "b1"]
    assert sh.evictions() == 2  # and then nothing moves


def test_weight_zero_queue_keeps_its_quota_while_weight_one_borrows() -> None:
    queues = QueueTree(
        [
            QueueSpec("zero", quota=gpus(1), over_quota_weight=0),
            QueueSpec("one", over_quota_weight=1),
        ]
    )
    sh = Shell(cluster(node("n1").gpus(4)), queues)
    for i in range(4):
        sh.submit(f"z{i}", "zero", pod().gpu(1).build(), at=float(i))
        sh.submit(f"o{i}", "one", pod().gpu(1).build(), at=float(i))
    d = sh.round()
    assert d.fair_share["zero"] == gpus(1)
    assert d.fair_share["one"] == gpus(3)
    assert sh.running("zero") == ["z0"]
    assert sh.running("one") == ["o0", "o1", "o2"]
    # when the weighted queue wants nothing more, the surplus goes to the weight-0 queue
    for i in range(3):
        sh.finish(f"o{i}")
    sh.finish("o3")
    d = sh.round()
    assert d.fair_share["zero"] == gpus(4)
    assert sh.running("zero") == ["z0", "z1", "z2", "z3"]


def test_whole_gpu_preemptor_takes_both_shares_of_one_gpu_not_one_of_each() -> None:
    # two GPUs, each with 0.5 + 0.5 low-priority work, started interleaved so that "most
    # recently started first" alone would pick one workload on each GPU.
    sh = Shell(cluster(node("n1").gpus(2)), QueueTree.single())
    half = pod().gpu(0.5).build()
    sh.run("g0-old", "default", half, 0, [0], priority=40, started=1.0)
    sh.run("g1-old", "default", half, 0, [1], priority=40, started=2.0)
    sh.run("g0-new", "default", half, 0, [0], priority=40, started=3.0)
    sh.run("g1-new", "default", half, 0, [1], priority=40, started=4.0)
    sh.submit("urgent", "default", pod().gpu(1).build(), priority=100, preemptible=True)
    d = sh.round()
    assert actions(d) == [
        ("preempt", "g1-new", "urgent", "preemption"),
        ("preempt", "g1-old", "urgent", "preemption"),
        ("wait", "urgent"),
    ]
    assert d.holds["urgent"].gpus == (1,)
    d = sh.round()
    assert actions(d) == [("place", "urgent", "n1", "(1,)"), ("wait", "g1-old"), ("wait", "g1-new")]


def test_non_preemptible_two_gpus_at_0_6_does_not_start_in_a_queue_with_quota_1() -> None:
    queues = QueueTree([QueueSpec("q", quota=gpus(1))])
    sh = Shell(cluster(node("n1").gpus(4)), queues)
    sh.submit("np", "q", pod().gpus(2, 0.6).build(), priority=100)
    d = sh.round()
    assert d.actions == [
        Wait(
            "np",
            "non-preemptible work must stay within the quota of queue q (quota 1.0 "
            "GPUs, in use 0.0, needs 1.2)",
        )
    ]
    # the same shape as preemptible work starts
    sh.submit("p", "q", pod().gpus(2, 0.6).build(), priority=50)
    assert ("place", "p", "n1", "(0, 1)") in actions(sh.round())


def thrash_setup(config: SchedulerConfig) -> Shell:
    # one GPU, two equal queues without quota: fair share 0.5 each, but work comes in 0.6
    sh = Shell(cluster(node("n1").gpus(1)), two_queues(), config)
    sh.run("a0", "a", pod().gpu(0.6).build(), 0, [0], started=0.0)
    sh.submit("b0", "b", pod().gpu(0.6).build(), at=1.0)
    return sh


def test_no_evict_readmit_cycle_over_50_rounds() -> None:
    sh = thrash_setup(SchedulerConfig(preempt_delay_s=0.0))
    for _ in range(50):
        sh.round()
    # b would exceed its fair share (0 + 600 > 500) by reclaiming: it waits instead
    assert sh.evictions() == 0
    assert sh.running() == ["a0"]


def test_the_naive_reclaim_rule_loops_in_the_same_setup() -> None:
    sh = thrash_setup(SchedulerConfig(reclaim_within_fair_share=False, preempt_delay_s=0.0))
    for _ in range(50):
        sh.round()
    assert sh.evictions() >= 20  # a and b keep evicting each other


def test_in_quota_work_of_a_lower_priority_queue_is_not_reclaimed() -> None:
    queues = QueueTree(
        [
            QueueSpec("low", quota=gpus(2), priority=0),
            QueueSpec("high", quota=gpus(2), priority=10),
        ]
    )
    sh = Shell(cluster(node("n1").gpus(4)), queues)
    for i in range(3):  # low borrowed a third GPU while high was idle
        sh.run(f"l{i}", "low", pod().gpu(1).build(), 0, [i], started=float(i))
    sh.run("h0", "high", pod().gpu(1).build(), 0, [3])
    for i in range(1, 4):
        sh.submit(f"h{i}", "high", pod().gpu(1).build(), at=5.0 + i)
    d = sh.round()
    assert d.fair_share["low"] == gpus(2)
    assert d.fair_share["high"] == gpus(2)
    # only the borrowed GPU comes back: low keeps its quota although high has priority
    assert [a for a in actions(d) if a[0] == "preempt"] == [("preempt", "l2", "h1", "reclaim")]
    for _ in range(5):
        sh.round()
    assert sh.running("low") == ["l0", "l1"]
    assert sh.running("high") == ["h0", "h1"]


def test_min_runtime_protects_young_workloads() -> None:
    sh = Shell(
        cluster(node("n1").gpus(1)),
        QueueTree.single(),
        SchedulerConfig(min_runtime_s=60, preempt_delay_s=0.0),
    )
    sh.run("young", "default", pod().gpu(1).build(), 0, [0], priority=40, started=100.0)
    sh.submit("urgent", "default", pod().gpu(1).build(), priority=90)
    sh.now = 130.0
    assert [a[0] for a in actions(sh.round())] == ["wait"]
    sh.now = 161.0
    assert actions(sh.round())[0] == ("preempt", "young", "urgent", "preemption")


def test_preemption_only_takes_strictly_lower_priority_preemptible_work() -> None:
    sh = Shell(cluster(node("n1").gpus(2)), QueueTree.single())
    sh.run("same", "default", pod().gpu(1).build(), 0, [0], priority=50)
    sh.run("guarded", "default", pod().gpu(1).build(), 0, [1], priority=40, preemptible=False)
    sh.submit("new", "default", pod().gpu(1).build(), priority=50)
    d = sh.round()
    assert actions(d) == [("wait", "new")]
    assert "insufficient GPU" in d.actions[0].reason  # type: ignore[union-attr]


def test_queue_limit_is_a_reason() -> None:
    queues = QueueTree([QueueSpec("capped", limit=gpus(1))])
    sh = Shell(cluster(node("n1").gpus(4)), queues)
    sh.submit("one", "capped", pod().gpu(1).build(), at=0.0)
    sh.submit("two", "capped", pod().gpu(1).build(), at=1.0)
    d = sh.round()
    assert d.actions[0] == Place("one", d.actions[0].allocation)  # type: ignore[union-attr]
    assert d.actions[1] == Wait("two", "queue capped would exceed its limit (2.0 > 1.0 GPUs)")


def stream(config: SchedulerConfig) -> tuple[Shell, float | None]:
    """A 4-GPU job against an endless stream of 0.5-GPU jobs (each runs 300 s, two
    arrive every 60 s) on one 4-GPU node; returns when the big job started."""
    sh = Shell(cluster(node("n1").gpus(4)), QueueTree.single(), config)
    ends: dict[str, float] = {}
    started = None
    n = 0
    for step in range(0, 7200, 60):
        sh.now = float(step)
        for wid, end in list(ends.items()):
            if end <= sh.now:
                sh.finish(wid)
                del ends[wid]
        for _ in range(2):
            sh.submit(f"s{n}", "default", pod().gpu(0.5).build())
            n += 1
        if step == 0:  # the big job arrives just after the first two small ones
            sh.submit("big", "default", pod().gpu(4).build(), at=0.5)
        d = sh.round()
        for a in d.actions:
            if isinstance(a, Place) and a.workload != "big":
                ends[a.workload] = sh.now + 300
            if isinstance(a, Place) and a.workload == "big":
                started = sh.now
        if started is not None:
            break
    return sh, started


def test_large_workload_starves_behind_small_ones_without_reservation() -> None:
    _, started = stream(SchedulerConfig())
    assert started is None  # two hours and the node never drains


def test_reservation_starts_the_large_workload_in_bounded_time() -> None:
    sh, started = stream(SchedulerConfig(reservation_after_s=600))
    assert started is not None
    # reserved at 600 s; the node drains within one small-job lifetime (300 s)
    assert 600 <= started <= 600 + 300 + 60
    assert any(h.is_reservation for d in sh.log for h in d.holds.values())


def test_aging_moves_a_waiting_workload_ahead_in_its_queue() -> None:
    config = SchedulerConfig(aging_interval_s=60, aging_step=5, aging_max=30)
    sh = Shell(cluster(node("n1").gpus(1)), QueueTree.single(), config)
    sh.run("busy", "default", pod().gpu(1).build(), 0, [0], priority=100, preemptible=False)
    sh.submit("old-low", "default", pod().gpu(1).build(), priority=40, at=0.0)
    sh.submit("new-normal", "default", pod().gpu(1).build(), priority=50, at=590.0)
    sh.now = 600.0  # old-low waited 10 intervals: 40 + 30 (capped) = 70 > 50
    sh.finish("busy")
    d = sh.round()
    assert actions(d)[0] == ("place", "old-low", "n1", "(0,)")


def test_quotas_above_capacity_are_reported_and_scaled() -> None:
    queues = QueueTree([QueueSpec("a", quota=gpus(3)), QueueSpec("b", quota=gpus(1))])
    sh = Shell(cluster(node("n1").gpus(2)), queues)
    for i in range(3):
        sh.submit(f"a{i}", "a", pod().gpu(1).build(), at=float(i))
    sh.submit("b0", "b", pod().gpu(1).build())
    d = sh.round()
    assert any("quotas add up to 4 GPUs" in w for w in d.warnings)
    # guarantees 3000 + 1000 > 2000: scaled in proportion to quota -> 1500 and 500
    assert d.fair_share["a"] == Resources(1500, 0, 0)
    assert d.fair_share["b"] == Resources(500, 0, 0)


def outside_round(sh: Shell, outside: OutsideUse):  # type: ignore[no-untyped-def]
    """One decision with use outside the cluster state (the service's MIG instances)."""
    return sh.scheduler.decide(
        sh.now, sh.state, sh.queues, list(sh.workloads.values()), sh.holds, outside
    )


def test_use_outside_the_cluster_counts_against_the_queue_limit() -> None:
    queues = QueueTree([QueueSpec("capped", limit=gpus(1))])
    sh = Shell(cluster(node("n1").gpus(4)), queues)
    sh.submit("half", "capped", pod().gpu(0.5).build())
    assert actions(outside_round(sh, OutsideUse())) == [("place", "half", "n1", "(0,)")]
    d = outside_round(sh, OutsideUse(gpus(1), {"capped": gpus(0.6)}))
    assert d.actions == [Wait("half", "queue capped would exceed its limit (1.1 > 1.0 GPUs)")]
    assert d.allocated["capped"] == gpus(0.6)


def test_use_outside_the_cluster_shapes_fair_share_and_order() -> None:
    sh = Shell(cluster(node("n1").gpus(2)), two_queues())
    for i in range(3):
        sh.submit(f"a{i}", "a", pod().gpu(1).build(), at=float(i))
        sh.submit(f"b{i}", "b", pod().gpu(1).build(), at=float(i))
    # a holds one GPU outside: the three GPUs are shared 1.5 / 1.5, and b goes first
    d = outside_round(sh, OutsideUse(gpus(1), {"a": gpus(1)}))
    assert (d.fair_share["a"], d.fair_share["b"]) == (gpus(1.5), gpus(1.5))
    placed = [a.workload for a in d.actions if isinstance(a, Place)]
    assert placed == ["b0", "a0"]


def test_non_preemptible_use_outside_counts_against_the_quota() -> None:
    queues = QueueTree([QueueSpec("team", quota=gpus(1))])
    sh = Shell(cluster(node("n1").gpus(2)), queues)
    sh.submit("svc", "team", pod().gpu(0.5).build(), priority=125)
    d = outside_round(sh, OutsideUse(gpus(1), {"team": gpus(0.7)}, {"team": 700}))
    assert d.actions == [
        Wait(
            "svc",
            "non-preemptible work must stay within the quota of queue team (quota 1.0 "
            "GPUs, in use 0.7, needs 0.5)",
        )
    ]


# ---------------------------------------------------------------- node constraints (rule 7)
def test_a_workload_goes_only_to_its_allowed_nodes() -> None:
    sh = Shell(cluster(node("a").gpus(2), node("b").gpus(2)), QueueTree.single())
    sh.run("busy", "default", pod().gpu(0.5).build(), 0, [0])  # best-fit would pick a
    sh.submit("free", "default", pod().gpu(0.5).build(), at=0.0)
    sh.submit("pinned", "default", pod().gpu(0.5).build(), at=1.0, nodes=frozenset({"b"}))
    assert actions(sh.round()) == [("place", "free", "a", "(0,)"), ("place", "pinned", "b", "(0,)")]


def test_no_allowed_node_is_the_first_reason() -> None:
    sh = Shell(cluster(node("a").gpus(1), node("b").gpus(1)), QueueTree.single())
    sh.submit("nowhere", "default", pod().gpu(1).build(), nodes=frozenset({"gone"}))
    sh.submit("one", "default", pod().gpu(4).build(), nodes=frozenset({"a"}))
    d = sh.round()
    assert d.actions == [
        Wait("nowhere", "0/2 nodes fit: 2 excluded by the workload's node constraints"),
        Wait(
            "one",
            "0/2 nodes fit: 1 excluded by the workload's node constraints, "
            "1 have fewer than 4 GPUs",
        ),
    ]


def test_same_request_other_nodes_is_not_taken_for_a_known_misfit() -> None:
    # the round remembers shapes that found no node; the allowed nodes are part of the shape
    sh = Shell(cluster(node("a").gpus(1), node("b").gpus(1)), QueueTree.single())
    sh.run("full", "default", pod().gpu(1).build(), 0, [0])
    sh.submit("on-a", "default", pod().gpu(1).build(), at=0.0, nodes=frozenset({"a"}))
    sh.submit("on-b", "default", pod().gpu(1).build(), at=1.0, nodes=frozenset({"b"}))
    assert actions(sh.round()) == [("wait", "on-a"), ("place", "on-b", "b", "(0,)")]


def test_preemption_frees_capacity_only_where_the_preemptor_may_run() -> None:
    sh = Shell(cluster(node("a").gpus(1), node("b").gpus(1)), QueueTree.single())
    # the victim on a is the better choice by every rule (lower priority, started later) ...
    sh.run("low-a", "default", pod().gpu(1).build(), 0, [0], priority=25, started=2.0)
    sh.run("low-b", "default", pod().gpu(1).build(), 1, [0], priority=40, started=1.0)
    # ... but the preemptor may only run on b
    sh.submit("urgent", "default", pod().gpu(1).build(), priority=90, nodes=frozenset({"b"}))
    d = sh.round()
    assert actions(d) == [("preempt", "low-b", "urgent", "preemption"), ("wait", "urgent")]
    assert d.holds["urgent"].node == "b"


def test_no_victim_on_allowed_nodes_means_no_preemption() -> None:
    sh = Shell(cluster(node("a").gpus(1), node("b").gpus(1)), QueueTree.single())
    sh.run("low-a", "default", pod().gpu(1).build(), 0, [0], priority=25)
    sh.run("guarded-b", "default", pod().gpu(1).build(), 1, [0], priority=25, preemptible=False)
    sh.submit("urgent", "default", pod().gpu(1).build(), priority=90, nodes=frozenset({"b"}))
    assert actions(sh.round()) == [("wait", "urgent")]
    assert sh.evictions() == 0


def test_reservation_only_on_an_allowed_node() -> None:
    config = SchedulerConfig(reservation_after_s=10, reservation_min_gpus=2)
    sh = Shell(cluster(node("a").gpus(4), node("b").gpus(2)), QueueTree.single(), config)
    sh.run("small-b", "default", pod().gpu(1).build(), 1, [0], priority=50)
    sh.run("small-a", "default", pod().gpu(1).build(), 0, [0], priority=50)
    sh.submit("big", "default", pod().gpu(2).build(), at=0.0, nodes=frozenset({"b"}))
    sh.now = 20.0
    d = sh.round()
    assert d.holds["big"].node == "b"
    assert d.holds["big"].is_reservation


def test_nodes_must_be_a_frozenset() -> None:
    import pytest

    from fgpu.model.types import InvalidRequestError
    from fgpu.sched.workload import Workload

    with pytest.raises(InvalidRequestError) as err:
        Workload("w", "default", pod().gpu(1).build(), nodes="a")  # type: ignore[arg-type]
    assert err.value.field == "nodes"
    assert "frozenset" in str(err.value)
