"""Queues (tenants) in the store: each change checked against the whole tree, with an event.

A change is validated by building the decision core's :class:`QueueTree` from every stored
queue plus the change; when that raises, nothing is written. Queue rows are locked while a
change is decided, so two concurrent changes cannot each pass alone and break the tree
together.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fgpu.model.types import InvalidRequestError
from fgpu.sched.workload import QueueTree
from fgpu.states import priority_word
from fgpu.store import convert, validate
from fgpu.store.base import StoreBase
from fgpu.store.errors import NotFound, StoreConflict
from fgpu.store.records import ACTIVE_PHASES, QueueConfig, QueueRecord
from fgpu.store.schema import QueueRow, WorkloadRow


class QueueStore(StoreBase):
    """Queue operations of :class:`fgpu.store.Store`."""

    def create_queue(self, config: QueueConfig) -> QueueRecord:
        """Add a queue (event ``queue-created``), checked together with every stored queue.

        Raises:
            InvalidRequestError: a malformed queue, an unknown parent, children's quotas above
                their parent's, a parent that has active workloads of its own.
            StoreConflict: the name is taken.
        """
        validate.queue_config(config)
        with self._write() as session:
            rows = self._lock_queues(session)
            if config.name in rows:
                raise StoreConflict(f"queue {config.name} already exists")
            self._check_tree(session, rows, config)
            now = self._clock()
            row = QueueRow(created_at=now, updated_at=now)
            convert.apply_queue_config(row, config)
            session.add(row)
            self._event(
                session, now, None, "queue-created", config.name, _describe_queue("created", config)
            )
            return convert.queue_record(row)

    def ensure_queue(self, config: QueueConfig) -> QueueRecord:
        """The queue ``config.name``, created from ``config`` if it does not exist yet (the
        single-machine ``default`` queue at first start). Raises as :meth:`create_queue`."""
        try:
            return self.get_queue(config.name)
        except NotFound:
            pass
        try:
            return self.create_queue(config)
        except StoreConflict:
            return self.get_queue(config.name)

    def update_queue(self, config: QueueConfig) -> QueueRecord:
        """Replace a queue's configuration (event ``queue-updated``); read, change with
        :func:`dataclasses.replace`, write back.

        Raises:
            NotFound: no such queue.
            InvalidRequestError: as :meth:`create_queue`, and a cycle of parents.
        """
        validate.queue_config(config)
        with self._write() as session:
            rows = self._lock_queues(session)
            row = rows.get(config.name)
            if row is None:
                raise NotFound("queue", config.name)
            self._check_tree(session, rows, config)
            now = self._clock()
            convert.apply_queue_config(row, config)
            row.updated_at = now
            self._event(
                session, now, None, "queue-updated", config.name, _describe_queue("updated", config)
            )
            return convert.queue_record(row)

    def delete_queue(self, name: str) -> None:
        """Remove a queue (event ``queue-deleted``).

        Raises:
            NotFound: no such queue.
            StoreConflict: it has child queues or active (pending, running, paused) workloads.
        """
        with self._write() as session:
            rows = self._lock_queues(session)
            row = rows.get(name)
            if row is None:
                raise NotFound("queue", name)
            children = sorted(n for n, r in rows.items() if r.parent == name)
            if children:
                raise StoreConflict(f"queue {name} has child queues: {', '.join(children)}")
            active = self._active_count(session, name)
            if active:
                raise StoreConflict(f"queue {name} has {active} active workload(s)")
            session.delete(row)
            self._event(
                session, self._clock(), None, "queue-deleted", name, f"queue {name} deleted"
            )

    def get_queue(self, name: str) -> QueueRecord:
        """The queue ``name``.

        Raises:
            NotFound: no such queue.
        """
        with self._read() as session:
            row = session.get(QueueRow, name)
            if row is None:
                raise NotFound("queue", name)
            return convert.queue_record(row)

    def list_queues(self) -> list[QueueRecord]:
        """Every queue, by name."""
        with self._read() as session:
            rows = session.scalars(select(QueueRow).order_by(QueueRow.name))
            return [convert.queue_record(r) for r in rows]

    def queue_tree(self) -> QueueTree:
        """The stored queues as the decision core's :class:`QueueTree`."""
        return QueueTree(q.to_spec() for q in self.list_queues())

    @staticmethod
    def _lock_queues(session: Session) -> dict[str, QueueRow]:
        """Lock every queue row, then read them all afresh: on PostgreSQL a concurrent queue
        change waits here and its result is then seen (under READ COMMITTED each statement
        reads the newest committed rows)."""
        session.execute(select(QueueRow.name).with_for_update()).all()
        return {r.name: r for r in session.scalars(select(QueueRow))}

    @staticmethod
    def _active_count(session: Session, queue: str) -> int:
        count = session.scalar(
            select(func.count())
            .select_from(WorkloadRow)
            .where(WorkloadRow.queue == queue, WorkloadRow.phase.in_(ACTIVE_PHASES))
        )
        return int(count or 0)

    def _check_tree(
        self, session: Session, rows: Mapping[str, QueueRow], config: QueueConfig
    ) -> None:
        """Check the stored queues with ``config`` added or replaced, as a whole."""
        specs = {n: convert.queue_record(r).to_spec() for n, r in rows.items()}
        specs[config.name] = config.to_spec()
        QueueTree(specs.values())
        _check_defaults(rows, config)
        parent = config.parent
        if parent is not None and self._active_count(session, parent):
            raise InvalidRequestError(
                "parent",
                f"queue {parent} has active workloads of its own and cannot get child queues",
            )


def _check_defaults(rows: Mapping[str, QueueRow], config: QueueConfig) -> None:
    """A user or group is the default of one queue at most.

    Raises:
        InvalidRequestError: field ``default_for``, naming the entry and both queues.
    """
    for other, row in sorted(rows.items()):
        if other == config.name:
            continue
        taken = [e for e in config.default_for if e in (row.default_for or ())]
        if taken:
            who = ", ".join(taken)
            raise InvalidRequestError(
                "default_for",
                f"{who} already has queue {other} as default; one default queue each: "
                f"remove it there first (fgpu queue set {other} --default-for ...) or leave "
                f"it out of queue {config.name}",
            )


def _describe_queue(verb: str, config: QueueConfig) -> str:
    gpus = config.quota.gpu_milli / 1000
    limit = config.limit.gpu_milli
    cap = "no GPU limit" if limit is None else f"GPU limit {limit / 1000:g}"
    parent = f" under {config.parent}" if config.parent else ""
    members = ", ".join(config.members) if config.members else "admins only"
    grant = ", non-preemptible work" if config.nonpreemptible else ""
    default = f"; default queue of {', '.join(config.default_for)}" if config.default_for else ""
    return (
        f"queue {config.name}{parent} {verb}: quota {gpus:g} GPU(s), {cap}, "
        f"over-quota weight {config.over_quota_weight:g}, priority {config.priority}; "
        f"members {members} (up to priority {priority_word(config.max_priority)}{grant})"
        f"{default}"
    )
