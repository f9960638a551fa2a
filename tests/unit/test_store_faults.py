"""The store's faults (issue 27): a database that cannot write says why and writes nothing
half; a damaged file is refused before anything is written to it. Real SQLite files: the
full database is SQLite's own ``max_page_count`` limit (the same SQLITE_FULL as a full disk).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from fgpu.store import Store
from fgpu.store.engine import check_integrity, make_engine, storage_fault
from fgpu.store.errors import StoreDamaged, StoreUnwritable
from tests.unit.test_store_support import half_gpu, open_store, with_default_queue


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with with_default_queue(open_store(tmp_path / "fgpu.db")) as opened:
        yield opened


def cap_pages(store: Store, pages: int) -> None:
    """New connections of ``store`` may grow the file to ``pages`` pages at most."""

    def limit(connection: Any, _record: Any) -> None:
        connection.execute(f"PRAGMA max_page_count = {pages}")

    event.listen(store.engine, "connect", limit)
    store.engine.dispose()


def big_submit(store: Store) -> None:
    store.submit(
        owner_uid=1000,
        queue="default",
        request=half_gpu(),
        argv=["sleep", "60"],
        env={"BIG": "x" * 200_000},
    )


def test_a_full_database_refuses_the_write_whole_and_says_why(store: Store, tmp_path: Path) -> None:
    with store.engine.connect() as connection:
        (pages,) = connection.exec_driver_sql("PRAGMA page_count").one()
    cap_pages(store, pages + 2)
    with pytest.raises(StoreUnwritable) as caught:
        big_submit(store)
    assert "database or disk is full" in caught.value.cause
    assert str(tmp_path / "fgpu.db") in caught.value.cause
    assert store.write_fault == caught.value.cause
    assert store.list_workloads() == []  # nothing half-written
    assert store.probe_write() is None  # a write that needs no new page still goes
    assert store.write_fault is None


def test_other_errors_are_no_storage_fault() -> None:
    import sqlite3

    assert storage_fault(sqlite3.OperationalError("no such table: x")) is None
    assert storage_fault(ValueError("x")) is None


def test_a_damaged_page_is_found_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / "fgpu.db"
    with with_default_queue(open_store(path)) as store:
        for _ in range(20):
            big_submit(store)
    with open(path, "r+b") as handle:
        handle.seek(4096 * 3)
        handle.write(b"\xff" * 4096)
    before = path.read_bytes()
    with pytest.raises(StoreDamaged) as caught:
        Store.open(path, verify=True)
    assert caught.value.database == str(path)
    assert caught.value.problems
    assert path.read_bytes() == before


def test_a_file_that_is_no_database_is_damaged(tmp_path: Path) -> None:
    path = tmp_path / "fgpu.db"
    path.write_bytes(b"not a database at all, just text " * 200)
    engine = make_engine(path)
    try:
        with pytest.raises(StoreDamaged) as caught:
            check_integrity(engine)
    finally:
        engine.dispose()
    assert "not a database" in " ".join(caught.value.problems)


def test_a_sound_database_passes(store: Store) -> None:
    check_integrity(store.engine)
