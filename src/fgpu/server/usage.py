"""What each user holds, kept in memory by the service: active workloads and stored bytes per
(owner, queue), so that a submission's per-user limits (:mod:`fgpu.server.quotas`) cost a
dictionary lookup instead of a scan of the owner's stored workloads (issue 27: the check
must not grow with the submitter's backlog).

The service is the only writer of its store (its state folder is locked), so the figures
are read from the store once (:meth:`fgpu.store.usage.UsageStore.usage_totals`, one grouped
read) and then kept current by the service's own writes: a submission adds a workload and
its bytes, a workload leaving the active phases removes one from the count (the service's
mirror of active workloads says when), and retention's pruning removes the bytes of what it
deleted.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from fgpu.store.usage import OwnerUsage

Key = tuple[int, str]
"""(owner uid, queue)."""


class UsageLedger:
    """Active workloads and stored bytes per (owner, queue), in memory (thread-safe).

    Args:
        load: the figures as stored: (owner, queue) -> (active workloads, stored bytes);
            called once, at the first use.
    """

    def __init__(self, load: Callable[[], Mapping[Key, tuple[int, int]]]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._active: Counter[Key] | None = None
        self._bytes: Counter[Key] = Counter()
        self._owner_active: Counter[int] = Counter()
        self._owner_bytes: Counter[int] = Counter()

    def _loaded(self) -> Counter[Key]:
        if self._active is None:
            active: Counter[Key] = Counter()
            for key, (count, size) in self._load().items():
                active[key] += count
                self._bytes[key] += size
                self._owner_active[key[0]] += count
                self._owner_bytes[key[0]] += size
            self._active = active
        return self._active

    def usage(self, owner_uid: int, queue: str) -> OwnerUsage:
        """What ``owner_uid`` holds, in ``queue`` and in all."""
        key = (owner_uid, queue)
        with self._lock:
            active = self._loaded()
            return OwnerUsage(
                active=self._owner_active[owner_uid],
                active_in_queue=active[key],
                stored_bytes=self._owner_bytes[owner_uid],
                stored_bytes_in_queue=self._bytes[key],
            )

    def submitted(self, owner_uid: int, queue: str, size: int) -> None:
        """A new (active) workload of ``size`` stored bytes."""
        with self._lock:
            if self._active is None:
                self._loaded()  # the store has it already
                return
            self._active[(owner_uid, queue)] += 1
            self._owner_active[owner_uid] += 1
            self._bytes[(owner_uid, queue)] += size
            self._owner_bytes[owner_uid] += size

    def ended(self, owner_uid: int, queue: str) -> None:
        """A workload left the active phases (its bytes stay until it is pruned)."""
        with self._lock:
            if self._active is None:
                return  # not loaded yet: the load will read it as it is now
            key = (owner_uid, queue)
            if self._active[key] > 0:
                self._active[key] -= 1
                self._owner_active[owner_uid] -= 1

    def pruned(self, freed: Iterable[tuple[Key, int]]) -> None:
        """Retention deleted finished workloads: (owner, queue) and their stored bytes."""
        with self._lock:
            if self._active is None:
                return
            for key, size in freed:
                self._bytes[key] = max(0, self._bytes[key] - size)
                self._owner_bytes[key[0]] = max(0, self._owner_bytes[key[0]] - size)


__all__ = ["Key", "UsageLedger"]
