"""Rows to records and back (the only module that knows both shapes)."""

from __future__ import annotations

from fgpu.model.types import Request
from fgpu.sched.workload import Hold, Resources
from fgpu.store.records import (
    EventRecord,
    GpuRecord,
    NodeRecord,
    QueueConfig,
    QueueLimit,
    QueueRecord,
    StoredAllocation,
    StoredArrayTask,
    StoredMigRequest,
    WorkloadRecord,
    models_from_text,
)
from fgpu.store.schema import EventRow, GpuRow, HoldRow, NodeRow, QueueRow, WorkloadRow


def queue_record(row: QueueRow) -> QueueRecord:
    """A queue row as a record."""
    config = QueueConfig(
        name=row.name,
        parent=row.parent,
        quota=Resources(row.quota_gpu_milli, row.quota_cpu_milli, row.quota_memory_mib),
        limit=QueueLimit(row.limit_gpu_milli, row.limit_cpu_milli, row.limit_memory_mib),
        over_quota_weight=row.over_quota_weight,
        priority=row.priority,
        members=tuple(row.members),
        max_priority=row.max_priority,
        nonpreemptible=row.nonpreemptible,
        squeeze=row.squeeze,
        default_time_s=row.default_time_s,
        max_time_s=row.max_time_s,
        default_for=tuple(row.default_for or ()),
        max_active_per_user=row.max_active_per_user,
        max_stored_bytes=row.max_stored_bytes,
        max_output_bytes=row.max_output_bytes,
        preempt_delay_s=row.preempt_delay_s,
        max_running_per_user=row.max_running_per_user,
    )
    return QueueRecord(config=config, created_at=row.created_at, updated_at=row.updated_at)


def apply_queue_config(row: QueueRow, config: QueueConfig) -> None:
    """Copy a (validated) configuration onto a queue row."""
    row.name = config.name
    row.parent = config.parent
    row.quota_gpu_milli, row.quota_cpu_milli, row.quota_memory_mib = config.quota.as_tuple()
    row.limit_gpu_milli, row.limit_cpu_milli, row.limit_memory_mib = config.limit.as_tuple()
    row.over_quota_weight = float(config.over_quota_weight)
    row.priority = config.priority
    row.members = list(config.members)
    row.max_priority = config.max_priority
    row.nonpreemptible = bool(config.nonpreemptible)
    row.squeeze = config.squeeze
    row.default_time_s = config.default_time_s
    row.max_time_s = config.max_time_s
    row.default_for = list(config.default_for) or None
    row.max_active_per_user = config.max_active_per_user
    row.max_stored_bytes = config.max_stored_bytes
    row.max_output_bytes = config.max_output_bytes
    row.max_running_per_user = config.max_running_per_user
    row.preempt_delay_s = None if config.preempt_delay_s is None else float(config.preempt_delay_s)


def workload_record(row: WorkloadRow) -> WorkloadRecord:
    """A workload row as a record."""
    request = Request(
        cpu_milli=row.cpu_milli,
        memory_mib=row.memory_mib,
        gpu_count=row.gpu_count,
        gpu_milli=row.gpu_milli,
        gpu_memory_mib=row.gpu_memory_mib,
        gpu_models=models_from_text(row.gpu_models),
    )
    allocation = None
    if row.node_name is not None and row.allocation is not None:
        allocation = StoredAllocation.from_json(row.node_name, row.allocation)
    return WorkloadRecord(
        id=row.id,
        name=row.name,
        owner_uid=row.owner_uid,
        queue=row.queue,
        phase=row.phase,
        priority=row.priority,
        preemptible=row.preemptible,
        request=request,
        argv=tuple(row.argv),
        shell=row.shell,
        cwd=row.cwd,
        env=dict(row.env),
        grace_s=row.grace_s,
        submitted_at=row.submitted_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        exit_code=row.exit_code,
        reason=row.reason,
        restarts=row.restarts,
        stop_requested_at=row.stop_requested_at,
        cancelled_by=row.cancelled_by,
        pid=row.pid,
        create_time=row.create_time,
        stdout_path=row.stdout_path,
        stderr_path=row.stderr_path,
        allocation=allocation,
        mig_request=StoredMigRequest.from_json(row.mig_request) if row.mig_request else None,
        squeezed_by=None if row.squeezed_by is None else tuple(row.squeezed_by),
        suspended_on=row.suspended_on,
        suspended_host_mib=row.suspended_host_mib or 0,
        time_limit_s=row.time_limit_s,
        dependency=tuple((str(k), str(w)) for k, w in row.dependency or ()),
        array=_array_task(row),
        preempted_by=row.preempted_by,
        preempted_kind=row.preempted_kind,
    )


def _array_task(row: WorkloadRow) -> StoredArrayTask | None:
    """The array of a task's row; None for a plain workload."""
    if row.array_id is None:
        return None
    return StoredArrayTask(
        id=row.array_id,
        name=row.array_name or row.array_id,
        index=int(row.array_index or 0),
        size=int(row.array_size or 1),
        throttle=row.array_throttle,
    )


def event_record(row: EventRow) -> EventRecord:
    """An event row as a record."""
    return EventRecord(
        id=row.id,
        workload_id=row.workload_id,
        time=row.time,
        kind=row.kind,
        reason=row.reason,
        message=row.message,
        count=row.count or 1,
        last_time=row.last_time if row.last_time is not None else row.time,
    )


def node_record(row: NodeRow, gpus: list[GpuRow]) -> NodeRecord:
    """A node row and its GPU rows as a record (GPUs by index)."""
    return NodeRecord(
        name=row.name,
        cpu_milli=row.cpu_milli,
        memory_mib=row.memory_mib,
        gpus=tuple(
            GpuRecord(
                index=g.gpu_index,
                uuid=g.uuid,
                model=g.model,
                memory_mib=g.memory_mib,
                mig_enabled=g.mig_enabled,
            )
            for g in sorted(gpus, key=lambda g: g.gpu_index)
        ),
    )


def hold_from_row(row: HoldRow) -> Hold:
    """A hold row as the decision core's :class:`Hold`."""
    return Hold(
        workload=row.workload_id,
        node=row.node_name,
        gpus=tuple(int(g) for g in row.gpus),
        victims=tuple(str(v) for v in row.victims),
        since=row.since,
    )


def hold_row(hold: Hold) -> HoldRow:
    """The decision core's :class:`Hold` as a row."""
    return HoldRow(
        workload_id=hold.workload,
        node_name=hold.node,
        gpus=[int(g) for g in hold.gpus],
        victims=[str(v) for v in hold.victims],
        since=float(hold.since),
    )
