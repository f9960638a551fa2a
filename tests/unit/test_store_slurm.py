"""The store's side of Slurm's habits (issue 25, point 4): an array's tasks in one
transaction with an id of their own, time limits and dependencies kept, a cancel by a rule
with its reason, and queues' default and maximum time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fgpu.model.types import InvalidRequestError
from fgpu.store import Store
from fgpu.store.records import ArrayPlan, QueueConfig, WorkloadRecord
from tests.unit.test_store_support import (
    allocation_for,
    half_gpu,
    open_store,
    snapshot,
    with_default_queue,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with with_default_queue(open_store(tmp_path / "fgpu.db")) as opened:
        yield opened


def _array(store: Store, name: str = "sweep", size: int = 3) -> list[WorkloadRecord]:
    tasks = [(f"{name}_{i}", {"A": "1"}, ArrayPlan(name, i, size, 2)) for i in range(size)]
    return store.submit_tasks(
        owner_uid=1000,
        queue="default",
        request=half_gpu(),
        argv=["sleep", "60"],
        tasks=tasks,
        time_limit_s=120.0,
        dependency=[("afterok", "w0")],
    )


def test_an_array_is_stored_whole_with_an_id_of_its_own(store: Store) -> None:
    records = _array(store)
    assert [r.name for r in records] == ["sweep_0", "sweep_1", "sweep_2"]
    array_ids = {r.array.id for r in records if r.array is not None}
    assert len(array_ids) == 1
    (array_id,) = array_ids
    assert array_id not in {r.id for r in records}
    assert [(r.array.index, r.array.size, r.array.throttle) for r in records if r.array] == [
        (0, 3, 2),
        (1, 3, 2),
        (2, 3, 2),
    ]
    stored = store.array_tasks(array_id)
    assert stored == records  # as read back
    assert all(r.time_limit_s == 120.0 for r in stored)
    assert all(r.dependency == (("afterok", "w0"),) for r in stored)
    assert store.active_array_names(1000, ["sweep", "other"]) == {"sweep": array_id}
    assert store.active_array_names(1001, ["sweep"]) == {}
    assert store.array_named(1000, "sweep") == array_id
    assert store.array_named(1000, "nothing") is None
    assert [e.message for e in store.events(records[1].id)] == [
        "submitted to queue default as task 1 of array sweep"
    ]


def test_a_bad_task_stores_nothing(store: Store) -> None:
    before = snapshot(store)
    tasks = [
        ("ok_0", {}, ArrayPlan("ok", 0, 2)),
        ("ok_1", {"": "x"}, ArrayPlan("ok", 1, 2)),  # an empty variable name
    ]
    with pytest.raises(InvalidRequestError):
        store.submit_tasks(
            owner_uid=1000,
            queue="default",
            request=half_gpu(),
            argv=["true"],
            tasks=tasks,
        )
    assert snapshot(store) == before


def test_a_cancel_by_a_rule_keeps_its_reason(store: Store) -> None:
    pending, running = _array(store, size=2)
    store.mark_running(running.id, allocation_for(running.request))
    ended = store.cancel(pending.id, 0, admin=True, reason="dependency never satisfied: x")
    assert (ended.phase, ended.reason) == ("cancelled", "dependency never satisfied: x")
    stopping = store.cancel(running.id, 0, admin=True, reason="time limit")
    assert (stopping.phase, stopping.reason, stopping.cancelled_by) == ("running", "time limit", 0)
    assert stopping.stop_requested_at is not None
    assert [(e.kind, e.reason) for e in store.events(running.id)][-1] == (
        "cancel-requested",
        "time limit",
    )


def test_queue_times_are_kept_and_checked(store: Store) -> None:
    store.create_queue(QueueConfig("short", default_time_s=60.0, max_time_s=600.0))
    config = store.get_queue("short").config
    assert (config.default_time_s, config.max_time_s) == (60.0, 600.0)
    with pytest.raises(InvalidRequestError, match="default time 700 s is above its maximum 600"):
        store.create_queue(QueueConfig("bad", default_time_s=700.0, max_time_s=600.0))
    with pytest.raises(InvalidRequestError, match="must be above 0 seconds"):
        store.create_queue(QueueConfig("zero", max_time_s=0.0))
