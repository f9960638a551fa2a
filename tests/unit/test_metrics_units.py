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
    pending = {
        (s.labels["queue"], s.labels["reason"]): s.value
        for f in text_string_to_metric_families(exposition(registry).decode())
        for s in f.samples
        if s.name == "fgpu_queue_pending_workloads"
    }
    # every reason of the fixed set, 0 where nothing waits for it
    assert pending == {("default", r): (2.0 if r == "capacity" else 0.0) for r in PENDING_REASONS}
    assert parsed["fgpu_fragmentation_ratio"].value == 0.25
    current["sample"] = FleetSample([gpu], [], [q], 0.25)
    text = exposition(registry).decode()
    assert "ab12" not in text


def _parsed(text: str) -> list[tuple[str, str, str, tuple[tuple[str, str], ...], float]]:
    """(family, its type, sample, labels, value) of every sample, in order."""
    return sorted(
        (f.name, f.type, s.name, tuple(sorted(s.labels.items())), s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
    )


def test_the_fast_text_is_what_the_client_library_writes() -> None:
    # label values with every character the format escapes; governed and ungoverned
    # workloads; a pending count; the fragmentation
    gpu = GpuSample("n", 0, "GPU-1", "A100-80GB", 81920, 750, 40960, None, 37)
    odd = 'say "hi"\\now\nnext'
    w1 = WorkloadSample("ab12", odd, "default", "alice", "n", 0, 500, 40960, 1024, 800, {})
    w2 = WorkloadSample("cd34", "b", "q-2", "bob", "n", 0, 250, 0, None, None)
    q = QueueSample("default", 1500, 1000, 500, {"capacity": 2, "quota": 1})
    sample = FleetSample([gpu], [w1, w2], [q], 0.125)
    fleet = FleetCollector(lambda: sample)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(fleet)
    fast = fleet.render().decode()
    assert _parsed(fast) == _parsed(exposition(registry).decode())
    names = {s.labels.get("name") for f in text_string_to_metric_families(fast) for s in f.samples}
    assert odd in names  # escaped on the way out, the same string back


def test_an_exporter_serves_its_events_and_its_fleet_over_http() -> None:
    import httpx

    from fgpu.metrics import Exporter
    from fgpu.metrics.http import serve_metrics

    gpu = GpuSample("n", 0, "GPU-1", "A100-80GB", 81920, 500, 40960)
    exporter = Exporter(lambda: FleetSample([gpu]))
    exporter.events.preempted("reclaim")
    server, thread = serve_metrics(exporter.exposition, ("127.0.0.1", 0))
    try:
        port = server.server_address[1]
        answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
        got = {(n, ls): v for _, _, n, ls, v in _parsed(answer.text)}
        assert got[("fgpu_preemptions_total", (("kind", "reclaim"),))] == 1.0
        labels = (("gpu", "0"), ("model", "A100-80GB"), ("node", "n"), ("uuid", "GPU-1"))
        assert got[("fgpu_gpu_compute_allocated_ratio", labels)] == 0.5
        assert httpx.get(f"http://127.0.0.1:{port}/other", timeout=30).status_code == 404
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def test_probes_answer_200_when_they_pass_503_when_not_500_when_they_break() -> None:
    import httpx

    from fgpu.metrics.http import serve_metrics

    def broken() -> tuple[bool, str]:
        raise RuntimeError("a bug in the check")

    probes = {
        "/healthz": lambda: (True, "a pass began 1 s ago"),
        "/readyz": lambda: (False, "the first list of the cluster has not succeeded yet"),
        "/broken": broken,
    }
    server, thread = serve_metrics(lambda: b"", ("127.0.0.1", 0), probes)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        got = {p: httpx.get(url + p, timeout=30) for p in (*probes, "/metrics", "/other")}
        assert (got["/healthz"].status_code, got["/healthz"].text) == (
            200,
            "ok: a pass began 1 s ago\n",
        )
        assert (got["/readyz"].status_code, got["/readyz"].text) == (
            503,
            "failing: the first list of the cluster has not succeeded yet\n",
        )
        assert got["/broken"].status_code == 500
        assert got["/metrics"].status_code == 200
        assert got["/other"].status_code == 404
        assert got["/other"].text == "only /metrics, /broken, /healthz, /readyz here\n"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
