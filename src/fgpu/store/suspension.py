"""Suspend to host memory in the store (issue 28; :mod:`fgpu.server.suspending` acts on it).

A suspended workload is ``pending`` with ``suspended_on`` set: the decision core sees it
waiting on that node for a :class:`~fgpu.sched.workload.Restore`, holding
``suspended_host_mib`` of the node's suspend budget. Its process stays recorded (``pid``,
``create_time``) and so does the allocation it had (the GPUs its memory comes back to)::

    running|paused --mark_suspended--> pending, suspended (event ``suspended``)
    pending, suspended --mark_restored--> running (event ``restoring``; the service adds
        ``restored`` with the copy time once the memory is back)
    pending, suspended --drop_suspension--> pending (restarts + 1, event ``preempted``)
    pending, suspended --end_suspended--> failed | cancelled

Cancelling a suspended workload (:meth:`fgpu.store.Store.cancel`) ends it at once like any
pending one; the service then kills its frozen processes.
"""

from __future__ import annotations

from sqlalchemy import delete
from sqlalchemy.orm import Session

from fgpu.model.types import Allocation, InvalidRequestError
from fgpu.store import convert, validate
from fgpu.store.base import StoreBase
from fgpu.store.errors import StoreConflict
from fgpu.store.records import (
    CANCELLED,
    FAILED,
    HOLDING_PHASES,
    PENDING,
    RUNNING,
    StoredAllocation,
    WorkloadRecord,
)
from fgpu.store.schema import HoldRow, WorkloadRow
from fgpu.users import user_text


def _host_text(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB"


class SuspensionStore(StoreBase):
    """Suspend and restore transitions of :class:`fgpu.store.Store`."""

    def mark_suspended(
        self, workload_id: str, host_mib: int, reason: str, *, copy_s: float
    ) -> WorkloadRecord:
        """running or paused -> pending, suspended on its allocation's node, holding
        ``host_mib`` of host memory (event ``suspended``, with the copy time). Its process,
        allocation and restarts are kept; a stop request and squeeze are cleared.

        Args:
            host_mib: host memory it holds while suspended, MiB (>= 0).
            reason: why (the preemptor).
            copy_s: seconds the device-to-host copy took.

        Raises:
            NotFound, StoreConflict: unknown id, not running or paused, no allocation or
                process, or cancelled by a user (finish it as cancelled instead).
            InvalidRequestError: a negative ``host_mib`` or ``copy_s``.
        """
        mib = validate.integer("host_mib", host_mib, minimum=0)
        copy = validate.seconds("copy_s", copy_s)
        with self._write() as session:
            row = self._lock(session, workload_id)
            self._expect(row, HOLDING_PHASES, "mark_suspended")
            if row.node_name is None or row.pid is None:
                raise StoreConflict(f"workload {workload_id} has no allocation or process")
            if row.cancelled_by is not None:
                raise StoreConflict(
                    f"workload {workload_id} was cancelled by {user_text(row.cancelled_by)}; "
                    "finish it as cancelled"
                )
            now = self._clock()
            row.phase = PENDING
            row.stop_requested_at = None
            row.squeezed_by = None
            row.suspended_on = row.node_name
            row.suspended_host_mib = mib
            row.reason = f"suspended (host {_host_text(mib)}): {reason}"
            self._event(
                session,
                now,
                workload_id,
                "suspended",
                reason,
                f"suspended to host memory on {row.node_name} ({_host_text(mib)} of host "
                f"memory, device-to-host copy {copy:.3f} s): {reason}",
            )
            return convert.workload_record(row)

    def mark_restored(
        self,
        workload_id: str,
        allocation: Allocation,
        gpu_uuids: tuple[str, ...],
        reason: str,
    ) -> WorkloadRecord:
        """pending, suspended -> running on ``allocation`` (which must be the node it is
        suspended on), before its memory is copied back (event ``restoring``); drops its
        hold. ``started_at`` becomes now (the run goes on from here).

        Raises:
            NotFound, StoreConflict: unknown id, not suspended.
            InvalidRequestError: an allocation on another node or that does not match the
                request (field ``allocation``).
        """
        uuids = tuple(gpu_uuids)
        with self._write() as session:
            row = self._row_suspended(session, workload_id, "mark_restored")
            record = convert.workload_record(row)
            if allocation.node_name != row.suspended_on:
                raise InvalidRequestError(
                    "allocation",
                    f"workload {workload_id} is suspended on {row.suspended_on}; it cannot be "
                    f"restored on {allocation.node_name}",
                )
            validate.allocation(record.request, allocation, uuids)
            now = self._clock()
            stored = StoredAllocation.from_core(allocation, uuids, None)
            row.phase = RUNNING
            row.started_at = now
            row.node_name = stored.node_name
            row.allocation = stored.to_json()
            row.suspended_on = None
            row.suspended_host_mib = None
            row.preempted_by = row.preempted_kind = None  # runs again
            row.reason = reason or "restored"
            session.execute(delete(HoldRow).where(HoldRow.workload_id == workload_id))
            self._event(
                session,
                now,
                workload_id,
                "restoring",
                reason or "restored",
                f"restoring on {stored.node_name} (GPUs {', '.join(uuids)})",
            )
            return convert.workload_record(row)

    def drop_suspension(self, workload_id: str, reason: str) -> WorkloadRecord:
        """pending, suspended -> pending from scratch (its process is gone or could not be
        restored: restarts + 1, process and allocation cleared; event ``preempted``).

        Raises:
            NotFound, StoreConflict: unknown id, not suspended.
        """
        with self._write() as session:
            row = self._row_suspended(session, workload_id, "drop_suspension")
            self._requeue(session, row, reason, f"preempted while suspended ({reason})")
            return convert.workload_record(row)

    def end_suspended(self, workload_id: str, phase: str, reason: str) -> WorkloadRecord:
        """pending, suspended -> failed or cancelled (its process ended while suspended;
        event named after the phase).

        Raises:
            InvalidRequestError: ``phase`` is neither.
            NotFound, StoreConflict: unknown id, not suspended.
        """
        if phase not in (FAILED, CANCELLED):
            raise InvalidRequestError("phase", f"{phase!r} is not failed or cancelled")
        with self._write() as session:
            row = self._row_suspended(session, workload_id, "end_suspended")
            now = self._clock()
            row.phase = phase
            row.finished_at = now
            row.reason = reason
            row.suspended_on = None
            row.suspended_host_mib = None
            session.execute(delete(HoldRow).where(HoldRow.workload_id == workload_id))
            self._event(session, now, workload_id, phase, reason, f"{phase}: {reason}")
            return convert.workload_record(row)

    def _row_suspended(self, session: Session, workload_id: str, action: str) -> WorkloadRow:
        row = self._lock(session, workload_id)
        if row.phase != PENDING or row.suspended_on is None:
            raise StoreConflict(
                f"workload {workload_id} is {row.phase} and not suspended; {action} needs it "
                "suspended"
            )
        return row


__all__ = ["SuspensionStore"]
