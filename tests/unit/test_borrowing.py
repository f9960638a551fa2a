"""Which running workloads run beyond their queue's quota (fgpu.sched.borrowing, issue 25)."""

from __future__ import annotations

import pytest

from fgpu.sched.borrowing import Holding, borrowed


def h(wid: str, queue: str, milli: int, priority: int = 50, started: float | None = 0.0) -> Holding:
    return Holding(
        workload_id=wid, queue=queue, gpu_milli=milli, priority=priority, started_at=started
    )


def test_the_issues_two_queues() -> None:
    running = [h("bob", "team-a", 500, priority=25), h("alice", "team-b", 500, priority=50)]
    assert borrowed(running, {"team-a": 1000, "team-b": 0}) == {"alice"}


def test_a_queue_fills_its_quota_by_priority_then_start_then_id() -> None:
    running = [
        h("late", "q", 400, started=20.0),
        h("early", "q", 400, started=10.0),
        h("urgent", "q", 400, priority=100, started=30.0),
        h("tie-b", "q", 100, started=5.0),
        h("tie-a", "q", 100, started=5.0),
    ]
    # urgent (400), then tie-a, tie-b (600), early (1000): exactly the quota; late over it
    assert borrowed(running, {"q": 1000}) == {"late"}
    # a workload that crosses the quota only in part counts as borrowed (it may be reclaimed)
    assert borrowed(running, {"q": 900}) == {"early", "late"}


def test_no_start_time_sorts_last_and_unknown_queues_are_not_borrowed() -> None:
    running = [h("new", "q", 500, started=None), h("old", "q", 500, started=99.0)]
    assert borrowed(running, {"q": 500}) == {"new"}
    assert borrowed([h("x", "gone", 500)], {"q": 0}) == frozenset()


def test_squeezed_work_counts_nothing_and_is_never_borrowed() -> None:
    running = [h("lent", "q", 0, priority=100), h("kept", "q", 500)]
    assert borrowed(running, {"q": 500}) == frozenset()
    assert borrowed(running, {"q": 0}) == {"kept"}


def test_negative_compute_is_refused() -> None:
    with pytest.raises(ValueError, match="w: gpu_milli must be >= 0, got -1"):
        h("w", "q", -1)
