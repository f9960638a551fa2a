"""Store records -> API wire views (no logic beyond shaping)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fgpu import states
from fgpu.agent.backend import GpuDevice
from fgpu.agent.governor.runtime import WorkloadView as GovernorView
from fgpu.agent.hostlimits import LimitSupport
from fgpu.mig.catalog import instance_milli
from fgpu.model.types import Node
from fgpu.sched.accounting import counted_gpu_milli
from fgpu.sched.workload import NON_PREEMPTIBLE_FROM
from fgpu.server.live import LiveFigures
from fgpu.server.mig_pool import MigPool
from fgpu.store.records import EventRecord, QueueRecord, WorkloadRecord
from fgpu.wire import (
    TERMINAL_PHASES,
    ArrayTaskView,
    EnforcementLayer,
    EventView,
    GpuGrant,
    GpuHolder,
    GpuView,
    MigInstanceView,
    NodeView,
    QueueView,
    ResourceRequest,
    WorkloadDetail,
    WorkloadView,
)


def workload(
    record: WorkloadRecord,
    wait_reason: str | None,
    gpu_state: str | None = None,
    names: Mapping[str, str] | None = None,
) -> WorkloadView:
    """The list view; a pending workload's reason is why it waits (last round). A finished
    workload shows where it last ran. ``gpu_state``: the governor's state of a running one
    in the words of :mod:`fgpu.states` (:func:`fgpu.states.governor_word`), where it is
    governed. ``names``: workload names by id, to name a preemptor as ``fgpu ls`` does
    (its id where it is missing)."""
    r = record.request
    grants: list[GpuGrant] = []
    a = record.allocation
    if a is not None and (record.holds_allocation or record.phase in TERMINAL_PHASES):
        uuids = a.gpu_uuids or ("",) * len(a.gpus)
        mig = a.mig
        grants = [
            GpuGrant(
                node=a.node_name,
                index=g,
                uuid=u,
                compute_milli=m,
                memory_mib=mm,
                mig_profile=mig.profile if mig else None,
                mig_start=mig.start if mig else None,
                mig_uuid=mig.uuid if mig else None,
            )
            for g, u, m, mm in zip(a.gpus, uuids, a.gpu_milli, a.gpu_memory_mib, strict=True)
        ]
    reason = record.reason
    if record.phase == "pending" and wait_reason:
        reason = wait_reason
    preemptible = (
        record.preemptible
        if record.preemptible is not None
        else record.priority < NON_PREEMPTIBLE_FROM
    )
    holding = record.holds_allocation
    stopping = holding and record.stop_requested_at is not None
    squeezed = holding and record.squeezed_by is not None
    squeezed_by = list(record.squeezed_by or ()) if holding else []
    shown_gpu_state = gpu_state if holding else None
    suspended_mib = record.suspended_host_mib if record.is_suspended else None
    preempted_by = record.preempted_by if record.phase == "pending" else None
    state = states.workload_state(
        phase=record.phase,
        stopping=stopping,
        squeezed=squeezed,
        suspended=suspended_mib is not None,
        gpu_state=shown_gpu_state,
        preempted_kind=record.preempted_kind if record.phase == "pending" else None,
    )
    by_name = None
    if preempted_by is not None:
        by_name = (names or {}).get(preempted_by) or preempted_by
    return WorkloadView(
        id=record.id,
        name=record.name,
        owner_uid=record.owner_uid,
        phase=record.phase,
        queue=record.queue,
        priority=record.priority,
        preemptible=preemptible,
        request=ResourceRequest(
            gpu_count=r.gpu_count,
            gpu_milli=r.gpu_milli,
            gpu_memory_mib=r.gpu_memory_mib,
            gpu_models=sorted(r.gpu_models),
            cpu_milli=r.cpu_milli,
            memory_mib=r.memory_mib,
            isolation="mig" if record.mig_request is not None else "share",
            mig_profile=record.mig_request.profile if record.mig_request is not None else None,
        ),
        gpus=grants,
        command=list(record.argv),
        submitted_at=record.submitted_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        exit_code=record.exit_code,
        stopping=stopping,
        gpu_state=shown_gpu_state,
        reason=reason,
        restarts=record.restarts,
        squeezed=squeezed,
        squeezed_by=squeezed_by,
        suspended_host_mib=suspended_mib,
        state=state,
        state_text=states.state_text(
            state,
            restarts=record.restarts,
            by=by_name,
            squeezed_by=squeezed_by,
            suspended_host_mib=suspended_mib,
        ),
        preempted_by=preempted_by,
        time_limit_s=record.time_limit_s,
        dependency=[f"{kind}:{target}" for kind, target in record.dependency],
        array=array_view(record),
    )


def array_view(record: WorkloadRecord) -> ArrayTaskView | None:
    """The array a task belongs to; None for a plain workload."""
    a = record.array
    if a is None:
        return None
    return ArrayTaskView(id=a.id, name=a.name, index=a.index, size=a.size, throttle=a.throttle)


def event(record: EventRecord) -> EventView:
    """One event."""
    return EventView(
        id=record.id,
        workload_id=record.workload_id,
        time=record.time,
        kind=record.kind,
        reason=record.reason,
        message=record.message,
        count=record.count,
        last_time=record.last_time,
    )


def detail(
    record: WorkloadRecord,
    wait_reason: str | None,
    events: Sequence[EventRecord],
    gpu_state: str | None = None,
    names: Mapping[str, str] | None = None,
) -> WorkloadDetail:
    """The describe view: the workload and its events (``gpu_state``, ``names``: as
    :func:`workload`)."""
    base = workload(record, wait_reason, gpu_state, names)
    return WorkloadDetail(**base.model_dump(), events=[event(e) for e in events])


def queue(
    record: QueueRecord,
    active: Sequence[WorkloadRecord],
    fair_milli: int,
    preempt_delay_s: float | None = None,
) -> QueueView:
    """A queue with its use (from its active workloads) and last fair share;
    ``preempt_delay_s`` is the service's wait before evict (seconds), what applies where the
    queue sets none."""
    c = record.config
    allocated = sum(
        counted_gpu_milli(w.allocation.gpu_milli, w.squeezed_by is not None)
        for w in active
        if w.allocation and w.holds_allocation
    )
    return QueueView(
        name=c.name,
        parent=c.parent,
        quota_milli=c.quota.gpu_milli,
        limit_milli=c.limit.gpu_milli,
        over_quota_weight=c.over_quota_weight,
        priority=c.priority,
        allocated_milli=allocated,
        fair_share_milli=fair_milli,
        pending=sum(1 for w in active if w.phase == "pending"),
        running=sum(1 for w in active if w.holds_allocation),
        members=list(c.members),
        max_priority=c.max_priority,
        nonpreemptible=c.nonpreemptible,
        squeeze=c.squeeze,
        default_time_s=c.default_time_s,
        max_time_s=c.max_time_s,
        default_for=list(c.default_for),
        max_active_per_user=c.max_active_per_user,
        max_running_per_user=c.max_running_per_user,
        max_stored_bytes=c.max_stored_bytes,
        max_output_bytes=c.max_output_bytes,
        preempt_delay_s=c.preempt_delay_s,
        effective_preempt_delay_s=(
            c.preempt_delay_s if c.preempt_delay_s is not None else preempt_delay_s
        ),
    )


def _gpu_view(
    device: GpuDevice,
    holders: list[GpuHolder],
    used_mib: Mapping[str, int],
    utilization: Mapping[str, int],
) -> GpuView:
    """One GPU with its holders (allocated = what they hold, squeezed workloads' compute not
    counted: it is lent to the workloads that squeezed them) and live figures."""
    return GpuView(
        index=device.index,
        uuid=device.uuid,
        model=device.model,
        memory_mib=device.memory_mib,
        allocated_milli=sum(
            counted_gpu_milli((h.compute_milli,), h.squeezed_by is not None) for h in holders
        ),
        allocated_memory_mib=sum(h.memory_mib for h in holders),
        holders=holders,
        used_memory_mib=used_mib.get(device.uuid),
        utilization_pct=utilization.get(device.uuid),
    )


def node(
    spec: Node,
    devices: Sequence[GpuDevice],
    running: Sequence[WorkloadRecord],
    live: LiveFigures,
    backend: str,
    layers: list[EnforcementLayer] | None = None,
) -> NodeView:
    """A node with each GPU's holders, their governor state and measured memory, in one
    pass over ``running``; each GPU shows ``layers`` (its enforcement mechanisms)."""
    by_gpu: dict[int, list[GpuHolder]] = {}
    uuids = [d.uuid for d in devices]
    for w in running:
        a = w.allocation
        if a is None or a.node_name != spec.name:
            continue
        v = live.governed.get(w.id)
        for g, m, mm in zip(a.gpus, a.gpu_milli, a.gpu_memory_mib, strict=True):
            uuid = uuids[g] if g < len(uuids) else ""
            by_gpu.setdefault(g, []).append(
                GpuHolder(
                    workload_id=w.id,
                    name=w.name,
                    compute_milli=m,
                    memory_mib=mm,
                    used_memory_mib=live.holder_used_mib.get((w.id, uuid), 0),
                    squeezed_by=None if w.squeezed_by is None else list(w.squeezed_by),
                    owner_uid=w.owner_uid,
                    **governor_fields(v, uuid),
                )
            )
    gpus = [
        _gpu_view(device, by_gpu.get(index, []), live.gpu_used_mib, live.utilization)
        for index, device in enumerate(devices)
    ]
    if layers is not None:
        gpus = [g.model_copy(update={"enforcement": layers}) for g in gpus]
    return NodeView(
        name=spec.name,
        backend=backend,
        cpu_milli=spec.cpu_milli,
        memory_mib=spec.memory_mib,
        gpus=gpus,
    )


def governor_fields(view: GovernorView | None, uuid: str) -> dict[str, Any]:
    """A holder's governor state on the GPU ``uuid`` (mode on that GPU, run state, busy,
    achieved share), as :class:`GpuHolder` fields; empty where the governor does not
    govern the workload there."""
    if view is None or uuid not in view.gpu_uuids:
        return {}
    return {
        "mode": str(view.modes[view.gpu_uuids.index(uuid)]),
        "state": states.governor_word(str(view.state)),
        "busy": view.busy,
        "achieved_milli": view.achieved_milli,
        "enforcement": view.enforcement or None,
    }


def mig_node(
    pool: MigPool,
    running: Sequence[WorkloadRecord],
    used_mib: Mapping[str, int],
    utilization: Mapping[str, int],
    backend: str,
) -> NodeView:
    """The MIG pool as a node (``HOST/mig``): each GPU with its instances and who holds
    them (a workload of the service, processes the device reports, or nobody)."""
    holder = {
        w.allocation.mig.uuid: w
        for w in running
        if w.allocation is not None and w.allocation.mig is not None
    }
    gpus: list[GpuView] = []
    for gpu in pool.gpus:
        table = gpu.mig.profiles()
        instances: list[MigInstanceView] = []
        holders: list[GpuHolder] = []
        for i in gpu.mig.instances():
            profile = table.find(i.profile)
            milli = instance_milli(table, profile) if profile is not None else 0
            memory = profile.memory_mib if profile is not None else 0
            w = holder.get(i.uuid) if i.uuid else None
            instances.append(
                MigInstanceView(
                    profile=i.profile,
                    start=i.start,
                    uuid=i.uuid,
                    compute_milli=milli,
                    memory_mib=memory,
                    workload_id=w.id if w else None,
                    name=w.name if w else None,
                    in_use_outside=i.in_use and w is None,
                )
            )
            if w is not None:
                holders.append(
                    GpuHolder(
                        workload_id=w.id,
                        name=w.name,
                        compute_milli=milli,
                        memory_mib=memory,
                        owner_uid=w.owner_uid,
                    )
                )
        device = gpu.device
        gpus.append(
            _gpu_view(device, holders, used_mib, utilization).model_copy(
                update={"mig_enabled": True, "mig_instances": instances}
            )
        )
    return NodeView(name=pool.node_name, backend=backend, cpu_milli=0, memory_mib=0, gpus=gpus)


def host_limit_layers(support: LimitSupport) -> list[EnforcementLayer]:
    """A node's ``host_limits``: whether ``--cpu`` and ``--memory`` are limits there (cgroups,
    :mod:`fgpu.agent.hostlimits`), and how, or why they cannot be enforced (then they only
    count for placement)."""
    placement = " (--cpu counts for placement only)"
    memory_placement = " (--memory counts for placement only)"
    return [
        EnforcementLayer(
            name="cpu-limit",
            active=support.cpu,
            why=support.cpu_why if support.cpu else f"not enforced: {support.cpu_why}{placement}",
        ),
        EnforcementLayer(
            name="memory-limit",
            active=support.memory,
            why=support.memory_why
            if support.memory
            else f"not enforced: {support.memory_why}{memory_placement}",
        ),
    ]


def with_enforcement(node: NodeView, layers: Mapping[str, list[EnforcementLayer]]) -> NodeView:
    """``node`` with each GPU's enforcement layers (by GPU uuid) filled in."""
    gpus = [g.model_copy(update={"enforcement": layers.get(g.uuid, [])}) for g in node.gpus]
    return node.model_copy(update={"gpus": gpus})
