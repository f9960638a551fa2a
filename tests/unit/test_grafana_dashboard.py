"""deploy/monitoring (issue 15): the Grafana dashboard is valid dashboard JSON whose queries
name only series fgpu exports; the Prometheus examples are valid YAML of the right kinds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from fgpu.metrics.names import SERIES, exposed_names

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
SERIES_NAME = re.compile(r"\bfgpu_[a-z_]+\b")


def dashboard() -> dict[str, object]:
    loaded = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_dashboard_is_grafana_dashboard_json() -> None:
    d = dashboard()
    assert isinstance(d["title"], str)
    assert d["title"]
    assert isinstance(d["uid"], str)
    assert len(d["uid"]) <= 40  # Grafana's limit on a dashboard uid
    assert isinstance(d["schemaVersion"], int)
    panels = d["panels"]
    assert isinstance(panels, list)
    assert panels
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["type"] in {"timeseries", "stat", "gauge", "barchart", "table", "bargauge"}
        grid = p["gridPos"]
        assert set(grid) == {"x", "y", "w", "h"}
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= 24  # Grafana's 24-column grid
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]


def test_every_query_names_only_exported_series() -> None:
    exported = exposed_names()
    used: set[str] = set()
    for p in dashboard()["panels"]:  # type: ignore[attr-defined]
        for t in p["targets"]:
            names = set(SERIES_NAME.findall(t["expr"]))
            assert names, t["expr"]
            assert names <= exported, f"{p['title']}: {sorted(names - exported)} not exported"
            used |= names
    # the panels: allocation, utilization, per-GPU split, queues against fair share,
    # pending reasons, preemptions, scheduling latency
    for name in (
        "fgpu_gpu_compute_allocated_ratio",
        "fgpu_gpu_utilization_ratio",
        "fgpu_workload_compute_share_ratio",
        "fgpu_queue_fair_share_gpus",
        "fgpu_queue_pending_workloads",
        "fgpu_preemptions_total",
        "fgpu_scheduling_round_seconds_bucket",
    ):
        assert name in used, name


def test_the_exposed_names_follow_the_series_types() -> None:
    names = exposed_names()
    assert "fgpu_scheduling_round_seconds_bucket" in names
    assert "fgpu_scheduling_round_seconds" not in names
    assert all(n.endswith("_total") for n, s in SERIES.items() if s.type == "counter")


def test_the_prometheus_examples_load() -> None:
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["fgpu-serve"]["authorization"]["type"] == "Bearer"
    kinds = [
        d["kind"] for d in yaml.safe_load_all((MONITORING / "servicemonitor.yaml").read_text())
    ]
    assert kinds == ["Service", "Service", "ServiceMonitor"]


def test_every_query_reads_one_scrape_job() -> None:
    """Two jobs scraping one server would count it twice: every selector is narrowed to the
    dashboard's ``job`` variable, and the Prometheus example keeps one live job per door."""
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}  # type: ignore[index]
    assert variables["job"]["type"] == "query"
    for p in dashboard()["panels"]:  # type: ignore[attr-defined]
        for t in p["targets"]:
            for name in SERIES_NAME.findall(t["expr"]):
                assert f'{name}{{job="$job"}}' in t["expr"], t["expr"]
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    targets = [
        target
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    ]
    assert len(targets) == len(set(targets)) == 1, targets
    names = [j["job_name"] for j in config["scrape_configs"]]
    assert len(names) == len(set(names)), names
