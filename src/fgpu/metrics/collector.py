"""Turns a :class:`~fgpu.metrics.sample.FleetSample` into the fixed ``fgpu_*`` gauges.

Each scrape calls a :class:`FleetCollector`'s ``read`` function and emits fresh families, so
a workload's series are gone as soon as the process stops listing it (no stale children to
remove, unlike labelled gauges).

The fleet's families are large (about eight series per running workload and GPU: 8,000 for
1,000 workloads), and prometheus-client's ``generate_latest`` spends some 20 us per series
checking and escaping label names that are fixed here. :meth:`FleetCollector.render` writes
the same text format (version 0.0.4) directly, label names checked once, label values
escaped as the format asks (backslash, double quote, line feed). :class:`Exporter` serves a
process's counters and histograms through prometheus-client and appends the fleet's text;
:meth:`FleetCollector.collect` still yields the families for any other registry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fgpu.metrics.events import EventMetrics
from fgpu.metrics.names import GPU_LABELS, PENDING_REASONS, SERIES, WORKLOAD_LABELS
from fgpu.metrics.sample import FleetSample

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The media type of :meth:`Exporter.exposition` (the classic text format, which
Prometheus 2 and 3 both read)."""
MIB = 1024 * 1024
MILLI = 1000.0
_PAUSED_TOTAL = "fgpu_workload_paused_seconds_total"


@dataclass(slots=True)
class _Family:
    """One family of a sample: ``name`` as stored (a counter's with ``_total``), its rows
    (label values, the same as text ``name="value",...``, value)."""

    name: str
    rows: list[tuple[Sequence[str], str, float]]

    def add(self, labels: Sequence[str], text: str, value: float) -> None:
        self.rows.append((labels, text, value))


def _label_text(names: Sequence[str], values: Sequence[str]) -> str:
    """``name="value",...`` with the values escaped as the text format asks."""
    return ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True))


class _LabelTexts:
    """The label texts of one scrape, reusing those of the scrape before (a workload's
    labels stay the same for its life): ``text(names, values)``; ``kept`` holds what the
    next scrape may reuse (this scrape's labels only, so nothing piles up)."""

    def __init__(self, previous: dict[tuple[str, ...], str]) -> None:
        self._previous = previous
        self.kept: dict[tuple[str, ...], str] = {}

    def text(self, names: Sequence[str], values: tuple[str, ...]) -> str:
        found = self._previous.get(values)
        if found is None:
            found = _label_text(names, values)
        self.kept[values] = found
        return found


def _families(sample: FleetSample, texts: _LabelTexts | None = None) -> list[_Family]:
    """Every fleet family of ``sample`` in exposition order (empty ones included)."""
    label = (texts or _LabelTexts({})).text
    fam = {name: _Family(name, []) for name in _ORDER}
    allocated = fam["fgpu_gpu_compute_allocated_ratio"]
    memory_allocated = fam["fgpu_gpu_memory_allocated_bytes"]
    total = fam["fgpu_gpu_memory_total_bytes"]
    gpu_used = fam["fgpu_gpu_memory_used_bytes"]
    utilization = fam["fgpu_gpu_utilization_ratio"]
    for gpu in sample.gpus:
        labels: tuple[str, ...] = (gpu.node, str(gpu.index), gpu.uuid, gpu.model)
        text = label(GPU_LABELS, labels)
        allocated.add(labels, text, gpu.allocated_milli / MILLI)
        memory_allocated.add(labels, text, gpu.allocated_memory_mib * MIB)
        total.add(labels, text, gpu.memory_mib * MIB)
        if gpu.used_memory_mib is not None:
            gpu_used.add(labels, text, gpu.used_memory_mib * MIB)
        if gpu.utilization_pct is not None:
            utilization.add(labels, text, gpu.utilization_pct / 100.0)
    share = fam["fgpu_workload_compute_share_ratio"].rows.append
    achieved = fam["fgpu_workload_compute_achieved_ratio"].rows.append
    limit = fam["fgpu_workload_gpu_memory_limit_bytes"].rows.append
    used = fam["fgpu_workload_gpu_memory_used_bytes"].rows.append
    paused = fam[_PAUSED_TOTAL].rows.append
    paused_now = fam["fgpu_workload_paused"].rows.append
    for w in sample.workloads:  # the hot loop: about 8 rows per share
        labels = (w.workload, w.name, w.queue, w.user, w.node, str(w.gpu))
        text = label(WORKLOAD_LABELS, labels)
        share((labels, text, w.compute_milli / MILLI))
        limit((labels, text, w.memory_mib * MIB))
        if w.used_memory_mib is not None:
            used((labels, text, w.used_memory_mib * MIB))
        if w.achieved_milli is not None:
            achieved((labels, text, w.achieved_milli / MILLI))
            paused_now((labels, text, 1.0 if w.paused else 0.0))
            by_reason = w.paused_s
            paused(((*labels, "share"), f'{text},reason="share"', by_reason.get("share", 0.0)))
            paused(
                ((*labels, "priority"), f'{text},reason="priority"', by_reason.get("priority", 0.0))
            )
    quota = fam["fgpu_queue_quota_gpus"]
    fair = fam["fgpu_queue_fair_share_gpus"]
    queue_allocated = fam["fgpu_queue_allocated_gpus"]
    pending = fam["fgpu_queue_pending_workloads"]
    for q in sample.queues:
        text = _label_text(("queue",), (q.name,))
        quota.add((q.name,), text, q.quota_milli / MILLI)
        fair.add((q.name,), text, q.fair_share_milli / MILLI)
        queue_allocated.add((q.name,), text, q.allocated_milli / MILLI)
        # every reason of the fixed set, 0 included, so a series drops to 0 rather than
        # vanishing when nothing waits (bounded: queues x PENDING_REASONS)
        counts = {reason: 0 for reason in PENDING_REASONS}
        for reason, count in q.pending.items():
            counts[reason if reason in counts else "other"] += count
        for reason, count in counts.items():
            pending.add((q.name, reason), f'{text},reason="{_escape(reason)}"', count)
    families = list(fam.values())
    if sample.fragmentation is None:
        families.pop()
    else:
        fam["fgpu_fragmentation_ratio"].add((), "", sample.fragmentation)
    return families


_ORDER = (
    "fgpu_gpu_compute_allocated_ratio",
    "fgpu_gpu_memory_allocated_bytes",
    "fgpu_gpu_memory_total_bytes",
    "fgpu_gpu_memory_used_bytes",
    "fgpu_gpu_utilization_ratio",
    "fgpu_workload_compute_share_ratio",
    "fgpu_workload_compute_achieved_ratio",
    "fgpu_workload_gpu_memory_limit_bytes",
    "fgpu_workload_gpu_memory_used_bytes",
    _PAUSED_TOTAL,
    "fgpu_workload_paused",
    "fgpu_queue_quota_gpus",
    "fgpu_queue_fair_share_gpus",
    "fgpu_queue_allocated_gpus",
    "fgpu_queue_pending_workloads",
    "fgpu_fragmentation_ratio",  # last: left out when unknown
)


def _escape(value: str) -> str:
    """A label value as the text format writes it."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def _number(value: float) -> str:
    """A sample value: integers as integers, other finite floats as Python's shortest
    repr, and the text format's ``+Inf``, ``-Inf``, ``NaN``."""
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value):
        return repr(value)
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def _render(family: _Family) -> str:
    series = SERIES[family.name]
    help_text = series.help.replace("\\", "\\\\").replace("\n", "\\n")
    name = family.name  # a counter's too, with its _total, as the text format names it
    lines = [f"# HELP {name} {help_text}\n# TYPE {name} {series.type}\n"]
    if series.labels:  # x - x == 0: finite, and repr() is the text format's number
        lines.extend(
            f"{name}{{{text}}} {value!r}\n"
            if value - value == 0
            else f"{name}{{{text}}} {_number(value)}\n"
            for _, text, value in family.rows
        )
    else:
        lines.extend(f"{name} {_number(value)}\n" for _, _, value in family.rows)
    return "".join(lines)


class FleetCollector(Collector):
    """Emits the per-GPU, per-workload, per-queue and fleet series of ``read()``.

    Args:
        read: returns the current sample; called once per scrape (from the scraping
            thread). An exception propagates: the scrape fails (500) rather than showing a
            fleet without its GPUs.
    """

    def __init__(self, read: Callable[[], FleetSample]) -> None:
        self._read = read
        self._texts: dict[tuple[str, ...], str] = {}

    def describe(self) -> Iterable[Metric]:
        # nothing: the registry then does not call collect() at registration
        return []

    def collect(self) -> Iterator[Metric]:
        """The families as prometheus-client metric families (for a registry)."""
        for family in _families(self._read()):
            series = SERIES[family.name]
            metric: Metric
            if series.type == "counter":
                name = family.name.removesuffix("_total")
                metric = CounterMetricFamily(name, series.help, labels=list(series.labels))
            else:
                metric = GaugeMetricFamily(family.name, series.help, labels=list(series.labels))
            for values, _, value in family.rows:
                metric.add_metric(list(values), value)
            yield metric

    def render(self) -> bytes:
        """The families of one ``read()`` in the text format (version 0.0.4), UTF-8."""
        texts = _LabelTexts(self._texts)
        families = _families(self._read(), texts)
        self._texts = texts.kept
        return "".join(_render(f) for f in families).encode()


class Exporter:
    """What one process exports at ``/metrics``: its counters and histograms
    (:class:`~fgpu.metrics.events.EventMetrics` in ``registry``) and the fleet gauges of
    ``read()``, read at each scrape.

    Args:
        read: the process's current :class:`FleetSample`.
    """

    def __init__(self, read: Callable[[], FleetSample]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.events = EventMetrics(self.registry)
        self.fleet = FleetCollector(read)

    def exposition(self) -> bytes:
        """Every series in the text format (version 0.0.4)."""
        return generate_latest(self.registry) + self.fleet.render()


def exposition(registry: CollectorRegistry) -> bytes:
    """A registry in the text format (version 0.0.4)."""
    return generate_latest(registry)
