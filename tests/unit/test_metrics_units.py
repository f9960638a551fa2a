"""fgpu.metrics pieces: pending reasons in a small fixed set, priority classes as a bounded
label, the FGD fragmentation of a fleet, and the collector's exposition as parsed back by
prometheus-client (a workload's series go when it is no longer sampled)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from fgpu.metrics import (
    FleetCollector,
    FleetSample,
    GpuSample,
    QueueSample,
    WorkloadSample,
    exposition,
    fleet_fragmentation,
    pending_reason,
    priority_class,
)
from fgpu.metrics.names import PENDING_REASONS
from fgpu.model.types import Node, Request
from fgpu.sched.frag import TargetWorkload
from fgpu.sched.state import ClusterState


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        (None, "scheduling"),
        ("submitted", "scheduling"),
        ("0/1 nodes fit: 1 insufficient GPU (need 500 milli, free 0)", "capacity"),
        ("queue a would exceed its limit (gpu: 2000 > 1000)", "quota"),
        ("waiting for 2 preempted workload(s) to exit", "preemption"),
        ("reserved node n1; waiting for it to drain", "reservation"),
        ("unknown queue 'x'", "queue"),
        ("something new", "other"),
    ],
)
def test_pending_reasons_fall_in_a_fixed_set(reason: str | None, label: str) -> None:
    assert pending_reason(reason) == label
    assert label in PENDING_REASONS


@pytest.mark.parametrize(
    ("priority", "label"),
    [
        (0, "very-low"),
        (25, "very-low"),
        (49, "low"),
        (50, "normal"),
        (110, "high"),
        (10**9, "critical"),
    ],
)
def test_priorities_map_to_their_class(priority: int, label: str) -> None:
    assert priority_class(priority) == label


def test_fragmentation_of_an_empty_and_a_split_gpu() -> None:
    state = ClusterState([Node("n", 8000, 65536, 1, "A100-80GB", 81920)])
    target = TargetWorkload.from_requests([Request(0, 0, 1, 600)])
    assert fleet_fragmentation(state, target) == 0.0
    state.allocate(Request(0, 0, 1, 500), 0, [0])  # 500 left: a 600 share no longer fits
    assert fleet_fragmentation(state, target) == pytest.approx(0.5)


def test_the_collector_emits_and_drops_series() -> None:
    current = {"sample": FleetSample()}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(lambda: current["sample"]))
    gpu = GpuSample("n", 0, "GPU-1", "A100-80GB", 81920, 500, 40960, 1024, 37)
    w = WorkloadSample("ab12", "train", "default", "alice", "n", 0, 500, 40960, 1024, 800)
    q = QueueSample("default", 1000, 1000, 500, {"capacity": 2})
    current["sample"] = FleetSample([gpu], [w], [q], 0.25)
    parsed = {
        s.name: s
        for f in text_string_to_metric_families(exposition(registry).decode())
        for s in f.samples
    }
    assert parsed["fgpu_gpu_compute_allocated_ratio"].value == 0.5
    assert parsed["fgpu_gpu_memory_used_bytes"].value == 1024 * 2**20
    assert parsed["fgpu_gpu_utilization_ratio"].value == 0.37
    assert parsed["fgpu_workload_compute_achieved_ratio"].value == 0.8
    assert parsed["fgpu_workload_compute_share_ratio"].labels["user"] == "alice"
    assert parsed["fgpu_queue_pending_workloads"].labels == {
        "queue": "default",
        "reason": "capacity",
    }
    assert parsed["fgpu_fragmentation_ratio"].value == 0.25
    current["sample"] = FleetSample([gpu], [], [q], 0.25)
    text = exposition(registry).decode()
    assert "ab12" not in text
