"""The store and its workloads: every state change in one transaction, with its event.

Each method that changes a workload writes the change and its event in one transaction, and
the transaction commits before the method returns, so the caller acts only on what is
already durable (DESIGN.md section 8). A transition from the wrong phase raises
:class:`StoreConflict` and writes nothing. Rows are locked while a change is decided
(``SELECT ... FOR UPDATE`` on PostgreSQL; ``BEGIN IMMEDIATE`` on SQLite), so two writers,
in threads or processes, never overwrite each other's changes.

Phases (DESIGN.md section 8)::

    pending --mark_running--> running <--mark_paused / mark_resumed--> paused
    running|paused --mark_finished--> succeeded | failed | cancelled
    running|paused --mark_preempted--> pending   (restarts + 1)
    running|paused --mark_lost--> failed          (after a restart, process gone)
    running|paused --mark_stopping--> (stop requested: the core sees it terminating)
    pending --cancel--> cancelled;  running|paused --cancel--> (stop requested)

Time comes from the injected ``clock`` and ids from ``new_id``; neither is read elsewhere.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import cast

from sqlalchemy import ColumnElement, Connection, bindparam, delete, insert, or_, select
from sqlalchemy.orm import Session

from fgpu.model.types import Allocation, InvalidRequestError, Request
from fgpu.sched.workload import PRIORITY_CLASSES, Workload, parse_priority
from fgpu.states import memory_text
from fgpu.store import convert, validate
from fgpu.store.errors import NotFound, PermissionDenied, StoreConflict, StoreError
from fgpu.store.idempotency import IdempotencyStore
from fgpu.store.inventory import InventoryStore
from fgpu.store.queues import QueueStore
from fgpu.store.records import (
    ACTIVE_PHASES,
    CANCELLED,
    FAILED,
    FINAL_PHASES,
    HOLDING_PHASES,
    LOST_REASON,
    PAUSED,
    PENDING,
    RUNNING,
    ArrayPlan,
    StoredAllocation,
    StoredMigInstance,
    StoredMigRequest,
    WorkloadRecord,
    models_to_text,
    to_core,
)
from fgpu.store.rows import DamagedRow, workload_select
from fgpu.store.schema import Base, EventRow, HoldRow, QueueRow, WorkloadRow
from fgpu.store.suspension import SuspensionStore
from fgpu.store.usage import UsageStore
from fgpu.users import user_text

DEFAULT_GRACE_S = 30.0
"""Seconds between SIGTERM and SIGKILL when a workload is stopped (issue 4, item 3)."""

_ID_ATTEMPTS = 32

# Core statements for the submission path (tables from the declarative metadata)
_WORKLOADS = Base.metadata.tables[WorkloadRow.__tablename__]
_QUEUES = Base.metadata.tables[QueueRow.__tablename__]
_WORKLOAD_COLUMNS = tuple(_WORKLOADS.columns)
_INSERT_WORKLOAD = insert(_WORKLOADS)
_INSERT_EVENT = insert(Base.metadata.tables[EventRow.__tablename__])
# an id is taken by a workload or by an array (whose id is none of its tasks')
_ID_TAKEN = select(_WORKLOADS.c.id).where(
    or_(_WORKLOADS.c.id == bindparam("id"), _WORKLOADS.c.array_id == bindparam("id"))
)
# a queue and its children, read-locked (a leaf has itself and nothing else): built once,
# as the submissions' hot path runs it every time
_QUEUE_AND_CHILDREN = (
    select(_QUEUES.c.name, _QUEUES.c.parent)
    .where(or_(_QUEUES.c.name == bindparam("queue"), _QUEUES.c.parent == bindparam("queue")))
    .with_for_update(read=True)
)


class Store(UsageStore, SuspensionStore, QueueStore, InventoryStore, IdempotencyStore):
    """Repository of fgpu's durable state: workloads (here), queues
    (:class:`~fgpu.store.queues.QueueStore`), nodes and holds
    (:class:`~fgpu.store.inventory.InventoryStore`), events
    (:class:`~fgpu.store.base.StoreBase`).

    Args:
        engine: an engine whose database is already at the newest migration (use
            :meth:`open`, which makes one and migrates it).
        clock: returns the current time in seconds.
        new_id: returns a candidate workload id (retried while taken).

    Thread-safe: every call uses its own session. Several ``Store`` objects, in one process
    or several, may share one database.
    """

    def submit(
        self,
        *,
        owner_uid: int,
        queue: str,
        request: Request,
        argv: Sequence[str],
        name: str = "",
        priority: int | str = PRIORITY_CLASSES["normal"],
        preemptible: bool | None = None,
        shell: bool = False,
        cwd: str = "/",
        env: Mapping[str, str] | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        mig_request: StoredMigRequest | None = None,
        idempotency: tuple[str, str] | None = None,
        time_limit_s: float | None = None,
        dependency: Sequence[tuple[str, str]] = (),
    ) -> WorkloadRecord:
        """Store a new pending workload, with the event ``submitted``.

        Args:
            owner_uid: the submitting user's uid.
            queue: a leaf queue.
            request: what it asks for (already validated by :class:`Request`).
            argv: the command, a non-empty list of strings.
            name: display name (default: the id).
            priority: a number or a class name (``"high"``).
            preemptible: None for the default (priority below 100).
            shell, cwd, env: how to run it.
            grace_s: seconds between SIGTERM and SIGKILL when it is stopped.
            mig_request: for a MIG workload, the instance it asks for (``request`` is then
                one GPU).
            idempotency: ``(key, fingerprint of the body)``: the submission's
                ``Idempotency-Key``, recorded with the workload in the same transaction
                (:mod:`fgpu.store.idempotency`).
            time_limit_s: the longest a run may last, seconds (None: no limit).
            dependency: ``(type, workload id)`` conditions before it may start.

        Raises:
            InvalidRequestError: a malformed field, an unknown queue, a queue with children.
            StoreConflict: ``idempotency`` names a key of this owner that is still kept
                (nothing is written; :meth:`keyed_workload` finds its workload).
        """
        (record,) = self.submit_tasks(
            owner_uid=owner_uid,
            queue=queue,
            request=request,
            argv=argv,
            tasks=[(name, env or {}, None)],
            priority=priority,
            preemptible=preemptible,
            shell=shell,
            cwd=cwd,
            grace_s=grace_s,
            mig_request=mig_request,
            time_limit_s=time_limit_s,
            dependency=dependency,
            idempotency=idempotency,
        )
        return record

    def submit_tasks(
        self,
        *,
        owner_uid: int,
        queue: str,
        request: Request,
        argv: Sequence[str],
        tasks: Sequence[tuple[str, Mapping[str, str], ArrayPlan | None]],
        priority: int | str = PRIORITY_CLASSES["normal"],
        preemptible: bool | None = None,
        shell: bool = False,
        cwd: str = "/",
        grace_s: float = DEFAULT_GRACE_S,
        mig_request: StoredMigRequest | None = None,
        time_limit_s: float | None = None,
        dependency: Sequence[tuple[str, str]] = (),
        idempotency: tuple[str, str] | None = None,
    ) -> builtins.list[WorkloadRecord]:
        """Store one or more pending workloads that differ only in name, environment and
        array task, in one transaction (all or none), each with its event ``submitted``: a
        plain submission is one task ``(name, env, None)``; an array is one task per index,
        ``(name, env, ArrayPlan)``, whose ``array_id`` None means "the first task's id".

        Raises:
            InvalidRequestError: as :meth:`submit`; no tasks; a bad time limit or dependency.
            StoreConflict: ``idempotency`` names a key of this owner that is still kept (the
                key is claimed for the first task; nothing is written).
        """
        if not tasks:
            raise InvalidRequestError("array", "no tasks to submit")
        limit = None if time_limit_s is None else validate.seconds("time", time_limit_s)
        conditions = [
            [validate.text("dependency", k), validate.text("dependency", w)] for k, w in dependency
        ]
        checked = []
        for task_name, task_env, plan in tasks:
            command, environment, grace = validate.submission(
                workload_name=task_name,
                owner_uid=owner_uid,
                request=request,
                argv=argv,
                cwd=cwd,
                env=task_env,
                grace_s=grace_s,
                preemptible=preemptible,
                shell=shell,
            )
            checked.append((task_name, environment, plan))
        level = validate.integer("priority", parse_priority(priority))
        if mig_request is not None:
            validate.mig_request(mig_request, request)
        with self._write() as session:
            # Core statements on the session's connection (no ORM compilation or unit of
            # work): this is the hot path of the service's submissions.
            connection = session.connection()
            names = connection.execute(_QUEUE_AND_CHILDREN, {"queue": queue}).all()
            if not any(found == queue for found, _ in names):
                raise InvalidRequestError("queue", f"unknown queue {queue!r}")
            children = sorted(found for found, parent in names if parent == queue)
            if children:
                raise InvalidRequestError(
                    "queue",
                    f"queue {queue} has child queues ({', '.join(children)}); "
                    "submit to one of them",
                )
            now = self._clock()
            records: builtins.list[WorkloadRecord] = []
            array_id = ""
            if any(plan is not None and not plan.array_id for _, _, plan in checked):
                array_id = self._fresh_id(connection)
            for task_name, environment, plan in checked:
                workload_id = self._fresh_id(connection, (array_id,))
                values = self._new_row(
                    workload_id,
                    task_name,
                    owner_uid=owner_uid,
                    queue=queue,
                    level=level,
                    preemptible=preemptible,
                    request=request,
                    command=command,
                    shell=shell,
                    cwd=cwd,
                    environment=environment,
                    grace=grace,
                    mig_request=mig_request,
                    now=now,
                )
                values.update(time_limit_s=limit, dependency=conditions or None)
                if plan is not None:
                    values.update(
                        array_id=plan.array_id or array_id,
                        array_name=plan.name,
                        array_index=plan.index,
                        array_size=plan.size,
                        array_throttle=plan.throttle,
                    )
                connection.execute(_INSERT_WORKLOAD, [values])
                message = f"submitted to queue {queue}"
                if plan is not None:
                    message += f" as task {plan.index} of array {plan.name}"
                connection.execute(
                    _INSERT_EVENT,
                    [
                        {
                            "workload_id": workload_id,
                            "time": now,
                            "kind": "submitted",
                            "reason": "submitted",
                            "message": message,
                        }
                    ],
                )
                # the record from the values as written (a plain namespace: an ORM row's
                # instrumented construction would cost more than the insert)
                records.append(
                    convert.workload_record(cast(WorkloadRow, SimpleNamespace(**values)))
                )
            if idempotency is not None:
                self._claim_key(session, owner_uid, *idempotency, records[0].id)
            return records

    @staticmethod
    def _new_row(
        workload_id: str,
        name: str,
        *,
        owner_uid: int,
        queue: str,
        level: int,
        preemptible: bool | None,
        request: Request,
        command: tuple[str, ...],
        shell: bool,
        cwd: str,
        environment: dict[str, str],
        grace: float,
        mig_request: StoredMigRequest | None,
        now: float,
    ) -> dict[str, object]:
        """The column values of a new pending workload (every other column empty)."""
        values: dict[str, object] = dict.fromkeys(c.key for c in _WORKLOAD_COLUMNS)
        values.update(
            id=workload_id,
            name=name or workload_id,
            owner_uid=owner_uid,
            queue=queue,
            phase=PENDING,
            priority=level,
            preemptible=preemptible,
            cpu_milli=request.cpu_milli,
            memory_mib=request.memory_mib,
            gpu_count=request.gpu_count,
            gpu_milli=request.gpu_milli,
            gpu_memory_mib=request.gpu_memory_mib,
            gpu_models=models_to_text(request.gpu_models),
            argv=list(command),
            shell=shell,
            cwd=cwd,
            env=environment,
            grace_s=grace,
            stored_bytes=validate.stored_bytes(command, environment, cwd),
            mig_request=None if mig_request is None else mig_request.to_json(),
            submitted_at=now,
            reason="submitted",
            restarts=0,
        )  # every other column starts empty (NULL)
        return values

    def _fresh_id(self, connection: Connection, avoid: Collection[str] = ()) -> str:
        for _ in range(_ID_ATTEMPTS):
            candidate = validate.workload_id(self._new_id())
            if candidate in avoid:
                continue
            taken = connection.execute(_ID_TAKEN, {"id": candidate}).first()
            if taken is None:
                return candidate
        raise StoreError(f"no free workload id after {_ID_ATTEMPTS} attempts")

    def mark_running(
        self,
        workload_id: str,
        allocation: Allocation,
        *,
        gpu_uuids: Sequence[str] = (),
        pid: int | None = None,
        create_time: float | None = None,
        stdout_path: str | None = None,
        stderr_path: str | None = None,
        reason: str = "placed",
        mig: StoredMigInstance | None = None,
    ) -> WorkloadRecord:
        """pending -> running on ``allocation`` (event ``started``); drops its hold.

        The process may be given here or, when it is launched after this commit, by
        :meth:`attach_process`.

        Args:
            allocation: the decision core's placement.
            gpu_uuids: UUIDs of the allocated GPUs, in the order of ``allocation.gpus``.
            pid, create_time: the process, if already started.
            stdout_path, stderr_path: its log files (kept when None).
            reason: why it starts (``placed``, ``placed after reclaim``...).
            mig: the MIG instance of a MIG workload (required for one, refused for others).

        Raises:
            NotFound, StoreConflict: unknown id, not pending.
            InvalidRequestError: an allocation that does not match the request, a MIG
                instance missing for a MIG workload or given for another one.
        """
        uuids = tuple(gpu_uuids)
        process_pid = None if pid is None else validate.integer("pid", pid, minimum=1)
        with self._write() as session:
            row = self._lock(session, workload_id)
            self._expect(row, {PENDING}, "mark_running")
            if row.suspended_on is not None:
                raise StoreConflict(
                    f"workload {workload_id} is suspended on {row.suspended_on}: restore it"
                )
            record = convert.workload_record(row)
            validate.allocation(record.request, allocation, uuids)
            if (mig is None) != (record.mig_request is None):
                wanted = "needs" if mig is None else "is not a MIG workload and takes no"
                raise InvalidRequestError("mig", f"workload {workload_id} {wanted} MIG instance")
            now = self._clock()
            stored = StoredAllocation.from_core(allocation, uuids, mig)
            row.phase = RUNNING
            row.started_at = now
            row.node_name = stored.node_name
            row.allocation = stored.to_json()
            row.preempted_by = row.preempted_kind = None  # runs again
            row.pid = process_pid
            row.create_time = create_time
            row.stdout_path = stdout_path if stdout_path is not None else row.stdout_path
            row.stderr_path = stderr_path if stderr_path is not None else row.stderr_path
            row.reason = reason
            session.execute(delete(HoldRow).where(HoldRow.workload_id == workload_id))
            # as fgpu ls names the GPUs it holds: node/0: 0.5 (20GiB)
            shares = ", ".join(
                f"{stored.node_name}/{g}: {m / 1000:g} ({memory_text(mib)})"
                for g, m, mib in zip(
                    stored.gpus, stored.gpu_milli, stored.gpu_memory_mib, strict=True
                )
            )
            where = shares or stored.node_name
            if mig is not None:
                where += f" on MIG {mig.profile}@{mig.start} of GPU {mig.gpu_index} ({mig.uuid})"
            self._event(session, now, workload_id, "started", reason, f"started on {where}")
            return convert.workload_record(row)

    def attach_process(
        self,
        workload_id: str,
        pid: int,
        create_time: float,
        *,
        stdout_path: str | None = None,
        stderr_path: str | None = None,
    ) -> WorkloadRecord:
        """Record the process of a running (or paused) workload that has none yet (event
        ``process``).

        Raises:
            NotFound, StoreConflict: unknown id, not running or paused, a process already
                recorded.
        """
        process_pid = validate.integer("pid", pid, minimum=1)
        started = validate.seconds("create_time", create_time)
        with self._write() as session:
            row = self._lock(session, workload_id)
            self._expect(row, HOLDING_PHASES, "attach_process")
            if row.pid is not None:
                raise StoreConflict(f"workload {workload_id} already has process {row.pid}")
            now = self._clock()
            row.pid = process_pid
            row.create_time = started
            row.stdout_path = stdout_path if stdout_path is not None else row.stdout_path
            row.stderr_path = stderr_path if stderr_path is not None else row.stderr_path
            self._event(session, now, workload_id, "process", "launched", f"process {pid} started")
            return convert.workload_record(row)

    def mark_paused(self, workload_id: str, reason: str) -> WorkloadRecord:
        """running -> paused (the governor froze it; event ``paused``).

        Raises:
            NotFound, StoreConflict: unknown id, not running.
        """
        return self._move(workload_id, RUNNING, PAUSED, "paused", reason)

    def mark_resumed(self, workload_id: str, reason: str) -> WorkloadRecord:
        """paused -> running (the governor thawed it; event ``resumed``).

        Raises:
            NotFound, StoreConflict: unknown id, not paused.
        """
        return self._move(workload_id, PAUSED, RUNNING, "resumed", reason)

    def _move(self, workload_id: str, old: str, new: str, kind: str, reason: str) -> WorkloadRecord:
        with self._write() as session:
            row = self._lock(session, workload_id)
            self._expect(row, {old}, f"mark_{kind}")
            now = self._clock()
            row.phase = new
            row.reason = reason
            self._event(session, now, workload_id, kind, reason, f"{kind}: {reason}")
            return convert.workload_record(row)

    def mark_squeezed(
        self, workload_id: str, by: tuple[str, ...] | None, reason: str
    ) -> WorkloadRecord:
        """Record a squeeze (``by``: who took its compute; event ``squeezed``) or its
        release (``by`` None; event ``released``) of a running or paused workload.

        Raises:
            NotFound, StoreConflict: unknown id, not running or paused.
            InvalidRequestError: ``by`` names the workload itself (field ``squeezed_by``).
        """
        if by is not None and workload_id in by:
            raise InvalidRequestError("squeezed_by", f"{workload_id} cannot squeeze itself")
        with self._write() as session:
            row = self._lock(session, workload_id)
            self._expect(row, HOLDING_PHASES, "mark_squeezed")
            now = self._clock()
            row.squeezed_by = None if by is None else list(by)
            kind = "released" if by is None else "squeezed"
            self._event(session, now, workload_id, kind, reason, f"{kind}: {reason}")
            return convert.workload_record(row)

    def mark_stopping(self, workload_id: str, reason: str) -> WorkloadRecord:
        """Record that a running or paused workload is being stopped for preemption or
        reclaim (event ``stopping``), before the caller signals it; the decision core then
        sees it ``terminating``.

        Raises:
            NotFound, StoreConflict: unknown id, not running or paused, already stopping.
        """
        with self._write() as session:
            row = self._lock(session, workload_id)
            self._expect(row, HOLDING_PHASES, "mark_stopping")
            if row.stop_requested_at is not None:
                raise StoreConflict(f"workload {workload_id} is already stopping ({row.reason})")
            now = self._clock()
            row.stop_requested_at = now
            row.reason = reason
            self._event(session, now, workload_id, "stopping", reason, f"stopping: {reason}")
            return convert.workload_record(row)

    def mark_preempted(
        self, workload_id: str, reason: str, by: tuple[str, str] | None = None
    ) -> WorkloadRecord:
        """running or paused -> pending: its process is gone, it waits to run again from the
        same command (restarts + 1; allocation, process and hold cleared; event
        ``preempted``). ``by``: ``(preemptor id, preemption|reclaim)`` where known
        (:attr:`WorkloadRecord.preempted_by`, kept until it runs again).

        Raises:
            NotFound, StoreConflict: unknown id, not running or paused, or cancelled by a user
                (finish it with :meth:`mark_finished` as ``cancelled`` instead).
        """
        with self._write() as session:
            row = self._lock(session, workload_id)
            self._expect(row, HOLDING_PHASES, "mark_preempted")
            if row.cancelled_by is not None:
                raise StoreConflict(
                    f"workload {workload_id} was cancelled by {user_text(row.cancelled_by)}; "
                    "finish it as cancelled"
                )
            self._requeue(session, row, reason, f"preempted ({reason})", by)
            return convert.workload_record(row)

    def mark_finished(
        self,
        workload_id: str,
        phase: str,
        *,
        exit_code: int | None = None,
        reason: str = "",
        finished_at: float | None = None,
    ) -> WorkloadRecord:
        """running or paused -> ``phase`` (succeeded, failed or cancelled; event named after
        the phase). The allocation is kept as history; the hold, if any, is dropped.

        Args:
            phase: the final phase.
            exit_code: the process's exit status, if known.
            reason: why (default: the exit code).
            finished_at: when it ended, seconds since the epoch, where that is known from
                elsewhere (the wrapper's exit record, read after a restart); default: now.

        Raises:
            InvalidRequestError: ``phase`` is not a final phase.
            NotFound, StoreConflict: unknown id, not running or paused.
        """
        if phase not in FINAL_PHASES:
            raise InvalidRequestError("phase", f"{phase!r} is not one of {sorted(FINAL_PHASES)}")
        code = (
            None
            if exit_code is None
            else validate.integer("exit_code", exit_code, minimum=-(2**31))
        )
        why = reason or ("finished" if code is None else f"exit code {code}")
        with self._write() as session:
            row = self._lock(session, workload_id)
            self._expect(row, HOLDING_PHASES, "mark_finished")
            ended = None if finished_at is None else validate.seconds("finished_at", finished_at)
            self._finish(session, row, phase, why, code, ended)
            return convert.workload_record(row)

    def _finish(
        self,
        session: Session,
        row: WorkloadRow,
        phase: str,
        reason: str,
        code: int | None,
        ended: float | None = None,
    ) -> None:
        now = self._clock()
        row.phase = phase
        row.finished_at = now if ended is None else ended
        row.exit_code = code
        row.reason = reason
        row.squeezed_by = None
        session.execute(delete(HoldRow).where(HoldRow.workload_id == row.id))
        self._event(session, now, row.id, phase, reason, f"{phase}: {reason}")

    def cancel(
        self, workload_id: str, by_uid: int, *, admin: bool = False, reason: str | None = None
    ) -> WorkloadRecord:
        """Cancel a workload on behalf of ``by_uid``.

        A pending workload is cancelled at once (event ``cancelled``). A running or paused one
        is marked as cancel-requested (event ``cancel-requested``, once) and returned still
        running: the caller stops its process, then calls
        ``mark_finished(id, "cancelled")``.

        Args:
            by_uid: the caller's uid (the service's own when it cancels by a rule).
            admin: the caller is root or a configured admin.
            reason: why, when the service cancels by a rule (``time limit``, a dependency
                never met); default ``cancelled by USER``.

        Raises:
            NotFound: unknown id.
            PermissionDenied: neither the owner nor an admin.
            StoreConflict: already finished.
        """
        with self._write() as session:
            row = self._lock(session, workload_id)
            if not admin and row.owner_uid != by_uid:
                raise PermissionDenied(
                    f"workload {workload_id} belongs to {user_text(row.owner_uid)}; "
                    f"{user_text(by_uid)} may not cancel it"
                )
            self._expect(row, ACTIVE_PHASES, "cancel")
            reason = reason or f"cancelled by {user_text(by_uid)}"
            if row.phase == PENDING:
                row.cancelled_by = by_uid
                self._finish(session, row, CANCELLED, reason, None)
            elif row.cancelled_by is None:
                now = self._clock()
                row.cancelled_by = by_uid
                if row.stop_requested_at is None:
                    row.stop_requested_at = now
                row.reason = reason
                self._event(
                    session, now, workload_id, "cancel-requested", reason, f"stopping: {reason}"
                )
            return convert.workload_record(row)

    def mark_lost(self, workload_id: str, reason: str = LOST_REASON) -> WorkloadRecord:
        """A running or paused workload whose process did not survive the service's restart:
        -> failed (cancelled if a user had cancelled it), with ``reason``.

        Raises:
            NotFound, StoreConflict: unknown id, not running or paused.
        """
        with self._write() as session:
            row = self._lock(session, workload_id)
            self._expect(row, HOLDING_PHASES, "mark_lost")
            phase = FAILED if row.cancelled_by is None else CANCELLED
            self._finish(session, row, phase, reason, None)
            return convert.workload_record(row)

    def get(self, workload_id: str) -> WorkloadRecord:
        """The workload ``workload_id``.

        Raises:
            NotFound: no such workload.
            RowDamaged: its row does not decode (:mod:`fgpu.store.rows`).
        """
        with self._read() as session:
            found = self._read_one(session, workload_id)
        if found is None:
            raise NotFound("workload", workload_id)
        if isinstance(found, DamagedRow):
            raise found.error()
        return found

    def list_workloads(
        self,
        phases: Iterable[str] | None = None,
        *,
        queue: str | None = None,
        owner_uid: int | None = None,
    ) -> builtins.list[WorkloadRecord]:
        """Workloads in submission order, optionally only those in ``phases``, in ``queue``
        or of ``owner_uid``. A row that does not decode is left out (logged once;
        :meth:`damaged` lists those seen)."""
        query = workload_select().order_by(WorkloadRow.submitted_at, WorkloadRow.id)
        if phases is not None:
            query = query.where(WorkloadRow.phase.in_(builtins.list(phases)))
        if queue is not None:
            query = query.where(WorkloadRow.queue == queue)
        if owner_uid is not None:
            query = query.where(WorkloadRow.owner_uid == owner_uid)
        with self._read() as session:
            return self._read_rows(session, query)[0]

    def active_names(self, owner_uid: int, prefix: str) -> set[str]:
        """Names of ``owner_uid``'s active workloads that start with ``prefix`` (names only,
        a range of the ``(owner_uid, phase, name)`` index)."""
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = (
            select(WorkloadRow.name)
            .where(WorkloadRow.owner_uid == owner_uid)
            .where(WorkloadRow.phase.in_(ACTIVE_PHASES))
            .where(WorkloadRow.name.like(f"{escaped}%", escape="\\"))
        )
        with self._read() as session:
            return set(session.scalars(query))

    def active_array_names(self, owner_uid: int, names: Collection[str]) -> dict[str, str]:
        """Which of ``names`` name an active array of ``owner_uid`` (one with an active
        task): name -> array id (from the ``(owner_uid, array_name)`` index)."""
        query = (
            select(WorkloadRow.array_name, WorkloadRow.array_id)
            .where(WorkloadRow.owner_uid == owner_uid)
            .where(WorkloadRow.array_name.in_(builtins.list(names)))
            .where(WorkloadRow.phase.in_(ACTIVE_PHASES))
        )
        with self._read() as session:
            return {str(n): str(a) for n, a in session.execute(query) if n and a}

    def array_named(self, owner_uid: int, name: str) -> str | None:
        """The id of ``owner_uid``'s array named ``name``: the active one, else the most
        recently submitted; None when there is none."""
        query = (
            select(WorkloadRow.array_id, WorkloadRow.phase)
            .where(WorkloadRow.owner_uid == owner_uid, WorkloadRow.array_name == name)
            .order_by(WorkloadRow.submitted_at.desc())
        )
        with self._read() as session:
            rows = session.execute(query).all()
        for array_id, phase in rows:
            if phase in ACTIVE_PHASES:
                return str(array_id)
        return str(rows[0][0]) if rows else None

    def dependency_targets(
        self, refs: Collection[str], *, arrays: bool = True
    ) -> tuple[dict[str, builtins.list[WorkloadRecord]], dict[str, WorkloadRecord]]:
        """What of ``refs`` are array ids and workload ids, in one indexed query (the
        primary key and the ``array_id`` index): array id -> its tasks by index, and
        workload id -> the workload. Refs that are neither are in neither answer; with
        ``arrays=False`` only workload ids are looked for."""
        wanted = builtins.list(dict.fromkeys(refs))
        tasks: dict[str, builtins.list[WorkloadRecord]] = {}
        workloads: dict[str, WorkloadRecord] = {}
        if not wanted:
            return tasks, workloads
        match: ColumnElement[bool] = WorkloadRow.id.in_(wanted)
        if arrays:
            match = or_(match, WorkloadRow.array_id.in_(wanted))
        query = select(WorkloadRow).where(match).order_by(WorkloadRow.array_index)
        asked = set(wanted)
        with self._read() as session:
            for row in session.scalars(query):
                record = convert.workload_record(row)
                if row.id in asked:
                    workloads[row.id] = record
                if row.array_id is not None and row.array_id in asked:
                    tasks.setdefault(row.array_id, []).append(record)
        return tasks, workloads

    def array_tasks(self, array_id: str) -> builtins.list[WorkloadRecord]:
        """Every task of the array ``array_id``, by index (none for an unknown id)."""
        query = (
            workload_select()
            .where(WorkloadRow.array_id == array_id)
            .order_by(WorkloadRow.array_index)
        )
        with self._read() as session:
            return self._read_rows(session, query)[0]

    def running_records(self) -> builtins.list[WorkloadRecord]:
        """Workloads that hold an allocation (running or paused): after a restart, re-adopt
        each whose process lives (pid and create_time match), :meth:`mark_lost` the rest."""
        return self.list_workloads(HOLDING_PHASES)

    def core_workloads(
        self, node_index: Mapping[str, int] | None = None
    ) -> builtins.list[Workload]:
        """The active (pending, running, paused) workloads as the decision core sees them."""
        return [to_core(r, node_index) for r in self.list_workloads(ACTIVE_PHASES)]

    @staticmethod
    def to_core(record: WorkloadRecord, node_index: Mapping[str, int] | None = None) -> Workload:
        """See :func:`fgpu.store.records.to_core`."""
        return to_core(record, node_index)

    # Spelt as in the issue; ``list`` would shadow the builtin in annotations above.
    list = list_workloads
