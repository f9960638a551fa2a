"""Queues and the node inventory in the store."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fgpu.model.types import InvalidRequestError
from fgpu.sched.workload import QueueSpec, Resources
from fgpu.store import (
    UNCAPPED,
    GpuRecord,
    NodeRecord,
    NotFound,
    QueueConfig,
    QueueLimit,
    Store,
    StoreConflict,
)
from tests.unit.test_store_support import allocation_for, open_store, snapshot, submit


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(tmp_path / "fgpu.db") as opened:
        yield opened


def gpus(n: float) -> Resources:
    return Resources(gpu_milli=int(n * 1000))


def tenants(store: Store) -> None:
    """org (quota 4) with team-a and team-b (quota 2 each)."""
    store.create_queue(QueueConfig("org", quota=gpus(4)))
    store.create_queue(QueueConfig("team-a", parent="org", quota=gpus(2)))
    store.create_queue(QueueConfig("team-b", parent="org", quota=gpus(2), priority=10))


# ----------------------------------------------------------------------- happy paths
def test_create_get_list_and_tree(store: Store) -> None:
    config = QueueConfig(
        "team-a",
        quota=Resources(1500, 8000, 65536),
        limit=QueueLimit(gpu_milli=4000),
        over_quota_weight=2.5,
        priority=50,
    )
    record = store.create_queue(config)
    assert record.config == config
    assert record.created_at == record.updated_at
    assert store.get_queue("team-a") == record
    assert store.list_queues() == [record]
    spec = store.queue_tree()["team-a"]
    assert spec == QueueSpec(
        "team-a",
        quota=Resources(1500, 8000, 65536),
        limit=Resources(4000, UNCAPPED, UNCAPPED),
        over_quota_weight=2.5,
        priority=50,
    )
    [event] = store.events()
    assert event.kind == "queue-created"
    assert "quota 1.5 GPU(s), GPU limit 4" in event.message


def test_a_queue_without_caps_has_no_limit_in_the_core(store: Store) -> None:
    store.create_queue(QueueConfig("default"))
    assert store.queue_tree()["default"].limit is None


def test_tree_of_tenants(store: Store) -> None:
    tenants(store)
    tree = store.queue_tree()
    assert sorted(tree.leaves) == ["team-a", "team-b"]
    assert [q.name for q in store.list_queues()] == ["org", "team-a", "team-b"]


def test_update_queue(store: Store) -> None:
    tenants(store)
    old = store.get_queue("team-a")
    new = store.update_queue(replace(old.config, quota=gpus(1), over_quota_weight=3))
    assert new.config.quota == gpus(1)
    assert new.created_at == old.created_at
    assert new.updated_at > old.updated_at
    assert store.get_queue("team-a") == new
    assert store.events()[-1].kind == "queue-updated"


def test_move_a_queue_to_another_parent(store: Store) -> None:
    tenants(store)
    store.create_queue(QueueConfig("lab", quota=gpus(2)))
    moved = store.update_queue(replace(store.get_queue("team-b").config, parent="lab"))
    assert moved.config.parent == "lab"
    assert sorted(store.queue_tree().children["lab"]) == ["team-b"]


def test_delete_queue(store: Store) -> None:
    tenants(store)
    store.delete_queue("team-b")
    assert [q.name for q in store.list_queues()] == ["org", "team-a"]
    assert store.events()[-1].kind == "queue-deleted"
    with pytest.raises(NotFound):
        store.get_queue("team-b")


def test_ensure_queue_creates_once(store: Store) -> None:
    first = store.ensure_queue(QueueConfig("default"))
    again = store.ensure_queue(QueueConfig("default", quota=gpus(1)))
    assert again == first
    assert len(store.list_queues()) == 1


def test_a_queue_with_finished_work_only_may_be_deleted(store: Store) -> None:
    store.create_queue(QueueConfig("default"))
    w = submit(store)
    store.cancel(w.id, by_uid=1000)
    store.delete_queue("default")
    assert store.get(w.id).queue == "default"  # history keeps the name


# ------------------------------------------------------------------------ bad input
BAD_QUEUES = [
    pytest.param(QueueConfig("x", quota=Resources(-1, 0, 0)), "quota.gpu_milli", id="neg-gpu"),
    pytest.param(QueueConfig("x", quota=Resources(0, -5, 0)), "quota.cpu_milli", id="neg-cpu"),
    pytest.param(QueueConfig("x", quota=Resources(1.5, 0, 0)), "quota.gpu_milli", id="float"),  # type: ignore[arg-type]
    pytest.param(
        QueueConfig("x", quota=gpus(2), limit=QueueLimit(gpu_milli=1000)),
        "limit.gpu_milli",
        id="limit-below-quota",
    ),
    pytest.param(
        QueueConfig("x", limit=QueueLimit(memory_mib=-1)), "limit.memory_mib", id="neg-limit"
    ),
    pytest.param(QueueConfig("x", parent="nowhere"), "parent", id="unknown-parent"),
    pytest.param(QueueConfig("x", parent="x"), "parent", id="own-parent"),
    pytest.param(
        QueueConfig("x", over_quota_weight=float("nan")), "over_quota_weight", id="nan-weight"
    ),
    pytest.param(
        QueueConfig("x", over_quota_weight=float("inf")), "over_quota_weight", id="inf-weight"
    ),
    pytest.param(QueueConfig("x", over_quota_weight=-1), "over_quota_weight", id="neg-weight"),
    pytest.param(QueueConfig("x", priority=-1), "priority", id="neg-priority"),
    pytest.param(QueueConfig(""), "name", id="empty-name"),
    pytest.param(QueueConfig("team a"), "name", id="space-in-name"),
    pytest.param(QueueConfig("-x"), "name", id="leading-dash"),
    pytest.param(QueueConfig("x" * 129), "name", id="long-name"),
    pytest.param(
        QueueConfig("team-c", parent="org", quota=gpus(1)), "quota.gpu_milli", id="over-parent"
    ),
]


@pytest.mark.parametrize(("config", "field"), BAD_QUEUES)
def test_bad_queue_is_refused_and_nothing_is_stored(
    store: Store, config: QueueConfig, field: str
) -> None:
    tenants(store)
    before = snapshot(store)
    with pytest.raises(InvalidRequestError) as caught:
        store.create_queue(config)
    assert caught.value.field == field
    assert snapshot(store) == before


@pytest.mark.parametrize(
    ("name", "changes", "field"),
    [
        pytest.param("org", {"parent": "team-a"}, "parent", id="cycle"),
        pytest.param("team-a", {"quota": gpus(3)}, "quota.gpu_milli", id="children-over-parent"),
        pytest.param("org", {"quota": gpus(3)}, "quota.gpu_milli", id="parent-under-children"),
        pytest.param("team-a", {"parent": "ghost"}, "parent", id="unknown-parent"),
        pytest.param("team-a", {"quota": gpus(-1)}, "quota.gpu_milli", id="negative"),
        pytest.param(
            "team-a", {"limit": QueueLimit(gpu_milli=1)}, "limit.gpu_milli", id="limit-below"
        ),
    ],
)
def test_bad_update_is_refused_and_nothing_is_stored(
    store: Store, name: str, changes: dict[str, object], field: str
) -> None:
    tenants(store)
    before = snapshot(store)
    with pytest.raises(InvalidRequestError) as caught:
        store.update_queue(replace(store.get_queue(name).config, **changes))  # type: ignore[arg-type]
    assert caught.value.field == field
    assert snapshot(store) == before


def test_duplicate_queue_is_a_conflict(store: Store) -> None:
    tenants(store)
    before = snapshot(store)
    with pytest.raises(StoreConflict, match="already exists"):
        store.create_queue(QueueConfig("team-a"))
    assert snapshot(store) == before


def test_unknown_queue_update_and_delete(store: Store) -> None:
    with pytest.raises(NotFound):
        store.update_queue(QueueConfig("ghost"))
    with pytest.raises(NotFound):
        store.delete_queue("ghost")


def test_a_queue_in_use_is_not_deleted(store: Store) -> None:
    tenants(store)
    w = submit(store, queue="team-a")
    before = snapshot(store)
    with pytest.raises(StoreConflict, match="child queues"):
        store.delete_queue("org")
    with pytest.raises(StoreConflict, match="1 active workload"):
        store.delete_queue("team-a")
    assert snapshot(store) == before
    assert store.get(w.id).phase == "pending"


def test_work_goes_to_leaf_queues_only(store: Store) -> None:
    tenants(store)
    before = snapshot(store)
    with pytest.raises(InvalidRequestError, match="child queues"):
        submit(store, queue="org")
    submit(store, queue="team-a")
    with pytest.raises(InvalidRequestError, match="active workloads of its own"):
        store.create_queue(QueueConfig("sub", parent="team-a"))
    assert [q.name for q in store.list_queues()] == [q.name for q in before[0][1]]  # type: ignore[index]


# ------------------------------------------------------------------------ inventory
def box(*models: str, name: str = "box") -> NodeRecord:
    return NodeRecord(
        name=name,
        cpu_milli=64_000,
        memory_mib=512 * 1024,
        gpus=tuple(
            GpuRecord(index=i, uuid=f"GPU-{name}-{i}", model=m, memory_mib=40960)
            for i, m in enumerate(models)
        ),
    )


def test_inventory_upsert_and_list(store: Store) -> None:
    node = box("A100-40GB", "A100-40GB")
    assert store.upsert_node(node) is True
    assert store.list_nodes() == [node]
    assert store.upsert_node(node) is False  # unchanged: no write, no event
    assert [e.kind for e in store.events()] == ["node-updated"]
    bigger = box("A100-40GB", "A100-40GB", "H100-80GB")
    assert store.upsert_node(bigger) is True
    assert store.list_nodes() == [bigger]
    other = box("H100-80GB", name="another")
    store.upsert_node(other)
    assert store.list_nodes() == [other, bigger]


def test_inventory_refuses_a_gpu_already_on_another_node(store: Store) -> None:
    store.upsert_node(box("A100-40GB"))
    stolen = NodeRecord("thief", 1000, 1024, (GpuRecord(0, "GPU-box-0", "A100-40GB", 40960),))
    before = snapshot(store)
    with pytest.raises(StoreConflict):
        store.upsert_node(stolen)
    assert snapshot(store) == before


def test_sync_nodes_replaces_the_inventory_and_moves_gpus(store: Store) -> None:
    store.sync_nodes([box("A100-40GB", "A100-40GB", name="vm/A100"), box("H100-80GB", name="vm/H")])
    # the machine comes back with one model: one node named otherwise, same GPU UUIDs
    moved = NodeRecord("vm", 1000, 1024, (GpuRecord(0, "GPU-vm/A100-0", "A100-40GB", 40960),))
    assert store.sync_nodes([moved]) is True
    assert store.list_nodes() == [moved]
    removed = [e.message for e in store.events() if e.kind == "node-removed"]
    assert removed == [
        "node vm/A100 removed: the GPU backend no longer reports it",
        "node vm/H removed: the GPU backend no longer reports it",
    ]
    assert store.sync_nodes([moved]) is False


def test_sync_nodes_refuses_a_gpu_on_two_nodes_and_changes_nothing(store: Store) -> None:
    store.sync_nodes([box("A100-40GB")])
    before = snapshot(store)
    twice = GpuRecord(0, "GPU-x", "A100-40GB", 40960)
    with pytest.raises(InvalidRequestError) as caught:
        store.sync_nodes([NodeRecord("a", 0, 0, (twice,)), NodeRecord("b", 0, 0, (twice,))])
    assert caught.value.field == "nodes"
    assert caught.value.reason == "GPU GPU-x is on both a and b"
    assert snapshot(store) == before


@pytest.mark.parametrize(
    ("node", "field"),
    [
        pytest.param(NodeRecord("", 0, 0), "name", id="no-name"),
        pytest.param(NodeRecord("n", -1, 0), "cpu_milli", id="negative-cpu"),
        pytest.param(
            NodeRecord("n", 0, 0, (GpuRecord(0, "u", "A100", 1), GpuRecord(0, "v", "A100", 1))),
            "gpus.index",
            id="duplicate-index",
        ),
        pytest.param(
            NodeRecord("n", 0, 0, (GpuRecord(0, "u", "A100", 1), GpuRecord(1, "u", "A100", 1))),
            "gpus.uuid",
            id="duplicate-uuid",
        ),
    ],
)
def test_bad_node_is_refused(store: Store, node: NodeRecord, field: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        store.upsert_node(node)
    assert caught.value.field == field
    assert store.list_nodes() == []


def test_remove_node(store: Store) -> None:
    store.create_queue(QueueConfig("default"))
    store.upsert_node(box("A100-40GB"))
    w = submit(store)
    store.mark_running(w.id, allocation_for(w.request, node="box"))
    with pytest.raises(StoreConflict, match="still runs 1"):
        store.remove_node("box")
    store.mark_finished(w.id, "succeeded", exit_code=0)
    store.remove_node("box")
    assert store.list_nodes() == []
    with pytest.raises(NotFound):
        store.remove_node("box")
