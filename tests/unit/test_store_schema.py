"""The store's database: migrations, SQLite settings, URLs and paths."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from fgpu.store import Store, database_url, default_db_path, make_engine, upgrade
from fgpu.store.engine import (
    BUSY_TIMEOUT_MS,
    alembic_config,
    current_revision,
    head_revision,
    writer,
)
from fgpu.store.schema import Base
from tests.unit.test_store_support import open_store, submit, with_default_queue

TABLES = {
    "alembic_version",
    "queues",
    "workloads",
    "events",
    "nodes",
    "gpus",
    "holds",
    "idempotency_keys",
}


def test_open_creates_the_schema_from_scratch(tmp_path: Path) -> None:
    path = tmp_path / "new" / "deeper" / "fgpu.db"
    with Store.open(path) as store:
        assert set(inspect(store.engine).get_table_names()) == TABLES
        assert current_revision(store.engine) == head_revision()
    assert path.is_file()


def test_migrations_match_the_orm_classes(tmp_path: Path) -> None:
    with Store.open(tmp_path / "fgpu.db") as store, store.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []


def test_reopen_is_idempotent_and_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "fgpu.db"
    with with_default_queue(open_store(path)) as store:
        first = submit(store)
        events = store.events()
    for _ in range(2):
        with Store.open(path) as again:
            assert current_revision(again.engine) == head_revision()
            assert again.get(first.id) == first
            assert again.events() == events
            upgrade(again.engine)  # once more on an open store: nothing to do
            assert again.list() == [first]


def test_downgrade_to_nothing_and_up_again(tmp_path: Path) -> None:
    with Store.open(tmp_path / "fgpu.db") as store:
        with writer(store.engine).begin() as connection:
            command.downgrade(alembic_config(connection), "base")
        assert set(inspect(store.engine).get_table_names()) == {"alembic_version"}
        upgrade(store.engine)
        assert set(inspect(store.engine).get_table_names()) == TABLES


def test_two_stores_opening_one_new_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "fgpu.db"
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def open_it() -> None:
        barrier.wait()
        try:
            Store.open(path).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with Store.open(path) as store:
        assert current_revision(store.engine) == head_revision()


def test_sqlite_runs_in_wal_mode_with_foreign_keys_and_a_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "fgpu.db"
    with Store.open(path) as store, store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == BUSY_TIMEOUT_MS
    raw = sqlite3.connect(path)  # WAL is a property of the file: another client sees it
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        raw.close()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({"XDG_STATE_HOME": "/var/state"}, Path("/var/state/fgpu/fgpu.db"), id="xdg"),
        pytest.param({}, Path.home() / ".local/state/fgpu/fgpu.db", id="unset"),
        pytest.param({"XDG_STATE_HOME": ""}, Path.home() / ".local/state/fgpu/fgpu.db", id="empty"),
    ],
)
def test_default_db_path(environ: dict[str, str], expected: Path) -> None:
    assert default_db_path(environ) == expected


def test_default_url_follows_xdg_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    url = database_url(None)
    assert url.get_backend_name() == "sqlite"
    assert url.database == str(tmp_path / "fgpu" / "fgpu.db")


@pytest.mark.parametrize(
    ("target", "backend", "database"),
    [
        pytest.param("/srv/fgpu.db", "sqlite", "/srv/fgpu.db", id="path"),
        pytest.param(Path("/srv/fgpu.db"), "sqlite", "/srv/fgpu.db", id="Path"),
        pytest.param("sqlite:////srv/fgpu.db", "sqlite", "/srv/fgpu.db", id="sqlite-url"),
        pytest.param("postgresql://fgpu@db.example/fgpu", "postgresql", "fgpu", id="postgres"),
    ],
)
def test_database_url(target: str | Path, backend: str, database: str) -> None:
    url = database_url(target)
    assert url.get_backend_name() == backend
    assert url.database == database


def test_postgres_url_gets_an_installed_driver() -> None:
    url = database_url("postgresql://fgpu@db.example/fgpu")
    assert url.drivername in ("postgresql", "postgresql+psycopg")


def test_make_engine_does_not_migrate(tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "fgpu.db")
    try:
        assert current_revision(engine) is None
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()
