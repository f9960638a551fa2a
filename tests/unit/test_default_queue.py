"""Whose default queue a submission without ``-q`` goes to
(:func:`fgpu.server.access.default_queue_of`; issue 25, point 5): a name beats a group, one
group's queue is taken, several groups naming different queues are refused naming each."""

from __future__ import annotations

import pytest

from fgpu.model.types import InvalidRequestError
from fgpu.rules.errors import BadRequest
from fgpu.server.access import Identity, default_queue_of
from fgpu.store import validate
from fgpu.store.records import QueueConfig, QueueRecord

ALICE = Identity(1001, "alice", frozenset({1001, 2001, 2002}), frozenset({"team", "ml"}))
CAROL = Identity(1003, "carol", frozenset({1003}), frozenset())


def queues(**default_for: tuple[str, ...]) -> list[QueueRecord]:
    return [
        QueueRecord(QueueConfig(name, default_for=who), 0.0, 0.0)
        for name, who in default_for.items()
    ]


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        pytest.param({}, "default", id="nobody-has-a-default"),
        pytest.param({"lab": ("alice",)}, "lab", id="by-name"),
        pytest.param({"lab": ("1001",)}, "lab", id="by-uid"),
        pytest.param({"lab": ("@team",)}, "lab", id="by-group"),
        pytest.param({"lab": ("@2002",)}, "lab", id="by-gid"),
        pytest.param({"lab": ("@team",), "solo": ("alice",)}, "solo", id="name-beats-group"),
        pytest.param({"lab": ("@team", "@ml")}, "lab", id="two-groups-one-queue"),
        pytest.param({"lab": ("bob", "@other")}, "default", id="someone-else"),
    ],
)
def test_default_queue_of(stored: dict[str, tuple[str, ...]], expected: str) -> None:
    assert default_queue_of(queues(**stored), ALICE, "default") == expected


def test_groups_naming_two_queues_are_refused_naming_both() -> None:
    with pytest.raises(BadRequest) as caught:
        default_queue_of(queues(lab=("@team",), ml=("@ml",)), ALICE, "default")
    assert caught.value.field == "queue"
    assert "(@team -> queue lab; @ml -> queue ml)" in caught.value.reason
    assert "give -q/--queue" in caught.value.reason
    assert default_queue_of(queues(lab=("@team",), ml=("@ml",)), CAROL, "default") == "default"


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        pytest.param(["*"], "'*' cannot be a default", id="everyone"),
        pytest.param(["alice", "alice"], "'alice' is listed twice", id="twice"),
        pytest.param(["a b"], "'a b' is not a member", id="malformed"),
        pytest.param("alice", "must be a list of names", id="not-a-list"),
    ],
)
def test_bad_default_for_is_refused(entries: object, reason: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        validate.default_for(entries)
    assert caught.value.field == "default_for"
    assert reason in caught.value.reason
