"""The node agent's enforcement on real cgroups: pods are found by uid in both kubelet layouts,
a low-priority pod is frozen through its own cgroup while a critical one is busy and thawed
when it goes idle, close() leaves nothing frozen, and a new agent thaws what a dead one left
frozen without moving or signalling anything.

The cgroup tests build an imitation of the kubelet's tree in a directory of their own under
the cgroup v2 mount (root only) and remove it afterwards. No assertion is about timing; waits
have generous timeouts."""

from __future__ import annotations

import dataclasses
import os
import signal
import uuid
from pathlib import Path

import pytest

from fgpu.agent.events import AgentEvent
from fgpu.agent.governor.plan import PlannerConfig
from fgpu.agent.governor.runtime import GovernorConfig
from fgpu.agent.memguard import MemoryPolicy
from fgpu.k8s import wire
from fgpu.k8s.agent import PlacedContainer
from fgpu.k8s.enforce import GovernorEnforcer
from fgpu.k8s.podcgroup import (
    PodCgroupFreezer,
    cgroup_pids,
    find_pod_cgroup,
    pod_cgroup_candidates,
    pod_handle,
)
from tests.k8s.podtree import (
    GPU,
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


# -- finding pod cgroups (plain directories: no cgroup needed) --------------------------------


@pytest.mark.parametrize(
    ("layout", "relative"),
    [
        ("kubepods", "kubepods/pod{uid}"),
        ("kubepods", "kubepods/burstable/pod{uid}"),
        ("kubepods", "kubepods/besteffort/pod{uid}"),
        ("kubepods.slice", "kubepods.slice/kubepods-pod{u}.slice"),
        (
            "kubepods.slice",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice",
        ),
        (
            "kubepods.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice",
        ),
        (
            "kubelet.slice/kubelet-kubepods.slice",
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
            "kubelet-kubepods-burstable-pod{u}.slice",
        ),
    ],
)
def test_a_pod_cgroup_is_found_by_uid_in_each_layout(
    tmp_path: Path, layout: str, relative: str
) -> None:
    uid = str(uuid.uuid4())
    other = str(uuid.uuid4())
    path = tmp_path / relative.format(uid=uid, u=uid.replace("-", "_"))
    path.mkdir(parents=True)
    assert find_pod_cgroup(tmp_path, uid) == path
    assert path in pod_cgroup_candidates(tmp_path / layout, uid)
    assert find_pod_cgroup(tmp_path, other) is None
    assert find_pod_cgroup(tmp_path, "") is None


def test_a_freezer_needs_a_cgroup_v2_directory(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="not a cgroup v2 directory"):
        PodCgroupFreezer(tmp_path)


def test_memory_policy_kill_needs_the_api(tmp_path: Path) -> None:
    (tmp_path / "cgroup.procs").touch()  # enough to pass the freezer's probe
    (tmp_path / "cgroup.freeze").touch()
    with pytest.raises(ValueError, match="pass api"):
        GovernorEnforcer(
            Backend(), [GPU], PodCgroupFreezer(tmp_path), memory_policy=MemoryPolicy.KILL
        )


# -- a fake kubelet tree under the cgroup v2 mount (the kubelet fixture) ---------------------


def enforcer(kubelet: Kubelet, backend: Backend) -> GovernorEnforcer:
    config = GovernorConfig(planner=PlannerConfig(resume_after_ns=50 * MS), activity_poll_s=0.02)
    return GovernorEnforcer(backend, [GPU], PodCgroupFreezer(kubelet.root), config=config)


def test_a_low_pod_pauses_while_a_critical_one_is_busy_and_resumes_after(
    kubelet: Kubelet,
) -> None:
    backend = Backend()
    critical, critical_group, critical_pid = kubelet.pod("critical", qos="burstable")
    low, low_group, low_pid = kubelet.pod("low", qos="besteffort")
    critical = with_priority(critical, 125)
    low = with_priority(low, 40)
    backend.busy = {critical_pid, low_pid}
    enf = enforcer(kubelet, backend)
    assert enf.freezer.pids(pod_handle(critical.workload_id)) == []  # not bound yet
    enf.start()
    try:
        enf.sync([critical, low])
        assert enf.freezer.pids(pod_handle(low.workload_id)) == [low_pid]
        wait_for(lambda: frozen(low_group), "the low pod's cgroup to freeze")
        assert not frozen(critical_group)

        def low_events() -> list[AgentEvent]:
            return [e for e in enf.events.since() if e.workload_id == low.workload_id]

        # the event follows the confirmed freeze (the kernel may report it first)
        wait_for(lambda: bool(low_events()), "the paused event")
        paused = low_events()
        assert paused[0].kind == "paused"
        assert paused[0].message == f"paused: default/critical (priority 125) is busy on {GPU}"

        backend.busy = {low_pid}  # the critical pod goes idle
        wait_for(lambda: not frozen(low_group), "the low pod's cgroup to thaw")
        assert freeze_file(low_group) == "0"
    finally:
        enf.close()
    for group in (critical_group, low_group):
        assert freeze_file(group) == "0"
        assert not frozen(group)
    # nothing was moved out of the pods' containers
    assert cgroup_pids(critical_group) == [critical_pid]
    assert cgroup_pids(low_group) == [low_pid]


def test_a_squeezed_pod_is_governed_and_paused_while_its_squeezer_is_busy(
    kubelet: Kubelet,
) -> None:
    # two low pods at 500 and a critical 500 that squeezed one of them (fgpu.io/squeezed-by):
    # 1500 milli on the GPU, of which 1000 are not squeezed
    backend = Backend()
    crit, crit_group, crit_pid = kubelet.pod("crit", qos="burstable")
    low1, low1_group, low1_pid = kubelet.pod("low1", qos="besteffort")
    low2, low2_group, low2_pid = kubelet.pod("low2", qos="besteffort")
    crit = with_priority(crit, 125)
    low1 = with_priority(low1, 25)
    low2 = dataclasses.replace(with_priority(low2, 25), squeezed_by=(crit.workload_id,))
    backend.busy = {crit_pid, low1_pid, low2_pid}
    enf = enforcer(kubelet, backend)
    enf.start()
    try:
        enf.sync([crit, low1, low2])
        views = {v.workload_id for v in enf.governor.snapshot().workloads}
        assert views == {crit.workload_id, low1.workload_id, low2.workload_id}
        wait_for(lambda: frozen(low1_group) and frozen(low2_group), "both low pods to freeze")
        assert not frozen(crit_group)
        wait_for(
            lambda: any(e.workload_id == low2.workload_id for e in enf.events.since()),
            "the squeezed pod's paused event",
        )
        paused = [e for e in enf.events.since() if e.workload_id == low2.workload_id]
        assert paused[0].message == f"paused: squeezed by default/crit, which is busy on {GPU}"

        backend.busy = {low1_pid, low2_pid}  # the squeezer goes idle: both run (in turns)
        wait_for(lambda: not frozen(low1_group) or not frozen(low2_group), "a low pod to thaw")
        wait_for(
            lambda: (
                enf.governor.snapshot().workloads
                and all(
                    v.state != "frozen-by-priority"
                    for v in enf.governor.snapshot().workloads
                    if v.workload_id != crit.workload_id
                )
            ),
            "neither low pod held by priority",
        )
    finally:
        enf.close()
    for group in (crit_group, low1_group, low2_group):
        assert not frozen(group)


def test_close_thaws_a_paused_pod_and_a_removed_pod_is_thawed(kubelet: Kubelet) -> None:
    backend = Backend()
    critical, _, critical_pid = kubelet.pod("critical")
    low, low_group, low_pid = kubelet.pod("low")
    backend.busy = {critical_pid, low_pid}
    enf = enforcer(kubelet, backend)
    enf.start()
    try:
        enf.sync([with_priority(critical, 125), with_priority(low, 40)])
        wait_for(lambda: frozen(low_group), "the low pod's cgroup to freeze")
        enf.sync([with_priority(low, 40)])  # the critical pod is gone
        wait_for(lambda: not frozen(low_group), "the low pod's cgroup to thaw")
        enf.sync([with_priority(critical, 125), with_priority(low, 40)])
        wait_for(lambda: frozen(low_group), "the low pod's cgroup to freeze again")
    finally:
        enf.close()
    assert freeze_file(low_group) == "0"
    assert not frozen(low_group)


def test_a_new_agent_thaws_a_pod_left_frozen_and_moves_nothing(kubelet: Kubelet) -> None:
    left, left_group, left_pid = kubelet.pod("left", qos="besteffort")
    other, other_group, _ = kubelet.pod("other", qos="burstable")
    (left_group / "cgroup.freeze").write_text("1")  # an agent died holding it frozen
    wait_for(lambda: frozen(left_group), "the test's own freeze")
    enf = enforcer(kubelet, Backend())
    try:
        thawed = enf.start()
        assert thawed == [left_group]
        assert freeze_file(left_group) == "0"
        wait_for(lambda: not frozen(left_group), "the thaw")
        assert freeze_file(other_group) == "0"
        assert cgroup_pids(left_group) == [left_pid]
        with open(f"/proc/{left_pid}/stat") as stat:
            assert stat.read().rsplit(")", 1)[1].split()[0] in "SR"
        enf.sync([left, other])  # pods without NVML activity are idle: nobody is paused
    finally:
        enf.close()
    assert not frozen(left_group)
    assert not frozen(other_group)
    os.kill(left_pid, signal.SIGKILL)  # the fixture reaps it


def test_a_pod_without_a_cgroup_or_on_another_gpu_is_not_governed(kubelet: Kubelet) -> None:
    enf = enforcer(kubelet, Backend())
    present, group, _ = kubelet.pod("present")
    missing = placed("missing", str(uuid.uuid4()))
    elsewhere = PlacedContainer(
        "default/elsewhere",
        present.uid,
        wire.Assignment(
            node="n",
            uuids=("GPU-other",),
            gpus=(1,),
            gpu_milli=(500,),
            gpu_memory_mib=(1024,),
            cpu_milli=0,
            memory_mib=0,
        ),
    )
    try:
        enf.sync([present, missing, elsewhere])
        ids = [w.workload_id for w in enf.governor.snapshot().workloads]
        assert ids == ["default/present"]
        assert enf.freezer.path(pod_handle("default/present")) == group
    finally:
        enf.close()


# -- the command line -----------------------------------------------------------------------------


def node_agent(*args: str) -> tuple[int, str]:
    from typer.testing import CliRunner

    from fgpu.cli import app

    base = ["k8s", "node-agent", "--node", "n", "--server", "http://127.0.0.1:9"]
    result = CliRunner().invoke(app, [*base, "--simulate-gpus", "1xA100-40GB", *args])
    return result.exit_code, result.output


def test_enforce_fails_clearly_where_cgroup_v2_is_not_usable(tmp_path: Path) -> None:
    code, output = node_agent("--enforce", "--cgroup-root", str(tmp_path))
    assert code == 2
    assert "--enforce: cgroup v2 not usable" in output
    assert "is not a cgroup v2 directory" in output


def test_unknown_policies_are_refused() -> None:
    code, output = node_agent("--compute-mode", "greedy")
    assert code == 2
    assert "--compute-mode is fair or strict" in output


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("lots", "is not a size (e.g. 64GiB), a percentage of the RAM (25%) or 0"),
        ("150%", "is not a percentage of the RAM in 0..100%"),
        ("1000000GiB", "is more than this machine's"),
    ],
)
def test_a_bad_suspend_budget_is_refused_naming_the_flag(value: str, why: str) -> None:
    code, output = node_agent("--suspend-host-memory", value)
    assert code == 2
    assert f"--suspend-host-memory: {value!r}" in output
    assert why in " ".join(output.split())


def test_a_cgroup_root_without_kubepods_is_named_in_the_error(tmp_path: Path) -> None:
    (tmp_path / "cgroup.procs").touch()  # like the mount's root cgroup: no cgroup.freeze
    with pytest.raises(OSError, match="no kubepods cgroup under"):
        PodCgroupFreezer(tmp_path)
