"""Why pending work waits, naming the rule (issue "Everyday use", point 2): the fair share
of its queue, priority and reclaim, a hold, and the node fit only when that is what blocks
it (:mod:`fgpu.sched.reasons`)."""

from __future__ import annotations

from fgpu.sched.decide import SchedulerConfig
from fgpu.sched.workload import QueueSpec, QueueTree, Resources, Wait
from tests.builders import cluster, node, pod
from tests.shell import Shell


def reasons(sh: Shell) -> dict[str, str]:
    return {a.workload: a.reason for a in sh.round().actions if isinstance(a, Wait)}


def test_a_queue_at_its_fair_share_is_told_so_not_only_the_node_fit() -> None:
    queues = QueueTree([QueueSpec("team-a"), QueueSpec("team-b")])
    sh = Shell(cluster(node("n1").gpus(2)), queues)
    sh.run("a1", "team-a", pod().gpu(1).build(), 0, [0])
    sh.run("b1", "team-b", pod().gpu(1).build(), 0, [1])
    sh.submit("a2", "team-a", pod().gpu(1).build())
    sh.submit("b2", "team-b", pod().gpu(1).build())
    why = reasons(sh)
    assert why["b2"].startswith(
        "queue team-b is at its fair share, 1.0 of 1.0 GPUs; it may not reclaim, so it waits "
        "for free capacity"
    )
    assert "insufficient GPU" in why["b2"]  # the node fit stays as the detail


def test_no_lower_priority_work_and_nothing_to_reclaim_is_named() -> None:
    quota = Resources(gpu_milli=2000)
    queues = QueueTree([QueueSpec("team-a", quota=quota), QueueSpec("team-b", quota=quota)])
    sh = Shell(cluster(node("n1").gpus(2)), queues)
    sh.run("same", "team-a", pod().gpu(1).build(), 0, [0], priority=50)
    sh.run("guarded", "team-a", pod().gpu(1).build(), 0, [1], priority=40, preemptible=False)
    sh.submit("new", "team-a", pod().gpu(1).build(), priority=50)
    why = reasons(sh)["new"]
    assert why.startswith(
        "waits for capacity: no lower-priority preemptible work in queue team-a to preempt "
        "(priority 50); no queue above its fair share to reclaim from ("
    ), why


def test_one_queue_is_not_told_about_reclaim() -> None:
    sh = Shell(cluster(node("n1").gpus(1)), QueueTree.single())
    sh.run("first", "default", pod().gpu(1).build(), 0, [0], priority=100)
    sh.submit("next", "default", pod().gpu(1).build(), priority=50)
    why = reasons(sh)["next"]
    assert why.startswith("waits for capacity: no lower-priority preemptible work in queue")
    assert "reclaim" not in why


def test_the_node_fit_alone_when_nothing_runs() -> None:
    sh = Shell(cluster(node("n1").gpus(1)), QueueTree.single())
    sh.submit("too-big", "default", pod().gpu(1).gpu_memory(200_000).build())
    assert reasons(sh)["too-big"].startswith("0/1 nodes fit")


def test_capacity_held_for_another_workload_is_named() -> None:
    config = SchedulerConfig(reservation_after_s=10, reservation_min_gpus=2)
    sh = Shell(cluster(node("a").gpus(4), node("b").gpus(2)), QueueTree.single(), config)
    sh.run("small-b", "default", pod().gpu(1).build(), 1, [0])
    sh.run("small-a", "default", pod().gpu(1).build(), 0, [0])
    sh.submit("big", "default", pod().gpu(2).build(), at=0.0, nodes=frozenset({"b"}))
    sh.submit("tiny", "default", pod().gpu(1).build(), at=5.0, nodes=frozenset({"b"}))
    sh.now = 20.0
    why = reasons(sh)
    assert why["tiny"].startswith(
        "the free capacity that fits it on b is held for workload big (a hold"
    ), why


def test_the_node_fit_alone_when_no_allowed_node_could_take_it() -> None:
    # work runs, but no node the workload allows could hold it even empty
    sh = Shell(cluster(node("a").gpus(1), node("b").gpus(1)), QueueTree.single())
    sh.run("busy", "default", pod().gpu(1).build(), 0, [0], priority=100)
    sh.submit("pinned", "default", pod().gpu(1).build(), nodes=frozenset({"gone"}))
    sh.submit("wide", "default", pod().gpu(2).build(), nodes=frozenset({"a"}))
    why = reasons(sh)
    assert why["pinned"].startswith("0/2 nodes fit: 2 excluded"), why
    assert why["wide"].startswith("0/2 nodes fit: 1 excluded"), why


def test_the_fair_share_reason_says_above_or_how_much_more_would_pass_it() -> None:
    """The numbers agree with the words: above the share, or below it by less than the
    request (a trial saw "at its fair share, 0.5 of 0.3 GPUs" and "0.5 of 1.0" for 0.99)."""
    queues = QueueTree([QueueSpec("team-a"), QueueSpec("team-b")])
    sh = Shell(cluster(node("n1").gpus(2)), queues)
    sh.run("a1", "team-a", pod().gpu(0.5).build(), 0, [0])
    sh.run("a2", "team-a", pod().gpu(0.5).build(), 0, [0])
    sh.run("a3", "team-a", pod().gpu(0.25).build(), 0, [1])
    sh.run("b1", "team-b", pod().gpu(0.75).build(), 0, [1])
    sh.submit("a4", "team-a", pod().gpu(0.5).build())
    sh.submit("b2", "team-b", pod().gpu(0.5).build())
    why = reasons(sh)
    # team-a holds 1.25 of its 1.0 share (demand 1.75 each side, capacity 2: 1.0 each)
    assert why["a4"].startswith("queue team-a is above its fair share, 1.25 of 1.0 GPUs; "), why
    # team-b holds 0.75 of 1.0: 0.5 more would take it past
    assert why["b2"].startswith(
        "queue team-b holds 0.75 of its fair share of 1.0 GPUs and 0.5 more would take it past; "
        "it may not reclaim"
    ), why


def test_limits_are_told_in_gpus() -> None:
    queues = QueueTree([QueueSpec("capped", limit=Resources(gpu_milli=990))])
    sh = Shell(cluster(node("n1").gpus(2)), queues)
    sh.run("c1", "capped", pod().gpu(0.5).build(), 0, [0])
    sh.submit("c2", "capped", pod().gpu(0.5).build())
    assert reasons(sh)["c2"] == "queue capped would exceed its limit (1.0 > 0.99 GPUs)"
