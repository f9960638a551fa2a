"""The store under concurrent writers and failures in the middle of a transaction.

Real SQLite files; several ``Store`` objects (so several connection pools) on one file, in
threads and in processes; failures injected at the database driver, between two statements
of one transaction.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from fgpu.sched.workload import Hold, Resources
from fgpu.store import QueueConfig, Store, StoreConflict
from tests.unit.test_store_support import (
    T0,
    InjectedFault,
    allocation_for,
    fail_on,
    in_threads,
    open_store,
    snapshot,
    submit,
    with_default_queue,
)


@pytest.fixture
def two_stores(tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    path = tmp_path / "fgpu.db"
    first = with_default_queue(open_store(path, prefix="a"))
    second = open_store(path, prefix="b")
    try:
        yield first, second
    finally:
        first.close()
        second.close()


# ------------------------------------------------------------------ concurrent writers
def test_concurrent_submissions_are_all_kept(two_stores: tuple[Store, Store]) -> None:
    stores = two_stores

    def work(i: int) -> None:
        for _ in range(15):
            submit(stores[i % 2], owner=i)

    assert in_threads(4, work) == []
    records = stores[0].list()
    assert len(records) == 60
    assert len({r.id for r in records}) == 60
    assert sorted(r.owner_uid for r in records) == sorted([0, 1, 2, 3] * 15)
    submitted = [e for e in stores[1].events() if e.kind == "submitted"]
    assert sorted(e.workload_id or "" for e in submitted) == sorted(r.id for r in records)


def test_one_transition_one_winner(two_stores: tuple[Store, Store]) -> None:
    stores = two_stores
    w = submit(stores[0])
    wins: list[int] = []

    def work(i: int) -> None:
        try:
            stores[i % 2].mark_running(w.id, allocation_for(w.request, first_gpu=i))
            wins.append(i)
        except StoreConflict:
            pass

    assert in_threads(6, work) == []
    assert len(wins) == 1
    record = stores[1].get(w.id)
    assert record.allocation is not None
    assert record.allocation.gpus == (wins[0],)
    assert [e.kind for e in stores[1].events(w.id)] == ["submitted", "started"]


def test_no_lost_updates_on_a_counter(two_stores: tuple[Store, Store]) -> None:
    """Threads race to start and preempt one workload; every successful preemption counts."""
    stores = two_stores
    w = submit(stores[0])
    preemptions = [0] * 4

    def work(i: int) -> None:
        store = stores[i % 2]
        for _ in range(10):
            with suppress(StoreConflict):
                store.mark_running(w.id, allocation_for(w.request))
            try:
                store.mark_preempted(w.id, f"thread {i}")
                preemptions[i] += 1
            except StoreConflict:
                pass

    assert in_threads(4, work) == []
    final = stores[0].get(w.id)
    events = stores[0].events(w.id)
    assert final.restarts == sum(preemptions) > 0
    assert sum(e.kind == "preempted" for e in events) == final.restarts
    started = sum(e.kind == "started" for e in events)
    assert started == final.restarts + (final.phase == "running")


def test_concurrent_queue_changes_keep_the_tree_valid(two_stores: tuple[Store, Store]) -> None:
    """Siblings created at once under a parent with quota 4: at most 4 of quota 1 fit."""
    stores = two_stores
    stores[0].create_queue(QueueConfig("org", quota=_gpus(4)))
    outcomes: list[str] = []

    def work(i: int) -> None:
        try:
            stores[i % 2].create_queue(QueueConfig(f"team-{i}", parent="org", quota=_gpus(1)))
            outcomes.append("created")
        except ValueError:
            outcomes.append("refused")

    assert in_threads(6, work) == []
    assert sorted(outcomes) == ["created"] * 4 + ["refused"] * 2
    tree = stores[1].queue_tree()  # builds and validates
    assert len(tree.children["org"]) == 4


def _gpus(n: int) -> Resources:
    return Resources(gpu_milli=1000 * n)


_WRITER = """
import sys
from fgpu.model.types import Request
from fgpu.store import Store
store = Store.open(sys.argv[1])
for _ in range(int(sys.argv[2])):
    store.submit(owner_uid=int(sys.argv[3]), queue="default",
                 request=Request(gpu_count=1, gpu_milli=250), argv=["true"])
store.close()
"""


def test_writers_in_separate_processes(tmp_path: Path) -> None:
    path = tmp_path / "fgpu.db"
    with_default_queue(open_store(path)).close()
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), "20", str(uid)])
        for uid in (1, 2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with Store.open(path) as store:
        records = store.list()
        assert sorted(r.owner_uid for r in records) == [1] * 20 + [2] * 20
        assert len({r.id for r in records}) == 40


# -------------------------------------------------------------- failure mid-transaction
@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with with_default_queue(open_store(tmp_path / "fgpu.db")) as opened:
        yield opened


def test_failed_event_write_undoes_the_submission(store: Store) -> None:
    before = snapshot(store)
    with fail_on(store, "INSERT INTO events") as seen, pytest.raises(InjectedFault):
        submit(store)
    assert "INSERT INTO workloads" in seen  # the row was written, then rolled back
    assert snapshot(store) == before
    assert submit(store).phase == "pending"  # the store still works


def test_failed_event_write_undoes_a_preemption(store: Store) -> None:
    w = submit(store)
    w = store.mark_running(w.id, allocation_for(w.request), pid=3, create_time=T0)
    before = snapshot(store, w.id)
    with fail_on(store, "INSERT INTO events") as seen, pytest.raises(InjectedFault):
        store.mark_preempted(w.id, "reclaim")
    assert any(s.startswith("UPDATE workloads") for s in seen)
    assert snapshot(store, w.id) == before
    assert store.get(w.id).restarts == 0


def test_failed_write_keeps_the_old_holds(store: Store) -> None:
    a, b = submit(store), submit(store)
    old = {a.id: Hold(a.id, "local", (0,), (), T0)}
    store.save_holds(old)
    with fail_on(store, "INSERT INTO holds") as seen, pytest.raises(InjectedFault):
        store.save_holds({b.id: Hold(b.id, "local", (1,), (), T0)})
    assert any(s.startswith("DELETE FROM holds") for s in seen)
    assert store.load_holds() == old


def test_failed_queue_change_stores_nothing(store: Store) -> None:
    before = snapshot(store)
    with fail_on(store, "INSERT INTO events"), pytest.raises(InjectedFault):
        store.create_queue(QueueConfig("team-a"))
    assert snapshot(store) == before


def test_failing_clock_leaves_the_workload_as_it_was(tmp_path: Path) -> None:
    ticks = iter([T0, T0 + 1])

    def clock() -> float:
        return next(ticks)  # StopIteration on the third read

    with Store.open(tmp_path / "fgpu.db", clock=clock) as store:
        store.create_queue(QueueConfig("default"))
        w = submit(store)
        before = snapshot(store, w.id)
        with pytest.raises(StopIteration):
            store.cancel(w.id, by_uid=1000)
        assert snapshot(store, w.id) == before
