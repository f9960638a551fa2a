"""What one user holds in the store, pages of workloads, retention and event coalescing
(issue 27), on a real SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fgpu.store import Store
from fgpu.store.records import QueueConfig, WorkloadRecord
from fgpu.store.usage import OwnerUsage
from fgpu.store.validate import stored_bytes
from tests.unit.test_store_support import (
    T0,
    Counter,
    allocation_for,
    half_gpu,
    submit,
    with_default_queue,
)

ALICE, BOB = 1001, 1002


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[Store]:
    opened = Store.open(tmp_path / "fgpu.db", clock=clock, new_id=Counter("w"))
    with with_default_queue(opened) as ready:
        ready.create_queue(QueueConfig("team", members=("*",)))
        yield ready


def finish(store: Store, workload_id: str) -> None:
    record = store.get(workload_id)
    store.mark_running(workload_id, allocation_for(record.request))
    store.mark_finished(workload_id, "succeeded", exit_code=0)


# ------------------------------------------------------------------------- usage
def test_owner_usage_counts_active_work_and_stored_bytes_per_queue_and_in_all(
    store: Store, clock: Clock
) -> None:
    size = stored_bytes(["sleep", "60"], {"PATH": "/usr/bin"}, "/tmp")
    assert store.owner_usage(BOB, "team") == OwnerUsage()
    done = submit(store, owner=BOB)
    clock.now += 1
    submit(store, owner=BOB)
    clock.now += 1
    submit(store, owner=BOB, queue="team")
    submit(store, owner=ALICE, queue="team")  # another user's: not bob's
    finish(store, done.id)
    usage = store.owner_usage(BOB, "team")
    assert usage == OwnerUsage(
        active=2, active_in_queue=1, stored_bytes=3 * size, stored_bytes_in_queue=size
    )
    # a finished workload's bytes count until it is pruned, its activity does not
    assert store.owner_usage(BOB, "default") == OwnerUsage(2, 1, 3 * size, 2 * size)


def test_the_stored_size_is_recorded_at_submission(store: Store) -> None:
    record = store.submit(
        owner_uid=BOB,
        queue="default",
        request=half_gpu(),
        argv=["echo", "é" * 10],
        env={"K": "v" * 100},
    )
    expected = stored_bytes(["echo", "é" * 10], {"K": "v" * 100}, "/")  # Store.submit's cwd
    assert store.owner_usage(BOB, "default").stored_bytes == expected
    assert expected > 120  # é is two bytes in UTF-8
    assert record.id


# ------------------------------------------------------------------------- pages
def test_pages_follow_the_cursor_in_submission_order(store: Store, clock: Clock) -> None:
    ids = []
    for _ in range(7):
        clock.now += 1
        ids.append(submit(store, owner=BOB).id)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = store.workload_page(after=cursor, limit=3)
        cursor = page.cursor
        seen += [r.id for r in page.records]
        pages += 1
        if cursor is None:
            break
    assert seen == ids
    assert pages == 3


def test_a_page_of_mine_has_my_work_and_others_running_work_only(
    store: Store, clock: Clock
) -> None:
    bob_pending = [submit(store, owner=BOB).id for _ in range(3)]
    bob_running = submit(store, owner=BOB)
    store.mark_running(bob_running.id, allocation_for(bob_running.request))
    alice = submit(store, owner=ALICE)
    page = store.workload_page(owner_uid=ALICE, with_others_running=True)
    assert {r.id for r in page.records} == {alice.id, bob_running.id}
    assert page.cursor is None
    everyone = store.workload_page()
    assert {r.id for r in everyone.records} >= set(bob_pending)


def test_a_page_stops_at_its_byte_budget_and_the_cursor_goes_on(store: Store, clock: Clock) -> None:
    big = "x" * 100_000
    ids = []
    for _ in range(5):
        clock.now += 1
        ids.append(store.submit(owner_uid=BOB, queue="default", request=half_gpu(), argv=[big]).id)
    seen: list[str] = []
    sizes = []
    cursor = None
    while True:
        page = store.workload_page(after=cursor, limit=1000, max_bytes=250_000)
        seen += [r.id for r in page.records]
        sizes.append(len(page.records))
        cursor = page.cursor
        if cursor is None:
            break
    assert seen == ids
    assert sizes == [2, 2, 1]  # each workload stores ~100 KB: two fit 250 KB, three do not
    one = store.workload_page(limit=1000, max_bytes=10)
    assert [r.id for r in one.records] == ids[:1]  # a page always holds one


# ---------------------------------------------------------------------- retention
def test_prune_deletes_finished_workloads_past_the_age_in_bounded_batches(
    store: Store, clock: Clock
) -> None:
    old = [submit(store, owner=BOB).id for _ in range(5)]
    for workload_id in old:
        finish(store, workload_id)
    store.record_event(None, "node-updated", "test", "a node event")
    clock.now += 100
    young = submit(store, owner=BOB).id
    finish(store, young)
    active = submit(store, owner=BOB).id
    cutoff = clock.now - 50
    first = store.prune(cutoff, batch=2)
    assert len(first.workload_ids) == 2
    assert first.events >= 2 * 4  # each: submitted, started, succeeded, ... and the node one
    removed = list(first.workload_ids)
    while not (batch := store.prune(cutoff, batch=2)).done:
        assert len(batch.workload_ids) <= 2
        removed += batch.workload_ids
    assert sorted(removed) == sorted(old)
    left = {r.id for r in store.list_workloads()}
    assert left == {young, active}
    assert all(e.workload_id in (young, active) for e in store.events())
    assert store.owner_usage(BOB, "default").stored_bytes == 2 * stored_bytes(
        ["sleep", "60"], {"PATH": "/usr/bin"}, "/tmp"
    )


def test_prune_refuses_an_empty_batch(store: Store) -> None:
    with pytest.raises(ValueError, match="batch: 0 must be at least 1"):
        store.prune(T0, batch=0)


# --------------------------------------------------------------------- coalescing
def test_like_events_within_the_interval_are_one_row_with_a_count(
    store: Store, clock: Clock
) -> None:
    workload = submit(store, owner=BOB)
    store.event_coalesce_s = 10.0
    for _ in range(2676):
        store.record_event(workload.id, "memory-denied", "over quota", "allocation refused")
        clock.now += 0.005
    mine = [e for e in store.events(workload.id) if e.kind == "memory-denied"]
    assert len(mine) == 2  # 13.4 s of them: two intervals of 10 s
    assert sum(e.count for e in mine) == 2676
    assert mine[0].last_time is not None
    assert mine[0].last_time - mine[0].time < 10
    # another kind, another workload: rows of their own
    store.record_event(workload.id, "gpu-throttled", "x", "y")
    other = submit(store, owner=ALICE)
    store.record_event(other.id, "memory-denied", "over quota", "allocation refused")
    assert [e.count for e in store.events(other.id) if e.kind == "memory-denied"] == [1]


def test_without_an_interval_every_event_is_a_row(store: Store) -> None:
    workload = submit(store, owner=BOB)
    for _ in range(3):
        store.record_event(workload.id, "memory-denied", "over quota", "refused")
    assert [e.count for e in store.events(workload.id) if e.kind == "memory-denied"] == [1] * 3


def test_events_visible_to_a_user_are_their_workloads_and_those_of_none(store: Store) -> None:
    bob = submit(store, owner=BOB)
    alice = submit(store, owner=ALICE)
    store.record_event(None, "node-updated", "test", "a node event")
    seen = {e.workload_id for e in store.events(visible_to=ALICE)}
    assert seen == {alice.id, None}
    assert bob.id in {e.workload_id for e in store.events()}


# ------------------------------------------------------------- the service's ledger
def test_the_ledger_starts_from_the_store_and_follows_the_services_writes(
    store: Store, clock: Clock
) -> None:
    from fgpu.server.usage import UsageLedger

    size = stored_bytes(["sleep", "60"], {"PATH": "/usr/bin"}, "/tmp")
    done = submit(store, owner=BOB)
    submit(store, owner=BOB, queue="team")
    finish(store, done.id)
    loads = []

    def load() -> dict[tuple[int, str], tuple[int, int]]:
        loads.append(1)
        return store.usage_totals()

    ledger = UsageLedger(load)
    assert ledger.usage(BOB, "team") == store.owner_usage(BOB, "team")
    ledger.submitted(BOB, "team", 100)
    assert ledger.usage(BOB, "team") == OwnerUsage(2, 2, 2 * size + 100, size + 100)
    ledger.ended(BOB, "team")
    ledger.pruned([((BOB, "default"), size)])
    assert ledger.usage(BOB, "default") == OwnerUsage(1, 0, size + 100, 0)
    assert ledger.usage(ALICE, "team") == OwnerUsage()
    assert loads == [1]  # read once


def test_prune_says_whose_bytes_it_freed(store: Store, clock: Clock) -> None:
    record = submit(store, owner=BOB, queue="team")
    finish(store, record.id)
    clock.now += 10
    pruned = store.prune(clock.now)
    size = stored_bytes(["sleep", "60"], {"PATH": "/usr/bin"}, "/tmp")
    assert pruned.freed == (((BOB, "team"), size),)


def test_r0007_fills_the_stored_size_of_workloads_already_stored(tmp_path: Path) -> None:
    from sqlalchemy import text

    from fgpu.store.engine import make_engine, upgrade

    engine = make_engine(tmp_path / "old.db")
    upgrade(engine, "r0006")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO workloads (id, name, owner_uid, queue, phase, priority, cpu_milli, "
                "memory_mib, gpu_count, gpu_models, argv, shell, cwd, env, grace_s, "
                "submitted_at, reason, restarts) VALUES ('w1', 'w1', 7, 'default', "
                "'pending', 50, 0, 0, 1, '', :argv, 0, '/', :env, 30, 1.0, 'submitted', 0)"
            ),
            {"argv": '["echo", "é"]', "env": '{"K": "v"}'},
        )
    upgrade(engine)
    with engine.connect() as connection:
        size = connection.execute(text("SELECT stored_bytes FROM workloads")).scalar_one()
    engine.dispose()
    assert size == stored_bytes(["echo", "é"], {"K": "v"}, "/")


def test_a_page_ended_by_its_reader_goes_on_after_the_last_record_taken(
    store: Store, clock: Clock
) -> None:
    ids = []
    for _ in range(5):
        clock.now += 1
        ids.append(submit(store, owner=BOB).id)
    taken: list[str] = []

    def two(record: WorkloadRecord) -> bool:
        if len(taken) == 2:
            return False
        taken.append(record.id)
        return True

    page = store.workload_page(limit=1000, each=two)
    assert page.records == []  # given to the reader, not kept
    assert taken == ids[:2]
    rest = store.workload_page(limit=1000, after=page.cursor)
    assert [r.id for r in rest.records] == ids[2:]
    assert rest.cursor is None
