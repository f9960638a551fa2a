"""Database URLs, engines and migrations.

SQLite (the default) runs in WAL mode with foreign keys on and a busy timeout, set on every
new connection. fgpu emits the ``BEGIN`` itself instead of leaving it to Python's ``sqlite3``
module: reading transactions begin with ``BEGIN`` (deferred) and writing ones with
``BEGIN IMMEDIATE``, which takes SQLite's write lock at the start, so that two writers queue
on the busy timeout instead of failing when a read lock cannot be upgraded (SQLite
documentation, "Transaction", section 2.2; SQLAlchemy documentation, "Transactions with SQLite
and the sqlite3 driver"). ``synchronous = NORMAL``, the usual choice with WAL, keeps every
committed transaction through a crash of the process, ``kill -9`` included; only a power loss
or an operating system crash may lose the last commits, and on one machine those end the
workloads too. PostgreSQL URLs (``postgresql://``) are used as given, except that the driver
is chosen among those installed (psycopg 3, else psycopg2).

The schema is made by the Alembic migrations shipped in ``fgpu/store/migrations``;
:func:`upgrade` runs them to the newest revision, in one transaction.
"""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url

BUSY_TIMEOUT_MS = 30_000
"""How long an SQLite connection waits for another writer's lock before giving up."""

WRITE_OPTION = "fgpu_write"
"""Execution option marking a connection whose transactions write (``BEGIN IMMEDIATE``)."""

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
"""The Alembic script directory shipped in the package."""


def default_db_path(environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    """Where the single-machine database lives by default.

    ``$XDG_STATE_HOME/fgpu/fgpu.db``, or ``~/.local/state/fgpu/fgpu.db`` when
    ``XDG_STATE_HOME`` is unset or empty (XDG Base Directory Specification 0.8).

    Args:
        environ: the environment to read (default: ``os.environ``).
    """
    env = os.environ if environ is None else environ
    state_home = env.get("XDG_STATE_HOME", "")
    base = Path(state_home) if state_home else Path.home() / ".local" / "state"
    return base / "fgpu" / "fgpu.db"


def database_url(target: str | Path | URL | None = None) -> URL:
    """A SQLAlchemy URL from what a user gave.

    Args:
        target: a URL (``sqlite:///...``, ``postgresql://...``), a path of an SQLite file,
            or None for :func:`default_db_path`.

    Returns:
        The URL; a ``postgresql://`` URL without a driver gets psycopg 3 when it is
        installed and psycopg2 is not.
    """
    if target is None:
        return URL.create("sqlite", database=str(default_db_path()))
    if isinstance(target, URL):
        url = target
    elif isinstance(target, Path) or "://" not in target:
        return URL.create("sqlite", database=str(Path(target).expanduser()))
    else:
        url = make_url(target)
    if url.drivername in ("postgresql", "postgres"):
        has_psycopg3 = importlib.util.find_spec("psycopg") is not None
        has_psycopg2 = importlib.util.find_spec("psycopg2") is not None
        driver = "postgresql+psycopg" if has_psycopg3 and not has_psycopg2 else "postgresql"
        url = url.set(drivername=driver)
    return url


def is_sqlite(url: URL) -> bool:
    """True for an SQLite URL."""
    return url.get_backend_name() == "sqlite"


def make_engine(target: str | Path | URL | None = None, **kwargs: Any) -> Engine:
    """An engine for ``target`` (see :func:`database_url`), SQLite set up as described above.

    The parent folder of an SQLite file is created if missing. Extra keyword arguments go to
    :func:`sqlalchemy.create_engine`.
    """
    url = database_url(target)
    if not is_sqlite(url):
        return create_engine(url, **kwargs)
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, **kwargs)
    event.listen(engine, "connect", _on_sqlite_connect)
    event.listen(engine, "begin", _on_sqlite_begin)
    return engine


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    """Set up a new SQLite connection: fgpu emits BEGIN itself; WAL, foreign keys, busy
    timeout."""
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
            _switch_to_wal(cursor)
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()


def _switch_to_wal(cursor: Any) -> None:
    """Put a new database file in WAL mode (a lasting property of the file).

    The switch needs the file to itself and SQLite does not wait on the busy timeout for it,
    so when another connection is using the new file at that moment, retry until the timeout
    has passed. (An in-memory database stays in its "memory" mode; that is no error.)
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _on_sqlite_begin(connection: Connection) -> None:
    """Begin an SQLite transaction: IMMEDIATE for writers, deferred for readers."""
    writing = connection.get_execution_options().get(WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if writing else "BEGIN")


SQLITE_STORAGE_CODES = {8: "read-only", 10: "I/O error", 13: "full", 14: "cannot open"}
"""SQLite primary result codes (the low byte of an extended code) that mean the database
cannot write for want of storage (SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL,
SQLITE_CANTOPEN; SQLite documentation, "Result and Error Codes")."""

POSTGRES_STORAGE_CLASSES = ("53", "58")
"""SQLSTATE classes of PostgreSQL that mean the server cannot write: 53 insufficient
resources (53100 disk full), 58 system error (58030 I/O error) (PostgreSQL documentation,
appendix A)."""


def storage_fault(exc: BaseException, url: URL | None = None) -> str | None:
    """Why a database error means the database cannot write now (disk full, I/O error,
    read-only), with the database named; None for any other error.

    Args:
        exc: a SQLAlchemy ``DBAPIError`` (its ``orig`` is the driver's error) or a driver
            error itself.
        url: the database, to name it.
    """
    orig = getattr(exc, "orig", None) or exc
    where = f" ({url.database if url is not None and is_sqlite(url) else url})" if url else ""
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        if isinstance(code, int) and (code & 0xFF) in SQLITE_STORAGE_CODES:
            return f"the database cannot write: {orig}{where}"
        if code is None and "disk is full" in str(orig):
            return f"the database cannot write: {orig}{where}"
        return None
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if isinstance(state, str) and state[:2] in POSTGRES_STORAGE_CLASSES:
        first = str(orig).strip().splitlines()[0] if str(orig).strip() else state
        return f"the database cannot write: {first} (SQLSTATE {state}){where}"
    return None


RECOVERY_STEPS = (
    "stop here and keep a copy of the file (cp {db} {db}.damaged); then either recover what "
    "can be read into a new file (sqlite3 {db} '.recover' | sqlite3 {db}.recovered) and serve "
    "from it (--db {db}.recovered), or move the file away to start with an empty store; "
    "either way, workloads still running that the store does not know are stopped at start "
    "before any GPU is handed out"
)
"""What to do with a damaged SQLite file (``{db}``: its path)."""


def check_integrity(engine: Engine, *, max_problems: int = 10) -> None:
    """Refuse a damaged database before anything writes to it.

    SQLite: ``PRAGMA quick_check`` (SQLite documentation, "PRAGMA quick_check": the
    integrity check without the index-content cross-checks, O(N)); a file that is not a
    database, or any problem it reports, is damage. PostgreSQL: a connection and a read of
    the migration table; an error there is raised as it is (the server reports its own
    damage).

    Raises:
        StoreDamaged: the problems found (at most ``max_problems`` lines), the file named.
        sqlalchemy.exc.SQLAlchemyError: PostgreSQL (or SQLite) could not be reached.
    """
    from sqlalchemy import text
    from sqlalchemy.exc import DatabaseError

    from fgpu.store.errors import StoreDamaged

    url = engine.url
    if not is_sqlite(url):
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        return
    name = url.database or ":memory:"
    try:
        with engine.connect() as connection:
            rows = connection.exec_driver_sql(f"PRAGMA quick_check({max_problems})").all()
            connection.rollback()
    except DatabaseError as exc:
        orig = exc.orig
        code = getattr(orig, "sqlite_errorcode", None)
        if isinstance(code, int) and (code & 0xFF) in (11, 26):  # SQLITE_CORRUPT, NOTADB
            raise StoreDamaged(name, [str(orig)]) from exc
        raise
    problems = [str(row[0]) for row in rows]
    if problems != ["ok"]:
        raise StoreDamaged(name, problems)


def writer(engine: Engine) -> Engine:
    """The same engine, its transactions marked as writing (see the module docstring)."""
    return engine.execution_options(**{WRITE_OPTION: True})


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic configuration for the shipped migrations, without an ini file.

    Args:
        connection: the connection ``env.py`` migrates on.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest migration's revision id."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations found in {MIGRATIONS_DIR}")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None: not migrated yet)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database to ``revision`` in one transaction (idempotent).

    On SQLite the transaction begins with ``BEGIN IMMEDIATE``, so two processes opening the
    same new file at once migrate one after the other.
    """
    with writer(engine).begin() as connection:
        command.upgrade(alembic_config(connection), revision)
