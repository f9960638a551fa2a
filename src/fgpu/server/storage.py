"""Whether the service can store what it is asked to (issue 27, point 3): the database
writes, and the state folder's disk (logs, exit records, process handles) has room.

:func:`disk_problem` reads the free space of a folder's file system (``statvfs``, no write);
:class:`StorageCheck` puts that together with the store's latest write failure
(:attr:`fgpu.store.base.StoreBase.write_fault`), trying a write again
(:meth:`~fgpu.store.base.StoreBase.probe_write`) while one is remembered, so that a disk made
free again is seen at once. ``/v1/healthz`` and ``/v1/readyz`` fail with the cause while
there is one; submissions are refused with 507 and the cause.

**Cancels and ends are written on a full disk.** A state change that frees resources (a
cancel, a stop, a workload's end) must never wait for room: the GPU share it frees may be
what the machine's users need to clean up. So the service keeps a *ballast*
(:class:`Ballast`): a file of ``fgpu serve --disk-ballast`` bytes (default
:data:`DEFAULT_BALLAST_BYTES`) in the state folder, allocated at start. When such a write
fails for want of space, the service deletes the ballast and tries the write once more
(:meth:`fgpu.server.core.ServiceCore._freeing`); the room it freed is then the store's
(workloads' output never takes it: it stays below the disk's free space reserve,
:mod:`fgpu.disk_room`). While the ballast is gone the service is not healthy and
submissions get 507, saying so; once the disk has room for it again (checked at most every
:data:`PROBE_INTERVAL_S`), it is allocated again and the service is healthy. A service that
finds no room for it at start is unhealthy the same way. Where the ballast is gone too, a
workload's end is kept in memory and written when the store can
(:mod:`fgpu.server.processes`), and a cancel gets 507 with the cause.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fgpu.disk_room import DiskReserve, free_bytes, size_words
from fgpu.store import Store
from fgpu.store.engine import is_sqlite

MIN_FREE_BYTES = 1 << 20
"""Least free space (bytes) the state folder's disk (and an SQLite file's) must have for a
new submission: its logs, its exit record and its process handle go there."""

SUBMISSION_DISK_FACTOR = 2
"""A submission's command and environment are counted twice on disk: in the database's file
and in its write-ahead log (:meth:`StorageCheck.room_problem`)."""
SUBMISSION_DISK_EXTRA = 64 * 1024
"""Bytes counted on disk for a submission besides its command and environment: its row's
pages and indexes, its log folder and exit record."""

PROBE_INTERVAL_S = 1.0
"""While a write failure is remembered, how often (at most) a check tries a write again."""

DEFAULT_BALLAST_BYTES = 16 * 2**20
"""Size of the ballast (``fgpu serve --disk-ballast``): room for thousands of the store's
writes of a cancel or an end (a few pages each in SQLite's write-ahead log)."""
BALLAST_NAME = "disk-ballast"
"""The ballast's file name in the state folder."""

log = logging.getLogger("fgpu.server")


class Ballast:
    """Space held in the state folder for the writes that free resources (see the module
    docstring).

    Args:
        folder: the state folder.
        size: bytes (0: no ballast).
    """

    def __init__(self, folder: Path, size: int) -> None:
        self.path = folder / BALLAST_NAME
        self.size = size
        self.released_because: str | None = None
        """Why it is missing (released for a write that failed, or no room for it at the
        service's start), while it is not back."""
        self._lock = threading.Lock()

    def allocate(self) -> bool:
        """Allocate the ballast's blocks (``posix_fallocate``) unless it is whole already;
        True when it is whole (or there is none to keep). A disk without room for it gets
        none (a partial file is removed)."""
        if self.size <= 0:
            return True
        with self._lock:
            try:
                if self.path.stat().st_size >= self.size:
                    self.released_because = None
                    return True
            except FileNotFoundError:
                pass
            except OSError:
                return False
            tmp = self.path.with_name(f".{BALLAST_NAME}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                try:
                    os.posix_fallocate(fd, 0, self.size)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, self.path)
            except OSError:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                return False
            self.released_because = None
            return True

    def release(self, cause: str) -> bool:
        """Delete the ballast because a write that frees resources failed (``cause``); True
        when it held space to give (the write is worth trying again)."""
        if self.size <= 0:
            return False
        with self._lock:
            try:
                self.path.unlink()
            except FileNotFoundError:
                return False
            except OSError as exc:
                log.error("cannot release the disk ballast %s: %s", self.path, exc)
                return False
            self.released_because = f"released when the disk ran full: {cause}"
        log.error(
            "the state disk is full (%s): released the ballast %s (%s) so that cancels and "
            "workloads' ends are recorded; submissions are refused until the disk has room "
            "for it again",
            cause,
            self.path,
            size_words(self.size),
        )
        return True

    def problem(self) -> str | None:
        """Why the service is not healthy for want of its ballast (it was released and
        there is no room to allocate it again), or None (allocates it again when there is
        room, keeping :data:`MIN_FREE_BYTES` free beside it)."""
        if self.released_because is None:
            return None
        free = free_bytes(self.path.parent)
        if free is not None and free >= self.size + MIN_FREE_BYTES and self.allocate():
            log.info("the disk ballast %s is allocated again", self.path)
            return None
        return (
            f"the disk of {self.path.parent} has no room for fgpu's reserve "
            f"({self.path.name}, {size_words(self.size)}, fgpu serve --disk-ballast; "
            f"{self.released_because}), which keeps cancels and workloads' ends recordable "
            "on a full disk; fgpu takes new work again once the disk has room for it"
        )


def disk_problem(folder: Path, minimum: int = MIN_FREE_BYTES) -> str | None:
    """Why ``folder``'s file system cannot take fgpu's files, or None.

    Counts the blocks this process may use (:func:`fgpu.disk_room.free_bytes`). A folder
    that cannot be read is no problem here (the write that needs it reports its own error).
    """
    free = free_bytes(folder)
    if free is None or free >= minimum:
        return None
    return (
        f"the disk of {folder} has {free // 1024} KiB free; fgpu needs at least "
        f"{minimum // 1024} KiB there for workloads' logs and exit records"
    )


class StorageCheck:
    """What stops the service from storing now, if anything (see the module docstring).

    Args:
        store: the service's store.
        folders: folders whose disks must have room (the state folder; an SQLite file's
            folder is added).
        clock: monotonic seconds (for the probe interval).
        ballast: the state folder's ballast (None: none).
        reserve: free space of the state disk that a submission never takes (the same
            reserve as workloads' output, ``fgpu serve --log-disk-reserve``; None: none).
    """

    def __init__(
        self,
        store: Store,
        folders: Sequence[Path],
        clock: Callable[[], float] = time.monotonic,
        ballast: Ballast | None = None,
        reserve: DiskReserve | None = None,
    ) -> None:
        self._store = store
        self.ballast = ballast
        self.reserve = reserve
        self._clock = clock
        paths = list(folders)
        url = store.engine.url
        self._wal: Path | None = None
        if is_sqlite(url) and url.database and url.database != ":memory:":
            paths.append(Path(url.database).parent)
            self._wal = Path(f"{url.database}-wal")
        self._folders = list(dict.fromkeys(p.resolve() for p in paths))
        self._probed = -PROBE_INTERVAL_S
        self._ballast_problem: str | None = None
        self._ballast_probed = -PROBE_INTERVAL_S
        self._lock = threading.Lock()

    def problem(self) -> str | None:
        """The first cause found: the database's last write failed and a new try fails too
        (tried at most every :data:`PROBE_INTERVAL_S`), the ballast was used and there is
        no room for it yet, or a folder's disk is (nearly) full; None when the service can
        store."""
        if self.ballast is not None and self.ballast.released_because is not None:
            with self._lock:
                now = self._clock()
                if self._ballast_problem is None or now - self._ballast_probed >= PROBE_INTERVAL_S:
                    self._ballast_probed = now
                    self._ballast_problem = self.ballast.problem()
                problem = self._ballast_problem
            if problem is not None:
                return problem
        else:
            self._ballast_problem = None
        fault = self._store.write_fault
        if fault is not None:
            with self._lock:
                now = self._clock()
                if now - self._probed >= PROBE_INTERVAL_S:
                    self._probed = now
                    fault = self._store.probe_write()
                else:
                    fault = self._store.write_fault
            if fault is not None:
                return fault
        for folder in self._folders:
            problem = disk_problem(folder)
            if problem is not None:
                return problem
        return None

    def room_problem(self, size: int) -> str | None:
        """Why a submission that stores ``size`` bytes of command, environment and working
        directory is refused for want of room, or None: storing it (counted as
        :data:`SUBMISSION_DISK_FACTOR` times ``size`` plus :data:`SUBMISSION_DISK_EXTRA`, for
        the database's file and write-ahead log and the workload's log folder; with SQLite the
        write-ahead log's size too, which the database file may grow by when the log is
        copied into it) would take a folder's free space below the reserve
        (:attr:`reserve`), which is kept for everyone's cancels, workloads' ends and records
        (issue 27: one user's pending submissions filled the state disk)."""
        if self.reserve is None:
            return None
        cost = SUBMISSION_DISK_FACTOR * size + SUBMISSION_DISK_EXTRA
        owed = 0  # pages of an SQLite write-ahead log grow the database file when copied there
        if self._wal is not None:
            with contextlib.suppress(OSError):
                owed = self._wal.stat().st_size
            if owed and self._short(cost + owed):
                owed = self._checkpoint()
        cost += owed
        for folder, free, needed in self._room():
            if free - cost >= needed:
                continue
            wal = f", with the {size_words(owed)} write-ahead log still to copy," if owed else ""
            return (
                f"this submission's {size} bytes of command, env and cwd (about "
                f"{size_words(cost - owed)} on disk{wal}) would leave the disk of {folder} with "
                f"{size_words(max(free - cost, 0))} of its {size_words(free)} free, less than the "
                f"{size_words(needed)} kept free for everyone's cancels, workloads' ends and "
                f"logs (fgpu serve --log-disk-reserve: {self.reserve.words()}); cancel or "
                "prune stored workloads, or submit a smaller command and environment"
            )
        return None

    def _room(self) -> list[tuple[Path, int, int]]:
        """``(folder, free bytes, reserve bytes)`` of each folder whose free space and
        reserve are known (and the reserve is not 0)."""
        room = []
        for folder in self._folders:
            free = free_bytes(folder)
            needed = self.reserve.needed(folder) if self.reserve is not None else 0
            if free is not None and needed:
                room.append((folder, free, needed))
        return room

    def _short(self, cost: int) -> bool:
        """Whether ``cost`` bytes would take a folder below its reserve."""
        return any(free - cost < needed for _, free, needed in self._room())

    def _checkpoint(self) -> int:
        """Copy the SQLite write-ahead log into the database as far as readers allow (a
        passive checkpoint, which waits for nobody); the bytes still owed to the database
        (the log's frames not copied times the page size). The log's file keeps its size,
        so only this tells how much of it the database may still grow by."""
        try:
            with self._store.engine.connect() as connection:
                row = connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").one()
                page = connection.exec_driver_sql("PRAGMA page_size").scalar_one()
        except Exception as exc:  # any failure: count the whole log
            log.warning("cannot checkpoint the database's write-ahead log: %s", exc)
            try:
                return self._wal.stat().st_size if self._wal is not None else 0
            except OSError:
                return 0
        _, frames, copied = row
        if frames < 0:  # not in WAL mode
            return 0
        return max(int(frames) - int(copied), 0) * int(page)


__all__ = [
    "BALLAST_NAME",
    "DEFAULT_BALLAST_BYTES",
    "MIN_FREE_BYTES",
    "PROBE_INTERVAL_S",
    "SUBMISSION_DISK_EXTRA",
    "SUBMISSION_DISK_FACTOR",
    "Ballast",
    "StorageCheck",
    "disk_problem",
]
