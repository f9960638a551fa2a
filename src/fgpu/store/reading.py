"""Reading workload rows so that a damaged one costs only itself (issue 27), and ending one.

:class:`RowReader` decodes every workload row it reads with :func:`fgpu.store.rows.examine`:
what decodes is returned, what does not is skipped, remembered (:meth:`RowReader.damaged`)
and logged once per row and problem (not once per read: a listing polled every second
would fill the log). :meth:`RowReader.end_damaged` is an admin's way forward.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Select, update
from sqlalchemy.orm import Session

from fgpu.store.base import StoreBase
from fgpu.store.errors import NotFound, StoreConflict
from fgpu.store.records import ACTIVE_PHASES, CANCELLED, WorkloadRecord
from fgpu.store.rows import DamagedRow, examine, neutral_values, workload_select
from fgpu.store.schema import HoldRow, WorkloadRow
from fgpu.users import user_text

log = logging.getLogger("fgpu.store")


class RowReader(StoreBase):
    """Workload reads that skip damaged rows, for :class:`fgpu.store.Store`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._damaged: dict[str, DamagedRow] = {}
        self._damaged_lock = threading.Lock()
        self._last_read = threading.local()

    def _read_rows(
        self,
        session: Session,
        query: Select[Any],
        each: Callable[[WorkloadRecord], bool] | None = None,
    ) -> tuple[list[WorkloadRecord], list[DamagedRow]]:
        """Run ``query`` (built on :func:`workload_select`) and decode each row: the records
        and the damaged rows skipped, both in the query's order.

        Args:
            each: given, each record goes to it as it is decoded and is not kept (the
                answer's record list stays empty); it returns False to stop the read there
                (that record not taken). :attr:`last_read` then names the last row taken.
        """
        records: list[WorkloadRecord] = []
        damaged: list[DamagedRow] = []
        seen: list[str] = []  # ids of the records given to ``each``, for _note
        last: tuple[object, str] | None = None
        # Core execution on the session's connection: rows are fetched as they are decoded
        # (the ORM would buffer every row's JSON text alongside the decoded records)
        for row in session.connection().execute(query):
            found = examine(row._mapping)
            if isinstance(found, DamagedRow):
                damaged.append(found)
            elif each is None:
                records.append(found)
            elif not each(found):
                break
            elif self._damaged:
                seen.append(found.id)
            last = (row._mapping.get("submitted_at"), str(row._mapping.get("id")))
        self._last_read.value = last
        if damaged or self._damaged:
            self._note([r.id for r in records] + seen, damaged)
        return records, damaged

    @property
    def last_read(self) -> tuple[object, str] | None:
        """``(submitted_at as stored, id)`` of the last row the latest :meth:`_read_rows`
        of this thread took (None: none)."""
        value: tuple[object, str] | None = getattr(self._last_read, "value", None)
        return value

    def _note(self, decoded: list[str], damaged: list[DamagedRow]) -> None:
        """Remember ``damaged`` (logging each new row or problem once) and forget the rows
        of the ids ``decoded`` (they decode again)."""
        with self._damaged_lock:
            for workload_id in decoded:
                self._damaged.pop(workload_id, None)
            for row in damaged:
                known = self._damaged.get(row.id)
                self._damaged[row.id] = row
                if known is None or known.problems != row.problems:
                    log.error(
                        "workload %s: its stored row is damaged and is left out of listings "
                        "(%s); an admin can end it with `fgpu cancel %s`",
                        row.id,
                        row.problem,
                        row.id,
                    )

    def damaged(self) -> list[DamagedRow]:
        """The damaged rows seen by reads so far and not ended since, by id."""
        with self._damaged_lock:
            return sorted(self._damaged.values(), key=lambda r: r.id)

    def _read_one(self, session: Session, workload_id: str) -> WorkloadRecord | DamagedRow | None:
        """The record of ``workload_id``, what is wrong with its row, or None (no row)."""
        records, damaged = self._read_rows(
            session, workload_select().where(WorkloadRow.id == workload_id)
        )
        if records:
            return records[0]
        return damaged[0] if damaged else None

    def end_damaged(self, workload_id: str, by_uid: int) -> tuple[DamagedRow, WorkloadRecord]:
        """End a damaged workload row (an admin's ``fgpu cancel ID``): it becomes
        ``cancelled``, each column that did not decode gets an empty value
        (:func:`fgpu.store.rows.neutral_values`), its hold is dropped, and the reason and
        event ``cancelled`` say what was damaged. One transaction. Any process it had is
        not touched here (the caller stops what it knows of).

        Returns:
            What was wrong with it, and the record it reads as now.

        Raises:
            NotFound: no row with that id.
            StoreConflict: the row is not damaged (cancel it the ordinary way).
        """
        with self._write() as session:
            query = workload_select().where(WorkloadRow.id == workload_id).with_for_update()
            row = session.execute(query).first()
            if row is None:
                raise NotFound("workload", workload_id)
            found = examine(row._mapping)
            if not isinstance(found, DamagedRow):
                raise StoreConflict(f"workload {workload_id}'s row is not damaged")
            changes = neutral_values(row._mapping)
            now = self._clock()
            reason = f"damaged row ended by {user_text(by_uid)}: {found.problem}"[:1000]
            changes.update(
                phase=CANCELLED,
                reason=reason,
                cancelled_by=by_uid,
                finished_at=now,
                stop_requested_at=None,
                squeezed_by=None,
            )
            if found.phase not in ACTIVE_PHASES and isinstance(row.finished_at, float):
                changes["finished_at"] = row.finished_at
            session.execute(
                update(WorkloadRow).where(WorkloadRow.id == workload_id).values(changes)
            )
            session.query(HoldRow).filter(HoldRow.workload_id == workload_id).delete()
            self._event(session, now, workload_id, CANCELLED, "damaged row", reason)
            session.flush()
            fixed = session.execute(workload_select().where(WorkloadRow.id == workload_id)).one()
            record = examine(fixed._mapping)
        if isinstance(record, DamagedRow):  # cannot happen: every bad column was emptied
            raise StoreConflict(f"workload {workload_id}'s row could not be repaired: {record}")
        with self._damaged_lock:
            self._damaged.pop(workload_id, None)
        log.warning("workload %s: damaged row ended by %s", workload_id, user_text(by_uid))
        return found, record


__all__ = ["RowReader"]
