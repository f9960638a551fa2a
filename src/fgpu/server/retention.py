"""Retention: finished workloads, their events and their log folders are deleted after a set
age (``fgpu serve --retention``, default :data:`DEFAULT_RETENTION_S`), so nothing one user
makes the service hold is kept forever (DESIGN.md section 5; issue 27).

Pruning runs in the background of the service (:meth:`Pruner.run`): every
:data:`PRUNE_EVERY_S` it deletes batches of at most :data:`PRUNE_BATCH` workloads (one short
transaction each, in a worker thread, never on the event loop), pausing between batches so
that submissions and rounds take turns with it, until nothing older than the cut-off is
left. Events of no workload (queue and node changes) older than the cut-off go too.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fgpu.store.usage import Pruned

log = logging.getLogger("fgpu.server")

DEFAULT_RETENTION_S = 7 * 86_400.0
"""Finished workloads are kept a week."""
DEFAULT_EVENT_INTERVAL_S = 60.0
"""Like events of one workload within a minute are one row with a count."""
PRUNE_EVERY_S = 60.0
"""How often pruning looks for work (more often for a retention under four minutes: a
quarter of it, at least every second)."""
PRUNE_BATCH = 200
"""Workloads per pruning transaction."""
PRUNE_PAUSE_S = 0.05
"""Pause between two batches (the store's writer is free meanwhile)."""

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*", re.IGNORECASE)
_SCALE = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}


def parse_duration(option: str, text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"90s"``, ``"2w"`` or plain seconds -> seconds.

    Raises:
        ValueError: naming ``option`` and echoing ``text`` when it is not a duration above 0.
    """
    found = _DURATION.fullmatch(text)
    if found is None:
        raise ValueError(
            f"{option}: {text!r} is not a duration; give a number with s, m, h, d or w (e.g. 7d)"
        )
    seconds = float(found.group(1)) * _SCALE[(found.group(2) or "s").lower()]
    if seconds <= 0:
        raise ValueError(f"{option}: {text!r} must be longer than 0")
    return seconds


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long the service keeps what is finished, and how it coalesces events.

    Attributes:
        retention_s: age (since a workload finished; since an event of no workload happened)
            after which it is deleted, seconds.
        event_interval_s: like events of one workload within this many seconds are one row
            with a count (0: every event is a row).
    """

    retention_s: float = DEFAULT_RETENTION_S
    event_interval_s: float = DEFAULT_EVENT_INTERVAL_S

    def check(self) -> None:
        """Raises ValueError naming the flag and echoing the value when out of range."""
        if not self.retention_s > 0:
            raise ValueError(f"--retention: {self.retention_s} must be above 0 seconds")
        if not 0 <= self.event_interval_s <= 86_400:
            raise ValueError(
                f"--event-interval: {self.event_interval_s} must be between 0 and 86400 seconds"
            )


class Pruner:
    """Deletes what is older than the retention, a batch at a time.

    Args:
        prune: one batch (:meth:`fgpu.store.usage.UsageStore.prune` bound to the store):
            takes the cut-off time and returns what it deleted.
        log_dir: the workloads' log folders (``<log_dir>/<id>``), removed with them.
        clock: seconds since the epoch.
        retention_s: see :class:`RetentionPolicy`.
        on_pruned: told what each batch deleted (the service's usage ledger frees the
            bytes).
    """

    def __init__(
        self,
        prune: Callable[[float], Pruned],
        log_dir: Path,
        clock: Callable[[], float],
        retention_s: float,
        on_pruned: Callable[[Pruned], None] | None = None,
    ) -> None:
        self._prune = prune
        self._on_pruned = on_pruned
        self._log_dir = log_dir
        self._clock = clock
        self.retention_s = retention_s
        self.workloads = 0
        """Workloads deleted since the start."""
        self.events = 0
        """Events deleted since the start."""

    def batch(self) -> Pruned:
        """One batch (blocking: call it from a worker thread): delete, then remove the log
        folders of the workloads deleted."""
        pruned = self._prune(self._clock() - self.retention_s)
        if self._on_pruned is not None:
            self._on_pruned(pruned)
        for workload_id in pruned.workload_ids:
            shutil.rmtree(self._log_dir / workload_id, ignore_errors=True)
        self.workloads += len(pruned.workload_ids)
        self.events += pruned.events
        return pruned

    async def pass_once(self) -> int:
        """Batches until nothing is left to prune, each in a worker thread, with a pause
        between them; returns the workloads deleted."""
        deleted = 0
        while True:
            pruned = await asyncio.to_thread(self.batch)
            deleted += len(pruned.workload_ids)
            if pruned.done:
                return deleted
            await asyncio.sleep(PRUNE_PAUSE_S)

    async def run(self, every_s: float | None = None) -> None:
        """Prune now, then every ``every_s`` seconds (default :data:`PRUNE_EVERY_S`, or a
        quarter of a short retention), until cancelled; a failing pass is logged and tried
        again at the next."""
        if every_s is None:
            every_s = min(PRUNE_EVERY_S, max(1.0, self.retention_s / 4))
        while True:
            try:
                deleted = await self.pass_once()
                if deleted:
                    log.info("retention: deleted %d finished workload(s)", deleted)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("retention: pruning failed; trying again later")
            await asyncio.sleep(every_s)


__all__ = [
    "DEFAULT_EVENT_INTERVAL_S",
    "DEFAULT_RETENTION_S",
    "Pruner",
    "RetentionPolicy",
    "parse_duration",
]
