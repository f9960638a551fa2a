"""What one user holds in the store, pages of workloads, and retention (issue 27: one user's
backlog must cost others nothing, and nothing may be kept forever).

- :meth:`UsageStore.owner_usage`: a user's active workloads and stored bytes (commands and
  environments), in one queue and in all, read from the ``(owner_uid, queue, phase,
  stored_bytes)`` index alone (no workload row is read): what the per-user limits count.
- :meth:`UsageStore.workload_page`: workloads in submission order from a cursor, at most
  ``limit``, optionally only one user's work and others' running work (``fgpu ls``).
- :meth:`UsageStore.prune`: one bounded batch of finished workloads (with their events and
  holds) and of events of no workload, older than a given time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from sqlalchemy import and_, delete, func, or_, select, tuple_

from fgpu.store.reading import RowReader
from fgpu.store.records import ACTIVE_PHASES, FINAL_PHASES, HOLDING_PHASES, WorkloadRecord
from fgpu.store.rows import DamagedRow, workload_select
from fgpu.store.schema import EventRow, HoldRow, WorkloadRow
from fgpu.wire_limits import MAX_COMMAND_BYTES


@dataclass(frozen=True, slots=True)
class OwnerUsage:
    """What one user holds (from :meth:`UsageStore.owner_usage`).

    Attributes:
        active: active (pending, running, paused) workloads, all queues.
        active_in_queue: of those, in the queue asked about.
        stored_bytes: bytes of commands and environments of all the user's stored workloads
            (active ones and finished ones not yet pruned).
        stored_bytes_in_queue: of those, in the queue asked about.
    """

    active: int = 0
    active_in_queue: int = 0
    stored_bytes: int = 0
    stored_bytes_in_queue: int = 0


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one :meth:`UsageStore.prune` batch deleted.

    Attributes:
        workload_ids: the finished workloads deleted (their log folders go too; the caller
            removes them).
        events: event rows deleted (the workloads' and those of no workload).
    """

    workload_ids: tuple[str, ...] = ()
    events: int = 0
    freed: tuple[tuple[tuple[int, str], int], ...] = ()
    """((owner uid, queue), stored bytes) of each workload deleted."""

    @property
    def done(self) -> bool:
        """Nothing was deleted: no more to prune for now."""
        return not self.workload_ids and not self.events


Cursor = tuple[float, str]
"""Where a page of workloads ends: ``(submitted_at, id)`` of its last workload."""


@dataclass(frozen=True, slots=True)
class Page:
    """A page of :meth:`UsageStore.workload_page`.

    Attributes:
        records: its workloads, in submission order.
        cursor: where the next page begins; None when this page is the last.
        damaged: rows of its range that do not decode, skipped (:mod:`fgpu.store.rows`).
    """

    records: list[WorkloadRecord]
    cursor: Cursor | None
    damaged: list[DamagedRow] = field(default_factory=list)


class UsageStore(RowReader):
    """Usage, pages and retention operations of :class:`fgpu.store.Store`."""

    def owner_usage(self, owner_uid: int, queue: str) -> OwnerUsage:
        """``owner_uid``'s active workloads and stored bytes, in ``queue`` and in all: one
        grouped read of the owner's range of the ``(owner_uid, queue, phase, stored_bytes)``
        index (cost grows with the owner's stored workloads, never with other users')."""
        query = (
            select(
                WorkloadRow.queue,
                WorkloadRow.phase,
                func.count(),
                func.coalesce(func.sum(WorkloadRow.stored_bytes), 0),
            )
            .where(WorkloadRow.owner_uid == owner_uid)
            .group_by(WorkloadRow.queue, WorkloadRow.phase)
        )
        active = active_in_queue = stored = stored_in_queue = 0
        with self._read() as session:
            for row_queue, phase, counted, summed in session.execute(query):
                here = row_queue == queue
                count, size = int(counted or 0), int(summed or 0)
                if phase in ACTIVE_PHASES:
                    active += count
                    active_in_queue += count if here else 0
                stored += size
                stored_in_queue += size if here else 0
        return OwnerUsage(active, active_in_queue, stored, stored_in_queue)

    def owner_workloads(self, owner_uid: int) -> list[tuple[str, str]]:
        """(id, queue) of every stored workload of ``owner_uid``, any phase (the per-user
        output limit measures their log folders, :mod:`fgpu.server.output_limits`)."""
        query = select(WorkloadRow.id, WorkloadRow.queue).where(WorkloadRow.owner_uid == owner_uid)
        with self._read() as session:
            return [(str(i), str(q)) for i, q in session.execute(query)]

    def usage_totals(self) -> dict[tuple[int, str], tuple[int, int]]:
        """Every user's figures: (owner uid, queue) -> (active workloads, stored bytes),
        one grouped read of the ``(owner_uid, queue, phase, stored_bytes)`` index (the
        service reads it once and keeps it current, :mod:`fgpu.server.usage`)."""
        query = select(
            WorkloadRow.owner_uid,
            WorkloadRow.queue,
            WorkloadRow.phase,
            func.count(),
            func.coalesce(func.sum(WorkloadRow.stored_bytes), 0),
        ).group_by(WorkloadRow.owner_uid, WorkloadRow.queue, WorkloadRow.phase)
        totals: dict[tuple[int, str], tuple[int, int]] = {}
        with self._read() as session:
            for owner, queue, phase, counted, summed in session.execute(query):
                active, size = totals.get((owner, queue), (0, 0))
                count = int(counted or 0) if phase in ACTIVE_PHASES else 0
                totals[(owner, queue)] = (active + count, size + int(summed or 0))
        return totals

    def workload_page(
        self,
        *,
        phases: Iterable[str] | None = None,
        after: Cursor | None = None,
        limit: int = 1000,
        owner_uid: int | None = None,
        with_others_running: bool = False,
        max_bytes: int | None = None,
        ids: Collection[str] | None = None,
        each: Callable[[WorkloadRecord], bool] | None = None,
    ) -> Page:
        """Workloads in submission order after ``after``, at most ``limit`` and about
        ``max_bytes`` of commands and environments, and the cursor of the next page.

        First the page's extent is read from the index columns and each row's stored bytes
        (``stored_bytes``; :data:`MAX_COMMAND_BYTES` where a row has none): rows
        are taken while their bytes sum to at most ``max_bytes`` (the first always); then
        only those rows are read whole. A row that does not decode is skipped and named in
        :attr:`Page.damaged` (the cursor goes past it).

        Args:
            phases: only these phases (None: all).
            after: the cursor a previous page returned (None: from the start).
            limit: most workloads on the page (>= 1).
            owner_uid: only this user's workloads ...
            with_others_running: ... and other users' running and paused ones (what ``fgpu
                ls`` shows by default: others' pending work is theirs to watch).
            max_bytes: most stored bytes read for the page (None: no bound).
            ids: only these workloads.
            each: given, each record goes to it as it is read, in order, and is not kept
                (:attr:`Page.records` stays empty: a listing encodes each and lets it go);
                it returns False to end the page before that record (the cursor then goes
                on from the record before it).
        """
        # from the index alone (ix_workloads_listing); a row of before revision r0007 that
        # was never counted is taken as the largest a submission may store
        size = func.coalesce(WorkloadRow.stored_bytes, MAX_COMMAND_BYTES)
        extent = select(WorkloadRow.submitted_at, WorkloadRow.id, size)
        extent = extent.order_by(WorkloadRow.submitted_at, WorkloadRow.id)
        if phases is not None:
            extent = extent.where(WorkloadRow.phase.in_(list(phases)))
        if owner_uid is not None:
            own = WorkloadRow.owner_uid == owner_uid
            if with_others_running:
                own = or_(own, WorkloadRow.phase.in_(sorted(HOLDING_PHASES)))
            extent = extent.where(own)
        if ids is not None:
            extent = extent.where(WorkloadRow.id.in_(list(ids)))
        if after is not None:
            extent = extent.where(
                tuple_(WorkloadRow.submitted_at, WorkloadRow.id) > tuple_(after[0], after[1])
            )
        with self._read() as session:
            taken: list[str] = []
            total = 0
            more = False
            # read as far as the page goes (rows of the index, fetched one by one)
            for _, row_id, stored in session.connection().execute(extent.limit(limit + 1)):
                bytes_ = int(stored or 0) if isinstance(stored, (int, float)) else 0
                if len(taken) == limit or (
                    taken and max_bytes is not None and total + bytes_ > max_bytes
                ):
                    more = True
                    break
                taken.append(row_id)
                total += bytes_
            query = (
                workload_select()
                .where(WorkloadRow.id.in_(taken))
                .order_by(WorkloadRow.submitted_at, WorkloadRow.id)
            )
            if not taken:
                return Page([], None, [])
            records, damaged = self._read_rows(session, query, each)
            last = self.last_read
        cursor = None
        if more or (last is not None and last[1] != taken[-1]):
            # more rows than this page took, or ``each`` ended it early
            when: object = None if last is None else last[0]  # text in a damaged row
            if last is not None and isinstance(when, (int, float)):
                cursor = (float(when), last[1])
            elif records:
                cursor = (records[-1].submitted_at, records[-1].id)
        return Page(records, cursor, damaged)

    def prune(self, before: float, *, batch: int = 200) -> Pruned:
        """Delete one batch: at most ``batch`` finished workloads that finished before
        ``before`` (oldest first, from the ``finished_at`` index) with their events and
        holds, and at most ``batch`` events of no workload older than ``before``. One short
        transaction; call again until :attr:`Pruned.done`.

        Raises:
            ValueError: ``batch`` below 1.
        """
        if batch < 1:
            raise ValueError(f"batch: {batch} must be at least 1")
        finished = (
            select(WorkloadRow.id)
            .where(WorkloadRow.finished_at < before, WorkloadRow.phase.in_(sorted(FINAL_PHASES)))
            .order_by(WorkloadRow.finished_at)
            .limit(batch)
        )
        loose = (
            select(EventRow.id)
            .where(and_(EventRow.workload_id.is_(None), EventRow.time < before))
            .order_by(EventRow.time)
            .limit(batch)
        )
        with self._write() as session:
            rows = session.execute(
                select(
                    WorkloadRow.id,
                    WorkloadRow.owner_uid,
                    WorkloadRow.queue,
                    WorkloadRow.stored_bytes,
                ).where(WorkloadRow.id.in_(finished.scalar_subquery()))
            ).all()
            ids = tuple(r[0] for r in rows)
            freed = tuple(((r[1], r[2]), int(r[3] or 0)) for r in rows)
            events = 0
            if ids:
                gone = session.execute(delete(EventRow).where(EventRow.workload_id.in_(ids)))
                events += int(getattr(gone, "rowcount", 0) or 0)
                session.execute(delete(HoldRow).where(HoldRow.workload_id.in_(ids)))
                session.execute(delete(WorkloadRow).where(WorkloadRow.id.in_(ids)))
            loose_ids = list(session.scalars(loose))
            if loose_ids:
                gone = session.execute(delete(EventRow).where(EventRow.id.in_(loose_ids)))
                events += int(getattr(gone, "rowcount", 0) or 0)
        for key in [k for k in self._coalescing if k[0] in ids]:
            self._coalescing.pop(key, None)
        return Pruned(ids, events, freed)


__all__ = ["Cursor", "OwnerUsage", "Page", "Pruned", "UsageStore"]
