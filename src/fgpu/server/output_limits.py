"""A per-user limit on the output stored for a user's workloads (issue 27: each log had its
own cap, so one user's many workloads, each within its cap, could still fill the disk).

A user's *stored output* is the size of the log folders (``<log_dir>/<id>/``: the logs and
their tail segments) of all their workloads the store still holds, active and finished
until retention prunes them (``fgpu serve --retention``). Two limits, as for the stored
bytes of commands (:mod:`fgpu.server.quotas`):

- the machine's, ``fgpu serve --max-output-bytes`` (default :data:`DEFAULT_MAX_OUTPUT_BYTES`),
  over all queues;
- a queue's, where an admin set it (``fgpu queue create|set --max-output-bytes SIZE``),
  counting the user's workloads in that queue.

Enforcement is a cut, never a kill: every :data:`CHECK_EVERY_S` the service measures the log
folders of the running workloads (``stat`` of their files; finished ones were measured
once, when first seen, and keep their figure until pruned), and when a user is at a limit it
writes a *stop file* (:data:`fgpu.disk_room.STOP_FILE`) into each of that user's running
workloads' log folders concerned; the wrapper then drops their output and the logs say so,
naming the limit (:class:`fgpu.disk_room.OutputGate`). A workload that starts while its user
is at a limit starts with the stop file written; one that starts below them has any stop file
of an earlier run removed. Between two checks a user's workloads may write past the limit by
what they write in that time (each log stays within ``--max-log-bytes``, and the disk's
reserve holds whatever happens, :mod:`fgpu.disk_room`).

:class:`OutputLedger` keeps the figures; it reads the store (the ids of a user's workloads)
the first time a user needs counting, then only measures running workloads.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fgpu.disk_room import STOP_FILE, write_stop
from fgpu.server.quotas import size_text
from fgpu.wire_limits import MIN_OUTPUT_BYTES

DEFAULT_MAX_OUTPUT_BYTES = 4 * 2**30
"""Output one user's stored workloads may keep, all queues (about 60 workloads at the
default log cap of 64 MiB per log, each filling all three of its logs)."""
CHECK_EVERY_S = 1.0
"""How often the service measures the running workloads' logs."""


def folder_bytes(folder: Path) -> int:
    """Bytes of the files in ``folder`` (not recursive); 0 when it is missing."""
    total = 0
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except OSError:
        return 0
    return total


@dataclass(frozen=True, slots=True)
class Running:
    """A running workload as the check sees it: id, owner uid, queue."""

    id: str
    owner_uid: int
    queue: str


class OutputLedger:
    """Bytes of output stored per user and queue (see the module docstring).

    Args:
        log_dir: the workloads' log folders.
        owner_workloads: ``uid -> [(workload id, queue)]`` of every stored workload of the
            user (:meth:`fgpu.store.usage.UsageStore.owner_workloads`).
        max_bytes: the machine's limit per user (``--max-output-bytes``).
    """

    def __init__(
        self,
        log_dir: Path,
        owner_workloads: Callable[[int], list[tuple[str, str]]],
        max_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        self.log_dir = log_dir
        self.max_bytes = max_bytes
        self._owner_workloads = owner_workloads
        self._lock = threading.Lock()
        self._sizes: dict[str, tuple[int, str, int]] = {}  # id -> (uid, queue, bytes)
        self._totals: dict[int, dict[str, int]] = {}  # uid -> queue -> bytes (loaded users)
        self._stopped: set[str] = set()  # running ids whose stop file is written
        self._running: set[str] = set()  # running at the last check

    def _load(self, uid: int) -> dict[str, int]:
        totals = self._totals.get(uid)
        if totals is not None:
            return totals
        totals = defaultdict(int)
        for workload_id, queue in self._owner_workloads(uid):
            size = folder_bytes(self.log_dir / workload_id)
            self._sizes[workload_id] = (uid, queue, size)
            totals[queue] += size
        self._totals[uid] = totals
        return totals

    def _measure(self, workload: Running) -> None:
        totals = self._load(workload.owner_uid)
        size = folder_bytes(self.log_dir / workload.id)
        _, queue, old = self._sizes.get(workload.id, (workload.owner_uid, workload.queue, 0))
        self._sizes[workload.id] = (workload.owner_uid, queue, size)
        totals[queue] += size - old

    def used(self, uid: int, queue: str | None = None) -> int:
        """Bytes of output ``uid``'s stored workloads keep (in ``queue``; None: all)."""
        with self._lock:
            totals = self._load(uid)
            return totals.get(queue, 0) if queue is not None else sum(totals.values())

    def over(self, uid: int, queue: str, queue_limit: int | None) -> str | None:
        """Why ``uid``'s workloads in ``queue`` may not store more output (the limit
        reached, where it is set, its value and the user's figure), or None."""
        with self._lock:
            totals = self._load(uid)
            in_queue = totals.get(queue, 0)
            total = sum(totals.values())
        if queue_limit is not None and in_queue >= queue_limit:
            return (
                f"your workloads in queue {queue} store {size_text(in_queue)} of output, at "
                f"the queue's limit per user (max_output_bytes {size_text(queue_limit)}, set "
                f"with 'fgpu queue set {queue} --max-output-bytes SIZE'); finished workloads "
                "count until they are pruned"
            )
        if total >= self.max_bytes:
            return (
                f"your workloads store {size_text(total)} of output, at the limit per user on "
                f"this machine (--max-output-bytes {size_text(self.max_bytes)}); finished "
                "workloads count until they are pruned"
            )
        return None

    def check(
        self, running: Iterable[Running], queue_limits: Mapping[str, int | None]
    ) -> list[tuple[str, str]]:
        """Measure the running workloads' logs and stop the output of those whose user is
        at a limit; returns ``(workload id, reason)`` of each stop file written now.
        (Blocking: call it from a worker thread.)"""
        running = list(running)
        with self._lock:
            for workload in running:
                self._measure(workload)
            ids = {w.id for w in running}
            for workload_id in self._running - ids:  # ended since: their last output
                found = self._sizes.get(workload_id)
                if found is not None:
                    self._measure(Running(workload_id, found[0], found[1]))
            self._running = ids
            self._stopped &= ids
        stopped = []
        for workload in running:
            if workload.id in self._stopped:
                continue
            reason = self.over(workload.owner_uid, workload.queue, queue_limits.get(workload.queue))
            if reason is not None and write_stop(self.log_dir / workload.id, reason):
                with self._lock:
                    self._stopped.add(workload.id)
                stopped.append((workload.id, reason))
        return stopped

    def before_launch(self, workload: Running, queue_limit: int | None) -> str | None:
        """Before ``workload`` starts: write its stop file when its user is at a limit (the
        reason, returned), else remove a stop file left by an earlier run (None)."""
        folder = self.log_dir / workload.id
        reason = self.over(workload.owner_uid, workload.queue, queue_limit)
        if reason is None:
            try:
                (folder / STOP_FILE).unlink()
            except FileNotFoundError:
                pass
            except OSError:
                return None
            with self._lock:
                self._stopped.discard(workload.id)
            return None
        folder.mkdir(parents=True, exist_ok=True)
        if write_stop(folder, reason):
            with self._lock:
                self._stopped.add(workload.id)
        return reason

    def pruned(self, workload_ids: Iterable[str]) -> None:
        """Retention deleted these workloads and their log folders."""
        with self._lock:
            for workload_id in workload_ids:
                found = self._sizes.pop(workload_id, None)
                if found is None:
                    continue
                uid, queue, size = found
                totals = self._totals.get(uid)
                if totals is not None:
                    totals[queue] = max(0, totals[queue] - size)
                self._stopped.discard(workload_id)


__all__ = [
    "CHECK_EVERY_S",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "MIN_OUTPUT_BYTES",
    "OutputLedger",
    "Running",
    "folder_bytes",
]
