"""``fgpu serve``'s Prometheus series (:mod:`fgpu.metrics`): a sample read from the service
at each scrape, and the event series observed as the service writes workloads, runs rounds,
stops victims and hears from the memory guard.

Served at ``/metrics`` on the API (the Unix socket, and the TCP listener with its token)
and, with ``fgpu serve --metrics-listen HOST:PORT``, on a plain HTTP port for scrapers
(:func:`fgpu.metrics.http.serve_metrics`).
"""

from __future__ import annotations

import functools
import logging
import pwd
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from fgpu.agent.backend import GpuDevice
from fgpu.agent.events import MEMORY_EXCEEDED, MEMORY_WARNING, AgentEvent
from fgpu.agent.governor.runtime import WorkloadView as GovernorView
from fgpu.metrics import (
    Exporter,
    FleetSample,
    GpuSample,
    QueueSample,
    WorkloadSample,
    fleet_fragmentation,
    pending_reason,
)
from fgpu.sched.accounting import counted_gpu_milli
from fgpu.sched.rounds import state_with, target_for, target_key
from fgpu.server import views
from fgpu.server.live import LiveFigures, read_live
from fgpu.store.records import WorkloadRecord

if TYPE_CHECKING:
    from fgpu.server.core import ServiceCore

log = logging.getLogger("fgpu.server")

_TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
_REMEMBERED = 10_000
"""Ended workloads remembered so that one end is counted once."""


@functools.lru_cache(maxsize=4096)
def user_name(uid: int) -> str:
    """The user name of ``uid``, or the uid as text where the machine has no such user."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class ServiceMetrics(Exporter):
    """The series of one service: the fleet read at each scrape and the event series.

    A scrape reads the service's memory only: the mirror of its active workloads (kept
    current by every write, :meth:`~fgpu.server.core.ServiceCore._active_records`), the
    queue tree it schedules with, the last round's fair shares and wait reasons, and one
    read of the backend and the governor (:func:`~fgpu.server.live.read_live`). The
    fragmentation is computed again only after a workload was written.

    Args:
        service: the service whose state each scrape reads.
    """

    def __init__(self, service: ServiceCore) -> None:
        super().__init__(self.sample)
        self._service = service
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._writes = 0  # workloads written so far: the fragmentation's cache key
        self._fragmentation: tuple[int, float] | None = None

    @property
    def writes(self) -> int:
        """Workload writes so far (every store write through the service's mirror)."""
        return self._writes

    def wrote(self, method: str, record: WorkloadRecord) -> None:
        """The service wrote ``record`` through the store's ``method``: a first start is
        observed in ``fgpu_submission_to_start_seconds`` (a restart after preemption is
        not a new submission), an end in ``fgpu_workloads_total`` (once per workload)."""
        with self._lock:
            self._writes += 1
        if method == "mark_running" and record.started_at is not None:
            if record.restarts == 0:
                waited = record.started_at - record.submitted_at
                self.events.started(record.queue, record.priority, waited)
        elif record.phase in _TERMINAL:
            with self._lock:
                if record.id in self._ended:
                    return
                self._ended[record.id] = None
                while len(self._ended) > _REMEMBERED:
                    self._ended.popitem(last=False)
            self.events.ended(record.phase)

    def agent_event(self, event: AgentEvent) -> None:
        """An event of the node agent: the memory guard's findings are counted."""
        if event.kind in (MEMORY_EXCEEDED, MEMORY_WARNING):
            self.events.memory_violations.inc()

    def sample(self) -> FleetSample:
        """The service's GPUs, running workloads and queues now."""
        svc = self._service
        records = svc._active_records()
        running = [r for r in records if r.holds_allocation and r.allocation is not None]
        live = read_live(svc.backend, svc.enforcement, dict(svc._handles))
        gpus, shares = self._shared_gpus(running, live)
        if svc.mig.gpus:
            mig_gpus, mig_shares = self._mig_gpus(running, live)
            gpus += mig_gpus
            shares += mig_shares
        return FleetSample(gpus, shares, self._queues(records), self._fragmentation_now())

    def _shared_gpus(
        self, running: list[WorkloadRecord], live: LiveFigures
    ) -> tuple[list[GpuSample], list[WorkloadSample]]:
        machine = self._service.machine
        milli: dict[tuple[str, int], int] = {}
        memory: dict[tuple[str, int], int] = {}
        shares: list[WorkloadSample] = []
        for r in running:
            a = r.allocation
            assert a is not None
            devices = machine.devices.get(a.node_name)
            if a.mig is not None or devices is None:
                continue
            view = live.governed.get(r.id)
            user = user_name(r.owner_uid)
            for g, m, mm in zip(a.gpus, a.gpu_milli, a.gpu_memory_mib, strict=True):
                if g >= len(devices):
                    continue
                key = (a.node_name, g)
                # a squeezed share is lent to who squeezed it
                milli[key] = milli.get(key, 0) + counted_gpu_milli((m,), r.squeezed_by is not None)
                memory[key] = memory.get(key, 0) + mm
                shares.append(_share(r, user, a.node_name, devices[g], m, mm, view, live))
        gpus = [
            GpuSample(
                node=node.name,
                index=d.index,
                uuid=d.uuid,
                model=d.model,
                memory_mib=d.memory_mib,
                allocated_milli=milli.get((node.name, g), 0),
                allocated_memory_mib=memory.get((node.name, g), 0),
                used_memory_mib=live.gpu_used_mib.get(d.uuid),
                utilization_pct=live.utilization.get(d.uuid),
            )
            for node in machine.nodes
            for g, d in enumerate(machine.devices[node.name])
        ]
        return gpus, shares

    def _mig_gpus(
        self, running: list[WorkloadRecord], live: LiveFigures
    ) -> tuple[list[GpuSample], list[WorkloadSample]]:
        """The MIG pool's GPUs and the workloads on their instances (a few GPUs at most)."""
        svc = self._service
        try:
            pool = views.mig_node(
                svc.mig, running, live.gpu_used_mib, live.utilization, svc.backend.kind
            )
        except Exception:  # a device error: the pool is left out of this scrape
            log.exception("reading the MIG instances failed")
            return [], []
        by_id = {r.id: r for r in running}
        gpus: list[GpuSample] = []
        shares: list[WorkloadSample] = []
        for g in pool.gpus:
            gpus.append(
                GpuSample(
                    node=pool.name,
                    index=g.index,
                    uuid=g.uuid,
                    model=g.model,
                    memory_mib=g.memory_mib,
                    allocated_milli=g.allocated_milli,
                    allocated_memory_mib=g.allocated_memory_mib,
                    used_memory_mib=g.used_memory_mib,
                    utilization_pct=g.utilization_pct,
                )
            )
            for i in g.mig_instances:
                r = by_id.get(i.workload_id or "")
                if r is not None:
                    shares.append(
                        WorkloadSample(
                            workload=r.id,
                            name=r.name,
                            queue=r.queue,
                            user=user_name(r.owner_uid),
                            node=pool.name,
                            gpu=g.index,
                            compute_milli=i.compute_milli,
                            memory_mib=i.memory_mib,
                        )
                    )
        return gpus, shares

    def _queues(self, records: list[WorkloadRecord]) -> list[QueueSample]:
        svc = self._service
        reasons = svc._reasons
        allocated: dict[str, int] = {}
        pending: dict[str, dict[str, int]] = {}
        for r in records:
            if r.phase == "pending":
                counts = pending.setdefault(r.queue, {})
                label = pending_reason(reasons.get(r.id) or r.reason)
                counts[label] = counts.get(label, 0) + 1
            elif r.holds_allocation and r.allocation is not None:
                milli = counted_gpu_milli(r.allocation.gpu_milli, r.squeezed_by is not None)
                allocated[r.queue] = allocated.get(r.queue, 0) + milli
        last = svc._last
        fair = last.fair_share if last is not None else {}
        return [
            QueueSample(
                name=name,
                quota_milli=spec.quota.gpu_milli,
                fair_share_milli=fair[name].gpu_milli if name in fair else 0,
                allocated_milli=allocated.get(name, 0),
                pending=pending.get(name, {}),
            )
            for name, spec in svc._queue_tree().specs.items()
        ]

    def _fragmentation_now(self) -> float:
        """FGD fragmentation of the machine's GPUs against the recent submissions, as a
        share of GPU capacity (:func:`fgpu.metrics.fleet_fragmentation`), computed again
        only after a write."""
        with self._lock:
            writes, cached = self._writes, self._fragmentation
        if cached is not None and cached[0] == writes:
            return cached[1]
        svc = self._service
        workloads = svc._workloads()
        state = state_with(svc.machine.nodes, workloads, lambda w, _: None)
        value = fleet_fragmentation(state, target_for(target_key(workloads)))
        with self._lock:
            self._fragmentation = (writes, value)
        return value


def _share(
    record: WorkloadRecord,
    user: str,
    node: str,
    device: GpuDevice,
    milli: int,
    memory_mib: int,
    view: GovernorView | None,
    live: LiveFigures,
) -> WorkloadSample:
    """A running workload's share of one shared GPU, with what the governor and the
    backend say of it."""
    governed = view is not None and device.uuid in view.gpu_uuids
    return WorkloadSample(
        workload=record.id,
        name=record.name,
        queue=record.queue,
        user=user,
        node=node,
        gpu=device.index,
        compute_milli=milli,
        memory_mib=memory_mib,
        used_memory_mib=live.holder_used_mib.get((record.id, device.uuid), 0),
        achieved_milli=view.achieved_milli if view is not None else None,
        paused_s=(
            {"share": view.paused_ns[0] / 1e9, "priority": view.paused_ns[1] / 1e9}
            if view is not None
            else {}
        ),
        paused=governed and view is not None and str(view.state) == "frozen-by-priority",
    )
