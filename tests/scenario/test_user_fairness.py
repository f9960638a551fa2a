"""Users inside a queue share it fairly (DESIGN.md section 5, "Ordering"; issue 25 point 5):
at equal priority the user with less GPU compute allocated in that queue goes first, then
submission time (:mod:`fgpu.sched.queueorder`). Three users: alice, bob, carol."""

from __future__ import annotations

import pytest

from fgpu.model.types import Allocation
from fgpu.sched.queueorder import QueueOrder, user_allocation
from fgpu.sched.workload import Place, QueueSpec, QueueTree, Workload
from tests.builders import cluster, node, pod
from tests.shell import Shell


def one_queue() -> QueueTree:
    return QueueTree([QueueSpec("team")])


def placed(decision) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.workload for a in decision.actions if isinstance(a, Place)]


def test_bobs_one_job_does_not_wait_behind_alices_six() -> None:
    # the case: alice submitted six, then bob one; room for three
    sh = Shell(cluster(node("n1").gpus(3)), one_queue())
    for i in range(6):
        sh.submit(f"alice{i}", "team", pod().gpu(1).build(), at=float(i), user="alice")
    sh.submit("bob0", "team", pod().gpu(1).build(), at=10.0, user="bob")
    d = sh.round()
    # alice0 first (both hold nothing; hers is older), then bob (alice now holds 1 GPU),
    # then alice again
    assert placed(d) == ["alice0", "bob0", "alice1"]


def test_three_users_take_turns_by_what_they_hold() -> None:
    # carol already runs two GPUs in the queue, bob one, alice none; room for four more
    sh = Shell(cluster(node("n1").gpus(7)), one_queue())
    sh.run("carol-r0", "team", pod().gpu(1).build(), 0, [0], user="carol")
    sh.run("carol-r1", "team", pod().gpu(1).build(), 0, [1], user="carol")
    sh.run("bob-r0", "team", pod().gpu(1).build(), 0, [2], user="bob")
    for user in ("carol", "bob", "alice"):  # carol submitted first, alice last
        for i in range(3):
            sh.submit(f"{user}{i}", "team", pod().gpu(1).build(), at=float(i), user=user)
    d = sh.round()
    # alice (holds 0) -> alice0; alice and bob now hold 1 GPU each: bob's oldest waiting
    # (t=0) before alice's (t=1) -> bob0; alice (1) before bob and carol (2) -> alice1;
    # all three hold 2: carol's oldest waiting (t=0) before bob's and alice's (t=1, t=2)
    assert placed(d) == ["alice0", "bob0", "alice1", "carol0"]


def test_priority_still_comes_first() -> None:
    # bob holds nothing, but alice's high-priority job goes before his normal one
    sh = Shell(cluster(node("n1").gpus(4)), one_queue())
    sh.run("alice-r", "team", pod().gpu(1).build(), 0, [0], user="alice")
    sh.run("alice-r2", "team", pod().gpu(1).build(), 0, [1], user="alice")
    sh.submit("bob0", "team", pod().gpu(1).build(), priority=50, at=0.0, user="bob")
    sh.submit("alice-hi", "team", pod().gpu(1).build(), priority=60, at=5.0, user="alice")
    sh.submit("carol0", "team", pod().gpu(1).build(), priority=50, at=1.0, user="carol")
    d = sh.round()
    assert placed(d) == ["alice-hi", "bob0"]


def test_users_count_per_queue_not_across_queues() -> None:
    # alice holds three GPUs in queue "other"; in "team" she holds none, so her older job
    # goes before bob's, who holds one GPU in "team"
    queues = QueueTree([QueueSpec("team", quota=_gpus(2)), QueueSpec("other", quota=_gpus(3))])
    sh = Shell(cluster(node("n1").gpus(5)), queues)
    for i in range(3):
        sh.run(f"alice-o{i}", "other", pod().gpu(1).build(), 0, [i], user="alice")
    sh.run("bob-r", "team", pod().gpu(1).build(), 0, [3], user="bob")
    sh.submit("bob1", "team", pod().gpu(1).build(), at=0.0, user="bob")
    sh.submit("alice1", "team", pod().gpu(1).build(), at=5.0, user="alice")
    d = sh.round()
    assert placed(d) == ["alice1"]


def test_one_user_keeps_submission_order() -> None:
    # no users (the simulator's trace without a user column): exactly the old order
    sh = Shell(cluster(node("n1").gpus(2)), one_queue())
    for i, at in enumerate((3.0, 1.0, 2.0)):
        sh.submit(f"w{i}", "team", pod().gpu(1).build(), at=at)
    assert placed(sh.round()) == ["w1", "w2"]


def _gpus(n: float):  # type: ignore[no-untyped-def]
    from fgpu.sched.workload import Resources

    return Resources(gpu_milli=round(n * 1000))


def _w(wid: str, user: str, at: float, priority: int = 50, milli: int | None = None) -> Workload:
    alloc = None
    if milli is not None:
        alloc = Allocation(0, "n1", (0,), (milli,), (1024,), 0, 0)
    return Workload(
        wid, "q", pod().gpu(0.5).build(), priority, at, allocation=alloc, started_at=at, user=user
    )


def test_user_allocation_counts_running_not_terminating_nor_squeezed() -> None:
    running = _w("a", "alice", 0.0, milli=500)
    squeezed = Workload(
        "b", "q", pod().gpu(0.5).build(), 50, 0.0, allocation=running.allocation,
        started_at=0.0, squeezed=True, user="bob",
    )  # fmt: skip
    leaving = Workload(
        "c", "q", pod().gpu(0.5).build(), 50, 0.0, allocation=running.allocation,
        started_at=0.0, terminating=True, user="carol",
    )  # fmt: skip
    pending = _w("d", "alice", 1.0)
    held = _w("e", "carol", 2.0)
    assert user_allocation([running, squeezed, leaving, pending], [(held, 300)]) == {
        ("q", "alice"): 500,
        ("q", "bob"): 0,
        ("q", "carol"): 300,
    }


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        pytest.param({}, ["a1", "b1", "c1", "a2", "b2"], id="nobody-holds-anything"),
        pytest.param(
            {("q", "alice"): 2000}, ["b1", "c1", "b2", "a1", "a2"], id="alice-holds-two-GPUs"
        ),
    ],
)
def test_queue_order_charges_as_it_goes(
    used: dict[tuple[str, str], int], expected: list[str]
) -> None:
    items = [
        _w("a1", "alice", 0.0),
        _w("a2", "alice", 1.0),
        _w("b1", "bob", 0.5),
        _w("b2", "bob", 3.0),
        _w("c1", "carol", 2.0),
    ]
    order = QueueOrder({"q": items}, lambda w: (-w.priority, False), dict(used))
    out = []
    while order.has_next("q"):
        w = order.pop("q")
        order.charge(w, 1000)  # each one placed takes a whole GPU
        out.append(w.id)
    assert out == expected
    with pytest.raises(IndexError, match="no pending workload left in queue 'q'"):
        order.pop("q")


def _reference_order(
    items: list[Workload], used: dict[tuple[str, str], int], charges: list[int]
) -> list[str]:
    """The rule written plainly: at each step the highest priority, then the least held,
    then the oldest, then the id; the i-th workload handed out is charged charges[i]."""
    left = list(items)
    out: list[str] = []
    held = dict(used)
    while left:
        best = min(
            left,
            key=lambda w: (-w.priority, held.get(("q", w.user), 0), w.submitted_at, w.id),
        )
        left.remove(best)
        held[("q", best.user)] = held.get(("q", best.user), 0) + charges[len(out)]
        out.append(best.id)
    return out


@pytest.mark.parametrize("seed", range(20))
def test_queue_order_is_the_rule_with_and_without_the_heap(seed: int) -> None:
    import random

    from fgpu.sched.queueorder import UserUse

    rng = random.Random(seed)
    users = ["alice", "bob", "carol", "dave"][: rng.randint(1, 4)]
    items = [
        _w(f"w{i:02d}", rng.choice(users), float(rng.randint(0, 9)), rng.choice([40, 50, 50]))
        for i in range(rng.randint(1, 25))
    ]
    start = {("q", u): rng.choice([0, 500, 1000]) for u in users}
    # most workloads are not placed (charge 0), some are
    charges = [rng.choice([0, 0, 0, 250, 1000]) for _ in items]
    expected = _reference_order(items, start, charges)
    for used in (dict(start), UserUse(start)):
        order = QueueOrder({"q": items}, lambda w: (-w.priority, False), used)
        got = []
        while order.has_next("q"):
            w = order.pop("q")
            if charges[len(got)]:
                order.charge(w, charges[len(got)])
            got.append(w.id)
        assert got == expected, type(used).__name__
