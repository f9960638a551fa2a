"""``--metrics-listen`` of ``fgpu k8s scheduler`` and of the node agent (issue 15), against
the API stand-in: the five processes of docs/kubernetes.md's demo, with metrics on; two
half-GPU pods show in the scheduler's series as one GPU allocated whole and as their
shares, and in the agent's series as its GPUs' live figures and the pods' shares. An
enforcing agent exports each pod's memory in use (the processes of its cgroup)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fgpu.k8s import wire
from fgpu.k8s.kube import KubeApi, KubeError, api_client
from tests.k8s.conftest import REAL, free_port
from tests.k8s.kube import wait_until
from tests.k8s.podtree import GPU, Backend, Kubelet
from tests.k8s.test_demo import FGPU, NODE, ROOT, blocks, half_pod, on_ports, section

pytestmark = pytest.mark.k8s

Samples = list[tuple[str, dict[str, str], float]]


def scrape(port: int) -> Samples:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[KubeApi, int, int]]:
    if REAL:
        pytest.skip("runs its own API stand-in")
    api_port, webhook_port = free_port(), free_port()
    sched_metrics, agent_metrics = free_port(), free_port()
    commands = [line for line in blocks(section(), "sh")[0].splitlines() if " k8s " in line]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FGPU_")}
    cwd = Path(tempfile.mkdtemp(prefix="fgpu-metrics-"))
    procs: list[subprocess.Popen[bytes]] = []
    url = f"http://127.0.0.1:{api_port}"
    try:
        for command in commands:
            argv = shlex.split(on_ports(command, api_port, webhook_port))
            # the page runs in the repository's root; this runs elsewhere
            root = Path(__file__).resolve().parents[2]
            argv = [str(root / a) if a.startswith("deploy/") else a for a in argv]
            if argv[2] == "scheduler":
                argv += ["--metrics-listen", f"127.0.0.1:{sched_metrics}"]
            if argv[2] == "node-agent":
                argv += ["--metrics-listen", f"127.0.0.1:{agent_metrics}", "--interval-s", "1"]
            exe = [str(ROOT / FGPU)] if (ROOT / FGPU).is_file() else [sys.executable, "-m", "fgpu"]
            with open(tmp_path / f"{argv[2]}.log", "wb") as out:
                procs.append(
                    subprocess.Popen(
                        [*exe, *argv[1:]], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd
                    )
                )
        api = KubeApi(api_client(host=url))

        def up() -> bool:
            assert all(p.poll() is None for p in procs), "a component exited; see its log"
            try:
                httpx.get(f"{url}/version", timeout=1).raise_for_status()
                httpx.get(f"http://127.0.0.1:{webhook_port}/healthz", timeout=1).raise_for_status()
                httpx.get(f"http://127.0.0.1:{sched_metrics}/metrics", timeout=1).raise_for_status()
                httpx.get(f"http://127.0.0.1:{agent_metrics}/metrics", timeout=1).raise_for_status()
                return wire.INVENTORY in wire.annotations_of(api.get_node(NODE))
            except (KubeError, httpx.HTTPError):
                return False

        wait_until(up, "the components and their metrics to come up", limit_s=120)
        yield api, sched_metrics, agent_metrics
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(cwd, ignore_errors=True)


def test_scheduler_and_agent_export_their_series(cluster: tuple[KubeApi, int, int]) -> None:
    api, sched_port, agent_port = cluster

    def fleet() -> list[dict[str, str]]:
        return [ls for n, ls, _ in scrape(sched_port) if n == "fgpu_gpu_memory_total_bytes"]

    # the series are the last round's: the scheduler serves them (and its probes) from its
    # start, before its first list and round
    wait_until(lambda: len(fleet()) == 8, "the scheduler's first round to show 8 GPUs", 120)
    gpus = fleet()
    assert len(gpus) == 8
    assert {ls["node"] for ls in gpus} == {NODE}
    for i in (1, 2):
        body = yaml.safe_load(half_pod().replace("NN", f"{i:02d}"))
        api._call(api.core.create_namespaced_pod, "default", body)
    names = {"default/half-01", "default/half-02"}

    def both_placed() -> bool:
        shares = {
            ls["workload"]: v
            for n, ls, v in scrape(sched_port)
            if n == "fgpu_workload_compute_share_ratio"
        }
        return shares == dict.fromkeys(names, 0.5)

    wait_until(both_placed, "the scheduler's series to show both pods at 0.5", limit_s=120)
    got = scrape(sched_port)
    full = [ls for n, ls, v in got if n == "fgpu_gpu_compute_allocated_ratio" and v == 1.0]
    assert len(full) == 1  # two halves on one GPU
    users = {ls["user"] for n, ls, _ in got if n == "fgpu_workload_compute_share_ratio"}
    assert users == {"default"}
    assert any(n == "fgpu_submission_to_start_seconds_count" and v == 2 for n, _, v in got)
    assert any(n == "fgpu_scheduling_round_seconds_count" and v >= 1 for n, _, v in got)
    assert any(n == "fgpu_fragmentation_ratio" for n, _, _ in got)

    def agent_sees_them() -> bool:
        samples = scrape(agent_port)
        shares = {
            ls["workload"] for n, ls, _ in samples if n == "fgpu_workload_compute_share_ratio"
        }
        return shares == names

    wait_until(agent_sees_them, "the agent's series to show both pods", limit_s=120)
    agent = scrape(agent_port)
    used = [v for n, _, v in agent if n == "fgpu_gpu_memory_used_bytes"]
    util = {ls["uuid"]: v for n, ls, v in agent if n == "fgpu_gpu_utilization_ratio"}
    assert len(used) == 8
    assert len(util) == 8
    assert sorted(util.values())[-1] > 0.0  # the GPU holding the two pods is busy
    assert sum(1 for v in util.values() if v == 0.0) == 7


def test_an_enforcing_agent_exports_each_pods_memory_in_use(kubelet: Kubelet) -> None:
    """The memory the processes in a pod's cgroup hold is that pod's (real cgroups, a test
    backend that reports per-process memory); another pod's processes are not counted."""
    from fgpu.k8s.agent import NodeAgent
    from fgpu.k8s.enforce import GovernorEnforcer
    from fgpu.k8s.metrics import AgentMetrics
    from fgpu.k8s.podcgroup import PodCgroupFreezer, pod_handle

    backend = Backend()
    first, _, first_pid = kubelet.pod("first")
    second, _, second_pid = kubelet.pod("second")
    backend.memory = {first_pid: 700, second_pid: 300, 999_999: 5000}
    enforcer = GovernorEnforcer(backend, [GPU], PodCgroupFreezer(kubelet.root))
    # the agent's API is never called here: the metrics read its devices and last placement
    agent = NodeAgent(KubeApi(api_client(host="http://127.0.0.1:9")), "n", backend)
    agent.last_placed = [first, second]
    enforcer.start()
    try:
        enforcer.sync([first, second])
        metrics = AgentMetrics(
            agent,
            lambda: enforcer.governor.snapshot().workloads,
            lambda pod: enforcer.freezer.pids(pod_handle(pod)),
        )
        used = {w.workload: w.used_memory_mib for w in metrics.sample().workloads if w.gpu == 0}
        assert used == {first.workload_id: 700, second.workload_id: 300}
        text = metrics.exposition().decode()
        series = {
            s.labels["workload"]: s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "fgpu_workload_gpu_memory_used_bytes"
        }
        assert series == {first.workload_id: 700 * 2**20, second.workload_id: 300 * 2**20}
        unknown = AgentMetrics(agent)  # not enforcing: no pids, no per-pod figure
        assert {w.used_memory_mib for w in unknown.sample().workloads} == {None}
    finally:
        enforcer.close()
