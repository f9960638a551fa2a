"""Squeeze before evict as scenarios (issue 17; DESIGN.md section 5; fgpu.sched.squeeze):
cluster, queues, running and pending work -> the exact actions."""

from __future__ import annotations

import pytest

from fgpu.model.types import Request
from fgpu.sched.decide import Decision, SchedulerConfig
from fgpu.sched.workload import (
    Place,
    Preempt,
    QueueSpec,
    QueueTree,
    Resources,
    Squeeze,
    Unsqueeze,
    Wait,
)
from tests.builders import cluster, node, pod
from tests.shell import Shell

LOW, NORMAL, HIGH, CRITICAL = 40, 50, 100, 125


def one_queue(**kw: object) -> QueueTree:
    # quota for the non-preemptible (high, critical) work of the scenarios
    return QueueTree([QueueSpec("q", quota=Resources(gpu_milli=4000), **kw)])  # type: ignore[arg-type]


def half(memory: str | None = None) -> Request:
    b = pod().gpu(0.5)
    return (b.gpu_memory(memory) if memory else b).build()


def share(fraction: float, memory: str) -> Request:
    return pod().gpu(fraction).gpu_memory(memory).build()


def summary(d: Decision) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for a in d.actions:
        if isinstance(a, Place):
            out.append(("place", a.workload, str(a.allocation.gpus)))
        elif isinstance(a, Preempt):
            out.append(("evict", a.victim, a.preemptor, a.kind))
        elif isinstance(a, Squeeze):
            out.append(("squeeze", a.workload, ",".join(a.by)))
        elif isinstance(a, Unsqueeze):
            out.append(("release", a.workload))
        elif isinstance(a, Wait):
            out.append(("wait", a.workload))
    return out


def two_low_and_critical(
    low: Request, queues: QueueTree | None = None, config: SchedulerConfig | None = None
) -> Shell:
    """Two low jobs at 0.5 on GPU 0 of a one-GPU node; a critical -g 0.5 arrives."""
    sh = Shell(cluster(node("n1").gpus(1)), queues or one_queue(), config or SchedulerConfig())
    sh.run("low-a", "q", low, 0, [0], priority=LOW, started=1.0)
    sh.run("low-b", "q", low, 0, [0], priority=LOW, started=2.0)
    sh.submit("crit", "q", half(), priority=CRITICAL, at=3.0)
    return sh


# name -> (setup, expected actions of the first round)
SCENARIOS = {
    "two low at 0.5, critical 0.5, memory fits: nobody is evicted": (
        lambda: two_low_and_critical(half("20GiB")),
        [("squeeze", "low-b", "crit"), ("place", "crit", "(0,)")],
    ),
    "the same with memory too short: one is evicted": (
        lambda: two_low_and_critical(half()),
        [("evict", "low-b", "crit", "preemption"), ("wait", "crit")],
    ),
    "switched off for the queue: evict as before": (
        lambda: two_low_and_critical(half("20GiB"), queues=one_queue(squeeze=False)),
        [("evict", "low-b", "crit", "preemption"), ("wait", "crit")],
    ),
    "switched off for the service, on for the queue: squeeze": (
        lambda: two_low_and_critical(
            half("20GiB"), queues=one_queue(squeeze=True), config=SchedulerConfig(squeeze=False)
        ),
        [("squeeze", "low-b", "crit"), ("place", "crit", "(0,)")],
    ),
    "switched off for the service: evict": (
        lambda: two_low_and_critical(half("20GiB"), config=SchedulerConfig(squeeze=False)),
        [("evict", "low-b", "crit", "preemption"), ("wait", "crit")],
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS), ids=list(SCENARIOS))
def test_scenario_table(name: str) -> None:
    setup, expected = SCENARIOS[name]
    sh = setup()
    assert summary(sh.round()) == expected


def test_squeezed_work_keeps_memory_and_gets_compute_back_when_the_preemptor_ends() -> None:
    sh = two_low_and_critical(half("20GiB"))
    sh.round()
    assert sh.squeezed() == {"low-b": ("crit",)}
    assert sh.running() == ["crit", "low-a", "low-b"]
    # compute of GPU 0: low-a 500 + crit 500 granted; low-b holds its 20 GiB but no compute
    assert int(sh.state.gpu_free_milli[0, 0]) == 0
    assert int(sh.state.gpu_free_memory[0, 0]) == 0
    # quotas and fair share: the squeezed compute is not counted as allocated
    d = sh.round()
    assert d.allocated["q"].gpu_milli == 1000
    assert summary(d) == []  # a squeezed GPU is full: nothing moves
    sh.finish("crit")
    assert summary(sh.round()) == [("release", "low-b")]
    assert sh.squeezed() == {}
    assert int(sh.state.gpu_free_milli[0, 0]) == 0
    assert sh.evictions() == 0


def test_high_training_over_normal_work_of_its_queue() -> None:
    sh = Shell(cluster(node("n1").gpus(2)), one_queue())
    for i, gpu in enumerate([0, 0, 1, 1]):
        sh.run(f"n{i}", "q", share(0.5, "16GiB"), 0, [gpu], priority=NORMAL, started=float(i))
    sh.submit("train", "q", share(0.5, "16GiB"), priority=HIGH)
    d = sh.round()
    # GPU 1's most recently started normal job is squeezed (equal cost: the node policy picks
    # GPU 0 or 1; both hold one squeeze of priority 50)
    squeezes = [a for a in summary(d) if a[0] == "squeeze"]
    assert len(squeezes) == 1
    assert squeezes[0][2] == "train"
    assert squeezes[0][1] in {"n1", "n3"}
    assert ("place", "train", "(0,)" if squeezes[0][1] == "n1" else "(1,)") in summary(d)
    assert sh.evictions() == 0


def test_placement_prefers_squeezing_the_lowest_priority_work() -> None:
    sh = Shell(cluster(node("n1").gpus(2)), one_queue())
    sh.run("normal-0a", "q", share(0.5, "16GiB"), 0, [0], priority=NORMAL, started=1.0)
    sh.run("normal-0b", "q", share(0.5, "16GiB"), 0, [0], priority=NORMAL, started=2.0)
    sh.run("normal-1", "q", share(0.5, "16GiB"), 0, [1], priority=NORMAL, started=3.0)
    sh.run("low-1", "q", share(0.5, "16GiB"), 0, [1], priority=LOW, started=0.0)
    sh.submit("crit", "q", share(0.5, "16GiB"), priority=CRITICAL)
    assert summary(sh.round()) == [("squeeze", "low-1", "crit"), ("place", "crit", "(1,)")]


def test_two_preemptors_on_one_gpu_share_one_squeezed_workload() -> None:
    sh = Shell(cluster(node("n1").gpus(1)), one_queue())
    sh.run("low-a", "q", share(0.5, "16GiB"), 0, [0], priority=LOW, started=1.0)
    sh.run("low-b", "q", share(0.5, "16GiB"), 0, [0], priority=LOW, started=2.0)
    sh.submit("p1", "q", share(0.3, "16GiB"), priority=CRITICAL)
    assert summary(sh.round()) == [("squeeze", "low-b", "p1"), ("place", "p1", "(0,)")]
    # low-b keeps the 200 milli p1 did not need, so the GPU is full; p2 takes those
    sh.submit("p2", "q", share(0.2, "16GiB"), priority=CRITICAL)
    assert summary(sh.round()) == [("squeeze", "low-b", "p1,p2"), ("place", "p2", "(0,)")]
    # p1 ends: 300 free, low-b needs 500: still squeezed, now by p2 alone
    sh.finish("p1")
    assert summary(sh.round()) == [("squeeze", "low-b", "p2")]
    sh.finish("p2")
    assert summary(sh.round()) == [("release", "low-b")]
    assert sh.evictions() == 0


def test_equal_priority_work_cannot_use_a_squeezed_gpu() -> None:
    sh = two_low_and_critical(half("16GiB"))
    sh.round()
    sh.submit("low-c", "q", share(0.1, "1GiB"), priority=LOW)
    d = sh.round()
    assert summary(d) == [("wait", "low-c")]


def test_memory_of_squeezed_work_goes_to_higher_pending_work_by_eviction() -> None:
    sh = two_low_and_critical(half("20GiB"))
    sh.round()
    assert sh.squeezed() == {"low-b": ("crit",)}
    # memory is full (20 + 20 + 40 GiB) and so is compute; a high job needs 20 GiB and 200
    # milli. Evicting the squeezed low-b alone frees memory but no compute, so the ordinary
    # rules evict low-a (which frees both); low-b keeps its memory and the compute left over
    sh.submit("high", "q", share(0.2, "20GiB"), priority=HIGH)
    assert summary(sh.round()) == [("evict", "low-a", "high", "preemption"), ("wait", "high")]
    assert summary(sh.round()) == [("place", "high", "(0,)"), ("wait", "low-a")]
    assert sh.squeezed() == {"low-b": ("crit",)}
    assert int(sh.state.gpu_free_memory[0, 0]) == 0


def test_reclaim_across_queues_still_evicts() -> None:
    queues = QueueTree(
        [
            QueueSpec("a", quota=Resources(gpu_milli=500)),
            QueueSpec("b", quota=Resources(gpu_milli=500)),
        ]
    )
    sh = Shell(cluster(node("n1").gpus(1)), queues)
    sh.run("a1", "a", share(0.5, "16GiB"), 0, [0], priority=LOW, started=1.0)
    sh.run("a2", "a", share(0.5, "16GiB"), 0, [0], priority=LOW, started=2.0)
    sh.submit("b1", "b", share(0.5, "16GiB"), priority=NORMAL)
    assert summary(sh.round()) == [("evict", "a2", "b1", "reclaim"), ("wait", "b1")]
    assert sh.squeezed() == {}
