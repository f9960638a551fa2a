"""Whether the service can store what it is asked to (issue 27, point 3): the database
writes, and the state folder's disk (logs, exit records, process handles) has room.

:func:`disk_problem` reads the free space of a folder's file system (``statvfs``, no write);
:class:`StorageCheck` puts that together with the store's latest write failure
(:attr:`fgpu.store.base.StoreBase.write_fault`), trying a write again
(:meth:`~fgpu.store.base.StoreBase.probe_write`) while one is remembered, so that a disk made
free again is seen at once. ``/v1/healthz`` and ``/v1/readyz`` fail with the cause while
there is one; submissions are refused with 507 and the cause.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from fgpu.store import Store
from fgpu.store.engine import is_sqlite

MIN_FREE_BYTES = 1 << 20
"""Least free space (bytes) the state folder's disk (and an SQLite file's) must have for a
new submission: its logs, its exit record and its process handle go there."""

PROBE_INTERVAL_S = 1.0
"""While a write failure is remembered, how often (at most) a check tries a write again."""


def disk_problem(folder: Path, minimum: int = MIN_FREE_BYTES) -> str | None:
    """Why ``folder``'s file system cannot take fgpu's files, or None.

    Counts the blocks this process may use (``f_bfree`` for root, who may use the blocks
    ext4 reserves, else ``f_bavail``) times the fragment size. A folder that cannot be read
    is no problem here (the write that needs it reports its own error).
    """
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    free = blocks * st.f_frsize
    if free >= minimum:
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
    """

    def __init__(
        self,
        store: Store,
        folders: Sequence[Path],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._clock = clock
        paths = list(folders)
        url = store.engine.url
        if is_sqlite(url) and url.database and url.database != ":memory:":
            paths.append(Path(url.database).parent)
        self._folders = list(dict.fromkeys(p.resolve() for p in paths))
        self._probed = -PROBE_INTERVAL_S
        self._lock = threading.Lock()

    def problem(self) -> str | None:
        """The first cause found: the database's last write failed and a new try fails too
        (tried at most every :data:`PROBE_INTERVAL_S`), or a folder's disk is (nearly)
        full; None when the service can store."""
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


__all__ = ["MIN_FREE_BYTES", "PROBE_INTERVAL_S", "StorageCheck", "disk_problem"]
