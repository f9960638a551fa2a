"""The "Try it without a cluster" demo of docs/kubernetes.md, run from that page: its five
``fgpu k8s`` commands (API stand-in, webhook, simulated node agent with its DRA driver,
kubelet stand-in, scheduler) as processes on free ports, and its half-GPU pod sixteen times;
the pods land two per GPU, each claim allocated and prepared over gRPC, each CDI spec naming
only the pod's own GPU. The first test creates the pods through the official client; the
second runs the page's ``kubectl create`` line (skipped without kubectl)."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fgpu.k8s import wire
from fgpu.k8s.dra import cdi
from fgpu.k8s.kube import KubeApi, KubeError, api_client
from fgpu.k8s.resourceapi import ResourceApi
from tests.k8s.conftest import REAL, free_port
from tests.k8s.kube import wait_until

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "kubernetes.md"
FGPU = ".venv/bin/fgpu"
"""How the page runs fgpu: the README installs it into the repository's ``.venv``."""
NODE = "gpu-node-1"


def section() -> str:
    text = DOC.read_text()
    start = text.index("## Try it without a cluster")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def on_ports(text: str, api_port: int, webhook_port: int) -> str:
    return re.sub(r"\b8443\b", str(webhook_port), re.sub(r"\b8001\b", str(api_port), text))


@dataclass
class Demo:
    api: KubeApi
    url: str
    api_port: int
    webhook_port: int
    logs: Path
    cwd: Path


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    """The page's four processes, running, the node published, the webhook answering."""
    if REAL:
        pytest.skip("the demo runs its own API stand-in")
    api_port, webhook_port = free_port(), free_port()
    commands = [line for line in blocks(section(), "sh")[0].splitlines() if " k8s " in line]
    # as written after the README's setup (the virtual environment is not activated)
    assert all(c.startswith(f"{FGPU} k8s ") for c in commands), commands
    assert [c.split()[2] for c in commands] == [
        "standin",
        "webhook",
        "node-agent",
        "kubelet",
        "scheduler",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FGPU_")}
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    cwd = Path(tempfile.mkdtemp(prefix="fgpu-demo-"))  # short: the driver's Unix sockets
    url = f"http://127.0.0.1:{api_port}"
    try:
        for command in commands:
            argv = shlex.split(on_ports(command, api_port, webhook_port))
            # the page runs in the repository's root; this runs elsewhere (short socket paths)
            argv = [str(ROOT / a) if a.startswith("deploy/") else a for a in argv]
            name = argv[2]
            # the page's own command where this checkout has it, else this interpreter's fgpu
            exe = [str(ROOT / FGPU)] if (ROOT / FGPU).is_file() else [sys.executable, "-m", "fgpu"]
            with open(logs / f"{name}.log", "wb") as out:
                proc = subprocess.Popen(
                    [*exe, *argv[1:]],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=cwd,
                )
            procs.append((name, proc))
        api = KubeApi(api_client(host=url))

        def up() -> bool:
            for name, proc in procs:
                assert proc.poll() is None, f"{name} exited: {(logs / f'{name}.log').read_text()}"
            try:  # plain HTTP first: the official client retries a refused connection
                httpx.get(f"{url}/version", timeout=1).raise_for_status()
                httpx.get(f"http://127.0.0.1:{webhook_port}/healthz", timeout=1).raise_for_status()
                node = api.get_node(NODE)
            except (KubeError, httpx.HTTPError):
                return False
            return wire.INVENTORY in wire.annotations_of(node)

        wait_until(up, "the stand-in, webhook and node agent to come up", limit_s=120)
        yield Demo(api, url, api_port, webhook_port, logs, cwd)
    finally:
        for _, proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for _, proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(cwd, ignore_errors=True)


def half_pod() -> str:
    heredoc = re.search(r"cat > half\.yaml <<'EOF'\n(.*?)\nEOF\n", section(), flags=re.S)
    assert heredoc is not None, "no half.yaml in the page"
    return heredoc.group(1)


def check_two_per_gpu(demo: Demo) -> None:
    """16 pods bound to the node, two per GPU, running, each with its claim allocated and
    prepared, the claim's CDI spec naming the pod's own GPU and nothing else."""

    def pods() -> list[dict[str, Any]]:
        return [
            p
            for p in demo.api.list_pods(namespace="default").items
            if p["metadata"]["name"].startswith("half-")
        ]

    def started() -> bool:
        return (
            len(
                [
                    p
                    for p in pods()
                    if wire.GPU_UUIDS in wire.annotations_of(p)
                    and p["status"].get("phase") == "Running"
                ]
            )
            == 16
        )

    wait_until(started, "the scheduler to bind and the kubelet to start 16 pods", limit_s=120)
    resources = ResourceApi(demo.api)
    layout = cdi.Layout(cdi_dir=demo.cwd / "demo" / "cdi")
    inventory = wire.Inventory.from_json(
        wire.annotations_of(demo.api.get_node(NODE))[wire.INVENTORY]
    )
    listed = pods()
    per_gpu = collections.Counter(wire.annotations_of(p)[wire.GPU_UUIDS] for p in listed)
    assert per_gpu == {g.uuid: 2 for g in inventory.gpus}
    assert len(inventory.gpus) == 8
    for p in listed:
        notes = wire.annotations_of(p)
        name = p["metadata"]["name"]
        assert p["spec"]["nodeName"] == NODE
        assert p["spec"]["schedulerName"] == "fgpu"
        assert p["status"]["phase"] == "Running"
        assert "volumes" not in p["spec"]  # no hostPath: the CDI spec mounts what is needed
        (status,) = p["status"]["resourceClaimStatuses"]
        claim = resources.get_claim("default", status["resourceClaimName"])
        assert claim["status"]["reservedFor"][0]["uid"] == p["metadata"]["uid"]
        spec = cdi.read_spec(cdi.spec_path(layout, claim["metadata"]["uid"]))
        edits = spec["devices"][0]["containerEdits"]
        env = dict(e.split("=", 1) for e in edits["env"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == notes[wire.GPU_UUIDS], name
        assert env["CUDA_VISIBLE_DEVICES"] == notes[wire.GPU_UUIDS], name
        assert env["FGPU_WORKLOAD_ID"] == f"default/{name}"
        assert env["FGPU_GPU_COMPUTE_MILLI"] == "500"
        index = next(g.index for g in inventory.gpus if g.uuid == notes[wire.GPU_UUIDS])
        gpu_nodes = [d["path"] for d in edits["deviceNodes"] if d["path"][-1].isdigit()]
        assert gpu_nodes == [f"/dev/nvidia{index}"], name


def test_the_documented_demo_places_sixteen_half_gpu_pods_two_per_gpu(demo: Demo) -> None:
    template = half_pod()
    for i in range(1, 17):
        body = yaml.safe_load(template.replace("NN", f"{i:02d}"))
        demo.api._call(demo.api.core.create_namespaced_pod, "default", body)
    check_two_per_gpu(demo)
    bad = yaml.safe_load(template.replace("NN", "bad").replace('"0.5"', '"1.5"'))
    with pytest.raises(KubeError) as err:
        demo.api._call(demo.api.core.create_namespaced_pod, "default", bad)
    assert err.value.status == 422
    assert (
        "fgpu.io/gpu: '1.5': above 1 a GPU request is a whole number of GPUs" in err.value.message
    )


def test_the_documented_kubectl_create_line_works(demo: Demo, tmp_path: Path) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    script = on_ports(blocks(section(), "sh")[1], demo.api_port, demo.webhook_port)
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=demo.cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"pod/half-{i:02d} created" for i in range(1, 17)]
    check_two_per_gpu(demo)
    # the page's listing of GPUs per pod
    shown = subprocess.run(
        [
            "kubectl",
            "--server",
            demo.url,
            "get",
            "pods",
            "-o",
            r"custom-columns=GPU:.metadata.annotations.fgpu\.io/gpu-uuids",
            "--no-headers",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert sorted(collections.Counter(shown).values()) == [2] * 8


def test_the_scheduler_stops_cleanly_when_the_api_server_went_first(tmp_path: Path) -> None:
    """Ctrl-C in the demo's terminals in any order: a scheduler whose API server is gone
    says it could not give the lease up, without a traceback, and exits 0."""
    from fgpu_standin import StandIn

    standin = StandIn().start()
    log_path = tmp_path / "scheduler.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fgpu", "k8s", "scheduler", "--server", standin.url],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "acquired lease" in log_path.read_text(), "the lease", limit_s=60)
    finally:
        standin.stop()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    text = log_path.read_text()
    assert "stopped without giving the lease up (it expires after 15 s)" in text
    assert "Traceback" not in text
