"""Tables of the store, as SQLAlchemy 2 typed ORM classes.

The schema is created and changed only by the Alembic migrations in
``fgpu/store/migrations`` (a test compares the migrated database with these classes). Types
are portable between SQLite and PostgreSQL: amounts are 64-bit integers in fgpu's units
(milli-GPU, milli-cores, MiB), times are seconds since the epoch as doubles, lists and maps
are JSON. Constraint names follow :data:`NAMING` so that migrations can refer to them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# longest workload id and name: the API's bounds (one source)
from fgpu.wire_limits import ID_LENGTH as ID_LENGTH
from fgpu.wire_limits import NAME_LENGTH as NAME_LENGTH

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Constraint naming convention shared by the ORM and the migrations."""

PHASES = ("pending", "running", "paused", "succeeded", "failed", "cancelled")
"""Workload phases (DESIGN.md section 8)."""


IDEMPOTENCY_KEY_LENGTH = 255
"""Longest ``Idempotency-Key`` a submission may carry."""

# A 64-bit integer column; on SQLite an INTEGER PRIMARY KEY must be spelt INTEGER to be the
# rowid (and so auto-increment), which BIGINT is not.
_EVENT_ID = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    """Declarative base holding the store's metadata."""

    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: dict[Any, Any] = {  # noqa: RUF012 (SQLAlchemy reads it as a class attribute)
        int: BigInteger(),
        float: Double(),
        str: Text(),
        bool: Boolean(),
    }


class QueueRow(Base):
    """A queue (tenant). ``limit_*`` None means no cap in that dimension."""

    __tablename__ = "queues"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    parent: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    quota_gpu_milli: Mapped[int]
    quota_cpu_milli: Mapped[int]
    quota_memory_mib: Mapped[int]
    limit_gpu_milli: Mapped[int | None]
    limit_cpu_milli: Mapped[int | None]
    limit_memory_mib: Mapped[int | None]
    over_quota_weight: Mapped[float]
    priority: Mapped[int]
    created_at: Mapped[float]
    updated_at: Mapped[float]
    # who may submit (records.QueueConfig.members) and what non-admins may ask for
    members: Mapped[list[str]] = mapped_column(JSON)
    max_priority: Mapped[int]
    nonpreemptible: Mapped[bool]
    # squeeze before evict for this queue's preemptions; NULL: the service's setting
    squeeze: Mapped[bool | None]
    # time limits of its workloads, seconds (--default-time, --max-time); NULL: none
    default_time_s: Mapped[float | None]
    max_time_s: Mapped[float | None]
    # whose default queue it is (records.QueueConfig.default_for); NULL: nobody's
    default_for: Mapped[list[str] | None] = mapped_column(JSON)
    # per-user limits of this queue (issue 27); NULL: only the machine's (fgpu serve flags)
    max_active_per_user: Mapped[int | None]
    max_stored_bytes: Mapped[int | None]
    # wait before evict: seconds a preemptor below priority 100 waits; NULL: the service's
    preempt_delay_s: Mapped[float | None]
    # per-user limit of stored output (logs) in this queue; NULL: only the machine's
    max_output_bytes: Mapped[int | None]
    # running workloads one user may have in this queue at once; NULL: the machine's
    max_running_per_user: Mapped[int | None]


class WorkloadRow(Base):
    """A submitted workload: what it asks for, how to run it, where it runs, how it ended."""

    __tablename__ = "workloads"
    __table_args__ = (
        CheckConstraint(
            "phase IN ('pending', 'running', 'paused', 'succeeded', 'failed', 'cancelled')",
            name="phase",
        ),
        Index("ix_workloads_phase", "phase"),
        Index("ix_workloads_queue", "queue"),
        # a submission's name check and its owner's active count (issue 27)
        Index("ix_workloads_owner_phase_name", "owner_uid", "phase", "name"),
        # the tasks of an array (issue 25)
        Index("ix_workloads_array_id", "array_id"),
        Index("ix_workloads_owner_array_name", "owner_uid", "array_name"),
        # a user's active count and stored bytes per queue, from the index alone (issue 27)
        Index("ix_workloads_owner_queue_phase", "owner_uid", "queue", "phase", "stored_bytes"),
        # retention: finished workloads oldest first
        Index("ix_workloads_finished_at", "finished_at"),
        # a listing page's extent from the index alone (issue 27, revision r0013)
        Index("ix_workloads_listing", "submitted_at", "id", "phase", "owner_uid", "stored_bytes"),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    owner_uid: Mapped[int]
    queue: Mapped[str] = mapped_column(String(NAME_LENGTH))
    phase: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int]
    preemptible: Mapped[bool | None]
    # the request (fgpu.model.types.Request); gpu_models joined by "|", "" for any model
    cpu_milli: Mapped[int]
    memory_mib: Mapped[int]
    gpu_count: Mapped[int]
    gpu_milli: Mapped[int | None]
    gpu_memory_mib: Mapped[int | None]
    gpu_models: Mapped[str]
    # how to run it
    argv: Mapped[list[str]] = mapped_column(JSON)
    shell: Mapped[bool]
    cwd: Mapped[str]
    env: Mapped[dict[str, str]] = mapped_column(JSON)
    grace_s: Mapped[float]
    # lifecycle
    submitted_at: Mapped[float]
    started_at: Mapped[float | None]
    finished_at: Mapped[float | None]
    exit_code: Mapped[int | None]
    reason: Mapped[str]
    restarts: Mapped[int]
    stop_requested_at: Mapped[float | None]
    cancelled_by: Mapped[int | None]
    # the process, while it runs
    pid: Mapped[int | None]
    create_time: Mapped[float | None]
    stdout_path: Mapped[str | None]
    stderr_path: Mapped[str | None]
    # the allocation: node name here, the rest as JSON (see records.StoredAllocation)
    node_name: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    allocation: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # a MIG workload's request (records.StoredMigRequest); NULL for the others
    mig_request: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # ids of the workloads that took its compute while it is squeezed; NULL otherwise
    squeezed_by: Mapped[list[str] | None] = mapped_column(JSON)
    # while suspended to host memory (pending, its processes kept, frozen and checkpointed):
    # the node it waits on and the host memory it holds there (MiB); NULL otherwise
    suspended_on: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    suspended_host_mib: Mapped[int | None]
    # Slurm's habits (issue 25; records.WorkloadRecord): the time limit of a run, seconds;
    # the dependencies as [[type, id], ...]; an array task's array (the array's id is its
    # own id, none of its tasks'), name, index, task count and how many may run at once. NULL: none.
    time_limit_s: Mapped[float | None]
    dependency: Mapped[list[list[str]] | None] = mapped_column(JSON)
    array_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    array_name: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    array_index: Mapped[int | None]
    array_size: Mapped[int | None]
    array_throttle: Mapped[int | None]
    # back to pending by preemption or reclaim and not run since: the preemptor's id and
    # the kind (records.WorkloadRecord.preempted_by); NULL otherwise
    preempted_by: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    preempted_kind: Mapped[str | None] = mapped_column(String(16))
    # bytes its command and environment take as stored (fgpu.store.validate.stored_bytes);
    # NULL only for rows written before revision r0007 and not backfilled
    stored_bytes: Mapped[int | None]


class EventRow(Base):
    """Something that happened: a workload's transition, a queue or node change."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_workload_id", "workload_id", "id"),
        Index("ix_events_time", "time"),
    )

    id: Mapped[int] = mapped_column(_EVENT_ID, primary_key=True, autoincrement=True)
    workload_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), ForeignKey("workloads.id"))
    time: Mapped[float]
    kind: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str]
    message: Mapped[str]
    # coalescing (issue 27): how many like events this row stands for (NULL: one) and when
    # the last of them happened (NULL: at ``time``)
    count: Mapped[int | None]
    last_time: Mapped[float | None]


class NodeRow(Base):
    """A node of the inventory."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    cpu_milli: Mapped[int]
    memory_mib: Mapped[int]
    updated_at: Mapped[float]


class GpuRow(Base):
    """A GPU of a node in the inventory."""

    __tablename__ = "gpus"

    node_name: Mapped[str] = mapped_column(
        String(NAME_LENGTH), ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True
    )
    gpu_index: Mapped[int] = mapped_column(Integer(), primary_key=True)
    uuid: Mapped[str] = mapped_column(String(96), unique=True)
    model: Mapped[str] = mapped_column(String(NAME_LENGTH))
    memory_mib: Mapped[int]
    mig_enabled: Mapped[bool]


class IdempotencyKeyRow(Base):
    """A submission's ``Idempotency-Key`` (per user), the fingerprint of its body and the
    workload it created (issue 27); kept a bounded time (``created_at``)."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (Index("ix_idempotency_keys_created_at", "created_at"),)

    owner_uid: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(IDEMPOTENCY_KEY_LENGTH), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    workload_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    created_at: Mapped[float]


class HoldRow(Base):
    """Capacity the decision core holds for a pending workload (fgpu.sched.workload.Hold)."""

    __tablename__ = "holds"

    workload_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("workloads.id"), primary_key=True
    )
    node_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    gpus: Mapped[list[int]] = mapped_column(JSON)
    victims: Mapped[list[str]] = mapped_column(JSON)
    since: Mapped[float]
