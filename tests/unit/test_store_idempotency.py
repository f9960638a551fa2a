"""Idempotency keys in the store (issue 27): a key names the workload its submission made,
per user, for a bounded time; a key still kept cannot be stored twice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fgpu.store import Store, StoreConflict
from fgpu.store.idempotency import KEY_TTL_S, SWEEP_EVERY_S, KeyReused, fingerprint
from tests.unit.test_store_support import Counter, half_gpu, with_default_queue

T0 = 1_700_000_000.0


class Clock:
    """A clock the test sets."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Store]:
    """The store on SQLite, and on a real PostgreSQL where ``FGPU_TEST_POSTGRES_URL`` names
    one (the key is claimed with each dialect's own upsert)."""
    if request.param == "sqlite":
        opened = Store.open(tmp_path / "fgpu.db", clock=clock, new_id=Counter())
        with with_default_queue(opened) as ready:
            yield ready
        return
    from tests.integration.test_store_postgres import pg_database

    with pg_database() as url:
        opened = Store.open(url, clock=clock, new_id=Counter())
        with with_default_queue(opened) as ready:
            yield ready


def submit(store: Store, owner: int, key: str, fp: str) -> str:
    return store.submit(
        owner_uid=owner,
        queue="default",
        request=half_gpu(),
        argv=["sleep", "60"],
        idempotency=(key, fp),
    ).id


def test_a_key_names_its_workload_for_its_user_only(store: Store) -> None:
    fp = fingerprint({"command": ["sleep", "60"], "gpu": "0.5"})
    first = submit(store, 1000, "k", fp)
    assert store.keyed_workload(1000, "k", fp) == first
    assert store.keyed_workload(1001, "k", fp) is None  # another user's key space
    other = submit(store, 1001, "k", fp)
    assert other != first
    assert store.keyed_workload(1001, "k", fp) == other


def test_a_key_with_another_body_is_refused(store: Store) -> None:
    first = submit(store, 1000, "k", fingerprint({"a": 1}))
    with pytest.raises(KeyReused) as caught:
        store.keyed_workload(1000, "k", fingerprint({"a": 2}))
    assert caught.value.workload_id == first
    assert "'k'" in str(caught.value)


def test_a_kept_key_is_not_stored_twice_and_the_second_workload_is_not_written(
    store: Store,
) -> None:
    submit(store, 1000, "k", "f")
    with pytest.raises(StoreConflict):
        submit(store, 1000, "k", "f")  # two submissions racing past the first look
    assert len(store.list_workloads()) == 1


def test_keys_expire_and_are_dropped(store: Store, clock: Clock) -> None:
    first = submit(store, 1000, "k", "f")
    clock.now += KEY_TTL_S + 1
    assert store.keyed_workload(1000, "k", "f") is None
    second = submit(store, 1000, "k", "f")  # the expired key is dropped, the new one kept
    assert second != first
    assert store.keyed_workload(1000, "k", "f") == second
    assert store.key_count() == 1


def test_an_expired_key_is_taken_over_between_sweeps_and_swept_later(
    store: Store, clock: Clock
) -> None:
    first = submit(store, 1000, "a", "f")  # the first claim sweeps (nothing to drop)
    clock.now = T0 + KEY_TTL_S - SWEEP_EVERY_S / 2
    submit(store, 2000, "b", "f")  # a sweep: "a" is not expired yet
    clock.now = T0 + KEY_TTL_S + 1  # "a" expired; no sweep due for another SWEEP_EVERY_S/2
    again = submit(store, 1000, "a", "f")
    assert again != first
    assert store.keyed_workload(1000, "a", "f") == again
    assert store.key_count() == 2  # "a" taken over in place, "b" kept
    with pytest.raises(StoreConflict):  # the taken-over key is kept again
        submit(store, 1000, "a", "f")
    clock.now = T0 + 2 * KEY_TTL_S  # "b" expired, "a" not; a sweep is due
    submit(store, 3000, "c", "f")
    assert store.keyed_workload(2000, "b", "f") is None
    assert store.key_count(2000) == 0  # swept by another user's submission
    assert store.key_count() == 2


def test_the_fingerprint_ignores_field_order() -> None:
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": "1"})
    assert len(fingerprint({})) == 64
