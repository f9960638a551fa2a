"""deploy/ and metrics (issue 15): in the base and in every overlay the scheduler and the
node agent serve ``/metrics`` (``--metrics-listen``) on the port their container names
``metrics``, and the Services of ``deploy/monitoring/servicemonitor.yaml`` select those
pods and target that port."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.test_manifests import DEPLOY, TARGETS, render

MONITOR = DEPLOY / "monitoring" / "servicemonitor.yaml"


def _metrics_ports(objects: list[dict[str, Any]]) -> dict[str, tuple[dict[str, str], int]]:
    """Workload name -> (its pod labels, the port it serves metrics on)."""
    found = {}
    for obj in objects:
        if obj["kind"] not in ("Deployment", "DaemonSet"):
            continue
        if obj["metadata"]["name"] not in ("fgpu-scheduler", "fgpu-node-agent"):
            continue
        pod = obj["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        args = container["args"]
        assert "--metrics-listen" in args, obj["metadata"]["name"]
        listen = args[args.index("--metrics-listen") + 1]
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        assert listen == f":{ports['metrics']}", (obj["metadata"]["name"], listen, ports)
        found[obj["metadata"]["name"]] = (pod["metadata"]["labels"], ports["metrics"])
    return found


@pytest.mark.parametrize("folder", TARGETS, ids=[p.name for p in TARGETS])
def test_the_scheduler_and_the_agent_serve_metrics_on_their_named_port(folder: Path) -> None:
    assert set(_metrics_ports(render(folder))) == {"fgpu-scheduler", "fgpu-node-agent"}


def test_the_monitoring_services_reach_those_ports() -> None:
    served = _metrics_ports(render(DEPLOY / "base"))
    services = [d for d in yaml.safe_load_all(MONITOR.read_text()) if d and d["kind"] == "Service"]
    assert len(services) == 2
    for service in services:
        selector = service["spec"]["selector"]
        (port,) = service["spec"]["ports"]
        matches = [p for labels, p in served.values() if selector.items() <= labels.items()]
        assert matches == [port["targetPort"]], service["metadata"]["name"]
        assert port["name"] == "metrics"
