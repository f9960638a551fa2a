"""The node agent's pod suspend (fgpu.k8s.suspend.PodSuspender) with real processes: a CUDA
process on the fake driver in an imitation of the kubelet's pod cgroups is checkpointed (its
device memory free in the fake's ledger), its pod cgroup frozen, then thawed and restored with
its memory contents. The controller runs in a process of its own (the fake driver keeps the
first state file it opens for the life of a process). The node agent's test loads the fake
driver into the test process (the agent calls it in-process), with a state file of its own."""

from __future__ import annotations

import json
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
from fgpu.native import ensure_built
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


@pytest.fixture(scope="session")
def in_process_fake(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[FakeGpus, CheckpointDriver]:
    """One fake machine for the whole session, whose driver is loaded into the test process
    (a library loaded once keeps its first state file: every test here uses this one)."""
    native = ensure_built()
    fake = FakeGpus(
        native, tmp_path_factory.mktemp("fake") / "fakegpu.state", f"{GPU_A}=A100-80GB:1024"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FGPU_FAKE_GPU_STATE", str(fake.state))
        patch.setenv("FGPU_FAKE_GPUS", fake.gpus)
        return fake, CheckpointDriver(str(native / "fakecuda" / "libcuda.so.1"))


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
