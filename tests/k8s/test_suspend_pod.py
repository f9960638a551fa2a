"""The node agent's pod suspend (fgpu.k8s.suspend.PodSuspender) with real processes: a CUDA
process on the fake driver in an imitation of the kubelet's pod cgroups is checkpointed (its
device memory free in the fake's ledger), its pod cgroup frozen, then thawed and restored with
its memory contents. The controller runs in a process of its own (the fake driver keeps the
first state file it opens for the life of a process). The node agent's test loads the fake
driver into the test process (the agent calls it in-process), with a state file of its own."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fgpu.agent.backend import SimulatedBackend
from fgpu.agent.checkpoint import CheckpointDriver
from fgpu.k8s import wire
from fgpu.k8s.agent import NodeAgent
from fgpu.k8s.podcgroup import PodCgroupFreezer
from fgpu.k8s.scheduler import K8sScheduler
from fgpu.k8s.suspend import PodSuspender, Suspensions
from fgpu.k8s.suspending import (
    FAILED,
    RESTORING,
    SUSPEND_TIMEOUT_S,
    SUSPENDED,
    SUSPENDING,
    copy_seconds,
    suspend_phase,
)
from fgpu.native import ensure_built
from fgpu.sched.decide import SchedulerConfig
from fgpu.sched.workload import Restore
from tests.k8s.kube import MERGE_PATCH, create, events, pod
from tests.k8s.podtree import Kubelet, freeze_file, frozen
from tests.k8s.test_agent import Recorder, bare_node
from tests.native.fakecuda_support import GPU_A, FakeGpus
from tests.native.test_fakecuda_checkpoint import CONTROL, WORKER, Proc, used_mib

pytestmark = pytest.mark.k8s


@pytest.fixture
def procs() -> Iterator[Callable[..., Proc]]:
    started: list[Proc] = []

    def start(args: list[str], env: dict[str, str]) -> Proc:
        p = Proc(args, env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()


def test_a_pod_is_suspended_and_restored_with_its_memory(
    kubelet: Kubelet, tmp_path: Path, procs: Callable[..., Proc]
) -> None:
    fake = FakeGpus(ensure_built(), tmp_path / "fakegpu.state", f"{GPU_A}=A100-80GB:1024")
    env = fake.env()
    worker = procs([str(WORKER), "200"], env)
    pid = worker.read()["pid"]
    uid = str(uuid.uuid4())
    group = kubelet.start(uid, pid=pid)
    ctl = procs([str(CONTROL)], env)
    assert ctl.read()["ready"]
    assert used_mib(fake) == 200

    suspended = ctl.ask(f"pod-suspend {kubelet.root} default/train {uid}")
    assert suspended["ok"], suspended
    assert suspended["pids"] == [pid]
    assert suspended["copy_s"] > 0
    assert frozen(group)
    assert freeze_file(group) == "1"
    assert used_mib(fake) == 0
    assert ctl.ask(f"state {pid}")["state"] == "checkpointed"

    restored = ctl.ask(f"pod-restore {kubelet.root} default/train {uid}")
    assert restored["ok"], restored
    assert restored["pids"] == [pid]
    assert not frozen(group)
    assert used_mib(fake) == 200
    assert ctl.ask(f"state {pid}")["state"] == "running"
    assert worker.ask("check") == {"intact": True}


def test_the_node_agent_suspends_a_pod_asked_to_be_and_restores_it(
    cluster: Any,
    kubelet: Kubelet,
    in_process_fake: tuple[FakeGpus, CheckpointDriver],
    procs: Callable[..., Proc],
) -> None:
    """``fgpu.io/suspend: "true"`` on a running pod: the governor lets go of it, the agent
    suspends it (annotation ``fgpu.io/suspended``, event ``Suspended``); the annotation
    removed: restored (event ``Restored``) and governed again."""
    fake, driver = in_process_fake
    worker = procs([str(WORKER), "100"], fake.env())
    pid = worker.read()["pid"]

    bare_node(cluster, "gpu-1")
    recorder = Recorder()
    suspensions = Suspensions(PodSuspender(driver, PodCgroupFreezer(kubelet.root)), cluster.api)
    agent = NodeAgent(
        cluster.api,
        "gpu-1",
        SimulatedBackend("1xA100-40GB"),
        enforcer=recorder,
        suspensions=suspensions,
    )
    agent.publish()
    create(cluster, pod("w", "0.5"))
    scheduler = K8sScheduler(cluster.api, env_without_isolation=True)
    scheduler.sync()
    scheduler.run_once()
    uid = cluster.api.get_pod(cluster.namespace, "w")["metadata"]["uid"]
    group = kubelet.start(uid, pid=pid)
    key = f"{cluster.namespace}/w"
    agent.report()
    assert [p.workload_id for p in recorder.calls[-1]] == [key]

    def ask(value: str | None) -> None:
        cluster.api.core.patch_namespaced_pod(
            "w",
            cluster.namespace,
            {"metadata": {"annotations": {wire.SUSPEND: value}}},
            _content_type=MERGE_PATCH,
        )

    ask("true")
    agent.report()
    assert recorder.calls[-1] == []  # not governed while suspended
    notes = cluster.api.get_pod(cluster.namespace, "w")["metadata"]["annotations"]
    assert json.loads(notes[wire.SUSPENDED])["pids"] == [pid]
    assert frozen(group)
    assert used_mib(fake) == 0
    assert [e["involvedObject"]["name"] for e in events(cluster, "Suspended")] == ["w"]
    agent.report()  # asked still: nothing changes, nothing thaws it
    assert frozen(group)

    ask(None)
    agent.report()
    assert [p.workload_id for p in recorder.calls[-1]] == [key]
    notes = cluster.api.get_pod(cluster.namespace, "w")["metadata"]["annotations"]
    assert wire.SUSPENDED not in notes
    assert not frozen(group)
    assert used_mib(fake) == 100
    assert [e["involvedObject"]["name"] for e in events(cluster, "Restored")] == ["w"]
    assert worker.ask("check") == {"intact": True}


# ------------------------------------------------------------ the scheduler asks (issue 28)
AT_ONCE = SchedulerConfig(preempt_delay_s=0.0)
BUDGET_MIB = 64 * 1024


def lost(s: K8sScheduler) -> dict[tuple[str, str], float]:
    """``fgpu_gpu_seconds_lost_total`` of scheduler ``s``, by (queue, reason)."""
    return {
        (m.labels["queue"], m.labels["reason"]): m.value
        for metric in s.metrics.events.gpu_seconds_lost.collect()
        for m in metric.samples
        if m.name.endswith("_total")
    }


def notes_of(cluster: Any, name: str) -> dict[str, str]:
    got: dict[str, str] = (
        cluster.api.get_pod(cluster.namespace, name)["metadata"].get("annotations") or {}
    )
    return got


def suspend_agent(cluster: Any, kubelet: Kubelet, driver: CheckpointDriver | None) -> NodeAgent:
    """Node gpu-1 (one simulated A100-40GB) with its agent published: with ``driver``, it
    suspends pods and publishes a budget of :data:`BUDGET_MIB`; without, it says its driver
    has no checkpoint API (budget 0)."""
    bare_node(cluster, "gpu-1")
    suspensions = (
        None
        if driver is None
        else Suspensions(PodSuspender(driver, PodCgroupFreezer(kubelet.root)), cluster.api)
    )
    agent = NodeAgent(
        cluster.api,
        "gpu-1",
        SimulatedBackend("1xA100-40GB"),
        enforcer=Recorder(),
        suspensions=suspensions,
        suspend_host_memory_mib=BUDGET_MIB,
        suspend_note="libcuda.so.1 has no cuCheckpointProcessLock (test)",
    )
    agent.publish()
    return agent


def test_a_low_pod_is_suspended_for_a_critical_one_and_restored_with_its_memory_after(
    cluster: Any,
    kubelet: Kubelet,
    in_process_fake: tuple[FakeGpus, CheckpointDriver],
    procs: Callable[..., Proc],
) -> None:
    """End to end with a real process on the fake driver: the scheduler suspends the low
    pod (``fgpu.io/suspend``) instead of evicting it, the agent checkpoints and freezes it,
    the critical pod gets its GPU while the low pod stays bound; when the critical pod ends
    the scheduler restores the low pod on its GPU and the agent brings its memory back."""
    fake, driver = in_process_fake
    worker = procs([str(WORKER), "300"], fake.env())
    pid = worker.read()["pid"]
    agent = suspend_agent(cluster, kubelet, driver)
    inventory = json.loads(wire.annotations_of(cluster.api.get_node("gpu-1"))[wire.INVENTORY])
    assert inventory["suspend"] == {"host_memory_mib": BUDGET_MIB}
    create(cluster, pod("low", "0.6", priority="low"))
    s = K8sScheduler(cluster.api, env_without_isolation=True, config=AT_ONCE)
    s.sync()
    s.run_once()
    low = cluster.api.get_pod(cluster.namespace, "low")
    gpu = wire.Assignment.from_json(low["metadata"]["annotations"][wire.ASSIGNMENT]).uuids
    group = kubelet.start(low["metadata"]["uid"], pid=pid)
    agent.report()
    assert used_mib(fake) == 300

    create(cluster, pod("vip", "0.6", priority="critical"))
    s.sync()
    s.run_once()
    assert notes_of(cluster, "low")[wire.SUSPEND] == "true"
    assert [e["involvedObject"]["name"] for e in events(cluster, "Suspending")] == ["low"]
    assert not events(cluster, "Preempted")
    assert not cluster.api.get_pod(cluster.namespace, "vip")["spec"].get("nodeName")
    s.sync()
    s.run_once()  # the agent has not suspended it yet: its share is still held
    assert not cluster.api.get_pod(cluster.namespace, "vip")["spec"].get("nodeName")

    agent.report()  # the agent checkpoints and freezes it
    assert json.loads(notes_of(cluster, "low")[wire.SUSPENDED])["pids"] == [pid]
    assert frozen(group)
    assert used_mib(fake) == 0

    s.sync()
    s.run_once()  # suspended: its share is free, the critical pod takes its GPU
    vip = cluster.api.get_pod(cluster.namespace, "vip")
    assert wire.Assignment.from_json(vip["metadata"]["annotations"][wire.ASSIGNMENT]).uuids == gpu
    low = cluster.api.get_pod(cluster.namespace, "low")
    assert low["spec"]["nodeName"] == "gpu-1"  # still bound, never evicted
    assert not low["metadata"].get("deletionTimestamp")
    rnd, decision = s.plan()
    s.check_state(rnd)
    charge = 24 * 1024 + 128  # 0.6 of a 40 GiB GPU's memory, plus its host memory request
    assert rnd.suspend_charges == {0: charge}
    (held,) = [w for w in rnd.others if w.id == f"{cluster.namespace}/low (suspended)"]
    assert held.allocation is not None
    assert (held.allocation.cpu_milli, held.allocation.memory_mib) == (100, 128)  # still held
    assert rnd.suspended[f"{cluster.namespace}/low"].request.gpu_count == 1
    assert not [a for a in decision.actions if isinstance(a, Restore)]
    assert lost(s)[("default", "suspend")] > 0.0
    s.sync()
    s.run_once()
    waiting = events(cluster, "WaitingToRestore")
    assert [e["involvedObject"]["name"] for e in waiting] == ["low"]
    assert "suspended on gpu-1" in waiting[0]["message"]
    conditions = (low.get("status") or {}).get("conditions") or []
    assert not [c for c in conditions if c.get("reason") == "Unschedulable"]

    cluster.api.delete_pod(cluster.namespace, "vip", grace_s=0)  # the critical pod ends
    s.sync()
    s.run_once()
    assert wire.SUSPEND not in notes_of(cluster, "low")
    assert [e["involvedObject"]["name"] for e in events(cluster, "Restoring")] == ["low"]
    agent.report()  # the agent thaws and restores it
    notes = notes_of(cluster, "low")
    assert wire.SUSPENDED not in notes
    assert json.loads(notes[wire.RESTORED])["copy_s"] >= 0.0
    assert not frozen(group)
    assert used_mib(fake) == 300
    assert worker.ask("check") == {"intact": True}
    s.sync()
    s.run_once()
    assert lost(s)[("default", "restore")] > 0.0
    rnd, decision = s.plan()
    (w,) = [w for w in rnd.workloads if w.id == f"{cluster.namespace}/low"]
    assert w.allocation is not None
    assert w.suspended_on is None
    assert rnd.suspend_charges == {}
    assert [e["involvedObject"]["name"] for e in events(cluster, "Preempted")] == []


def test_a_pod_whose_suspend_fails_is_evicted_instead(
    cluster: Any, kubelet: Kubelet, in_process_fake: tuple[FakeGpus, CheckpointDriver]
) -> None:
    """No cgroup for the pod on the node (nothing to checkpoint): the agent says
    ``SuspendFailed`` and the scheduler evicts the victim as it would have."""
    _, driver = in_process_fake
    agent = suspend_agent(cluster, kubelet, driver)
    create(cluster, pod("low", "0.6", priority="low"))
    s = K8sScheduler(cluster.api, env_without_isolation=True, config=AT_ONCE)
    s.sync()
    s.run_once()
    create(cluster, pod("vip", "0.6", priority="critical"))
    s.sync()
    s.run_once()
    assert notes_of(cluster, "low")[wire.SUSPEND] == "true"
    agent.report()
    assert "error" in json.loads(notes_of(cluster, "low")[wire.SUSPENDED])
    assert [e["involvedObject"]["name"] for e in events(cluster, "SuspendFailed")] == ["low"]
    s.sync()
    s.run_once()
    preempted = events(cluster, "Preempted")
    assert [e["involvedObject"]["name"] for e in preempted] == ["low"]
    assert "suspend to host memory failed" in preempted[0]["message"]
    assert lost(s)[("default", "preempt")] > 0.0


def test_a_node_whose_driver_lacks_the_checkpoint_api_gets_evictions(
    cluster: Any, kubelet: Kubelet
) -> None:
    agent = suspend_agent(cluster, kubelet, None)
    del agent
    inventory = json.loads(wire.annotations_of(cluster.api.get_node("gpu-1"))[wire.INVENTORY])
    assert inventory["suspend"]["host_memory_mib"] == 0
    assert "cuCheckpointProcessLock" in inventory["suspend"]["note"]
    create(cluster, pod("low", "0.6", priority="low"))
    s = K8sScheduler(cluster.api, env_without_isolation=True, config=AT_ONCE)
    s.sync()
    s.run_once()
    create(cluster, pod("vip", "0.6", priority="critical"))
    s.sync()
    s.run_once()
    assert [e["involvedObject"]["name"] for e in events(cluster, "Preempted")] == ["low"]
    assert not events(cluster, "Suspending")


# ------------------------------------------------------------ wire and phases
def test_the_inventory_carries_the_suspend_budget_and_refuses_a_negative_one() -> None:
    inv = wire.Inventory((), "nvml", suspend_host_memory_mib=4096)
    assert wire.Inventory.from_json(inv.to_json()) == inv
    off = wire.Inventory((), "nvml", suspend_note="no checkpoint API")
    assert json.loads(off.to_json())["suspend"] == {
        "host_memory_mib": 0,
        "note": "no checkpoint API",
    }
    assert "suspend" not in json.loads(wire.Inventory((), "simulated").to_json())
    assert wire.Inventory.from_json('{"gpus": []}').suspend_host_memory_mib == 0  # older agents
    with pytest.raises(wire.WireError, match=r"suspend\.host_memory_mib -1 is negative"):
        wire.Inventory.from_json('{"gpus": [], "suspend": {"host_memory_mib": -1}}')


DONE = '{"pids": [7], "copy_s": 0.5}'
PHASES = [
    # (fgpu.io/suspend, fgpu.io/suspended, what this scheduler asked) -> phase
    (None, None, None, ""),
    ("true", None, None, SUSPENDING),
    ("true", DONE, None, SUSPENDED),
    ("true", '{"error": "no CUDA process"}', None, FAILED),
    ("true", "not json", None, FAILED),
    (None, DONE, None, RESTORING),
    (None, '{"error": "old"}', None, ""),
    (None, '{"error": "old"}', True, SUSPENDING),  # asked; the watch is behind
    ("true", DONE, False, RESTORING),  # restore asked; the watch is behind
    ("true", DONE, True, SUSPENDED),
]


@pytest.mark.parametrize(("ask", "note", "asked", "phase"), PHASES)
def test_the_suspend_phase_of_a_pod(
    ask: str | None, note: str | None, asked: bool | None, phase: str
) -> None:
    notes = {k: v for k, v in ((wire.SUSPEND, ask), (wire.SUSPENDED, note)) if v is not None}
    assert suspend_phase(notes, asked) == phase


def test_copy_seconds_of_a_note() -> None:
    assert copy_seconds(DONE) == 0.5
    assert copy_seconds(None) == 0.0
    assert copy_seconds('{"copy_s": "x"}') == 0.0


def test_a_victim_whose_agent_never_answers_is_evicted_after_the_timeout(
    cluster: Any, kubelet: Kubelet, in_process_fake: tuple[FakeGpus, CheckpointDriver]
) -> None:
    """The agent publishes a budget but never reports (stopped): the critical pod does not
    wait for ever; after :data:`SUSPEND_TIMEOUT_S` the victim is evicted instead."""
    _, driver = in_process_fake
    suspend_agent(cluster, kubelet, driver)  # published, never reports again
    now = [time.time()]
    create(cluster, pod("low", "0.6", priority="low"))
    s = K8sScheduler(cluster.api, env_without_isolation=True, config=AT_ONCE, clock=lambda: now[0])
    s.sync()
    s.run_once()
    create(cluster, pod("vip", "0.6", priority="critical"))
    s.sync()
    s.run_once()
    assert notes_of(cluster, "low")[wire.SUSPEND] == "true"
    now[0] += SUSPEND_TIMEOUT_S / 2
    s.sync()
    s.run_once()
    assert not events(cluster, "Preempted")
    now[0] += SUSPEND_TIMEOUT_S
    s.sync()
    s.run_once()
    preempted = events(cluster, "Preempted")
    assert [e["involvedObject"]["name"] for e in preempted] == ["low"]
    assert "did not report it suspended within 120 s" in preempted[0]["message"]
