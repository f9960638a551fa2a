"""A damaged workload row costs only itself (issue 27): listings skip it and name it, a
lookup of it raises :class:`RowDamaged` naming its id, it is logged once, and an admin's
:meth:`Store.end_damaged` makes it listable again as cancelled. On SQLite always; on
PostgreSQL when ``FGPU_TEST_POSTGRES_URL`` is set (the same cases, damage PostgreSQL lets in).
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from fgpu.store import Store, database_url
from fgpu.store.errors import RowDamaged
from tests.unit.test_store_support import Counter, Ticker, submit, with_default_queue

SERVER = os.environ.get("FGPU_TEST_POSTGRES_URL", "")

# (case id, SQL that damages the row :id, backends it applies to, column named)
DAMAGE = [
    ("argv-not-json", "UPDATE workloads SET argv = 'not json{' WHERE id = :id", {"sqlite"}, "argv"),
    (
        "argv-wrong-shape",
        """UPDATE workloads SET argv = '{"a": 1}' WHERE id = :id""",
        {"sqlite", "postgresql"},
        "argv",
    ),
    (
        "env-a-list",
        "UPDATE workloads SET env = '[1, 2]' WHERE id = :id",
        {"sqlite", "postgresql"},
        "env",
    ),
    (
        "allocation-missing-keys",
        "UPDATE workloads SET node_name = 'local', allocation = '{}' WHERE id = :id",
        {"sqlite", "postgresql"},
        "allocation",
    ),
    (
        "unknown-preempted-kind",
        "UPDATE workloads SET preempted_kind = 'stolen' WHERE id = :id",
        {"sqlite", "postgresql"},
        "preempted_kind",
    ),
    (
        "text-owner",
        "UPDATE workloads SET owner_uid = 'bob' WHERE id = :id",
        {"sqlite"},
        "owner_uid",
    ),
    ("bad-phase", "UPDATE workloads SET phase = 'zombie' WHERE id = :id", {"sqlite"}, "phase"),
    (
        "null-dependency-pair",
        """UPDATE workloads SET dependency = '[["afterok"]]' WHERE id = :id""",
        {"sqlite", "postgresql"},
        "dependency",
    ),
]


@pytest.fixture(params=["sqlite", "postgresql"])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        store = Store.open(tmp_path / "fgpu.db", clock=Ticker(), new_id=Counter("w"))
        with with_default_queue(store) as ready:
            yield ready
        return
    if not SERVER:
        pytest.skip("FGPU_TEST_POSTGRES_URL is not set")
    server = database_url(SERVER)
    name = f"fgpu_test_{secrets.token_hex(4)}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        url: URL = server.set(database=name)
        with with_default_queue(Store.open(url, clock=Ticker(), new_id=Counter("w"))) as ready:
            yield ready
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.dispose()


def damage(store: Store, sql: str, workload_id: str) -> None:
    with store.engine.begin() as connection:
        if store.engine.dialect.name == "sqlite":  # the CHECK on phase, as a damaged page would
            connection.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
        connection.execute(text(sql), {"id": workload_id})
        if store.engine.dialect.name == "sqlite":
            connection.exec_driver_sql("PRAGMA ignore_check_constraints = OFF")


def cases(backend: str) -> list[tuple[str, str, str]]:
    return [(case, sql, column) for case, sql, where, column in DAMAGE if backend in where]


def each_case(store: Store, check: Callable[[str, str, str], None]) -> None:
    for case, sql, column in cases(store.engine.dialect.name):
        check(case, sql, column)


def test_a_damaged_row_is_skipped_named_and_logged_once(
    opened: Store, caplog: pytest.LogCaptureFixture
) -> None:
    store = opened

    def check(case: str, sql: str, column: str) -> None:
        before, victim, after = (submit(store) for _ in range(3))
        damage(store, sql, victim.id)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="fgpu.store"):
            listed = [r.id for r in store.list_workloads()]
            assert before.id in listed, case
            assert after.id in listed, case
            assert victim.id not in listed, case
            page = store.workload_page(limit=1000)
            assert victim.id not in [r.id for r in page.records], case
            assert [d.id for d in page.damaged] == [victim.id], case
            assert column in page.damaged[0].problem, (case, page.damaged[0].problem)
            for _ in range(3):  # read again: logged once, not per read
                store.list_workloads()
        logged = [r for r in caplog.records if victim.id in r.getMessage()]
        assert len(logged) == 1, (case, [r.getMessage() for r in logged])
        with pytest.raises(RowDamaged) as raised:
            store.get(victim.id)
        assert raised.value.workload_id == victim.id
        assert column in str(raised.value)
        assert "damaged" in str(raised.value)
        assert victim.id in [d.id for d in store.damaged()]
        # an admin ends it: cancelled, listable again, the damage said in its reason and event
        found, record = store.end_damaged(victim.id, 0)
        assert column in found.problem
        assert record.phase == "cancelled"
        assert column in record.reason
        assert "damaged row ended by" in record.reason
        assert store.get(victim.id).phase == "cancelled"
        assert victim.id in [r.id for r in store.list_workloads()]
        assert victim.id not in [d.id for d in store.damaged()]
        assert store.events(victim.id)[-1].kind == "cancelled"

    each_case(store, check)


def test_a_page_cut_at_a_damaged_row_goes_on_past_it(opened: Store) -> None:
    store = opened
    ids = [submit(store).id for _ in range(4)]
    damage(store, DAMAGE[1][1], ids[1])
    first = store.workload_page(limit=2)
    assert [r.id for r in first.records] == ids[:1]
    assert [d.id for d in first.damaged] == [ids[1]]
    assert first.cursor is not None
    rest = store.workload_page(limit=2, after=first.cursor)
    assert [r.id for r in rest.records] == ids[2:]
    assert rest.cursor is None
