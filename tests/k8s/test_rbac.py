"""Least privilege, derived: each component runs its real code paths against the stand-in
as its own service account, with the stand-in enforcing deploy/'s RBAC (403 for what it does
not grant, Kubernetes 1.36's ``resourceclaims/binding`` rule for claim status writes) and
recording every request; what each account called must be exactly what deploy/ grants it.

Also: a write the API server keeps refusing shows on the pod (one event per cause with a
count, the ``PodScheduled`` condition, ``kubectl describe``) and in a metric."""

from __future__ import annotations

import copy
import itertools
import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fgpu.agent.backend import SimulatedBackend
from fgpu.agent.checkpoint import CheckpointDriver
from fgpu.agent.memguard import MemoryPolicy
from fgpu.k8s import claims, wire
from fgpu.k8s.acting import TEMPLATE_RECHECK_S
from fgpu.k8s.agent import NodeAgent, PlacedContainer
from fgpu.k8s.dra import cdi
from fgpu.k8s.dra.driver import DraDriver
from fgpu.k8s.dra.node import publish_nothing
from fgpu.k8s.dra.share import DRIVER, GpuShare, device_name
from fgpu.k8s.dra.slices import SlicePublisher, resource_slice, slice_name
from fgpu.k8s.enforce import GovernorEnforcer
from fgpu.k8s.kube import KubeApi, KubeError, api_client
from fgpu.k8s.leader import LeaseElector
from fgpu.k8s.podcgroup import PodCgroupFreezer
from fgpu.k8s.refusals import CONDITION_REASON, REASON, SERIES_PATCH_S, fix_for
from fgpu.k8s.resourceapi import ResourceApi
from fgpu.k8s.scheduler import K8sScheduler
from fgpu.k8s.suspend import PodSuspender, Suspensions
from fgpu.k8s.webhook import mutate
from fgpu.k8s.webhook_app import KubeLookup, create_app
from fgpu.mig.device import SimulatedMigDevice
from fgpu_standin.kubelet import KubeletStandIn
from fgpu_standin.patch import json_patch
from fgpu_standin.rbac import Rbac
from tests.k8s.conftest import DEPLOY, Cluster, Served, fgpu_admission
from tests.k8s.kube import add_node, ensure_ceiling_class, gpu_uuid, pod, wait_until
from tests.k8s.podtree import GPU, Backend, Kubelet, placed
from tests.k8s.test_agent import bare_node
from tests.k8s.test_dra_driver import NODE, Node, claimed_pod
from tests.k8s.test_dra_driver import inventory as driver_inventory
from tests.k8s.test_dra_scheduler import claim_of, inventory_of
from tests.k8s.test_slices import publish_where_sharing_is_dropped

pytestmark = pytest.mark.k8s

SYSTEM = "fgpu-system"
Permission = tuple[str, str, str]  # (API group, resource[/subresource], verb)


def account(name: str) -> str:
    return f"system:serviceaccount:{SYSTEM}:{name}"


def rbac_objects(component: str | None = None) -> list[dict[str, Any]]:
    """deploy/base/rbac.yaml, with ``component``'s patches of its roles applied (as
    kustomize applies a component's JSON 6902 patches)."""
    objects = [d for d in yaml.safe_load_all((DEPLOY / "base" / "rbac.yaml").read_text()) if d]
    if component is None:
        return objects
    kustomization = yaml.safe_load(
        (DEPLOY / "components" / component / "kustomization.yaml").read_text()
    )
    for patch in kustomization.get("patches") or []:
        target = patch["target"]
        for i, obj in enumerate(objects):
            if (obj["kind"], obj["metadata"]["name"]) == (target["kind"], target["name"]):
                objects[i] = json_patch(obj, yaml.safe_load(patch["patch"]))
    return objects


def granted(objects: list[dict[str, Any]], name: str) -> set[Permission]:
    """Every (group, resource, verb) the roles bound to service account ``name`` name."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects if "rules" in o}
    out: set[Permission] = set()
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(
            s["kind"] == "ServiceAccount" and (s["name"], s.get("namespace")) == (name, SYSTEM)
            for s in binding["subjects"]
        ):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role["rules"]:
            out.update(itertools.product(rule["apiGroups"], rule["resources"], rule["verbs"]))
    return out


def used(cluster: Cluster, name: str) -> set[Permission]:
    """What service account ``name`` asked of the stand-in (requests and the 1.36 check)."""
    assert cluster.standin is not None
    return {a.permission for a in cluster.standin.api.requests if a.user == account(name)}


def as_account(cluster: Cluster, name: str, **extra: str) -> KubeApi:
    """The API as service account ``name`` (the stand-in trusts impersonation), with user
    extras such as the node name a pod-bound token carries."""
    assert cluster.standin is not None
    client = api_client(host=cluster.standin.url, pool_size=16)
    client.set_default_header("Impersonate-User", account(name))
    client.set_default_header("Impersonate-Group", "system:serviceaccounts")
    for key, value in extra.items():
        client.set_default_header(f"Impersonate-Extra-{key.replace('/', '%2F')}", value)
    return KubeApi(client)


def secured(make_cluster: Callable[..., Cluster], objects: list[Any], **options: Any) -> Cluster:
    cluster = make_cluster(rbac=Rbac(objects), record=True, **options)
    if cluster.real:
        pytest.skip("the stand-in's request record and RBAC from the manifests")
    cluster.api.core.create_namespace({"metadata": {"name": SYSTEM}})
    return cluster


def dra_pod(name: str, gpu: str | None = "0.5", **annotations: str) -> dict[str, Any]:
    """An fgpu pod as the webhook admits it on the DRA path."""
    body = pod(name, gpu, **annotations)
    return json_patch(body, mutate(body))


def make(cluster: Cluster, body: dict[str, Any]) -> dict[str, Any]:
    made: dict[str, Any] = cluster.api._call(
        cluster.api.core.create_namespaced_pod, cluster.namespace, body
    )
    return made


def claims_made(cluster: Cluster) -> None:
    """Wait until every pod naming a claim template has its claim (the resource claim
    controller's work, asynchronous on a real API server)."""

    def made() -> bool:
        return all(
            len((p.get("status") or {}).get("resourceClaimStatuses") or [])
            >= len(p["spec"].get("resourceClaims") or [])
            for p in cluster.api.list_pods(namespace=cluster.namespace).items
        )

    wait_until(made, "the pods' claims made from their templates")


def scheduler_round(cluster: Cluster, scheduler: K8sScheduler) -> None:
    """Two rounds: the first makes the namespace's claim template, the second (once the
    claims are made) places."""
    for first in (True, False):
        if scheduler.elector is not None:
            scheduler.elector.step()
        scheduler.sync()
        scheduler.run_once()
        if first:
            claims_made(cluster)


def condition(cluster: Cluster, name: str) -> dict[str, Any]:
    got = cluster.api.get_pod(cluster.namespace, name)
    found = [c for c in got["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
    return found[0] if found else {}


def pod_events(cluster: Cluster, name: str, reason: str) -> list[dict[str, Any]]:
    out = cluster.api._call(cluster.api.core.list_namespaced_event, cluster.namespace)
    return [
        e for e in out["items"] if e.get("reason") == reason and e["involvedObject"]["name"] == name
    ]


def without_binding_rule(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifests as an older fgpu shipped them: the scheduler's role without
    ``resourceclaims/binding``."""
    out = copy.deepcopy(objects)
    for obj in out:
        if obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == "fgpu-scheduler":
            obj["rules"] = [
                r for r in obj["rules"] if "resourceclaims/binding" not in r["resources"]
            ]
    return out


# ----------------------------------------------------------------- the stand-in's RBAC


def test_what_a_role_does_not_grant_is_forbidden_as_the_api_server_words_it(
    make_cluster,
) -> None:
    cluster = secured(make_cluster, rbac_objects())
    webhook = as_account(cluster, "fgpu-webhook")
    with pytest.raises(KubeError) as refused:
        webhook.list_pods(namespace="default")
    assert (refused.value.status, refused.value.reason) == (403, "Forbidden")
    assert refused.value.message == (
        'pods is forbidden: User "system:serviceaccount:fgpu-system:fgpu-webhook" cannot list '
        'resource "pods" in API group "" in the namespace "default"'
    )
    with pytest.raises(KubeError) as named:
        webhook.get_node("n1")
    assert named.value.message.startswith('nodes "n1" is forbidden: User ')
    assert named.value.message.endswith(
        'cannot get resource "nodes" in API group "" at the cluster scope'
    )
    # a Role's resourceNames: the scheduler's lease only
    scheduler = as_account(cluster, "fgpu-scheduler")
    assert scheduler.get_lease(SYSTEM, "fgpu-scheduler") is None  # allowed: 404 is "none"
    with pytest.raises(KubeError) as other:
        scheduler.get_lease(SYSTEM, "someone-else")
    assert other.value.status == 403
    with pytest.raises(KubeError) as elsewhere:
        scheduler.get_lease("default", "fgpu-scheduler")
    assert elsewhere.value.status == 403  # a Role grants in its namespace only
    # the tests' own client plays the administrator
    assert cluster.api.list_pods(namespace="default").items == []


def test_each_admission_policy_matches_one_resource_type_and_reads_only_its_fields() -> None:
    """The API server type-checks a ValidatingAdmissionPolicy's expressions against every
    resource type it matches (a warning in the policy's status for a field one of them
    lacks, such as ``object.spec`` on a ConfigMap): each fgpu policy matches one type, and
    only the types with a ``spec`` read it."""
    with_spec = {("", "nodes"), ("", "pods")}
    policies = [
        d
        for d in yaml.safe_load_all((DEPLOY / "base" / "admission-policies.yaml").read_text())
        if d and d["kind"] == "ValidatingAdmissionPolicy"
    ]
    assert {p["metadata"]["name"] for p in policies} == {
        "fgpu-node-agent.fgpu.io",
        "fgpu-node-agent-pods.fgpu.io",
        "fgpu-scheduler-nodes.fgpu.io",
        "fgpu-scheduler-pods.fgpu.io",
        "fgpu-scheduler-configmaps.fgpu.io",
    }
    for policy in policies:
        types = {
            (group, resource)
            for rule in policy["spec"]["matchConstraints"]["resourceRules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
        }
        assert len(types) == 1, policy["metadata"]["name"]
        text = yaml.safe_dump(policy["spec"]["validations"])
        if types - with_spec:
            assert "object.spec" not in text, policy["metadata"]["name"]


# ------------------------------------------------------------- what each component calls


def test_the_scheduler_calls_exactly_what_its_role_grants(make_cluster) -> None:
    objects = rbac_objects()
    cluster = secured(make_cluster, objects, graceful_delete=True)
    api = as_account(cluster, "fgpu-scheduler")
    ensure_ceiling_class(cluster)
    add_node(cluster, "node-a", gpus=2)
    mig = NodeAgent(cluster.api, "mig-a", SimulatedBackend("1xA100-80GB:mig"))
    bare_node(cluster, "mig-a")
    mig.publish()
    device = next(iter(mig.mig.values()))
    assert isinstance(device, SimulatedMigDevice)
    device.create("1g.10gb", 6)  # idle, in the way: the scheduler asks for a new layout
    mig.publish()
    cluster.api._call(
        cluster.api.core.create_persistent_volume,
        {
            "metadata": {"name": "pv-data"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": "/tmp/data"},
            },
        },
    )
    cluster.api._call(
        cluster.api.core.create_namespaced_persistent_volume_claim,
        cluster.namespace,
        {
            "metadata": {"name": "data"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "volumeName": "pv-data",
            },
        },
    )
    make(cluster, dra_pod("low", "0.6", priority="low"))
    make(cluster, dra_pod("normal", "0.6", priority="normal"))
    volume = dra_pod("with-volume", "0.3")
    volume["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]
    make(cluster, volume)
    make(cluster, dra_pod("big", None, mig_profile="4g.40gb"))
    elector = LeaseElector(api, SYSTEM, "fgpu-scheduler", "replica-a")
    scheduler = K8sScheduler(api, elector=elector)
    scheduler_round(cluster, scheduler)
    placed = {
        p["metadata"]["name"] for p in cluster.api.list_pods().items if p["spec"].get("nodeName")
    }
    assert placed == {"low", "normal", "with-volume"}
    assert wire.MIG_REQUEST in wire.annotations_of(cluster.api.get_node("mig-a"))
    make(cluster, dra_pod("vip", "0.6", priority="90"))
    scheduler_round(cluster, scheduler)
    assert cluster.api.get_pod(cluster.namespace, "low")["metadata"].get("deletionTimestamp")
    assert wire.HOLD in cluster.api.get_pod(cluster.namespace, "vip")["metadata"]["annotations"]
    scheduler.cache.start()  # the watches
    try:
        wait_until(
            lambda: (
                {
                    a.resource
                    for a in cluster.standin.api.requests  # type: ignore[union-attr]
                    if a.user == account("fgpu-scheduler") and a.verb == "watch"
                }
                == {"nodes", "pods", "queues", "resourceclaims"}
            ),
            "the scheduler's watches",
        )
    finally:
        scheduler.cache.stop()
    elector.release()
    refusal = secured(make_cluster, without_binding_rule(objects))
    refused_pod_scenario(
        refusal, K8sScheduler(as_account(refusal, "fgpu-scheduler"), clock=Clock())
    )
    calls = used(cluster, "fgpu-scheduler") | used(refusal, "fgpu-scheduler")
    assert calls == granted(objects, "fgpu-scheduler")


def test_the_node_agent_calls_exactly_what_its_role_grants(
    make_cluster, in_process_fake: tuple[Any, CheckpointDriver], tmp_path: Path
) -> None:
    objects = rbac_objects()
    cluster = secured(make_cluster, objects)
    api = as_account(cluster, "fgpu-node-agent", **{"authentication.kubernetes.io/node-name": NODE})
    bare_node(cluster, NODE)
    stray = resource_slice(NODE, driver_inventory(1), 1)
    stray["metadata"]["name"] = f"old-{slice_name(NODE)}"
    ResourceApi(cluster.api).create_slice(stray)  # an older version's: the agent deletes it
    slices = SlicePublisher(ResourceApi(api), NODE)
    agent = NodeAgent(api, NODE, SimulatedBackend("2xA100-80GB", NODE), on_publish=slices.publish)
    runner = threading.Thread(target=agent.run, args=(0.05,), daemon=True)
    runner.start()
    host = Node()
    try:
        wait_until(lambda: agent.reports >= 2, "two reports of the agent")
        names = {s["metadata"]["name"] for s in ResourceApi(cluster.api).list_slices().items}
        assert names == {slice_name(NODE)}
        grown = driver_inventory(3)
        assert slices.publish(grown)["spec"]["pool"]["generation"] == 2  # an update
        inventory = agent.inventory()
        driver = DraDriver(
            ResourceApi(api),
            NODE,
            lambda: inventory,
            host.layout,
            registry_dir=host.registry,
            plugin_dir=host.plugins,
            segment_dir=host.segments,
        )
        driver.start()
        try:
            uuid = inventory.gpus[0].uuid
            claimed_pod(cluster, "w", [device_name(uuid)], GpuShare(500, 40960, "default", 0, True))
            kubelet = KubeletStandIn(
                cluster.api,
                NODE,
                host.registry,
                [host.layout.cdi_dir],
                {"NVIDIA_VISIBLE_DEVICES": "all"},
            )
            kubelet.sync()
            assert kubelet.waiting == {}
            suspend_as_the_agent(cluster, api, in_process_fake[1], tmp_path)
        finally:
            driver.stop()
    finally:
        agent.stop()
        runner.join(timeout=30)
        shutil.rmtree(host.root, ignore_errors=True)
    publish_nothing(api, slices, NODE, "test: no GPUs")  # withdraws (deletes) its slice
    assert ResourceApi(cluster.api).list_slices().items == []
    older = secured(make_cluster, objects, consumable_capacity=False)  # as 1.34 stores slices
    agent_there = as_account(
        older, "fgpu-node-agent", **{"authentication.kubernetes.io/node-name": NODE}
    )
    told, _ = publish_where_sharing_is_dropped(older, agent_there)
    assert told.sharing_dropped
    calls = used(cluster, "fgpu-node-agent") | used(older, "fgpu-node-agent")
    assert calls == granted(objects, "fgpu-node-agent")


def suspend_as_the_agent(
    cluster: Cluster, api: KubeApi, driver: CheckpointDriver, tmp_path: Path
) -> None:
    """The agent's suspend of pod ``w`` (asked by ``fgpu.io/suspend``) as its service
    account: its pod has no cgroup under the (imitation) cgroup root here, so the suspend
    fails, which the agent records on the pod (``fgpu.io/suspended``) with an event."""
    root = tmp_path / "cgroup"
    (root / "kubepods.slice").mkdir(parents=True)
    for name in ("cgroup.procs", "cgroup.freeze"):
        (root / name).write_text("")
    w = cluster.api.get_pod(cluster.namespace, "w")
    cluster.api.patch_pod(
        cluster.namespace, "w", {"metadata": {"annotations": {wire.SUSPEND: "true"}}}
    )
    w = cluster.api.get_pod(cluster.namespace, "w")
    granted_to = wire.Assignment(NODE, (), (), (), (), 0, 0, "default", 50, None)
    asked = PlacedContainer(f"{cluster.namespace}/w", w["metadata"]["uid"], granted_to, (), True)
    suspensions = Suspensions(PodSuspender(driver, PodCgroupFreezer(root)), api)
    suspensions.suspend_asked([asked], {asked.workload_id: w})
    note = wire.annotations_of(cluster.api.get_pod(cluster.namespace, "w"))[wire.SUSPENDED]
    assert "has no cgroup on this node" in note


def test_the_webhook_calls_exactly_what_its_role_grants(make_cluster) -> None:
    objects = rbac_objects()
    lookup = KubeLookup(KubeApi(api_client(host="http://127.0.0.1:1")))
    with Served(create_app(lookup=lookup)) as served:
        cluster = secured(make_cluster, objects, admission=fgpu_admission(served.url))
        lookup.api = as_account(cluster, "fgpu-webhook")
        cluster.api.custom.create_cluster_custom_object(
            "fgpu.io",
            "v1alpha1",
            "queues",
            {
                "apiVersion": "fgpu.io/v1alpha1",
                "kind": "Queue",
                "metadata": {"name": "team"},
                "spec": {},
            },
        )
        made = make(cluster, pod("queued", "0.5", queue="team"))
        assert made["spec"]["resourceClaims"]  # admitted on the DRA path
        ResourceApi(cluster.api).create_claim(
            cluster.namespace,
            {
                "metadata": {"name": "mine"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                    }
                },
            },
        )
        own = pod("own-claim", "0.5")
        own["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "mine"}]
        with pytest.raises(KubeError) as refused:
            make(cluster, own)
        assert refused.value.status == 422  # a claim of fgpu's class the pod names itself
        assert "names ResourceClaim mine of device class gpu.fgpu.io" in refused.value.message
        other = pod("own-template", "0.5")
        other["spec"]["resourceClaims"] = [{"name": "t", "resourceClaimTemplateName": "none"}]
        assert make(cluster, other)["metadata"]["name"] == "own-template"
    assert used(cluster, "fgpu-webhook") == granted(objects, "fgpu-webhook")


def test_the_env_overlay_adds_exactly_what_the_environment_path_calls(make_cluster) -> None:
    """deploy/components/env-without-isolation adds ConfigMap rights to the scheduler's role:
    each one is called on the environment path (a ConfigMap left by an earlier attempt at
    the same pod is read and replaced), and nothing it calls is outside the overlay's
    grants."""
    base, overlay = rbac_objects(), rbac_objects("env-without-isolation")
    cluster = secured(make_cluster, overlay)
    add_node(cluster, "node-a", gpus=1)
    body = pod("p", "0.5")
    made = make(cluster, json_patch(body, mutate(body, env_without_isolation=True)))
    name = made["metadata"]["annotations"][wire.ENV_CONFIGMAP]
    cluster.api.create_config_map(  # left by an earlier attempt at this pod
        cluster.namespace,
        {
            "metadata": {
                "name": name,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": made["metadata"]["uid"]}
                ],
            },
            "data": {"NVIDIA_VISIBLE_DEVICES": "stale"},
        },
    )
    scheduler = K8sScheduler(as_account(cluster, "fgpu-scheduler"), env_without_isolation=True)
    scheduler.sync()
    scheduler.run_once()
    assert cluster.api.get_pod(cluster.namespace, "p")["spec"]["nodeName"] == "node-a"
    assert cluster.api.get_config_map(cluster.namespace, name)["data"][
        "NVIDIA_VISIBLE_DEVICES"
    ] != ("stale")
    added = granted(overlay, "fgpu-scheduler") - granted(base, "fgpu-scheduler")
    assert added == {("", "configmaps", verb) for verb in ("create", "get", "delete")}
    calls = used(cluster, "fgpu-scheduler")
    assert added <= calls
    assert calls <= granted(overlay, "fgpu-scheduler")


def test_the_enforcing_overlay_adds_exactly_the_eviction_the_memory_guard_calls(
    make_cluster, kubelet: Kubelet
) -> None:
    """deploy/components/enforcing adds ``create`` on ``pods/eviction`` to the agent's role:
    the memory guard (policy kill) evicts a pod over its GPU memory quota through it."""
    base, overlay = rbac_objects(), rbac_objects("enforcing")
    cluster = secured(make_cluster, overlay)
    made = make(
        cluster,
        {"metadata": {"name": "hog"}, "spec": {"containers": [{"name": "m", "image": "c"}]}},
    )
    uid = made["metadata"]["uid"]
    kubelet.start(uid)
    backend = Backend(memory={kubelet.procs[-1].pid: 4096})  # its quota: 1024 MiB
    api = as_account(cluster, "fgpu-node-agent", **{"authentication.kubernetes.io/node-name": "n"})
    guard = GovernorEnforcer(
        backend, [GPU], PodCgroupFreezer(kubelet.root), api=api, memory_policy=MemoryPolicy.KILL
    )
    try:
        guard.sync([placed("hog", uid)])
        assert [v.workload_id for v in guard.guard.check()] == [f"{cluster.namespace}/hog"]
    finally:
        guard.close()
    assert cluster.api.list_pods(namespace=cluster.namespace).items == []  # evicted
    added = granted(overlay, "fgpu-node-agent") - granted(base, "fgpu-node-agent")
    assert added == {("", "pods/eviction", "create")}
    calls = used(cluster, "fgpu-node-agent")
    assert added <= calls
    assert calls <= granted(overlay, "fgpu-node-agent")


# ---------------------------------------------------------------- refused writes on the pod


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refused_pod_scenario(cluster: Cluster, scheduler: K8sScheduler) -> dict[str, Any]:
    """The scheduler of a cluster whose RBAC lacks ``resourceclaims/binding`` tries to place
    pod ``p`` in three rounds, the last :data:`SERIES_PATCH_S` later; returns its event."""
    clock = scheduler.clock
    assert isinstance(clock, Clock)
    add_node(cluster, "node-a", gpus=1)
    make(cluster, dra_pod("p", "0.5"))
    scheduler.sync()
    scheduler.run_once()  # makes the template; the pod waits for its claim
    claims_made(cluster)
    waiting = condition(cluster, "p")
    assert (waiting["status"], waiting["reason"]) == ("False", "Unschedulable")
    for advance in (0.0, 1.0, SERIES_PATCH_S):
        clock.now += advance
        scheduler.sync()
        scheduler.run_once()
    assert not cluster.api.get_pod(cluster.namespace, "p")["spec"].get("nodeName")
    (event,) = pod_events(cluster, "p", REASON)
    return event


def test_a_refused_claim_write_shows_on_the_pod_once_with_a_count_and_the_fix(
    make_cluster, tmp_path: Path
) -> None:
    full = rbac_objects()
    cluster = secured(make_cluster, without_binding_rule(full))
    scheduler = K8sScheduler(as_account(cluster, "fgpu-scheduler"), clock=Clock())
    event = refused_pod_scenario(cluster, scheduler)
    assert (event["type"], event["count"]) == ("Warning", 3)
    assert event["source"]["component"] == "fgpu-scheduler"
    message = event["message"]
    assert message.startswith(
        f"the API server refused to update resourceclaims/status for pod {cluster.namespace}/p "
        "(422 Invalid): ResourceClaim.resource.k8s.io "
    )
    assert (
        "is invalid: status: Forbidden: changing status.allocation or status.reservedFor "
        'requires resource="resourceclaims/binding", verb="update" permission: '
        "resourceclaims.resource.k8s.io is forbidden: User "
        '"system:serviceaccount:fgpu-system:fgpu-scheduler" cannot update resource '
        '"resourceclaims/binding" in API group "resource.k8s.io" at the cluster scope'
    ) in message
    assert message.endswith(
        "; fix: fgpu-scheduler may not update resourceclaims/binding: apply "
        "deploy/base/rbac.yaml of this version"
    )
    now = condition(cluster, "p")  # the old reason (waiting for the claim) is replaced
    assert (now["status"], now["reason"], now["message"]) == ("False", CONDITION_REASON, message)
    exposition = scheduler.metrics.exposition().decode()
    assert (
        'fgpu_k8s_refused_writes_total{code="422",resource="resourceclaims/status"} 3.0'
        in exposition
    )
    described = kubectl_describe(cluster, "p")
    if described is not None:
        assert "Warning  FailedBinding" in described
        assert "(x3 over" in described
        assert "fgpu-scheduler may not update resourceclaims/binding" in described
    # the manifest of this version applied: the next round binds, the condition turns True
    assert cluster.standin is not None
    cluster.standin.api.recorder.rbac = Rbac(full)
    scheduler.sync()
    scheduler.run_once()
    assert cluster.api.get_pod(cluster.namespace, "p")["spec"]["nodeName"] == "node-a"
    assert condition(cluster, "p")["status"] == "True"
    assert len(pod_events(cluster, "p", REASON)) == 1


@pytest.mark.parametrize(
    ("message", "fix"),
    [
        (
            'pods "p" is forbidden: User "system:serviceaccount:fgpu-system:fgpu-scheduler" '
            'cannot create resource "pods/binding" in API group "" in the namespace "default"',
            "fgpu-scheduler may not create pods/binding: apply deploy/base/rbac.yaml of this "
            "version",
        ),
        (
            "status: Forbidden: changing status.allocation or status.reservedFor requires "
            'resource="resourceclaims/binding", verb="update" permission: ...',
            "fgpu-scheduler may not update resourceclaims/binding: apply deploy/base/rbac.yaml "
            "of this version",
        ),
        ("pods \"p\" is forbidden: ValidatingAdmissionPolicy 'x' denied request: no", ""),
    ],
)
def test_the_fix_is_named_only_for_a_permission_the_message_names(message: str, fix: str) -> None:
    assert fix_for(message) == fix


def test_under_1_34_semantics_the_claim_write_needs_no_binding_permission(make_cluster) -> None:
    cluster = make_cluster(
        rbac=Rbac(without_binding_rule(rbac_objects()), granular_claim_status=False)
    )
    if cluster.real:
        pytest.skip("the stand-in's RBAC")
    add_node(cluster, "node-a", gpus=1)
    make(cluster, dra_pod("p", "0.5"))
    scheduler = K8sScheduler(as_account(cluster, "fgpu-scheduler"))
    scheduler_round(cluster, scheduler)
    assert cluster.api.get_pod(cluster.namespace, "p")["spec"]["nodeName"] == "node-a"
    assert pod_events(cluster, "p", REASON) == []


def kubectl_describe(cluster: Cluster, name: str) -> str | None:
    """``kubectl describe pod`` against the stand-in (None where kubectl is missing)."""
    path = shutil.which("kubectl")
    if path is None or cluster.standin is None:
        return None
    done = subprocess.run(
        [path, "--server", cluster.standin.url, "describe", "pod", name, "-n", cluster.namespace],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# ------------------------------------------------------------------------ the claim template


def test_the_namespace_template_is_read_then_made_once_while_pods_wait(make_cluster) -> None:
    cluster = make_cluster(record=True)
    if cluster.real:
        pytest.skip("the stand-in's request record")
    add_node(cluster, "node-a", gpus=1)
    make(cluster, dra_pod("first"))
    clock = Clock()
    scheduler = K8sScheduler(as_account(cluster, "fgpu-scheduler"), clock=clock)
    scheduler.sync()  # not again: the rounds below see the pod waiting for its claim

    def calls() -> list[str]:
        assert cluster.standin is not None
        return [
            a.verb
            for a in cluster.standin.api.requests
            if a.resource == "resourceclaimtemplates" and a.user == account("fgpu-scheduler")
        ]

    for _ in range(3):
        scheduler.run_once()
    assert calls() == ["get", "create"]  # read (404), made, then left alone
    clock.now += TEMPLATE_RECHECK_S
    scheduler.run_once()
    assert calls() == ["get", "create", "get"]  # read again, there: no create, no 409
    ResourceApi(cluster.api).resource.delete_namespaced_resource_claim_template(
        claims.TEMPLATE, cluster.namespace
    )
    clock.now += TEMPLATE_RECHECK_S
    scheduler.run_once()
    assert calls() == ["get", "create", "get", "get", "create"]  # deleted: made again


# ------------------------------------------------------- sixteen pods as the manifests' accounts


def test_sixteen_half_gpu_pods_bind_two_per_gpu_as_the_manifests_service_accounts(
    make_cluster,
) -> None:
    """The DRA path end to end with the manifests' RBAC enforced (1.36 rules): the
    scheduler, the webhook's admission and the node's driver each as its own account."""
    objects = rbac_objects()
    lookup = KubeLookup(KubeApi(api_client(host="http://127.0.0.1:1")))
    with Served(create_app(lookup=lookup)) as served:
        cluster = secured(make_cluster, objects, admission=fgpu_admission(served.url))
        lookup.api = as_account(cluster, "fgpu-webhook")
        add_node(cluster, "node-a", gpus=8)
        host = Path(tempfile.mkdtemp(prefix="fgpu-rb-"))  # short: Unix socket paths
        layout = cdi.Layout(cdi_dir=host / "cdi", lib_dir=host / "lib", hint_dir=host / "hint")
        agent = as_account(
            cluster, "fgpu-node-agent", **{"authentication.kubernetes.io/node-name": "node-a"}
        )
        SlicePublisher(ResourceApi(agent), "node-a").publish(inventory_of("node-a"))
        driver = DraDriver(
            ResourceApi(agent),
            "node-a",
            lambda: inventory_of("node-a"),
            layout,
            registry_dir=host / "reg",
            plugin_dir=host / "plug",
            segment_dir=host / "seg",
        )
        driver.start()
        try:
            for i in range(16):
                make(cluster, pod(f"half-{i:02d}", "0.5"))  # admitted by the webhook
            scheduler_round(cluster, K8sScheduler(as_account(cluster, "fgpu-scheduler")))
            placed = [p for p in cluster.api.list_pods().items if p["spec"].get("nodeName")]
            assert len(placed) == 16
            per_gpu = Counter(
                claim_of(cluster, p)["status"]["allocation"]["devices"]["results"][0]["device"]
                for p in placed
            )
            assert per_gpu == {device_name(gpu_uuid("node-a", i)): 2 for i in range(8)}
            kubelet = KubeletStandIn(
                cluster.api,
                "node-a",
                host / "reg",
                [layout.cdi_dir],
                {"NVIDIA_VISIBLE_DEVICES": "all"},
            )
            kubelet.sync()
            assert kubelet.waiting == {}
            assert len(kubelet.containers) == 16
        finally:
            driver.stop()
            shutil.rmtree(host, ignore_errors=True)
    assert cluster.standin is not None
    refused = [
        a
        for a in cluster.standin.api.requests
        if a.user and not cluster.standin.api.recorder.rbac.allows(a)  # type: ignore[union-attr]
    ]
    assert refused == []
