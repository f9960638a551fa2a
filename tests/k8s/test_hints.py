"""Activity hints from pods: real processes in (imitation) pod cgroups send hints through
:mod:`fgpu.sdk` to the node agent's socket, and the governor treats them as that pod's
activity; a hint from a process that is not in the pod it names is dropped and counted.

The pod cgroups are real cgroups in a test tree under the cgroup v2 mount (the ``kubelet``
fixture, root only), so freezes are the kernel's. Waits poll with generous timeouts; no
assertion is about timing."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fgpu.agent.backend import GpuBackend, SimulatedBackend
from fgpu.agent.events import AgentEvent
from fgpu.agent.governor.activity import HintListener
from fgpu.agent.governor.plan import PlannerConfig
from fgpu.agent.governor.runtime import GovernorConfig, WorkloadView
from fgpu.k8s import wire
from fgpu.k8s.agent import PlacedContainer
from fgpu.k8s.enforce import GovernorEnforcer
from fgpu.k8s.kube import KubeApi, api_client
from fgpu.k8s.podcgroup import PodCgroupFreezer
from fgpu_standin import Options, StandIn
from tests.k8s.podtree import (
    Backend,
    Kubelet,
    freeze_file,
    frozen,
    placed,
    wait_for,
    with_priority,
)

pytestmark = pytest.mark.k8s

MS = 1_000_000
SIMULATED = "1xA100-40GB"
RESUMED = "resumed: no higher-priority workload is busy on its GPUs"


@pytest.fixture
def sock() -> Iterator[Path]:
    """Where the agent binds its hint socket (a short path: sun_path holds 108 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="fgpu-hints-"))
    try:
        yield folder / "agent.sock"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def enforcer(kubelet: Kubelet, backend: GpuBackend, sock: Path) -> GovernorEnforcer:
    gpus = [g.uuid for g in backend.gpus()]
    config = GovernorConfig(planner=PlannerConfig(resume_after_ns=50 * MS), activity_poll_s=0.02)
    return GovernorEnforcer(
        backend, gpus, PodCgroupFreezer(kubelet.root), config=config, agent_socket=sock
    )


def view(enf: GovernorEnforcer, workload_id: str) -> WorkloadView:
    return next(v for v in enf.governor.snapshot().workloads if v.workload_id == workload_id)


def events_of(enf: GovernorEnforcer, workload_id: str) -> list[AgentEvent]:
    return [e for e in enf.events.since() if e.workload_id == workload_id]


def on(
    p: PlacedContainer, backend: GpuBackend, priority: int, milli: int, index: int = 0
) -> PlacedContainer:
    """``p`` on the backend's GPU ``index`` with this priority and share."""
    return placed(
        p.workload_id.split("/", 1)[1],
        p.uid,
        priority=priority,
        milli=milli,
        gpu=backend.gpus()[index].uuid,
    )


def test_hints_from_a_pod_replace_always_busy_on_simulated_gpus(
    kubelet: Kubelet, sock: Path
) -> None:
    backend = SimulatedBackend(SIMULATED)
    gpu = backend.gpus()[0].uuid
    critical, _, hinter = kubelet.hinting_pod("critical", sock)
    low, low_group, _ = kubelet.pod("low", qos="besteffort")
    critical = on(critical, backend, 125, 500)
    low = on(low, backend, 40, 500)
    enf = enforcer(kubelet, backend, sock)
    assert sock.exists()  # bound before the first sync
    enf.start()
    try:
        enf.sync([critical, low])
        # no hint yet: on a simulated GPU the critical pod counts as busy, so low is paused
        wait_for(lambda: frozen(low_group), "the low pod to pause")
        assert (view(enf, "default/critical").busy, view(enf, "default/critical").activity) == (
            True,
            "assumed",
        )

        hinter.send("idle")  # fgpu.sdk.mark_idle() from the pod's own process
        wait_for(lambda: not frozen(low_group), "the low pod to resume after the idle hint")
        assert freeze_file(low_group) == "0"
        critical_view = view(enf, "default/critical")
        assert (critical_view.busy, critical_view.activity) == (False, "hints")

        hinter.send("busy")
        wait_for(lambda: frozen(low_group), "the low pod to pause again after the busy hint")
        critical_view = view(enf, "default/critical")
        assert (critical_view.busy, critical_view.activity) == (True, "hints")
        wait_for(lambda: len(events_of(enf, "default/low")) == 3, "three events of the low pod")
        assert [(e.kind, e.message) for e in events_of(enf, "default/low")] == [
            ("paused", f"paused: default/critical (priority 125) is busy on {gpu}"),
            ("resumed", RESUMED),
            ("paused", f"paused: default/critical (priority 125) is busy on {gpu}"),
        ]
        assert enf.dropped_hints == 0
    finally:
        enf.close()
    assert not frozen(low_group)
    assert not sock.exists()  # the agent removes its socket when it stops


def test_a_busy_hint_wins_over_nvml_and_keeps_the_low_pod_paused(
    kubelet: Kubelet, sock: Path
) -> None:
    backend = Backend()  # NVML sees no process of either pod using the GPU
    critical, critical_group, hinter = kubelet.hinting_pod("critical", sock)
    low, low_group, _ = kubelet.pod("low", qos="besteffort")
    critical, low = with_priority(critical, 125), with_priority(low, 40)
    enf = enforcer(kubelet, backend, sock)
    enf.start()
    try:
        enf.sync([critical, low])
        wait_for(
            lambda: view(enf, "default/critical").activity == "nvml", "an NVML read of the pod"
        )
        assert not view(enf, "default/critical").busy
        # (assumed busy until that read, then idle for the hysteresis: low runs after)
        wait_for(lambda: not frozen(low_group), "the low pod to run (NVML: critical is idle)")

        hinter.send("busy")
        wait_for(lambda: frozen(low_group), "the low pod to pause after the busy hint")
        reads = backend.reads
        wait_for(lambda: backend.reads >= reads + 10, "ten more NVML reads")
        # NVML still says the critical pod is idle; its hint decides: low stays paused
        assert frozen(low_group)
        critical_view = view(enf, "default/critical")
        assert (critical_view.busy, critical_view.activity) == (True, "hints")
        assert not frozen(critical_group)

        hinter.send("idle")
        wait_for(lambda: not frozen(low_group), "the low pod to resume after the idle hint")
    finally:
        enf.close()
    assert not frozen(low_group)


def test_hints_from_processes_outside_the_pod_they_name_are_dropped_and_counted(
    kubelet: Kubelet, sock: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = SimulatedBackend("2xA100-40GB")
    critical, _, hinter = kubelet.hinting_pod("critical", sock)
    low, low_group, _ = kubelet.pod("low", qos="besteffort")
    # a process of another governed pod (alone on the second GPU, so it runs) that claims
    # to be the critical pod
    other, _, spoofer = kubelet.hinting_pod("other", sock, claim="default/critical")
    stranger = kubelet.hinter(sock, "default/critical")  # in no pod at all
    pods = [
        on(critical, backend, 125, 500),
        on(low, backend, 40, 500),
        on(other, backend, 40, 500, index=1),
    ]
    enf = enforcer(kubelet, backend, sock)
    enf.start()
    try:
        enf.sync(pods)
        wait_for(lambda: frozen(low_group), "the low pod to pause (critical assumed busy)")

        stranger.send("idle")
        wait_for(lambda: enf.dropped_hints == 1, "the stranger's hint to be dropped")
        spoofer.send("idle")
        wait_for(lambda: enf.dropped_hints == 2, "the other pod's spoofed hint to be dropped")
        critical_view = view(enf, "default/critical")
        assert (critical_view.busy, critical_view.activity) == (True, "assumed")
        assert frozen(low_group)
        assert [e.kind for e in events_of(enf, "default/low")] == ["paused"]
        with caplog.at_level(logging.INFO, logger="fgpu.k8s.enforce"):
            enf.sync(pods)
        assert (
            "2 activity hint(s) dropped since the last sync (2 in all): not from a process of "
            "the governed pod they name, or malformed" in caplog.messages
        )

        hinter.send("idle")  # the critical pod's own process: taken
        wait_for(lambda: not frozen(low_group), "the low pod to resume after the real hint")
        assert enf.dropped_hints == 2
    finally:
        enf.close()


def test_a_read_only_mount_of_the_socket_folder_can_send_but_not_replace_the_socket(
    sock: Path,
) -> None:
    """What a pod gets (the webhook mounts the host's /run/fgpu read only): sending works,
    removing or replacing the agent's socket does not."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs root and unshare(1) to make a read-only bind mount")
    listener = HintListener(sock)
    view_dir = Path(tempfile.mkdtemp(prefix="fgpu-view-"))
    pod_side = f"""
import os, sys
import fgpu.sdk
print(fgpu.sdk.mark_busy(), flush=True)
try:
    os.unlink({str(view_dir / "agent.sock")!r})
except OSError as exc:
    print(exc.strerror, flush=True)
"""
    script = (
        f"mount --bind {sock.parent} {view_dir} && mount -o remount,bind,ro {view_dir} && "
        f'exec "$0" -c "$1"'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FGPU_")}
    env |= {"FGPU_AGENT_SOCKET": str(view_dir / "agent.sock"), "FGPU_WORKLOAD_ID": "default/p"}
    try:
        proc = subprocess.run(
            [
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                sys.executable,
                pod_side,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0 and "mount" in proc.stderr:
            pytest.skip(f"cannot make a read-only bind mount here: {proc.stderr.strip()}")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split("\n")[:2] == ["True", "Read-only file system"]
        hints: list = []
        wait_for(lambda: bool(hints.extend(listener.receive()) or hints), "the hint")
        assert [(h.message.workload_id, h.message.kind) for h in hints] == [("default/p", "busy")]
        assert sock.exists()
    finally:
        listener.close()
        shutil.rmtree(view_dir, ignore_errors=True)


def test_an_old_agent_stopping_leaves_a_new_agents_socket_alone(sock: Path) -> None:
    """A DaemonSet update may start the new agent before the old one exits: the old one's
    exit must not remove the socket the new one bound at the same path."""
    old = HintListener(sock)
    new = HintListener(sock)  # replaces the old socket file with its own
    try:
        old.close()
        assert sock.exists()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FGPU_")}
        env |= {"FGPU_AGENT_SOCKET": str(sock), "FGPU_WORKLOAD_ID": "default/p"}
        sent = subprocess.run(
            [sys.executable, "-c", "import fgpu.sdk; print(fgpu.sdk.mark_idle())"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sent.stdout.strip() == "True"
        hints: list = []
        wait_for(lambda: bool(hints.extend(new.receive()) or hints), "the hint on the new socket")
        assert [h.message.kind for h in hints] == ["idle"]
    finally:
        new.close()
    assert not sock.exists()


# -- the node agent as a process, against the API stand-in ---------------------------------


def test_the_node_agent_process_takes_hints_from_its_pods(kubelet: Kubelet, sock: Path) -> None:
    """``fgpu k8s node-agent`` (simulated GPUs, enforcing over the test's pod cgroups) with
    two pods bound to its node: the low one is paused while the critical one counts as busy
    and resumed when the critical pod's process says it is idle; a hint from a process in no
    pod is dropped and the agent logs it; on SIGTERM it thaws the pod and removes its
    socket."""
    standin = StandIn(Options(kubelet=True)).start()
    log_path = sock.parent / "agent.log"
    agent: subprocess.Popen[bytes] | None = None
    try:
        api = KubeApi(api_client(host=standin.url))
        api.core.create_node({"metadata": {"name": "n1"}})
        with open(log_path, "wb") as log_file:
            agent = subprocess.Popen(
                [sys.executable, "-m", "fgpu", "k8s", "node-agent", "--node", "n1",
                 "--server", standin.url, "--simulate-gpus", SIMULATED, "--enforce",
                 "--cgroup-root", str(kubelet.root), "--agent-socket", str(sock),
                 "--interval-s", "0.2"],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if not k.startswith("FGPU_")},
            )  # fmt: skip

        def inventory() -> str:
            return wire.annotations_of(api.get_node("n1")).get(wire.INVENTORY, "")

        wait_for(lambda: bool(inventory()) and sock.exists(), "the agent to publish and bind")
        gpu = wire.Inventory.from_json(inventory()).gpus[0].uuid
        uids = {}
        for name, priority in (("critical", 125), ("low", 40)):
            body = {
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            }
            made = api._call(api.core.create_namespaced_pod, "default", body)
            uid = made["metadata"]["uid"]
            uids[name] = uid
            grant = placed(name, uid, priority=priority, gpu=gpu).assignment
            api.bind("default", name, uid, "n1", {wire.ASSIGNMENT: grant.to_json()})
        _, _, hinter = kubelet.hinting_pod("critical", sock, uid=uids["critical"])
        low_group = kubelet.start(uids["low"], qos="besteffort")

        wait_for(lambda: frozen(low_group), "the agent to pause the low pod")
        stranger = kubelet.hinter(sock, "default/critical")
        stranger.send("idle")
        wait_for(lambda: "1 activity hint(s) dropped" in log_path.read_text(), "the agent's log")
        assert frozen(low_group)
        hinter.send("idle")
        wait_for(lambda: not frozen(low_group), "the agent to resume the low pod")
        hinter.send("busy")
        wait_for(lambda: frozen(low_group), "the agent to pause the low pod again")

        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0, log_path.read_text()
        assert not frozen(low_group)
        assert not sock.exists()
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()
        standin.stop()
