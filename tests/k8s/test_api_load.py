"""The load fgpu's components put on the API server.

Kubernetes semantics relied on:

- every write of a Node is sent to every watcher of Nodes in the cluster, which is why the
  kubelet's heartbeat moved from Node status to a Lease (KEP-589, "Efficient Node
  Heartbeats"): the node agent writes its Node only when what it says changed;
- a list with ``resourceVersion=0`` may be answered from the API server's watch cache, a
  list without one is a quorum read through etcd; a watch from a list's version sends
  every later change, and a watch with a field selector sends an object that leaves the
  selection as ``DELETED`` ("Efficient detection of changes", API concepts): the agent
  learns its pods from a watch on ``spec.nodeName`` instead of listing every interval;
- a watch from a version the server no longer keeps answers ``410 Gone``, and the client
  lists again (client-go's reflector);
- the official Python client keeps ``connection_pool_maxsize`` connections per host
  (urllib3); past that it opens one per call and discards it, warning "Connection pool is
  full": the scheduler sizes the pool to its bind workers plus its watches.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

import pytest

from fgpu.agent.backend import SimulatedBackend
from fgpu.k8s import wire
from fgpu.k8s.agent import USAGE_MEMORY_STEP_MIB, NodeAgent, PlacedContainer, usage_moved
from fgpu.k8s.kube import KubeApi, api_client
from fgpu.k8s.scheduler import K8sScheduler, connections_needed
from tests.k8s.kube import add_node, bound, create, pod, wait_until
from tests.k8s.test_agent import bare_node

pytestmark = pytest.mark.k8s


class Recorder:
    """An enforcer that remembers the pods it was last given."""

    def __init__(self) -> None:
        self.last: list[PlacedContainer] = []

    def sync(self, placed) -> None:
        self.last = list(placed)


def _bind(cluster, name: str, node: str) -> None:
    made = create(cluster, pod(name, "0.5"))
    a = wire.Assignment(node, ("GPU-x",), (0,), (500,), (1024,), 100, 128, "default", 50, None)
    cluster.api.bind(
        cluster.namespace, name, made["metadata"]["uid"], node, {wire.ASSIGNMENT: a.to_json()}
    )


@pytest.fixture
def running(cluster):
    """An agent of node ``gpu-1`` running its loop every 0.1 s."""
    if cluster.real:
        pytest.skip("counts the stand-in's requests")
    bare_node(cluster, "gpu-1")
    recorder = Recorder()
    agent = NodeAgent(
        cluster.agent_api("gpu-1"), "gpu-1", SimulatedBackend("2xA100-80GB"), enforcer=recorder
    )
    thread = threading.Thread(target=agent.run, args=(0.1,), daemon=True)
    thread.start()
    wait_until(lambda: agent.reports >= 1, "the agent's first report")
    yield cluster, agent, recorder
    agent.stop()
    thread.join(timeout=30)


def test_an_idle_agent_neither_writes_its_node_nor_lists_pods(running) -> None:
    cluster, agent, _ = running
    version = cluster.api.get_node("gpu-1")["metadata"]["resourceVersion"]
    calls = cluster.standin.api.calls
    done = agent.reports
    wait_until(lambda: agent.reports >= done + 10, "ten more reports")
    # ten intervals later: not one request (no usage write, no list; the watches stay open)
    assert cluster.standin.api.calls == calls
    assert cluster.api.get_node("gpu-1")["metadata"]["resourceVersion"] == version
    assert agent.usage_writes == 1
    assert (agent.view.pods.lists, agent.view.nodes.lists) == (1, 1)


def test_the_agent_learns_its_pods_from_the_watch(running) -> None:
    cluster, agent, recorder = running
    add_node(cluster, "other", gpus=1)
    _bind(cluster, "here", "gpu-1")
    _bind(cluster, "there", "other")
    key = f"{cluster.namespace}/here"
    wait_until(lambda: [p.workload_id for p in recorder.last] == [key], "the bound pod governed")
    cluster.api.delete_pod(cluster.namespace, "here", grace_s=0)
    wait_until(lambda: recorder.last == [], "the deleted pod dropped")
    assert agent.view.pods.lists == 1  # all from the one list and its watch


def test_usage_is_written_when_it_moved_by_a_step(running) -> None:
    cluster, agent, _ = running
    backend = agent.backend
    assert isinstance(backend, SimulatedBackend)
    gpu = agent.devices[0].uuid
    backend.report_usage(4242, gpu, USAGE_MEMORY_STEP_MIB - 1)  # below the step: not written
    done = agent.reports
    wait_until(lambda: agent.reports >= done + 3, "three reports")
    assert agent.usage_writes == 1
    backend.report_usage(4242, gpu, 4096)
    wait_until(lambda: agent.usage_writes == 2, "the moved usage written")
    usage = wire.annotations_of(cluster.api.get_node("gpu-1"))[wire.USAGE]
    assert '"memory_mib": {"' in usage
    assert f'"{gpu}": 4096' in usage


def _u(memory: dict[str, int], util: dict[str, int]) -> dict[str, dict[str, int]]:
    return {"memory_mib": memory, "utilization": util}


@pytest.mark.parametrize(
    ("last", "now", "moved"),
    [
        (None, _u({"g": 0}, {}), True),
        (_u({"g": 0}, {"g": 5}), _u({"g": 255}, {"g": 14}), False),
        (_u({"g": 0}, {}), _u({"g": 256}, {}), True),
        (_u({"g": 0}, {"g": 5}), _u({"g": 0}, {"g": 15}), True),
        (_u({"g": 0}, {}), _u({"h": 0}, {}), True),
        ({"garbage": 1}, _u({}, {}), True),
    ],
    ids=["first", "small-moves", "memory-step", "utilization-step", "other-gpus", "unreadable"],
)
def test_usage_moved(last, now, moved) -> None:
    assert usage_moved(last, now) is moved


def test_a_restarted_agent_does_not_rewrite_the_same_usage(running) -> None:
    cluster, agent, _ = running
    again = NodeAgent(cluster.agent_api("gpu-1"), "gpu-1", agent.backend, enforcer=Recorder())
    version = cluster.api.get_node("gpu-1")["metadata"]["resourceVersion"]
    again.report()
    assert again.usage_writes == 0
    assert cluster.api.get_node("gpu-1")["metadata"]["resourceVersion"] == version


def test_an_expired_watch_lists_again(running) -> None:
    cluster, agent, recorder = running
    store = cluster.standin.api.store
    store.events = deque(store.events, maxlen=2)  # a short history, as after compaction
    for i in range(3):  # push the watches' versions out of the history
        cluster.api.create_lease(
            cluster.namespace,
            {"metadata": {"name": f"filler-{i}"}, "spec": {"holderIdentity": "x"}},
        )
    cluster.standin.close_watches()  # they resume from a version the history lost: 410
    wait_until(lambda: agent.view.pods.lists >= 2, "the pods listed again after 410")
    _bind(cluster, "late", "gpu-1")  # seen by the watch that follows the new list
    key = f"{cluster.namespace}/late"
    wait_until(lambda: [p.workload_id for p in recorder.last] == [key], "the pod governed")


def test_the_scheduler_pool_fits_its_workers_and_watches(make_cluster, caplog) -> None:
    cluster = make_cluster(latency_s=0.02)  # binds overlap: all workers call at once
    if cluster.real:
        pytest.skip("the latency knob is the stand-in's")
    url = cluster.standin.url
    add_node(cluster, "node-a", gpus=8)
    for i in range(32):
        create(cluster, pod(f"p-{i}", "0.25"))
    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    sized = KubeApi(api_client(host=url, pool_size=connections_needed(8)))
    scheduler = K8sScheduler(sized, env_without_isolation=True, workers=8)
    scheduler.start(tick_s=0.2)
    try:
        wait_until(lambda: len(bound(cluster)) == 32, "32 pods bound")
    finally:
        scheduler.stop()
    assert not [r for r in caplog.records if "Connection pool is full" in r.getMessage()]
    # the check can fail: a pool below the workers discards connections
    add_node(cluster, "node-b", gpus=4)
    for i in range(32, 48):
        create(cluster, pod(f"p-{i}", "0.25"))
    small = KubeApi(api_client(host=url, pool_size=2))
    scheduler = K8sScheduler(small, env_without_isolation=True, workers=8)
    scheduler.start(tick_s=0.2)
    try:
        wait_until(lambda: len(bound(cluster)) == 48, "16 more pods bound")
    finally:
        scheduler.stop()
    assert [r for r in caplog.records if "Connection pool is full" in r.getMessage()]
    assert "fewer than the 14 this scheduler uses at once" in caplog.text
