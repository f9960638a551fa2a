"""Health probes and spreading in deploy/: every fgpu container of the base and the overlays
has a liveness and a readiness probe on a port it declares and listens on, over the scheme it
serves, at a path it answers; the webhook's and the scheduler's replicas prefer different
nodes. Then the scheduler and the node agent as processes, their probes over real HTTP
(at the paths deploy/base names) against the API stand-in: live but not ready while the API
server is not up, the agent still not ready while its Node does not exist, ready once both
listed, and the scheduler not ready again when its watches fail."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fgpu.k8s.webhook_app import create_app
from fgpu_standin import StandIn
from tests.k8s.conftest import REAL, free_port
from tests.k8s.kube import wait_until
from tests.k8s.test_demo import FGPU, NODE, ROOT
from tests.k8s.test_manifests import DEPLOY, TARGETS, render

pytestmark = pytest.mark.k8s

PROBED = ("fgpu-scheduler", "fgpu-node-agent", "fgpu-webhook")
SPREAD = ("fgpu-scheduler", "fgpu-webhook")


def _workloads(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet") and o["metadata"]["name"].startswith("fgpu")
    }


def _listens_on(container: dict[str, Any]) -> tuple[int, str]:
    """The port the process serves its probes on, from its arguments, and the scheme."""
    args = [str(a) for a in container["args"]]
    if "--metrics-listen" in args:  # the scheduler and the node agent: plain HTTP
        return int(args[args.index("--metrics-listen") + 1].rpartition(":")[2]), "HTTP"
    (port,) = [a.split("=", 1)[1] for a in args if a.startswith("--port=")]  # the webhook
    assert any(a.startswith("--tls-cert-file=") for a in args)
    return int(port), "HTTPS"


def _webhook_paths() -> set[str]:
    """The paths the webhook's application answers a GET on."""
    app = create_app()
    return {r.path for r in app.routes if "GET" in (getattr(r, "methods", None) or set())}


SERVED = {
    "fgpu-scheduler": {"/healthz", "/readyz"},  # answered over HTTP by the test below
    "fgpu-node-agent": {"/healthz", "/readyz"},
}


@pytest.mark.parametrize("folder", TARGETS, ids=[p.name for p in TARGETS])
def test_every_fgpu_container_has_probes_it_answers(folder: Path) -> None:
    found = _workloads(render(folder))
    assert set(PROBED) <= set(found)
    served = {**SERVED, "fgpu-webhook": _webhook_paths()}
    for name, obj in found.items():
        for container in obj["spec"]["template"]["spec"]["containers"]:
            ports = {p["containerPort"]: p for p in container.get("ports", [])}
            named = {p["name"]: n for n, p in ports.items() if "name" in p}
            port, scheme = _listens_on(container)
            assert port in ports, (name, port, "not a declared container port")
            for kind in ("livenessProbe", "readinessProbe"):
                probe = container.get(kind)
                assert probe is not None, (name, container["name"], f"no {kind}")
                get = probe["httpGet"]
                target = named.get(get["port"], get["port"])
                assert target == port, (name, kind, get["port"], port)
                assert get.get("scheme", "HTTP") == scheme, (name, kind)
                assert get["path"] in served[name], (name, kind, get["path"])


@pytest.mark.parametrize("folder", TARGETS, ids=[p.name for p in TARGETS])
def test_replicas_prefer_different_nodes(folder: Path) -> None:
    found = _workloads(render(folder))
    for name in SPREAD:
        template = found[name]["spec"]["template"]
        terms = template["spec"]["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert [t["podAffinityTerm"]["topologyKey"] for t in terms] == ["kubernetes.io/hostname"]
        selector = terms[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]
        assert selector.items() <= template["metadata"]["labels"].items(), name
        assert selector == found[name]["spec"]["selector"]["matchLabels"], name


# ---------------------------------------------------------------- over HTTP


def _base_paths(name: str) -> tuple[str, str]:
    """(liveness path, readiness path) of workload ``name`` as deploy/base writes them."""
    file = {"fgpu-scheduler": "scheduler.yaml", "fgpu-node-agent": "node-agent.yaml"}[name]
    (obj,) = [d for d in yaml.safe_load_all((DEPLOY / "base" / file).read_text()) if d]
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    return container["livenessProbe"]["httpGet"]["path"], container["readinessProbe"]["httpGet"][
        "path"
    ]


def _get(port: int, path: str) -> tuple[int, str] | None:
    try:
        reply = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
    except httpx.HTTPError:
        return None
    return reply.status_code, reply.text


class Component:
    """One fgpu process with its probe port."""

    def __init__(self, name: str, args: list[str], log: Path, cwd: Path) -> None:
        self.name = name
        self.port = free_port()
        self.live_path, self.ready_path = _base_paths(name)
        self.log = log
        exe = [str(ROOT / FGPU)] if (ROOT / FGPU).is_file() else [sys.executable, "-m", "fgpu"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FGPU_")}
        argv = [*exe, "k8s", *args, "--metrics-listen", f"127.0.0.1:{self.port}"]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd
            )

    def probe(self, path: str) -> tuple[int, str] | None:
        assert self.proc.poll() is None, f"{self.name} exited: {self.log.read_text()}"
        return _get(self.port, path)

    def live(self) -> tuple[int, str] | None:
        return self.probe(self.live_path)

    def ready(self) -> tuple[int, str] | None:
        return self.probe(self.ready_path)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def components(tmp_path: Path) -> Iterator[tuple[str, int, Component, Component]]:
    """A scheduler and a node agent (its DRA driver's folders in a short temporary folder)
    told of an API server on a port where none listens yet."""
    if REAL:
        pytest.skip("starts its own API stand-in")
    api_port = free_port()
    url = f"http://127.0.0.1:{api_port}"
    cwd = Path(tempfile.mkdtemp(prefix="fgpu-probes-"))  # short: the driver's Unix sockets
    made: list[Component] = []
    try:
        made.append(
            Component("fgpu-scheduler", ["scheduler", "--server", url], tmp_path / "s", cwd)
        )
        agent_args = [
            "node-agent", "--node", NODE, "--server", url, "--simulate-gpus", "2xA100-80GB",
            "--no-enforce", "--interval-s", "1", "--plugin-registry-dir", "registry",
            "--plugin-dir", "plugin", "--cdi-dir", "cdi", "--segment-dir", "segments",
            "--interposer-dir", "lib",
        ]  # fmt: skip
        made.append(Component("fgpu-node-agent", agent_args, tmp_path / "a", cwd))
        yield url, api_port, made[0], made[1]
    finally:
        for c in made:
            c.stop()
        shutil.rmtree(cwd, ignore_errors=True)


def test_probes_say_live_and_ready_only_once_the_cluster_was_listed(
    components: tuple[str, int, Component, Component],
) -> None:
    url, api_port, scheduler, agent = components
    for c in (scheduler, agent):
        wait_until(lambda c=c: c.live() is not None, f"{c.name} to serve its probes", 120)
        live, ready = c.live(), c.ready()
        assert live is not None
        assert live[0] == 200, live
        assert live[1].startswith("ok: ")
        assert ready is not None
        assert ready[0] == 503, ready
    said = str(scheduler.ready())
    assert "failing: the first list of the cluster has not succeeded yet" in said
    assert f"failing: the inventory of {NODE} is not published yet" in str(agent.ready())

    standin = StandIn(port=api_port).start()
    try:
        wait_until(lambda: (scheduler.ready() or (0, ""))[0] == 200, "the scheduler ready", 120)
        assert (scheduler.ready() or (0, ""))[1].startswith("ok: caches synced; ")
        # the API answers now, but the agent's Node does not exist: it cannot publish
        wait_until(
            lambda: "404 NotFound" in str(agent.ready()), "the agent to find no Node", limit_s=120
        )
        assert (agent.ready() or (0, ""))[0] == 503
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
        httpx.post(f"{url}/api/v1/nodes", json=node, timeout=10).raise_for_status()
        wait_until(lambda: (agent.ready() or (0, ""))[0] == 200, "the agent ready", 120)
        assert (agent.ready() or (0, ""))[1] == "ok: 2 GPU(s) published; 0 fgpu pod(s)\n"
        assert (agent.live() or (0, ""))[0] == 200
        assert (scheduler.live() or (0, ""))[0] == 200
    finally:
        standin.stop()
    # the API server gone: the scheduler cannot read its Lease (or, whichever it notices
    # first, keep its watches): not ready, yet live
    wait_until(
        lambda: "Unreachable" in str(scheduler.ready()), "the scheduler to lose the API", 120
    )
    ready = scheduler.ready() or (0, "")
    assert ready[0] == 503
    assert ready[1].startswith(
        ("failing: the Lease cannot be read: 0 Unreachable: ", "failing: watch of ")
    ), ready
    assert "0 Unreachable: " in ready[1], ready
    assert (scheduler.live() or (0, ""))[0] == 200


def test_an_agent_without_gpus_is_live_and_ready_and_says_why(tmp_path: Path) -> None:
    if REAL:
        pytest.skip("starts its own API stand-in")
    from fgpu.k8s.dra.node import real_backend

    found = real_backend(None, NODE)
    if not isinstance(found, str):
        found.close()
        pytest.skip("NVML finds GPUs here: the agent publishes them")
    cwd = Path(tempfile.mkdtemp(prefix="fgpu-probes-"))
    with StandIn() as standin:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
        httpx.post(f"{standin.url}/api/v1/nodes", json=node, timeout=10).raise_for_status()
        args = ["node-agent", "--node", NODE, "--server", standin.url, "--no-enforce"]
        agent = Component("fgpu-node-agent", [*args, "--cdi-dir", "cdi"], tmp_path / "a", cwd)
        try:
            wait_until(lambda: agent.ready() is not None, "the agent's probes", 120)
            for said in (agent.live(), agent.ready()):
                assert said is not None
                assert said[0] == 200, said
                assert said[1].startswith("ok: no GPUs published: NVML"), said
        finally:
            agent.stop()
            shutil.rmtree(cwd, ignore_errors=True)
