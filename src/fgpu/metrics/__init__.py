"""Prometheus series of fgpu (``fgpu_*``; DESIGN.md section 9, README "Metrics and
dashboard").

The three processes that export them (``fgpu serve``, ``fgpu k8s scheduler``, the node agent)
share this package: :mod:`fgpu.metrics.sample` holds what a scrape reads (plain dataclasses
the process fills from its own state), :mod:`fgpu.metrics.collector` turns one sample into
the fixed series (:class:`Exporter`: one process's ``/metrics``), and
:mod:`fgpu.metrics.events` holds the counters and histograms observed
where things happen. Series names are fixed (dashboards and alerts rely on them); they are
listed in :data:`fgpu.metrics.names.SERIES`.
"""

from fgpu.metrics.collector import CONTENT_TYPE, Exporter, FleetCollector, exposition
from fgpu.metrics.events import EventMetrics, priority_class
from fgpu.metrics.names import SERIES
from fgpu.metrics.sample import (
    FleetSample,
    GpuSample,
    QueueSample,
    WorkloadSample,
    fleet_fragmentation,
    pending_reason,
)

__all__ = [
    "CONTENT_TYPE",
    "SERIES",
    "EventMetrics",
    "Exporter",
    "FleetCollector",
    "FleetSample",
    "GpuSample",
    "QueueSample",
    "WorkloadSample",
    "exposition",
    "fleet_fragmentation",
    "pending_reason",
    "priority_class",
]
