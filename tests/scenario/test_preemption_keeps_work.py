"""Preemption that keeps the work (issue 28; DESIGN.md section 5; rules 9-12 of
fgpu.sched.decide) as scenarios: cluster, queues, running and pending work -> the exact
actions. Suspend rather than evict, restore before lower-ranked new work, wait before
evicting, non-preemptible work first, whole-GPU work with declared memory squeezed."""

from __future__ import annotations

from fgpu.model.types import Request
from fgpu.sched.decide import PREEMPT_DELAY_S, Decision, SchedulerConfig
from fgpu.sched.workload import (
    Place,
    Preempt,
    QueueSpec,
    QueueTree,
    Resources,
    Restore,
    Squeeze,
    Suspend,
    Wait,
)
from tests.builders import cluster, node, pod
from tests.shell import Shell

LOW, NORMAL, HIGH, CRITICAL = 40, 50, 100, 125
GIB = 1024


def one_queue(**kw: object) -> QueueTree:
    return QueueTree([QueueSpec("q", quota=Resources(gpu_milli=8000), **kw)])  # type: ignore[arg-type]


def whole(memory: str | None = None) -> Request:
    b = pod().gpu(1).memory("8GiB")
    return (b.gpu_memory(memory) if memory else b).build()


def summary(d: Decision) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for a in d.actions:
        if isinstance(a, Place):
            out.append(("place", a.workload, a.allocation.node_name, str(a.allocation.gpus)))
        elif isinstance(a, Restore):
            out.append(("restore", a.workload, a.allocation.node_name, str(a.allocation.gpus)))
        elif isinstance(a, Suspend):
            out.append(("suspend", a.victim, a.preemptor, str(a.host_memory_mib)))
        elif isinstance(a, Preempt):
            out.append(("evict", a.victim, a.preemptor))
        elif isinstance(a, Squeeze):
            out.append(("squeeze", a.workload, ",".join(a.by)))
        elif isinstance(a, Wait):
            out.append(("wait", a.workload))
    return out


def reasons(d: Decision) -> dict[str, str]:
    return {a.workload: a.reason for a in d.actions if isinstance(a, Wait)}


def at_once(**kw: object) -> SchedulerConfig:
    return SchedulerConfig(preempt_delay_s=0.0, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ rule 9: suspend
def low_on_one_gpu(pool: str | None, suspendable: bool = True) -> Shell:
    """One GPU held by a low whole-GPU job (8 GiB host memory); a normal one arrives."""
    n = node("n1").gpus(1)
    sh = Shell(cluster(n.suspend_pool(pool) if pool else n), one_queue(), at_once())
    sh.run("low", "q", whole(), 0, [0], priority=LOW, suspendable=suspendable)
    sh.submit("new", "q", whole(), priority=NORMAL, at=1.0)
    return sh


SUSPEND_TABLE = {
    # host memory held once suspended: the whole GPU's 80 GiB plus 8 GiB of host memory
    "budget has room: suspended, not evicted": (
        lambda: low_on_one_gpu("256GiB"),
        [("suspend", "low", "new", str(88 * GIB)), ("wait", "new")],
    ),
    "no budget on the node: evicted": (
        lambda: low_on_one_gpu(None),
        [("evict", "low", "new"), ("wait", "new")],
    ),
    "budget too small for its memory: evicted": (
        lambda: low_on_one_gpu("64GiB"),
        [("evict", "low", "new"), ("wait", "new")],
    ),
    "victim cannot be checkpointed: evicted": (
        lambda: low_on_one_gpu("256GiB", suspendable=False),
        [("evict", "low", "new"), ("wait", "new")],
    ),
}


def test_suspend_or_evict_table() -> None:
    for name, (setup, expected) in SUSPEND_TABLE.items():
        assert summary(setup().round()) == expected, name


def test_suspend_switched_off_for_the_scheduler_evicts() -> None:
    sh = Shell(
        cluster(node("n1").gpus(1).suspend_pool("256GiB")), one_queue(), at_once(suspend=False)
    )
    sh.run("low", "q", whole(), 0, [0], priority=LOW, suspendable=True)
    sh.submit("new", "q", whole(), priority=NORMAL)
    assert summary(sh.round()) == [("evict", "low", "new"), ("wait", "new")]


def test_a_suspended_victim_frees_its_gpu_and_waits_on_its_node_holding_host_memory() -> None:
    sh = low_on_one_gpu("256GiB")
    sh.round()
    d = sh.round()  # the copy to host is done: low waits suspended, new takes the GPU
    assert summary(d)[0] == ("place", "new", "n1", "(0,)")
    assert sh.suspended() == {"low": "n1"}
    assert int(sh.state.suspend_free[0]) == (256 - 88) * GIB
    assert reasons(d)["low"].startswith(
        f"suspended on n1 (host {88 * GIB} MiB); restores when that node has room"
    )


def test_the_node_whose_victims_can_be_suspended_is_chosen() -> None:
    # the same victim on both nodes; only b has a budget: suspending there beats evicting
    sh = Shell(
        cluster(node("a").gpus(1), node("b").gpus(1).suspend_pool("256GiB")),
        one_queue(),
        at_once(),
    )
    sh.run("low-a", "q", whole(), 0, [0], priority=LOW, suspendable=True)
    sh.run("low-b", "q", whole(), 1, [0], priority=LOW, suspendable=True)
    sh.submit("new", "q", whole(), priority=NORMAL)
    assert summary(sh.round()) == [("suspend", "low-b", "new", str(88 * GIB)), ("wait", "new")]


def test_the_budget_is_counted_across_victims_of_one_round() -> None:
    # two GPUs, room in the budget for one whole-GPU victim: one is suspended, one evicted
    sh = Shell(cluster(node("n1").gpus(2).suspend_pool("100GiB")), one_queue(), at_once())
    sh.run("low-0", "q", whole(), 0, [0], priority=LOW, started=1.0, suspendable=True)
    sh.run("low-1", "q", whole(), 0, [1], priority=LOW, started=2.0, suspendable=True)
    sh.submit("two", "q", pod().gpus(2).build(), priority=NORMAL)
    assert summary(sh.round()) == [
        ("suspend", "low-1", "two", str(88 * GIB)),
        ("evict", "low-0", "two"),
        ("wait", "two"),
    ]


# ------------------------------------------------------------------ rule 11: restore
def test_restored_on_its_node_before_new_work_of_its_priority_and_not_elsewhere() -> None:
    sh = Shell(
        cluster(node("a").gpus(1).suspend_pool("256GiB"), node("b").gpus(1)),
        one_queue(),
        at_once(),
    )
    sh.run("low", "q", whole(), 0, [0], priority=LOW, started=10.0, suspendable=True)
    sh.run("other", "q", whole(), 1, [0], priority=HIGH)
    sh.submit("new", "q", whole(), priority=NORMAL, at=11.0)
    sh.round()
    sh.round()
    assert sh.suspended() == {"low": "a"}
    # b frees up: low may only come back on a, so b's GPU goes to a later low job
    sh.finish("other")
    sh.submit("later-low", "q", whole(), priority=LOW, at=12.0)
    d = sh.round()
    assert ("place", "later-low", "b", "(0,)") in summary(d)
    assert "restores when that node has room" in reasons(d)["low"]
    # new ends on a: low is restored there before a pending job of its priority
    sh.finish("later-low")
    sh.finish("new")
    sh.submit("rival", "q", whole(), priority=LOW, at=5.0)  # submitted before low was
    d = sh.round()
    assert summary(d)[:1] == [("restore", "low", "a", "(0,)")]
    assert ("place", "rival", "b", "(0,)") in summary(d)
    assert sh.suspended() == {}
    assert int(sh.state.suspend_free[0]) == 256 * GIB


def test_higher_priority_new_work_goes_before_a_restore() -> None:
    sh = low_on_one_gpu("256GiB")
    sh.round()
    sh.round()
    sh.finish("new")
    sh.submit("normal", "q", whole(), priority=NORMAL, at=5.0)
    d = sh.round()
    assert summary(d)[0] == ("place", "normal", "n1", "(0,)")
    assert sh.suspended() == {"low": "n1"}


def test_a_suspended_workload_is_never_dropped_by_waiting() -> None:
    sh = low_on_one_gpu("256GiB")
    sh.round()
    sh.round()
    for hours in (1, 24, 24 * 30):
        sh.now = 3600.0 * hours
        d = sh.round()
        assert sh.suspended() == {"low": "n1"}
        assert "restores when that node has room" in reasons(d)["low"]
    sh.finish("new")
    assert summary(sh.round()) == [("restore", "low", "n1", "(0,)")]


# ------------------------------------------------------------------ rule 10: wait
def wait_setup(config: SchedulerConfig | None = None, queues: QueueTree | None = None) -> Shell:
    sh = Shell(
        cluster(node("n1").gpus(2)),
        queues or one_queue(),
        config or SchedulerConfig(preempt_delay_s=PREEMPT_DELAY_S),
    )
    sh.run("low-0", "q", whole(), 0, [0], priority=LOW, started=1.0)
    sh.run("low-1", "q", whole(), 0, [1], priority=LOW, started=2.0)
    return sh


def test_a_normal_preemptor_waits_and_says_how_long_and_when_it_will_preempt() -> None:
    sh = wait_setup()
    sh.submit("new", "q", whole(), priority=NORMAL, at=100.0)
    sh.now = 220.0
    d = sh.round()
    assert summary(d) == [("wait", "new")]
    assert reasons(d)["new"].endswith(
        "; waiting for capacity to free before it looks for work to preempt (waited 120 s "
        "of 300 s; looks in 180 s)"
    )
    sh.now = 400.0
    assert summary(sh.round()) == [("evict", "low-1", "new"), ("wait", "new")]


def test_capacity_that_frees_while_it_waits_goes_to_it_and_nobody_is_evicted() -> None:
    sh = wait_setup()
    sh.submit("new", "q", whole(), priority=NORMAL, at=100.0)
    sh.now = 150.0
    sh.round()
    sh.finish("low-0")
    sh.submit("later-low", "q", whole(), priority=LOW, at=160.0)
    sh.now = 200.0
    d = sh.round()
    assert summary(d) == [("place", "new", "n1", "(0,)"), ("wait", "later-low")]
    assert sh.evictions() == 0


def test_high_and_critical_preempt_at_once() -> None:
    for priority in (HIGH, CRITICAL):
        sh = wait_setup()
        sh.submit("urgent", "q", whole(), priority=priority, at=100.0)
        sh.now = 100.0
        assert summary(sh.round()) == [("evict", "low-1", "urgent"), ("wait", "urgent")]


def test_the_delay_is_per_queue() -> None:
    sh = wait_setup(queues=one_queue(preempt_delay_s=0.0))
    sh.submit("new", "q", whole(), priority=NORMAL, at=100.0)
    sh.now = 100.0
    assert summary(sh.round()) == [("evict", "low-1", "new"), ("wait", "new")]
    sh = wait_setup(queues=one_queue(preempt_delay_s=30.0))
    sh.submit("new", "q", whole(), priority=NORMAL, at=100.0)
    sh.now = 129.0
    assert summary(sh.round()) == [("wait", "new")]
    sh.now = 130.0
    assert summary(sh.round()) == [("evict", "low-1", "new"), ("wait", "new")]


def test_a_squeeze_does_not_wait() -> None:
    # squeezing keeps the victim's memory and progress: it is not held back by the wait
    sh = Shell(
        cluster(node("n1").gpus(1)), one_queue(), SchedulerConfig(preempt_delay_s=PREEMPT_DELAY_S)
    )
    sh.run("low", "q", pod().gpu(0.5).gpu_memory("20GiB").build(), 0, [0], priority=LOW)
    sh.run("low-2", "q", pod().gpu(0.5).gpu_memory("20GiB").build(), 0, [0], priority=LOW)
    sh.submit("new", "q", pod().gpu(0.5).gpu_memory("20GiB").build(), priority=NORMAL, at=5.0)
    sh.now = 5.0
    d = sh.round()
    assert [a[0] for a in summary(d)] == ["squeeze", "place"]


# ------------------------------------------------------------------ rule 12: critical first
def test_non_preemptible_work_is_placed_first_across_queues() -> None:
    # queue a is furthest below its fair share and goes first in the order; its normal job
    # would take the one free GPU, but b's critical job is placed first
    quota = Resources(gpu_milli=2000)
    queues = QueueTree([QueueSpec("a", quota=quota), QueueSpec("b", quota=quota)])
    sh = Shell(cluster(node("n1").gpus(2)), queues)
    sh.run("b-run", "b", whole(), 0, [0], priority=HIGH)
    sh.submit("a-normal", "a", whole(), priority=NORMAL, at=0.0)
    sh.submit("b-crit", "b", whole(), priority=CRITICAL, at=1.0)
    d = sh.round()
    assert summary(d)[0] == ("place", "b-crit", "n1", "(1,)")
    assert ("wait", "a-normal") in summary(d)


def test_critical_work_is_not_held_behind_the_cap_on_victim_searches() -> None:
    # one victim search per round; queue a's normal preemptors come first in the order and
    # would spend it, yet b's critical job finds its victim in the same round
    quota = Resources(gpu_milli=2000)
    queues = QueueTree([QueueSpec("a", quota=quota), QueueSpec("b", quota=quota)])
    sh = Shell(cluster(node("n1").gpus(2)), queues, at_once(max_preemptors_per_round=1))
    sh.run("b-low-0", "b", whole(), 0, [0], priority=LOW, started=1.0)
    sh.run("b-low-1", "b", whole(), 0, [1], priority=LOW, started=2.0)
    sh.submit("a-normal", "a", pod().gpus(2).build(), priority=NORMAL, at=0.0)
    sh.submit("b-crit", "b", whole(), priority=CRITICAL, at=1.0)
    d = sh.round()
    assert summary(d)[:2] == [("evict", "b-low-1", "b-crit"), ("wait", "b-crit")]


# ------------------------------------------------------------------ point 6: whole GPU
def test_whole_gpu_work_that_declares_its_memory_is_squeezed_not_evicted() -> None:
    sh = Shell(cluster(node("n1").gpus(1)), one_queue(), at_once())
    sh.run("train", "q", whole("40GiB"), 0, [0], priority=LOW)
    sh.submit("infer", "q", pod().gpu(0.3).gpu_memory("20GiB").build(), priority=NORMAL)
    d = sh.round()
    assert summary(d) == [("squeeze", "train", "infer"), ("place", "infer", "n1", "(0,)")]
    assert sh.squeezed() == {"train": ("infer",)}
    # the rest of the GPU's compute stays with the squeezed job: nothing else joins
    assert int(sh.state.gpu_free_milli[0, 0]) == 700
    assert sh.evictions() == 0


def test_whole_gpu_work_without_declared_memory_is_evicted_as_before() -> None:
    sh = Shell(cluster(node("n1").gpus(1)), one_queue(), at_once())
    sh.run("train", "q", whole(), 0, [0], priority=LOW)
    sh.submit("infer", "q", pod().gpu(0.3).gpu_memory("20GiB").build(), priority=NORMAL)
    assert summary(sh.round()) == [("evict", "train", "infer"), ("wait", "infer")]


def test_a_declared_memory_that_leaves_no_room_is_evicted() -> None:
    sh = Shell(cluster(node("n1").gpus(1)), one_queue(), at_once())
    sh.run("train", "q", whole("70GiB"), 0, [0], priority=LOW)
    sh.submit("infer", "q", pod().gpu(0.3).gpu_memory("20GiB").build(), priority=NORMAL)
    assert summary(sh.round()) == [("evict", "train", "infer"), ("wait", "infer")]


def test_a_workload_suspended_from_named_gpus_is_restored_only_on_those() -> None:
    """``suspended_gpus`` (a driver that restores onto the GPUs it checkpointed from, or a
    Kubernetes pod whose claim names its GPUs): another free GPU of the node is not used."""
    from dataclasses import replace

    sh = Shell(cluster(node("n1").gpus(2).suspend_pool("256GiB")), one_queue(), at_once())
    sh.run("low", "q", whole(), 0, [1], priority=LOW, suspendable=True)
    sh.run("other", "q", whole(), 0, [0], priority=HIGH)
    sh.submit("new", "q", whole(), priority=NORMAL, at=1.0)
    sh.round()
    sh.round()
    assert sh.suspended() == {"low": "n1"}
    sh.workloads["low"] = replace(sh.workloads["low"], suspended_gpus=(1,))
    sh.finish("other")  # GPU 0 free, GPU 1 still held by new
    d = sh.round()
    assert not [a for a in d.actions if isinstance(a, Restore)]
    assert (
        "restores when that node has room on GPUs 1, the ones it was checkpointed from"
        in (reasons(d)["low"])
    )
    sh.finish("new")
    assert summary(sh.round()) == [("restore", "low", "n1", "(1,)")]


def test_suspended_gpus_without_a_node_is_refused() -> None:
    import pytest

    from fgpu.model.types import InvalidRequestError
    from fgpu.sched.workload import Workload

    with pytest.raises(InvalidRequestError, match="suspended_gpus"):
        Workload("w", "q", whole(), suspended_gpus=(0,))
