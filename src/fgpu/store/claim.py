"""One service per database: an exclusive claim held for the life of the service.

Two services on one database would both recover the same running workloads (one marking
the other's live processes lost) and both launch the same pending ones. The state folder
lock does not cover a database given with ``--db``, so the database is claimed as well:

- SQLite: an exclusive ``flock`` on ``DATABASE.lock`` beside the file (the kernel drops it
  when the holder dies, even by SIGKILL); the holder's pid is written in it for the error;
- PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``) on a connection kept
  open for the claim's life (the server drops it when that connection ends);
- an in-memory SQLite database is private to its process: nothing to claim.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from sqlalchemy import Connection, Engine, text

from fgpu.store.errors import StoreConflict

ADVISORY_LOCK_KEY = int.from_bytes(b"fgpu-svc", "big") & 0x7FFF_FFFF_FFFF_FFFF
"""The PostgreSQL advisory lock key of the service claim (a positive bigint)."""


class DatabaseClaim:
    """An exclusive claim on a database; :meth:`release` (or process exit) gives it up."""

    def __init__(self, file: IO[str] | None = None, connection: Connection | None = None):
        self._file = file
        self._connection = connection

    def release(self) -> None:
        """Give the claim up (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def claim_database(engine: Engine) -> DatabaseClaim:
    """Claim ``engine``'s database for this process.

    Raises:
        StoreConflict: another process holds the claim (its pid, where known, is named).
    """
    url = engine.url
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if not database or database == ":memory:" or database.startswith("file:"):
            return DatabaseClaim()
        return DatabaseClaim(file=_lock_file(Path(database)))
    connection = engine.connect()
    try:
        held = connection.execute(
            text("SELECT pg_try_advisory_lock(:key)"), {"key": ADVISORY_LOCK_KEY}
        ).scalar()
        connection.commit()
    except BaseException:
        connection.close()
        raise
    if not held:
        connection.close()
        where = url.render_as_string(hide_password=True)
        raise StoreConflict(f"another fgpu serve uses the database {where}")
    return DatabaseClaim(connection=connection)


class LockHeld(Exception):
    """Another process holds the lock file; ``holder`` is the pid it wrote ("unknown" when
    it wrote none)."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"held by pid {holder}")
        self.holder = holder


def hold_lock_file(path: Path) -> IO[str]:
    """An exclusive ``flock`` on ``path`` (created when missing), with this process's pid
    written in it, held until the returned file is closed (or the process dies, even by
    SIGKILL: the kernel drops the lock).

    Raises:
        LockHeld: another process holds it.
        OSError: the file cannot be opened.
    """
    handle = open(path, "a+")  # noqa: SIM115 - held for the lock's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise LockHeld(holder) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def _lock_file(database: Path) -> IO[str]:
    try:
        return hold_lock_file(database.with_name(database.name + ".lock"))
    except LockHeld as held:
        raise StoreConflict(
            f"another fgpu serve (pid {held.holder}) uses the database {database}"
        ) from None
