"""The store's foundation: engine, injected clock and ids, transactions, events.

:class:`StoreBase` opens the database (migrating it), hands out one session per call, and
writes events; the repositories built on it (:mod:`fgpu.store.queues`,
:mod:`fgpu.store.inventory`, :mod:`fgpu.store.store`) add the state changes. Writing
transactions commit when their block ends and roll back on any error, so a change and its
event are stored together or not at all.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sqlalchemy import Engine, func, or_, select, text, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from fgpu.model.types import InvalidRequestError
from fgpu.store import convert
from fgpu.store.engine import check_integrity, make_engine, storage_fault, upgrade, writer
from fgpu.store.errors import NotFound, StoreConflict, StoreUnwritable
from fgpu.store.records import PENDING, EventRecord
from fgpu.store.schema import EventRow, WorkloadRow

Clock = Callable[[], float]
"""Seconds since the epoch (``time.time``, or a test's or simulator's clock)."""


def random_id() -> str:
    """A new workload id: 8 hexadecimal digits from the operating system's random source."""
    return secrets.token_hex(4)


class StoreBase:
    """Engine, clock, id source and transactions shared by the store's repositories.

    Args:
        engine: an engine whose database is already at the newest migration (use
            :meth:`open`, which makes one and migrates it).
        clock: returns the current time in seconds.
        new_id: returns a candidate workload id (retried while taken).

    Thread-safe: every call uses its own session, and writing transactions of one ``Store``
    take turns on a mutex (SQLite admits one writer at a time, and its busy handler waits
    by sleeping in growing steps, which costs tens of milliseconds under contention; the
    mutex hands over at once). Several ``Store`` objects, in one process or several, may
    share one database; between them the database's own locking applies.
    """

    def __init__(
        self, engine: Engine, *, clock: Clock = time.time, new_id: Callable[[], str] = random_id
    ) -> None:
        self.engine = engine
        self._writer = writer(engine)
        self._clock = clock
        self._new_id = new_id
        self._write_turn = threading.Lock()
        self.write_fault: str | None = None
        """Why the latest write failed for want of storage (:class:`StoreUnwritable`); None
        once a write succeeds again."""
        self.event_coalesce_s = 0.0
        """Seconds within which :meth:`record_event` adds like events (same workload and
        kind) to the first one's count instead of writing a row each (0: never; the service
        sets ``fgpu serve --event-interval``)."""
        # (workload id, kind) -> (id of the row counting them, when its interval began)
        self._coalescing: dict[tuple[str | None, str], tuple[int, float]] = {}

    @classmethod
    def open(
        cls,
        target: str | Path | URL | None = None,
        *,
        clock: Clock = time.time,
        new_id: Callable[[], str] = random_id,
        verify: bool = False,
        **engine_options: Any,
    ) -> Self:
        """Open (creating and migrating as needed) the database at ``target``.

        Args:
            target: a URL, an SQLite file path, or None for the default file
                (:func:`fgpu.store.engine.default_db_path`).
            clock, new_id: see the class.
            verify: check the database before anything is written to it
                (:func:`fgpu.store.engine.check_integrity`; what a service does at start).
            engine_options: passed to :func:`sqlalchemy.create_engine`.

        Raises:
            StoreDamaged: with ``verify``, a damaged database (nothing was written to it).
        """
        engine = make_engine(target, **engine_options)
        try:
            if verify:
                check_integrity(engine)
            upgrade(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, clock=clock, new_id=new_id)

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ transactions
    @contextmanager
    def _write(self) -> Iterator[Session]:
        """A writing transaction: commits when the block ends, rolls back on any error."""
        with self._write_turn:
            session = Session(self._writer, expire_on_commit=False, autoflush=True)
            try:
                with session.begin():
                    yield session
            except IntegrityError as exc:
                raise StoreConflict(f"the change conflicts with stored data: {exc.orig}") from exc
            except DBAPIError as exc:
                cause = storage_fault(exc, self.engine.url)
                if cause is None:
                    raise
                self.write_fault = cause
                raise StoreUnwritable(cause) from exc
            else:
                self.write_fault = None
            finally:
                session.close()

    def probe_write(self) -> str | None:
        """Try a write that changes nothing of meaning (the migration row rewritten as it
        is, which still makes the database write a page); None when it commits, else why
        not (and :attr:`write_fault` says the same)."""
        try:
            with self._write() as session:
                session.execute(text("UPDATE alembic_version SET version_num = version_num"))
        except StoreUnwritable as exc:
            return exc.cause
        return None

    @contextmanager
    def _read(self) -> Iterator[Session]:
        """A reading transaction (one consistent snapshot)."""
        with Session(self.engine) as session, session.begin():
            yield session

    @staticmethod
    def _lock(session: Session, workload_id: str) -> WorkloadRow:
        row = session.scalars(
            select(WorkloadRow).where(WorkloadRow.id == workload_id).with_for_update()
        ).one_or_none()
        if row is None:
            raise NotFound("workload", workload_id)
        return row

    @staticmethod
    def _expect(row: WorkloadRow, phases: Collection[str], action: str) -> None:
        if row.phase not in phases:
            wanted = " or ".join(sorted(phases))
            raise StoreConflict(f"workload {row.id} is {row.phase}; {action} needs it {wanted}")

    def _requeue(
        self,
        session: Session,
        row: WorkloadRow,
        reason: str,
        message: str,
        by: tuple[str, str] | None = None,
    ) -> None:
        """``row`` back to pending from scratch: restarts + 1; its run, place and process
        cleared (suspension too); event ``preempted`` with ``message`` and the restart count;
        ``by``: ``(preemptor id, kind)`` where known, kept until it runs again. The caller
        has locked the row and checked its phase."""
        row.preempted_by, row.preempted_kind = by if by is not None else (None, None)
        row.phase = PENDING
        row.restarts += 1
        row.started_at = None
        row.stop_requested_at = None
        row.node_name = None
        row.allocation = None
        row.pid = None
        row.create_time = None
        row.squeezed_by = None
        row.suspended_on = None
        row.suspended_host_mib = None
        row.reason = reason
        self._event(
            session,
            self._clock(),
            row.id,
            "preempted",
            reason,
            f"{message}; pending again, restart {row.restarts}",
        )

    def _event(
        self,
        session: Session,
        now: float,
        workload_id: str | None,
        kind: str,
        reason: str,
        message: str,
    ) -> EventRow:
        session.flush()  # the change first: the event refers to the workload row
        row = EventRow(workload_id=workload_id, time=now, kind=kind, reason=reason, message=message)
        session.add(row)
        return row

    # ------------------------------------------------------------------------ events
    def record_event(self, workload_id: str | None, kind: str, reason: str, message: str) -> None:
        """Store an event that goes with no state change here (re-adoption after a restart,
        the node agent's governor and memory guard).

        Raises:
            InvalidRequestError: an empty or too long ``kind``, an empty ``reason``.
            StoreConflict: ``workload_id`` names no workload.
        """
        if not kind or len(kind) > 32:
            raise InvalidRequestError("kind", "must be 1 to 32 characters")
        if not reason:
            raise InvalidRequestError("reason", "must not be empty")
        with self._write() as session:
            now = self._clock()
            key = (workload_id, kind)
            window = self.event_coalesce_s
            held = self._coalescing.get(key)
            if window > 0 and held is not None and now - held[1] < window:
                counted = session.execute(
                    update(EventRow)
                    .where(EventRow.id == held[0])
                    .values(count=func.coalesce(EventRow.count, 1) + 1, last_time=now)
                )
                if getattr(counted, "rowcount", 0) == 1:
                    return
            row = self._event(session, now, workload_id, kind, reason, message)
            if window > 0:
                session.flush()
                self._forget_windows(now, window)
                self._coalescing[key] = (row.id, now)

    def _forget_windows(self, now: float, window: float) -> None:
        """Drop intervals that ended (the map holds one entry per workload and kind seen in
        the last interval)."""
        if len(self._coalescing) < 1024:
            return
        for key, (_, began) in list(self._coalescing.items()):
            if now - began >= window:
                del self._coalescing[key]

    def events(
        self,
        workload_id: str | None = None,
        *,
        since: float | None = None,
        after_id: int | None = None,
        limit: int | None = None,
        visible_to: int | None = None,
    ) -> list[EventRecord]:
        """Events in the order they were written.

        Args:
            workload_id: only this workload's (None: all, queue and node events included).
            visible_to: only the events of this uid's workloads and those of no workload
                (queue and node events); None: everyone's.
            since: only those at or after this time (seconds).
            after_id: only those with a larger id (a cursor for following; on SQLite ids
                follow commit order, on PostgreSQL two transactions committing at once
                may commit their ids out of order, so a follower there should re-read a
                short overlap).
            limit: at most this many (the oldest first).
        """
        query = select(EventRow).order_by(EventRow.id)
        if workload_id is not None:
            query = query.where(EventRow.workload_id == workload_id)
        if since is not None:
            query = query.where(EventRow.time >= since)
        if after_id is not None:
            query = query.where(EventRow.id > after_id)
        if visible_to is not None:
            own = select(WorkloadRow.id).where(WorkloadRow.owner_uid == visible_to)
            query = query.where(or_(EventRow.workload_id.is_(None), EventRow.workload_id.in_(own)))
        if limit is not None:
            query = query.limit(limit)
        with self._read() as session:
            return [convert.event_record(r) for r in session.scalars(query)]
