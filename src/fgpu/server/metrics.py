"""``fgpu serve``'s Prometheus series (:mod:`fgpu.metrics`): a sample read from the service
at each scrape, and the event series observed as the service writes workloads, runs rounds,
stops victims and hears from the memory guard.

Served at ``/metrics`` on the API (the Unix socket, and the TCP listener with its token)
and, with ``fgpu serve --metrics-listen HOST:PORT``, on a plain HTTP port for scrapers
(:func:`fgpu.metrics.http.serve_metrics`).
"""

from __future__ import annotations

import functools
import pwd
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from fgpu.agent.events import MEMORY_EXCEEDED, MEMORY_WARNING, AgentEvent
from fgpu.metrics import (
    EventMetrics,
    FleetCollector,
    FleetSample,
    GpuSample,
    QueueSample,
    WorkloadSample,
    pending_reason,
)
from fgpu.store.records import WorkloadRecord

if TYPE_CHECKING:
    from fgpu.server.service import Service

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


class ServiceMetrics:
    """The registry of one service, with its fleet collector and event series.

    Args:
        service: the service whose state each scrape reads.
    """

    def __init__(self, service: Service) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.events = EventMetrics(self.registry)
        self._service = service
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self.registry.register(FleetCollector(self.sample))

    def wrote(self, method: str, record: WorkloadRecord) -> None:
        """The service wrote ``record`` through the store's ``method``: a start is
        observed in ``fgpu_submission_to_start_seconds``, an end in
        ``fgpu_workloads_total`` (once per workload)."""
        if method == "mark_running" and record.started_at is not None:
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
        service = self._service
        nodes = service.nodes()
        workloads = {w.id: w for w in service.list_workloads()}
        governed = service.enforcement.views()
        gpus: list[GpuSample] = []
        running: list[WorkloadSample] = []
        for node in nodes:
            for g in node.gpus:
                gpus.append(
                    GpuSample(
                        node=node.name,
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
                shares = [
                    (h.workload_id, h.compute_milli, h.memory_mib, h.used_memory_mib)
                    for h in g.holders
                ] + [
                    (i.workload_id, i.compute_milli, i.memory_mib, None)
                    for i in g.mig_instances
                    if i.workload_id is not None
                ]
                states = {h.workload_id: h for h in g.holders}
                for workload_id, milli, mib, used in shares:
                    w = workloads.get(workload_id)
                    if w is None:
                        continue
                    view = governed.get(workload_id)
                    holder = states.get(workload_id)
                    running.append(
                        WorkloadSample(
                            workload=workload_id,
                            name=w.name,
                            queue=w.queue,
                            user=user_name(w.owner_uid),
                            node=node.name,
                            gpu=g.index,
                            compute_milli=milli,
                            memory_mib=mib,
                            used_memory_mib=used,
                            achieved_milli=view.achieved_milli if view else None,
                            paused_s=(
                                {
                                    "share": view.paused_ns[0] / 1e9,
                                    "priority": view.paused_ns[1] / 1e9,
                                }
                                if view
                                else {}
                            ),
                            paused=holder is not None and holder.state == "frozen-by-priority",
                        )
                    )
        pending: dict[str, dict[str, int]] = {}
        for w in workloads.values():
            if w.phase == "pending":
                counts = pending.setdefault(w.queue, {})
                reason = pending_reason(w.reason)
                counts[reason] = counts.get(reason, 0) + 1
        queues = [
            QueueSample(
                name=q.name,
                quota_milli=q.quota_milli,
                fair_share_milli=q.fair_share_milli,
                allocated_milli=q.allocated_milli,
                pending=pending.get(q.name, {}),
            )
            for q in service.list_queues()
        ]
        return FleetSample(gpus, running, queues, service.fragmentation())
