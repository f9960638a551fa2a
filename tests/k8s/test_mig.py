"""MIG instances for Kubernetes pods (``fgpu.io/mig-profile``): the real scheduler and node
agent against the API (stand-in, or a real cluster with KUBECONFIG), the agent's GPUs
simulated in MIG mode (``SimulatedBackend("...:mig")``)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from fgpu.agent.backend import SimulatedBackend
from fgpu.k8s import wire
from fgpu.k8s.agent import NodeAgent, PlacedContainer
from fgpu.k8s.kube import MERGE_PATCH, KubeError
from fgpu.k8s.objects import PodRequestError, node_info, pod_ask
from fgpu.k8s.podcgroup import pod_handle
from fgpu.k8s.scheduler import K8sScheduler
from fgpu.k8s.webhook_app import create_app
from fgpu.mig.catalog import mig_profiles
from fgpu.mig.device import SimulatedMigDevice
from fgpu.mig.layout import is_valid, make_layout
from fgpu.rules.errors import BadRequest
from fgpu.rules.requests import parse_submission
from fgpu.wire import SubmitRequest
from tests.k8s.conftest import Cluster, Served, fgpu_admission
from tests.k8s.kube import (
    add_node,
    assignment,
    bound,
    create,
    events,
    pod,
    pods,
    wait_until,
)
from tests.k8s.podtree import GPU, Backend, Kubelet, frozen, placed, with_priority
from tests.k8s.test_agent import bare_node
from tests.k8s.test_enforce import enforcer

pytestmark = pytest.mark.k8s

A100 = mig_profiles("A100-80GB")


def mig_node(cluster: Cluster, name: str, spec: str = "1xA100-80GB:mig") -> NodeAgent:
    """A Ready node whose agent (not started) has ``spec``'s simulated GPUs, published."""
    bare_node(cluster, name)
    agent = NodeAgent(cluster.agent_api(name), name, SimulatedBackend(spec))
    agent.publish()
    return agent


def device(agent: NodeAgent, number: int = 0) -> SimulatedMigDevice:
    found = list(agent.mig.values())[number]
    assert isinstance(found, SimulatedMigDevice)
    return found


def mig_pod(name: str, profile: str, **annotations: str) -> dict[str, Any]:
    return pod(name, None, mig_profile=profile, **annotations)


def condition(cluster: Cluster, name: str) -> str:
    got = cluster.api.get_pod(cluster.namespace, name)
    for c in (got.get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled":
            return str(c.get("message", ""))
    return ""


def node_notes(cluster: Cluster, name: str) -> dict[str, str]:
    return wire.annotations_of(cluster.api.get_node(name))


def env(cluster: Cluster, p: dict[str, Any]) -> dict[str, str]:
    cm = p["metadata"]["annotations"][wire.ENV_CONFIGMAP]
    data: dict[str, str] = cluster.api.get_config_map(cluster.namespace, cm)["data"]
    return data


def round_(scheduler: K8sScheduler) -> None:
    scheduler.sync()
    scheduler.run_once()


# ------------------------------------------------------------------ admission


MIG_BAD = [
    pytest.param({"mig_profile": "3g.40gb", "gpu_memory": "5Gi"}, "mig_profile", id="with-mem"),
    pytest.param({"mig_profile": "3g.40gb", "gpu_model": "A100-80GB"}, "gpu_model", id="model"),
    pytest.param({"mig_profile": "  "}, "mig_profile", id="empty"),
    pytest.param({"mig_profile": "3g.40gb\x1b[2J"}, "mig_profile", id="control-char"),
]


@pytest.mark.parametrize(("fields", "api_field"), MIG_BAD)
def test_bad_mig_annotations_get_the_cli_and_api_reason(fields, api_field) -> None:
    api_fields = {k: [v] if k == "gpu_model" else v for k, v in fields.items()}
    with pytest.raises(BadRequest) as api:
        parse_submission(SubmitRequest(command=["true"], **api_fields))
    assert api.value.field == api_field
    body = pod("p", None)
    body["metadata"]["annotations"] = {
        f"fgpu.io/{k.replace('_', '-')}": v for k, v in fields.items()
    }
    with pytest.raises(PodRequestError) as k8s:
        pod_ask(body)
    assert (
        k8s.value.field == {"mig_profile": wire.MIG_PROFILE, "gpu_model": wire.GPU_MODEL}[api_field]
    )
    assert k8s.value.reason == api.value.reason


def test_a_mig_pod_asks_for_its_profile_and_its_containers_cpu_and_memory() -> None:
    ask = pod_ask(mig_pod("m", "3G.40GB", priority="high"))
    assert ask.mig_profile == "3g.40gb"
    assert (ask.request.gpu_count, ask.request.cpu_milli, ask.request.memory_mib) == (0, 100, 128)
    assert ask.priority == 100
    with pytest.raises(PodRequestError) as err:
        pod_ask(mig_pod("m", "3g.40gb", gpu_count="2"))
    assert err.value.field == wire.MIG_PROFILE
    assert "cannot be combined" in err.value.reason


def test_bad_mig_profiles_are_refused_at_admission_with_field_and_reason(make_cluster) -> None:
    with Served(create_app(env_without_isolation=True)) as webhook:
        cluster = make_cluster(admission=fgpu_admission(webhook.url))
        if cluster.real:
            pytest.skip("a real cluster calls the webhook through its own configuration")
        with pytest.raises(KubeError) as unknown:
            create(cluster, mig_pod("unknown", "5g.50gb"), admit=False)
        with pytest.raises(KubeError) as mixed:
            create(cluster, pod("mixed", "0.5", mig_profile="3g.40gb"), admit=False)
        elsewhere = create(cluster, mig_pod("elsewhere", "1g.6gb"), admit=False)
    assert unknown.value.status == 422
    assert (
        "fgpu.io/mig-profile: '5g.50gb' is not a MIG profile of any GPU model fgpu knows; "
        "valid: A30: 1g.6gb," in unknown.value.message
    )
    assert "A100-80GB: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb" in unknown.value.message
    assert (
        "fgpu.io/mig-profile: --mig-profile cannot be combined with -g or --gpu-memory"
        in mixed.value.message
    )
    # a profile of a model no node has yet is admitted (nodes may join) and waits, saying why
    assert elsewhere["spec"]["schedulerName"] == "fgpu"
    mig_node(cluster, "mig-a")
    round_(K8sScheduler(cluster.scheduler_api, env_without_isolation=True))
    assert condition(cluster, "elsewhere") == (
        "no node has a MIG GPU with profile 1g.6gb (a profile of A30; MIG GPU models in "
        "the cluster: A100-80GB); the pod waits for such a node"
    )
    assert wire.MIG_REQUEST not in node_notes(cluster, "mig-a")


# ------------------------------------------------------------------ agent


def test_the_agent_publishes_mig_gpus_and_the_core_never_shares_them(cluster) -> None:
    agent = mig_node(cluster, "mixed", "1xA100-80GB,1xA100-80GB:mig")
    device(agent).create("3g.40gb", 4)
    agent.publish()
    node = cluster.api.get_node("mixed")
    inventory = wire.Inventory.from_json(node["metadata"]["annotations"][wire.INVENTORY])
    shared, mig = inventory.gpus
    assert shared.mig is None
    assert mig.mig == (wire.InventoryMigInstance(device(agent).instances()[0].uuid, "3g.40gb", 4),)
    info = node_info(node)
    assert info is not None
    assert info.uuids == (shared.uuid,)
    create(cluster, pod("whole", "1"))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(scheduler)
    assert assignment(cluster.api.get_pod(cluster.namespace, "whole")).uuids == (shared.uuid,)
    create(cluster, pod("half", "0.5"))
    round_(scheduler)
    assert not cluster.api.get_pod(cluster.namespace, "half")["spec"].get("nodeName")
    assert "0/1 nodes fit: 1 insufficient GPU" in condition(cluster, "half")


def test_the_agent_applies_a_request_once_and_reports_what_it_could_not_do(cluster) -> None:
    agent = mig_node(cluster, "mig-a", "2xA100-80GB:mig")
    first, second = agent.devices
    request = wire.MigLayoutRequest(
        1, {first.uuid: (("3g.40gb", 4), ("4g.40gb", 0)), second.uuid: (("9g.90gb", 0),)}
    )
    cluster.api.patch_node(
        "mig-a", {"metadata": {"annotations": {wire.MIG_REQUEST: request.to_json()}}}
    )
    status = agent.reconcile_mig()
    assert status is not None
    assert status.generation == 1
    assert status.errors == {second.uuid: "'9g.90gb' is not a MIG profile of A100-80GB"}
    assert [(i.profile, i.start) for i in device(agent).instances()] == [
        ("4g.40gb", 0),
        ("3g.40gb", 4),
    ]
    notes = node_notes(cluster, "mig-a")
    assert wire.MIG_STATUS in notes
    published = wire.Inventory.from_json(notes[wire.INVENTORY]).gpus[0].mig
    assert published is not None
    assert {i.uuid for i in published} == {i.uuid for i in device(agent).instances()}
    made = device(agent).log[:]
    assert agent.reconcile_mig() is None  # handled: nothing to do again
    assert device(agent).log == made


def test_instances_made_outside_fgpu_are_published_at_the_next_report(cluster) -> None:
    agent = mig_node(cluster, "mig-a")
    made = device(agent).create("2g.20gb", 2)  # e.g. `fgpu mig apply` on the node
    before = node_notes(cluster, "mig-a")[wire.INVENTORY]
    agent.report()
    after = wire.Inventory.from_json(node_notes(cluster, "mig-a")[wire.INVENTORY])
    assert after.to_json() != before
    assert after.gpus[0].mig == (wire.InventoryMigInstance(made.uuid, "2g.20gb", 2),)


# ------------------------------------------------------------------ scheduling


def test_a_mig_pod_binds_to_a_free_instance_and_its_configmap_names_the_instance(
    cluster,
) -> None:
    agent = mig_node(cluster, "mig-a")
    instance = device(agent).create("3g.40gb", 4)
    agent.publish()
    create(cluster, mig_pod("m", "3g.40gb"))
    round_(K8sScheduler(cluster.scheduler_api, env_without_isolation=True))
    got = cluster.api.get_pod(cluster.namespace, "m")
    assert got["spec"]["nodeName"] == "mig-a"
    a = assignment(got)
    assert a.uuids == (instance.uuid,)
    assert a.mig == wire.MigHeld(agent.devices[0].uuid, "3g.40gb", 4)
    assert (a.gpu_milli, a.gpu_memory_mib) == ((428,), (A100.get("3g.40gb").memory_mib,))
    assert (a.cpu_milli, a.memory_mib) == (100, 128)
    data = env(cluster, got)
    assert data["NVIDIA_VISIBLE_DEVICES"] == instance.uuid
    assert data["CUDA_VISIBLE_DEVICES"] == instance.uuid
    assert instance.uuid.startswith("MIG-")
    assert data["FGPU_GPU_COMPUTE_MILLI"] == "428"
    assert data["FGPU_GPU_MEMORY_MIB"] == str(A100.get("3g.40gb").memory_mib)
    assert got["metadata"]["annotations"][wire.GPU_UUIDS] == instance.uuid
    assert wire.MIG_REQUEST not in node_notes(cluster, "mig-a")  # nothing to reconfigure


def test_two_pods_never_get_the_same_instance(cluster) -> None:
    agent = mig_node(cluster, "mig-a")
    made = [device(agent).create("1g.10gb", s) for s in (5, 6)]
    agent.publish()
    for i in range(4):
        create(cluster, mig_pod(f"m-{i}", "1g.10gb"))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    scheduler.sync()
    scheduler.run_once()
    scheduler.run_once()  # before the watch (none runs) shows the binds: they are assumed
    placed = bound(cluster)
    assert Counter(assignment(p).uuids[0] for p in placed) == {m.uuid: 1 for m in made}
    round_(scheduler)
    round_(
        K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    )  # a new scheduler reads them back from the pods
    assert len(bound(cluster)) == 2
    waiting = [p["metadata"]["name"] for p in pods(cluster) if not p["spec"].get("nodeName")]
    assert len(waiting) == 2
    for name in waiting:
        assert condition(cluster, name).startswith("no free MIG instance of 1g.10gb")
    assert wire.MIG_REQUEST not in node_notes(cluster, "mig-a")  # its GPU has holders


def test_mig_pods_bind_with_the_scheduler_and_the_agent_running(cluster) -> None:
    agent = mig_node(cluster, "mig-a", "2xA100-80GB:mig")
    # they fill both GPUs exactly, so they must be planned together (a GPU with an
    # instance held is never changed): all are there before the scheduler's first round
    profiles = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb", "4g.40gb"]
    for i, profile in enumerate(profiles):
        create(cluster, mig_pod(f"m-{i}", profile))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    scheduler.start(tick_s=0.5)
    runner = threading.Thread(target=agent.run, args=(0.1,), daemon=True)
    runner.start()
    try:
        wait_until(lambda: len(bound(cluster)) == len(profiles), "every MIG pod bound")
    finally:
        scheduler.stop()
        agent.stop()
        runner.join(timeout=30)
    placed = bound(cluster)
    uuids = [assignment(p).uuids[0] for p in placed]
    assert len(set(uuids)) == len(uuids)
    instances = {i.uuid: (d, i) for d in agent.mig.values() for i in d.instances()}
    for p in placed:
        a = assignment(p)
        d, i = instances[a.uuids[0]]
        assert a.mig is not None
        assert (a.mig.profile, a.mig.start) == (i.profile, i.start)
        assert a.mig.profile == p["metadata"]["annotations"][wire.MIG_PROFILE]
        assert env(cluster, p)["NVIDIA_VISIBLE_DEVICES"] == i.uuid
    for d in agent.mig.values():
        assert is_valid(d.profiles(), make_layout(i.placement for i in d.instances()))


def test_an_idle_gpu_is_reconfigured_through_the_node_and_the_agent_then_the_pod_binds(
    cluster,
) -> None:
    agent = mig_node(cluster, "mig-a")
    gpu = agent.devices[0].uuid
    device(agent).create("1g.10gb", 6)  # idle, and in the way of 4g@0 + 3g@4
    agent.publish()
    create(cluster, mig_pod("big", "4g.40gb"))
    create(cluster, mig_pod("mid", "3g.40gb"))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(scheduler)
    request = wire.MigLayoutRequest.from_json(node_notes(cluster, "mig-a")[wire.MIG_REQUEST])
    assert request.generation == 1
    assert dict(request.gpus) == {gpu: (("4g.40gb", 0), ("3g.40gb", 4))}
    assert bound(cluster) == []
    assert condition(cluster, "big").startswith(
        f"waiting for MIG GPU {gpu} (GPU 0 of node mig-a) to be reconfigured to "
        "4g.40gb@0, 3g.40gb@4"
    )
    round_(scheduler)  # the request is pending: the pods wait for it, nothing new is asked
    again = wire.MigLayoutRequest.from_json(node_notes(cluster, "mig-a")[wire.MIG_REQUEST])
    assert again == request
    assert "(request generation 1, not yet applied by the node agent)" in condition(cluster, "mid")
    said = lambda: [  # noqa: E731
        e for e in events(cluster, "FailedScheduling") if e["involvedObject"]["name"] == "mid"
    ]
    assert len(said()) == 2  # planned, then waiting for the agent
    round_(scheduler)
    assert len(said()) == 2  # the same reason is not said again
    status = agent.reconcile_mig()
    assert status == wire.MigLayoutStatus(1, {}, status.time)
    made = {i.profile: i.uuid for i in device(agent).instances()}
    assert set(made) == {"4g.40gb", "3g.40gb"}  # the idle 1g.10gb went
    round_(scheduler)
    for name, profile in (("big", "4g.40gb"), ("mid", "3g.40gb")):
        assert assignment(cluster.api.get_pod(cluster.namespace, name)).uuids == (made[profile],)


def test_a_gpu_with_an_instance_held_is_never_reconfigured(cluster) -> None:
    agent = mig_node(cluster, "mig-a")
    gpu = agent.devices[0].uuid
    small = device(agent).create("1g.10gb", 0)
    agent.publish()
    create(cluster, mig_pod("small", "1g.10gb"))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(scheduler)
    assert assignment(cluster.api.get_pod(cluster.namespace, "small")).uuids == (small.uuid,)
    create(cluster, mig_pod("whole", "7g.80gb"))
    create(cluster, mig_pod("next", "3g.40gb"))  # would fit beside it: still not made
    round_(scheduler)
    round_(scheduler)
    assert wire.MIG_REQUEST not in node_notes(cluster, "mig-a")
    for name in ("whole", "next"):
        assert "(GPU 0 of mig-a) are not reconfigured" in condition(cluster, name)
    # the agent refuses too, whoever asks
    cluster.api.patch_node(
        "mig-a",
        {
            "metadata": {
                "annotations": {
                    wire.MIG_REQUEST: wire.MigLayoutRequest(1, {gpu: (("7g.80gb", 0),)}).to_json()
                }
            }
        },
    )
    agent.report()
    status = wire.MigLayoutStatus.from_json(node_notes(cluster, "mig-a")[wire.MIG_STATUS])
    assert status.errors == {
        gpu: f"pods hold instances of it ({cluster.namespace}/small); a GPU with instances held "
        "is never reconfigured"
    }
    assert device(agent).instances() == [small]
    # a simulated agent that restarts has lost its instances (as a GPU reset would): the pod
    # still holds its GPU by its assignment, so nothing is reconfigured there either
    again = NodeAgent(cluster.agent_api("mig-a"), "mig-a", SimulatedBackend("1xA100-80GB:mig"))
    again.publish()
    assert device(again).instances() == []
    round_(
        K8sScheduler(
            cluster.scheduler_api, env_without_isolation=True, clock=lambda: time.time() + 120
        )
    )  # past the refusal
    assert wire.MigLayoutRequest.from_json(
        node_notes(cluster, "mig-a")[wire.MIG_REQUEST]
    ) == wire.MigLayoutRequest(1, {gpu: (("7g.80gb", 0),)})  # only the test's own


def test_an_instance_in_use_outside_fgpu_stops_the_change_and_is_retried_later(cluster) -> None:
    agent = mig_node(cluster, "mig-a")
    gpu = agent.devices[0].uuid
    busy = device(agent).create("1g.10gb", 0)
    device(agent).set_in_use(busy.uuid)  # processes fgpu does not know of
    agent.publish()
    create(cluster, mig_pod("whole", "7g.80gb"))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(scheduler)
    status = agent.reconcile_mig()
    assert status is not None
    assert "1g.10gb@0 is in use now; it will not be destroyed" in status.errors[gpu]
    round_(scheduler)
    reason = condition(cluster, "whole")
    assert "the node agent of mig-a could not change GPU 0" in reason
    assert "is in use now" in reason
    assert (
        wire.MigLayoutRequest.from_json(node_notes(cluster, "mig-a")[wire.MIG_REQUEST]).generation
        == 1
    )  # not asked again at once
    later = K8sScheduler(
        cluster.scheduler_api, env_without_isolation=True, clock=lambda: time.time() + 120
    )
    device(agent).set_in_use(busy.uuid, False)
    round_(later)
    assert (
        wire.MigLayoutRequest.from_json(node_notes(cluster, "mig-a")[wire.MIG_REQUEST]).generation
        == 2
    )
    agent.reconcile_mig()
    round_(later)
    assert assignment(cluster.api.get_pod(cluster.namespace, "whole")).mig == wire.MigHeld(
        gpu, "7g.80gb", 0
    )


def test_deleting_a_mig_pod_frees_its_instance_even_when_the_scheduler_was_down(
    cluster,
) -> None:
    agent = mig_node(cluster, "mig-a")
    whole = device(agent).create("7g.80gb", 0)
    agent.publish()
    create(cluster, mig_pod("first", "7g.80gb"))
    first = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(first)
    create(cluster, mig_pod("second", "7g.80gb"))
    round_(first)
    assert not cluster.api.get_pod(cluster.namespace, "second")["spec"].get("nodeName")
    del first  # the scheduler is gone; the pod is deleted meanwhile
    cluster.api.delete_pod(cluster.namespace, "first", grace_s=0)
    round_(K8sScheduler(cluster.scheduler_api, env_without_isolation=True))
    assert assignment(cluster.api.get_pod(cluster.namespace, "second")).uuids == (whole.uuid,)


def test_mig_pods_go_only_where_their_node_selector_and_taints_allow(cluster) -> None:
    a = mig_node(cluster, "mig-a")
    b = mig_node(cluster, "mig-b")
    c = mig_node(cluster, "mig-c")
    for agent, zone in ((a, "1"), (b, "2"), (c, "2")):
        device(agent).create("3g.40gb", 4)  # a free instance everywhere
        agent.publish()
        cluster.api.patch_node(agent.node, {"metadata": {"labels": {"zone": zone}}})
    cluster.api._call(
        cluster.api.core.patch_node,
        "mig-b",
        {"spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]}},
        _content_type=MERGE_PATCH,
    )
    picky = mig_pod("picky", "3g.40gb")
    picky["spec"]["nodeSelector"] = {"zone": "2"}
    create(cluster, picky)
    wide = mig_pod("wide", "4g.40gb")  # needs a change: only on a node it may use
    wide["spec"]["nodeSelector"] = {"zone": "2"}
    create(cluster, wide)
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(scheduler)
    got = cluster.api.get_pod(cluster.namespace, "picky")
    assert got["spec"]["nodeName"] == "mig-c"  # mig-a: other zone; mig-b: tainted
    assert assignment(got).uuids == (device(c).instances()[0].uuid,)
    for node in ("mig-a", "mig-b", "mig-c"):
        assert wire.MIG_REQUEST not in node_notes(cluster, node)  # mig-c's GPU is held now
    reason = condition(cluster, "wide")
    assert reason.startswith(
        "no free MIG instance of 4g.40gb on the nodes the pod's node selector, affinity and "
        "tolerations allow (1 did not match the pod's node selector or affinity, 1 has the "
        "untolerated taint dedicated=x:NoSchedule)"
    )
    cluster.api.patch_node("mig-a", {"metadata": {"labels": {"zone": "2"}}})
    round_(scheduler)
    request = wire.MigLayoutRequest.from_json(node_notes(cluster, "mig-a")[wire.MIG_REQUEST])
    assert dict(request.gpus) == {a.devices[0].uuid: (("4g.40gb", 0), ("3g.40gb", 4))}
    assert wire.MIG_REQUEST not in node_notes(cluster, "mig-b")


def test_a_deletion_seen_through_the_watch_frees_the_instance(cluster) -> None:
    agent = mig_node(cluster, "mig-a")
    whole = device(agent).create("7g.80gb", 0)
    agent.publish()
    create(cluster, mig_pod("first", "7g.80gb"))
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    scheduler.start(tick_s=0.5)
    try:
        wait_until(lambda: len(bound(cluster)) == 1, "first bound")
        create(cluster, mig_pod("second", "7g.80gb"))
        wait_until(lambda: "no free MIG instance" in condition(cluster, "second"), "second waits")
        cluster.api.delete_pod(cluster.namespace, "first", grace_s=0)
        wait_until(
            lambda: bool(cluster.api.get_pod(cluster.namespace, "second")["spec"].get("nodeName")),
            "second bound after first was deleted",
        )
    finally:
        scheduler.stop()
    assert assignment(cluster.api.get_pod(cluster.namespace, "second")).uuids == (whole.uuid,)


def test_a_restarted_scheduler_rebuilds_the_same_mig_state(cluster) -> None:
    agent = mig_node(cluster, "mig-a", "2xA100-80GB:mig")
    add_node(cluster, "shared-a", gpus=2)
    for start in (0, 4):
        device(agent, 0).create("3g.40gb", start)
    agent.publish()
    for i in range(2):
        create(cluster, mig_pod(f"m-{i}", "3g.40gb"))
    create(cluster, pod("frac", "0.5"))
    first = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    round_(first)
    assert len(bound(cluster)) == 3
    create(cluster, mig_pod("waits", "2g.20gb"))  # makes a request for the idle GPU 1
    round_(first)
    assert wire.MIG_REQUEST in node_notes(cluster, "mig-a")
    first.sync()
    rnd_a, dec_a = first.plan()
    second = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    second.sync()
    rnd_b, dec_b = second.plan()
    assert rnd_a.mig == rnd_b.mig
    assert rnd_a.mig is not None
    assert list(rnd_a.mig.waits) == [f"{cluster.namespace}/waits"]
    assert rnd_a.mig.writes == []
    assert dec_a.allocated == dec_b.allocated
    assert dec_a.fair_share == dec_b.fair_share
    # the MIG pods hold their instances in the queues' accounting: 2 x 428 plus 500
    assert dec_b.allocated["default"].gpu_milli == 2 * 428 + 500
    key = lambda w: (w.id, w.allocation, w.request, w.queue)  # noqa: E731
    assert sorted(map(key, rnd_a.others)) == sorted(map(key, rnd_b.others))
    assert {w.id for w in rnd_b.others} == {f"{cluster.namespace}/m-{i}" for i in range(2)}
    first.check_state(rnd_a)


def test_a_queue_limit_counts_mig_instances(cluster) -> None:
    cluster.api.create_queue(
        {
            "apiVersion": "fgpu.io/v1alpha1",
            "kind": "Queue",
            "metadata": {"name": "team-a"},
            "spec": {"quota": 0, "limit": 1},
        }
    )
    agent = mig_node(cluster, "mig-a")
    add_node(cluster, "shared-a", gpus=2)
    for start in (0, 4):
        device(agent).create("3g.40gb", start)
    agent.publish()
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    create(cluster, pod("frac", "0.5", queue="team-a"))
    round_(scheduler)
    create(cluster, mig_pod("mig-1", "3g.40gb", queue="team-a"))
    round_(scheduler)
    assert {p["metadata"]["name"] for p in bound(cluster)} == {"frac", "mig-1"}  # 928
    create(cluster, mig_pod("mig-2", "3g.40gb", queue="team-a"))
    create(cluster, pod("frac-2", "0.1", queue="team-a"))
    round_(scheduler)
    assert {p["metadata"]["name"] for p in bound(cluster)} == {"frac", "mig-1"}
    assert condition(cluster, "mig-2") == ("queue team-a would exceed its limit (1.356 > 1.0 GPUs)")
    assert "queue team-a would exceed its limit" in condition(cluster, "frac-2")
    cluster.api.delete_pod(cluster.namespace, "mig-1", grace_s=0)
    round_(scheduler)  # the core's round goes first: frac-2 takes 100 of the room
    assert {p["metadata"]["name"] for p in bound(cluster)} == {"frac", "frac-2"}
    assert condition(cluster, "mig-2") == ("queue team-a would exceed its limit (1.028 > 1.0 GPUs)")
    cluster.api.delete_pod(cluster.namespace, "frac-2", grace_s=0)
    round_(scheduler)
    assert {p["metadata"]["name"] for p in bound(cluster)} == {"frac", "mig-2"}


# ------------------------------------------------------------------ enforcement


def test_the_governor_never_time_slices_or_guards_a_mig_pod(kubelet: Kubelet) -> None:
    """The assignment's ``mig`` decides, not the accident that an instance's uuid is not
    one of the agent's GPU uuids: the MIG pod here names the governed GPU itself."""
    critical, _, critical_pid = kubelet.pod("critical")
    mig, mig_group, mig_pid = kubelet.pod("mig", qos="besteffort")
    a = placed("mig", mig.uid, priority=40).assignment
    mig = PlacedContainer(
        mig.workload_id,
        mig.uid,
        wire.Assignment(
            node=a.node,
            uuids=a.uuids,
            gpus=a.gpus,
            gpu_milli=(428,),
            gpu_memory_mib=(40192,),
            cpu_milli=0,
            memory_mib=0,
            priority=40,
            mig=wire.MigHeld(GPU, "3g.40gb", 4),
        ),
    )
    critical = with_priority(critical, 125)
    enf = enforcer(kubelet, Backend(busy={critical_pid, mig_pid}))
    enf.start()
    try:
        enf.sync([critical, mig])
        assert [w.workload_id for w in enf.governor.snapshot().workloads] == [critical.workload_id]
        assert enf.freezer.path(pod_handle(mig.workload_id)) is None  # never even bound
    finally:
        enf.close()
    assert not frozen(mig_group)


def test_a_batch_seen_over_two_rounds_gets_every_instance_two_gpus_can_hold(cluster) -> None:
    # 14 x 1g.10gb fit two A100s (7 each). The first round sees 5 of them; the GPU it
    # reconfigures is filled with 1g.10gb instances, so that the 9 seen later find 2 free
    # there (a GPU holding pods is never changed again) and 7 on the other GPU.
    agent = mig_node(cluster, "mig-a", "2xA100-80GB:mig")
    scheduler = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    for i in range(5):
        create(cluster, mig_pod(f"early-{i}", "1g.10gb"))
    round_(scheduler)
    request = wire.MigLayoutRequest.from_json(node_notes(cluster, "mig-a")[wire.MIG_REQUEST])
    (layout,) = request.gpus.values()
    assert [p for p, _ in layout] == ["1g.10gb"] * 7
    agent.reconcile_mig()
    round_(scheduler)
    assert len(bound(cluster)) == 5
    for i in range(9):
        create(cluster, mig_pod(f"late-{i}", "1g.10gb"))
    round_(scheduler)  # 2 bind on the first GPU, 7 wait for the second
    agent.reconcile_mig()
    round_(scheduler)
    placed = bound(cluster)
    assert len(placed) == 14
    assert len({assignment(p).uuids[0] for p in placed}) == 14
