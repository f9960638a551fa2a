"""Turns a :class:`~fgpu.metrics.sample.FleetSample` into the fixed ``fgpu_*`` gauges.

A :class:`FleetCollector` is registered once with a process's registry; each scrape calls
its ``read`` function and emits fresh families, so a workload's series are gone as soon as
the process stops listing it (no stale children to remove, unlike labelled gauges).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fgpu.metrics.names import GPU_LABELS, SERIES, WORKLOAD_LABELS
from fgpu.metrics.sample import FleetSample

MIB = 1024 * 1024
MILLI = 1000.0


def _gauge(name: str) -> GaugeMetricFamily:
    series = SERIES[name]
    return GaugeMetricFamily(name, series.help, labels=list(series.labels))


class FleetCollector(Collector):
    """Emits the per-GPU, per-workload, per-queue and fleet series of ``read()``.

    Args:
        read: returns the current sample; called once per scrape (from the scraping
            thread). An exception propagates: the scrape fails (500) rather than showing a
            fleet without its GPUs.
    """

    def __init__(self, read: Callable[[], FleetSample]) -> None:
        self._read = read

    def describe(self) -> Iterable[Metric]:
        # nothing: the registry then does not call collect() at registration
        return []

    def collect(self) -> Iterator[Metric]:
        sample = self._read()
        yield from _gpu_families(sample)
        yield from _workload_families(sample)
        yield from _queue_families(sample)
        if sample.fragmentation is not None:
            frag = _gauge("fgpu_fragmentation_ratio")
            frag.add_metric([], sample.fragmentation)
            yield frag


def _gpu_families(sample: FleetSample) -> Iterator[Metric]:
    allocated = _gauge("fgpu_gpu_compute_allocated_ratio")
    memory_allocated = _gauge("fgpu_gpu_memory_allocated_bytes")
    total = _gauge("fgpu_gpu_memory_total_bytes")
    used = _gauge("fgpu_gpu_memory_used_bytes")
    utilization = _gauge("fgpu_gpu_utilization_ratio")
    assert len(GPU_LABELS) == 4
    for gpu in sample.gpus:
        labels = [gpu.node, str(gpu.index), gpu.uuid, gpu.model]
        allocated.add_metric(labels, gpu.allocated_milli / MILLI)
        memory_allocated.add_metric(labels, gpu.allocated_memory_mib * MIB)
        total.add_metric(labels, gpu.memory_mib * MIB)
        if gpu.used_memory_mib is not None:
            used.add_metric(labels, gpu.used_memory_mib * MIB)
        if gpu.utilization_pct is not None:
            utilization.add_metric(labels, gpu.utilization_pct / 100.0)
    yield from (allocated, memory_allocated, total, used, utilization)


def _workload_families(sample: FleetSample) -> Iterator[Metric]:
    share = _gauge("fgpu_workload_compute_share_ratio")
    achieved = _gauge("fgpu_workload_compute_achieved_ratio")
    limit = _gauge("fgpu_workload_gpu_memory_limit_bytes")
    used = _gauge("fgpu_workload_gpu_memory_used_bytes")
    paused_now = _gauge("fgpu_workload_paused")
    name = "fgpu_workload_paused_seconds_total"
    paused = CounterMetricFamily(
        name.removesuffix("_total"), SERIES[name].help, labels=list(SERIES[name].labels)
    )
    assert len(WORKLOAD_LABELS) == 6
    for w in sample.workloads:
        labels = [w.workload, w.name, w.queue, w.user, w.node, str(w.gpu)]
        share.add_metric(labels, w.compute_milli / MILLI)
        limit.add_metric(labels, w.memory_mib * MIB)
        if w.used_memory_mib is not None:
            used.add_metric(labels, w.used_memory_mib * MIB)
        if w.achieved_milli is not None:
            achieved.add_metric(labels, w.achieved_milli / MILLI)
            paused_now.add_metric(labels, 1.0 if w.paused else 0.0)
            for reason in ("share", "priority"):
                paused.add_metric([*labels, reason], w.paused_s.get(reason, 0.0))
    yield from (share, achieved, limit, used, paused, paused_now)


def _queue_families(sample: FleetSample) -> Iterator[Metric]:
    quota = _gauge("fgpu_queue_quota_gpus")
    fair = _gauge("fgpu_queue_fair_share_gpus")
    allocated = _gauge("fgpu_queue_allocated_gpus")
    pending = _gauge("fgpu_queue_pending_workloads")
    for q in sample.queues:
        quota.add_metric([q.name], q.quota_milli / MILLI)
        fair.add_metric([q.name], q.fair_share_milli / MILLI)
        allocated.add_metric([q.name], q.allocated_milli / MILLI)
        for reason, count in sorted(q.pending.items()):
            pending.add_metric([q.name, reason], count)
    yield from (quota, fair, allocated, pending)


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format (version 0.0.4)."""
    return generate_latest(registry)
