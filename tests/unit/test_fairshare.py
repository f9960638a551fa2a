"""Fair share arithmetic and queue-tree validation (DESIGN.md section 5)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fgpu.model.types import InvalidRequestError
from fgpu.sched.fairshare import config_warnings, fair_share
from fgpu.sched.workload import QueueSpec, QueueTree, Resources, parse_priority


def g(n: float) -> Resources:
    return Resources(gpu_milli=round(n * 1000))


def shares(tree: QueueTree, capacity: float, demand: dict[str, float]) -> dict[str, int]:
    result = fair_share(tree, g(capacity), {}, {q: g(d) for q, d in demand.items()})
    return {q: r.gpu_milli for q, r in result.share.items()}


@pytest.mark.parametrize(
    ("queues", "capacity", "demand", "expected"),
    [
        (
            [QueueSpec("a"), QueueSpec("b")],
            4,
            {"a": 4, "b": 4},
            {"a": 2000, "b": 2000},
        ),
        (
            [QueueSpec("a"), QueueSpec("b")],
            4,
            {"a": 1, "b": 4},
            {"a": 1000, "b": 3000},
        ),
        (
            [QueueSpec("a", over_quota_weight=1), QueueSpec("b", over_quota_weight=3)],
            4,
            {"a": 4, "b": 4},
            {"a": 1000, "b": 3000},
        ),
        (
            [QueueSpec("a", quota=g(1)), QueueSpec("b", quota=g(1))],
            3,
            {"a": 0.5, "b": 3},
            {"a": 500, "b": 2500},
        ),
        (
            [QueueSpec("hi", priority=1), QueueSpec("lo", priority=0)],
            4,
            {"hi": 3, "lo": 4},
            {"hi": 3000, "lo": 1000},
        ),
        (
            [QueueSpec("hi", priority=1), QueueSpec("lo", quota=g(2), priority=0)],
            4,
            {"hi": 4, "lo": 4},
            {"hi": 2000, "lo": 2000},
        ),
        (
            [QueueSpec("z", quota=g(1), over_quota_weight=0), QueueSpec("w")],
            4,
            {"z": 4, "w": 4},
            {"z": 1000, "w": 3000},
        ),
        (
            [QueueSpec("z", quota=g(1), over_quota_weight=0), QueueSpec("w")],
            4,
            {"z": 4, "w": 1},
            {"z": 3000, "w": 1000},
        ),
        (
            [QueueSpec("a", limit=g(1)), QueueSpec("b")],
            4,
            {"a": 4, "b": 4},
            {"a": 1000, "b": 3000},
        ),
        (
            [QueueSpec("a"), QueueSpec("b"), QueueSpec("c")],
            1,
            {"a": 1, "b": 1, "c": 1},
            {"a": 334, "b": 333, "c": 333},
        ),
        (
            [
                QueueSpec("org", quota=g(2)),
                QueueSpec("t1", parent="org"),
                QueueSpec("t2", parent="org", over_quota_weight=3),
                QueueSpec("other"),
            ],
            4,
            {"t1": 4, "t2": 4, "other": 1},
            {"org": 3000, "t1": 750, "t2": 2250, "other": 1000},
        ),
    ],
    ids=[
        "equal",
        "water-fill",
        "weights",
        "quota-then-surplus",
        "priority-first",
        "quota-beats-priority",
        "weight-zero-keeps-quota",
        "weight-zero-gets-leftover",
        "limit-caps",
        "integer-remainder",
        "hierarchy",
    ],
)
def test_fair_share_table(
    queues: list[QueueSpec], capacity: float, demand: dict[str, float], expected: dict[str, int]
) -> None:
    got = shares(QueueTree(queues), capacity, demand)
    assert {q: got[q] for q in expected} == expected


@given(
    quotas=st.lists(st.integers(0, 5000), min_size=1, max_size=5),
    weights=st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=5, max_size=5),
    priorities=st.lists(st.integers(0, 2), min_size=5, max_size=5),
    demand=st.lists(st.integers(0, 8000), min_size=5, max_size=5),
    capacity=st.integers(0, 10_000),
)
def test_shares_never_exceed_capacity_or_demand(
    quotas: list[int],
    weights: list[float],
    priorities: list[int],
    demand: list[int],
    capacity: int,
) -> None:
    names = [f"q{i}" for i in range(len(quotas))]
    tree = QueueTree(
        QueueSpec(n, quota=Resources(q), over_quota_weight=w, priority=p)
        for n, q, w, p in zip(names, quotas, weights, priorities, strict=False)
    )
    result = fair_share(
        tree,
        Resources(capacity),
        {},
        {n: Resources(d) for n, d in zip(names, demand, strict=False)},
    )
    got = {n: result.share[n].gpu_milli for n in names}
    assert sum(got.values()) <= capacity
    for n, d in zip(names, demand, strict=False):
        assert 0 <= got[n] <= d
    # work-conserving: capacity stays idle only when every demand is met
    if sum(got.values()) < capacity:
        assert all(got[n] == d for n, d in zip(names, demand, strict=False))
    # guarantees are met first when they fit
    guaranteed = [min(q, d) for q, d in zip(quotas, demand, strict=False)]
    if sum(guaranteed) <= capacity:
        for n, gq in zip(names, guaranteed, strict=False):
            assert got[n] >= gq


def test_quotas_above_capacity_warn_and_scale() -> None:
    tree = QueueTree([QueueSpec("a", quota=g(3)), QueueSpec("b", quota=g(1))])
    result = fair_share(tree, g(2), {}, {"a": g(3), "b": g(1)})
    assert result.share["a"] == g(1.5)
    assert result.share["b"] == g(0.5)
    assert result.warnings[0].startswith("quotas add up to 4 GPUs, above the capacity of 2 GPUs")


BAD_TREES = [
    ([QueueSpec("a", parent="b"), QueueSpec("b", parent="a")], "parent: queue cycle: a -> b -> a"),
    ([QueueSpec("a", parent="ghost")], "parent: queue a: unknown parent queue 'ghost'"),
    ([QueueSpec("a"), QueueSpec("a")], "name: duplicate queue name 'a'"),
    (
        [
            QueueSpec("p", quota=g(1)),
            QueueSpec("c1", quota=g(1), parent="p"),
            QueueSpec("c2", quota=g(1), parent="p"),
        ],
        "quota.gpu_milli: children of p have quotas summing to 2000, above its 1000",
    ),
]


@pytest.mark.parametrize(
    ("queues", "message"),
    BAD_TREES,
    ids=["cycle", "unknown-parent", "duplicate", "children-over-parent"],
)
def test_bad_trees_are_rejected(queues: list[QueueSpec], message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        QueueTree(queues)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: QueueSpec("a", quota=Resources(-1)),
            "quota.gpu_milli: queue a: must not be negative",
        ),
        (
            lambda: QueueSpec("a", quota=g(2), limit=g(1)),
            "limit.gpu_milli: queue a: limit 1000 is below quota 2000",
        ),
        (
            lambda: QueueSpec("a", over_quota_weight=-1),
            "over_quota_weight: queue a: must be a number in 0..1e+06",
        ),
        (
            lambda: QueueSpec("a", over_quota_weight=float("nan")),
            "over_quota_weight: queue a: must be a number in 0..1e+06",
        ),
        (lambda: QueueSpec(""), "name: a queue needs a name"),
        (lambda: QueueSpec("a", parent="a"), "parent: queue a cannot be its own parent"),
    ],
    ids=[
        "negative-quota",
        "limit-below-quota",
        "negative-weight",
        "nan-weight",
        "no-name",
        "self-parent",
    ],
)
def test_bad_queue_specs_are_rejected(make: object, message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        make()  # type: ignore[operator]
    assert str(caught.value) == message


def test_a_bad_change_leaves_the_tree_unchanged() -> None:
    tree = QueueTree([QueueSpec("a"), QueueSpec("b", parent="a")])
    with pytest.raises(InvalidRequestError, match="queue cycle"):
        tree.with_queue(QueueSpec("a", parent="b"))
    assert tree["a"].parent is None
    assert tree.leaves == ["b"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("high", 100), ("critical", 125), ("7", 7), (40, 40)],
)
def test_priorities(value: object, expected: int) -> None:
    assert parse_priority(value) == expected  # type: ignore[arg-type]


def test_unknown_priority_lists_classes() -> None:
    with pytest.raises(
        InvalidRequestError, match="unknown priority 'urgent'; use a number or very-low"
    ):
        parse_priority("urgent")


def test_config_warnings_name_quotas_above_capacity_and_above_the_parent() -> None:
    tree = QueueTree(
        [
            QueueSpec("org", quota=g(0)),
            QueueSpec("team", parent="org", quota=g(2)),
            QueueSpec("other", quota=g(4)),
        ]
    )
    assert config_warnings(tree, g(3)) == [
        "quotas add up to 4 GPUs, above the capacity of 3 GPUs; guarantees are scaled down in "
        "proportion to quota when demand exceeds capacity",
        "the quotas under org add up to 2 GPUs, above its own quota of 0 GPUs; the children's "
        "guarantees are scaled down to fit it",
    ]
    assert config_warnings(QueueTree([QueueSpec("a", quota=g(1))]), g(3)) == []
