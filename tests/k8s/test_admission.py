"""Issue 16 (admission, tenancy, RBAC narrowing, scheduling gates, watch fidelity) against
the API stand-in, each test naming the Kubernetes behaviour it holds the stand-in and fgpu
to. Stand-in only: these tests drive what a real cluster's own configuration decides (its
webhook configurations, its service-account tokens, its etcd compaction)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request

from fgpu.agent.backend import SimulatedBackend
from fgpu.k8s import objects, tenancy, wire
from fgpu.k8s.agent import NodeAgent
from fgpu.k8s.cache import ClusterCache
from fgpu.k8s.kube import KubeApi, KubeError, api_client
from fgpu.k8s.scheduler import K8sScheduler
from fgpu.k8s.webhook_app import KubeLookup, mutate_review, validate
from fgpu_standin.admission import (
    Attributes,
    load,
    point_services,
    rule_matches,
    selector_matches,
)
from tests.k8s.conftest import DEPLOY, Cluster, Served, fgpu_admission
from tests.k8s.kube import add_node, create, pod, wait_until

pytestmark = pytest.mark.k8s

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
AGENT = "system:serviceaccount:fgpu-system:fgpu-node-agent"


class Recorder:
    """fgpu's webhook (both endpoints), recording ``(endpoint, AdmissionReview request)``;
    ``lookup`` reads Namespaces and Queues from the cluster once it is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.lookup: KubeLookup | None = None
        self.app = FastAPI()

        @self.app.post("/mutate")
        async def mutating(request: Request) -> dict[str, Any]:
            body = json.loads(await request.body())
            self.calls.append(("mutate", body["request"]))
            return mutate_review(body, lookup=self.lookup)

        @self.app.post("/validate")
        async def validating(request: Request) -> dict[str, Any]:
            body = json.loads(await request.body())
            self.calls.append(("validate", body["request"]))
            return validate(body, lookup=self.lookup)


@pytest.fixture
def hooked(make_cluster: Any) -> Iterator[tuple[Cluster, Recorder]]:
    """The stand-in with deploy/base's admission configurations, calling fgpu's webhook."""
    hook = Recorder()
    with Served(hook.app) as served:
        cluster = make_cluster(admission=fgpu_admission(served.url))
        if cluster.real:
            pytest.skip("a real cluster calls the webhooks through its own configuration")
        hook.lookup = KubeLookup(cluster.api)
        yield cluster, hook


def _as(cluster: Cluster, user: str, **extra: str) -> KubeApi:
    """The cluster's API as ``user`` with user extras (the stand-in trusts impersonation)."""
    client = api_client(host=cluster.standin.url if cluster.standin else None)
    client.set_default_header("Impersonate-User", user)
    for key, value in extra.items():
        client.set_default_header(f"Impersonate-Extra-{key.replace('/', '%2F')}", value)
    return KubeApi(client)


def _namespace(cluster: Cluster, name: str, **annotations: str) -> None:
    cluster.api.core.create_namespace({"metadata": {"name": name, "annotations": annotations}})


def _queue(cluster: Cluster, name: str, **spec: Any) -> None:
    cluster.api.custom.create_cluster_custom_object(
        "fgpu.io",
        "v1alpha1",
        "queues",
        {
            "apiVersion": "fgpu.io/v1alpha1",
            "kind": "Queue",
            "metadata": {"name": name},
            "spec": spec,
        },
    )


def _class(cluster: Cluster, name: str, value: int) -> None:
    from kubernetes import client

    client.SchedulingV1Api(cluster.api.client).create_priority_class(
        {"metadata": {"name": name}, "value": value}
    )


def _create_in(cluster: Cluster, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = cluster.api._call(
        cluster.api.core.create_namespaced_pod, namespace, body
    )
    return found


def _refused(cluster: Cluster, namespace: str, body: dict[str, Any]) -> KubeError:
    with pytest.raises(KubeError) as err:
        _create_in(cluster, namespace, body)
    return err.value


# -- 9. webhooks are called as their configuration says ------------------------------------------


def test_webhooks_are_called_only_for_what_their_rules_selectors_and_conditions_match(
    hooked: tuple[Cluster, Recorder],
) -> None:
    """Kubernetes documentation, "Dynamic Admission Control", "Matching requests": a webhook
    is called only when a rule names the operation and resource (``pods`` never matches the
    ``pods/status`` or ``pods/binding`` subresources), the ``namespaceSelector`` matches the
    namespace's labels (every namespace has ``kubernetes.io/metadata.name``), and every
    ``matchConditions`` expression is true. Mutating webhooks run before validating ones,
    which see the mutated object."""
    cluster, hook = hooked
    plain = pod("plain", None)
    plain["spec"].pop("schedulerName")
    _create_in(cluster, "default", plain)
    assert hook.calls == []  # not an fgpu pod: the matchConditions are false
    _create_in(cluster, "kube-system", pod("system", "0.5"))
    assert hook.calls == []  # namespaceSelector: kube-system is left out
    made = _create_in(cluster, "default", pod("p", "0.5"))
    assert [(e, r["operation"]) for e, r in hook.calls] == [
        ("mutate", "CREATE"),
        ("validate", "CREATE"),
    ]
    validated = hook.calls[1][1]["object"]
    assert validated["metadata"]["annotations"][wire.QUEUE] == wire.DEFAULT_QUEUE  # mutated
    hook.calls.clear()
    cluster.api.patch_pod("default", "p", {"metadata": {"labels": {"team": "a"}}})
    cluster.api.patch_pod_status("default", "p", {"status": {"message": "hi"}})
    cluster.api.bind("default", "p", made["metadata"]["uid"], "n1", {})
    assert hook.calls == []  # a label, a status write and a Binding: nothing fgpu guards
    cluster.api.patch_pod("default", "p", {"metadata": {"annotations": {wire.QUEUE: "b"}}})
    assert [(e, r["operation"]) for e, r in hook.calls] == [("validate", "UPDATE")]


def _attributes(**changes: Any) -> Attributes:
    base = Attributes("CREATE", "", "v1", "pods", "", True, "team-a", "p", "Pod", {}, None, None)
    return Attributes(**{**{f: getattr(base, f) for f in base.__dataclass_fields__}, **changes})


@pytest.mark.parametrize(
    ("resources", "sub", "matched"),
    [
        (["pods"], "", True),
        (["pods"], "status", False),  # subresources are named on their own
        (["pods/*"], "status", True),
        (["pods/*"], "", False),
        (["*"], "", True),
        (["*"], "binding", False),  # "*" is every resource, no subresource
        (["*/*"], "binding", True),
        (["pods/ephemeralcontainers"], "ephemeralcontainers", True),
    ],
    ids=[
        "pods",
        "pods-not-status",
        "pods-star",
        "star-not-main",
        "star",
        "star-no-sub",
        "star-star",
        "named-sub",
    ],
)
def test_rules_match_resources_and_subresources_as_the_api_server_does(
    resources: list[str], sub: str, matched: bool
) -> None:
    """Kubernetes API reference, ``RuleWithOperations.resources``: "pods" is the main
    resource, "pods/status" a subresource, "*" every resource, "*/*" every subresource too,
    "pods/*" every subresource of pods."""
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["*"], "resources": resources}
    assert rule_matches(rule, _attributes(subresource=sub)) is matched


def test_selectors_and_failure_policy_of_a_webhook_that_cannot_be_reached(
    make_cluster: Any,
) -> None:
    """ "Matching requests: objectSelector" (the labels of the object or the old object) and
    "Failure policy": ``Ignore`` admits the request when the call fails, ``Fail`` refuses it
    with ``failed calling webhook``."""
    unreachable = "http://127.0.0.1:9/never"

    def config(policy: str) -> dict[str, Any]:
        return {
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": f"gone-{policy.lower()}"},
            "webhooks": [
                {
                    "name": f"{policy.lower()}.example.com",
                    "failurePolicy": policy,
                    "clientConfig": {"url": unreachable},
                    "objectSelector": {"matchLabels": {"checked": policy.lower()}},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                }
            ],
        }

    cluster = make_cluster(admission=[config("Ignore"), config("Fail")])
    if cluster.real:
        pytest.skip("the stand-in's admission configuration")
    create(cluster, pod("unlabelled", "0.5"), admit=False)  # neither selector matches
    create(cluster, pod("ignored", "0.5", labels={"checked": "ignore"}), admit=False)
    with pytest.raises(KubeError) as err:
        create(cluster, pod("failed", "0.5", labels={"checked": "fail"}), admit=False)
    assert err.value.status == 500
    assert 'failed calling webhook "fail.example.com"' in err.value.message
    assert selector_matches({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""})
    assert not selector_matches(
        {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, {"a": "x"}
    )


# -- 5. refusals come from the validating webhook -------------------------------------------------


def test_a_later_mutating_webhook_cannot_undo_a_check(make_cluster: Any) -> None:
    """Kubernetes documentation, "Dynamic Admission Control": validating webhooks run after
    every mutating webhook, on the final object; so fgpu's refusals live there. A mutating
    webhook that runs after fgpu's (its configuration's name sorts later) and makes the
    pod privileged does not get the pod in."""
    hook = Recorder()
    sneaky = FastAPI()

    @sneaky.post("/")
    async def make_privileged(request: Request) -> dict[str, Any]:
        body = json.loads(await request.body())
        patch = [
            {
                "op": "add",
                "path": "/spec/containers/0/securityContext",
                "value": {"privileged": True},
            }
        ]
        import base64

        return {
            "response": {
                "uid": body["request"]["uid"],
                "allowed": True,
                "patchType": "JSONPatch",
                "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
            }
        }

    with Served(hook.app) as served, Served(sneaky) as other:
        later = {
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "zz-later"},
            "webhooks": [
                {
                    "name": "privileged.example.com",
                    "clientConfig": {"url": f"{other.url}/"},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                }
            ],
        }
        cluster = make_cluster(admission=[*fgpu_admission(served.url), later])
        if cluster.real:
            pytest.skip("the stand-in's admission configuration")
        error = _refused(cluster, "default", pod("p", "0.5"))
    assert error.status == 422
    assert 'admission webhook "pods.fgpu.io" denied the request' in error.message
    assert "spec.containers[0].securityContext.privileged" in error.message


# -- 1. queue access and the priority ceiling ----------------------------------------------------


def test_queue_access_default_queue_and_priority_ceiling_at_admission(
    hooked: tuple[Cluster, Recorder],
) -> None:
    """DESIGN.md section 5 ("a queue lists who may submit to it; on Kubernetes,
    namespaces"). Priorities are Kubernetes's to authorize: the Priority admission plugin
    sets ``spec.priority`` from the PriorityClass before webhooks run (Kubernetes
    documentation, "Pod Priority and Preemption"; classes are limited per namespace through
    ResourceQuota ``scopeSelector``), so ``fgpu.io/priority`` may only lower it."""
    cluster, _ = hooked
    _namespace(cluster, "team-b", **{tenancy.DEFAULT_QUEUE_ANNOTATION: "team-b"})
    _namespace(cluster, "team-a")
    _queue(cluster, "team-a", namespaces=["team-a"])
    _queue(cluster, "team-b", namespaces=["team-b"], nonPreemptible=True)
    _class(cluster, "fgpu-high", 100)
    # another team's queue
    error = _refused(cluster, "team-b", pod("steal", "0.5", queue="team-a"))
    assert error.status == 422
    assert (
        "fgpu.io/queue: namespace team-b may not use queue team-a (its spec.namespaces: "
        "team-a)" in error.message
    )
    # the namespace's default queue
    made = _create_in(cluster, "team-b", pod("mine", "0.5"))
    assert made["metadata"]["annotations"][wire.QUEUE] == "team-b"
    # the annotation above the class (or above normal without a class)
    unclassed = pod("loud", "0.5", priority="high")
    unclassed["spec"].pop("priorityClassName")
    error = _refused(cluster, "team-b", unclassed)
    assert (
        "fgpu.io/priority: high (100) is above what the pod may have: pods without a "
        in error.message
    )
    above = pod("above", "0.5", priority="critical")
    above["spec"]["priorityClassName"] = "fgpu-high"
    error = _refused(cluster, "team-b", above)
    assert "its PriorityClass fgpu-high has 100" in error.message
    lower = pod("lower", "0.5", priority="low")
    lower["spec"]["priorityClassName"] = "fgpu-high"
    assert _create_in(cluster, "team-b", lower)["spec"]["priority"] == 100
    # non-preemptible work only where the queue allows it
    high = pod("high", "0.5", queue="team-a")
    high["spec"]["priorityClassName"] = "fgpu-high"
    error = _refused(cluster, "team-a", high)
    assert "spec.priorityClassName: queue team-a does not allow non-preemptible work" in (
        error.message
    )
    high["metadata"]["annotations"][wire.PREEMPTIBLE] = "true"
    _create_in(cluster, "team-a", high)
    keep = pod("keep", "0.5", queue="team-a", preemptible="false")
    error = _refused(cluster, "team-a", keep)
    assert "fgpu.io/preemptible: queue team-a does not allow" in error.message
    high_b = pod("high-b", "0.5")
    high_b["spec"]["priorityClassName"] = "fgpu-high"
    _create_in(cluster, "team-b", high_b)  # team-b allows it
    # moving a pending pod to another team's queue is refused too
    with pytest.raises(KubeError) as moved:
        cluster.api.patch_pod(
            "team-b", "mine", {"metadata": {"annotations": {wire.QUEUE: "team-a"}}}
        )
    assert "fgpu.io/queue: namespace team-b may not use queue team-a " in moved.value.message


def test_a_queue_whose_namespaces_is_not_a_list_is_broken_and_a_default_queue_is_blamed(
    hooked: tuple[Cluster, Recorder],
) -> None:
    """``spec.namespaces: "team-a"`` (a string) is not read letter by letter: the queue is
    broken, its pods are refused at admission and it is left out by the scheduler; a
    refusal caused by the namespace's default queue says where the queue came from."""
    cluster, _ = hooked
    _namespace(cluster, "team-a")
    _queue(cluster, "stringy", namespaces="team-a")
    error = _refused(cluster, "team-a", pod("p", "0.5", queue="stringy"))
    assert error.status == 422
    assert (
        "fgpu.io/queue: queue stringy is broken, so no pod may use it: its spec.namespaces: "
        '"team-a" is not a list of namespace names' in error.message
    )
    _queue(cluster, "team-a", namespaces=["team-a"])
    _namespace(cluster, "team-c", **{tenancy.DEFAULT_QUEUE_ANNOTATION: "team-a"})
    error = _refused(cluster, "team-c", pod("q", "0.5"))
    assert (
        "fgpu.io/queue: team-a is the default queue of Namespace team-c (its "
        "fgpu.io/default-queue annotation, which a pod naming no queue gets); namespace "
        "team-c may not use queue team-a" in error.message
    )
    # the scheduler leaves the broken queue out, naming the field and the value
    queues = objects.queue_tree(
        [{"metadata": {"name": "stringy"}, "spec": {"namespaces": "team-a"}}], 1000
    )
    assert "stringy" not in queues.tree.specs
    assert queues.left_out["stringy"].startswith('spec.namespaces: "team-a" is not a list')


def _user_claim(cluster: Cluster, namespace: str, name: str, device_class: str) -> None:
    from fgpu.k8s.resourceapi import ResourceApi

    request = {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": 8}}
    ResourceApi(cluster.api).create_claim(
        namespace, {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}
    )


def test_a_pod_naming_its_own_claim_of_fgpus_class_is_refused(
    hooked: tuple[Cluster, Recorder],
) -> None:
    """fgpu allocates only the claim it makes for the pod: a pod that names a user's claim
    (or template) of class gpu.fgpu.io beside fgpu's entry would be bound with that claim
    allocated and its own never (it would not start), so it is refused at admission."""
    from fgpu.k8s.dra.share import DRIVER
    from fgpu.k8s.resourceapi import ResourceApi

    cluster, _ = hooked
    ns = cluster.namespace
    _user_claim(cluster, ns, "sneaky", DRIVER)
    body = pod("sneaky-pod", "0.5")
    body["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": "sneaky"}]
    error = _refused(cluster, ns, body)
    assert error.status == 422
    assert (
        "spec.resourceClaims[0]: 'g' names ResourceClaim sneaky of device class gpu.fgpu.io"
        in error.message
    )
    ResourceApi(cluster.api).create_claim_template(
        ns,
        {
            "metadata": {"name": "mine"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                    }
                }
            },
        },
    )
    body = pod("templated", "0.5")
    body["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimTemplateName": "mine"}]
    error = _refused(cluster, ns, body)
    assert "spec.resourceClaims[0]: 'g' names ResourceClaimTemplate mine of device class" in (
        error.message
    )
    # a claim of another class (another driver's device) is the pod's own business
    _user_claim(cluster, ns, "nic", "nic.example.com")
    body = pod("with-nic", "0.5")
    body["spec"]["resourceClaims"] = [{"name": "n", "resourceClaimName": "nic"}]
    made = _create_in(cluster, ns, body)
    assert [e["name"] for e in made["spec"]["resourceClaims"]] == ["n", "fgpu-gpu"]


def test_the_scheduler_never_allocates_a_claim_the_user_wrote(make_cluster: Any) -> None:
    """A pod made without the webhook that names a user's claim of fgpu's class is not
    placed, and the user's claim stays unallocated."""
    from fgpu.k8s.dra.share import DRIVER
    from fgpu.k8s.resourceapi import ResourceApi

    cluster = make_cluster()
    if cluster.real:
        pytest.skip("makes claims by hand")
    add_node(cluster, "node-a", gpus=1)
    ns = cluster.namespace
    _user_claim(cluster, ns, "sneaky", DRIVER)
    body = pod("sneaky-pod", "0.5")
    body["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": "sneaky"}]
    _create_in(cluster, ns, body)
    s = K8sScheduler(cluster.scheduler_api)
    for _ in range(2):
        s.sync()
        s.run_once()
    assert not cluster.api.get_pod(ns, "sneaky-pod")["spec"].get("nodeName")
    assert not (ResourceApi(cluster.api).get_claim(ns, "sneaky").get("status") or {}).get(
        "allocation"
    )
    assert "no spec.resourceClaims entry 'fgpu-gpu' of ResourceClaimTemplate" in _message(
        cluster, ns, "sneaky-pod"
    )


def _message(cluster: Cluster, namespace: str, name: str) -> str:
    got = cluster.api.get_pod(namespace, name)
    conditions = (got.get("status") or {}).get("conditions") or []
    found = [c for c in conditions if c.get("type") == "PodScheduled"]
    return f"{found[0].get('reason')}: {found[0].get('message')}" if found else ""


def test_the_scheduler_does_not_place_a_pod_in_a_queue_its_namespace_may_not_use(
    make_cluster: Any,
) -> None:
    """The same rules at placement (a pod created without the webhook, or a Queue changed
    after admission): the pod waits with the reason instead of being placed."""
    cluster = make_cluster()
    if cluster.real:
        pytest.skip("creates Queue objects and namespaces")
    add_node(cluster, "node-a", gpus=1)
    _queue(cluster, "team-a", namespaces=["team-a"])
    _create_in(cluster, "team-b", pod("p", "0.5", queue="team-a"))
    s = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    s.sync()
    s.run_once()
    assert not cluster.api.get_pod("team-b", "p")["spec"].get("nodeName")
    assert "not allowed: fgpu.io/queue: namespace team-b may not use queue team-a" in _message(
        cluster, "team-b", "p"
    )


# -- 2. scheduling gates ---------------------------------------------------------------------------


def test_a_gated_pod_is_not_placed_until_its_gates_are_removed(make_cluster: Any) -> None:
    """Kubernetes documentation, "Pod Scheduling Readiness": a pod with
    ``spec.schedulingGates`` is ``SchedulingGated`` (``PodScheduled=False``, set by the API
    server at creation) and no scheduler places it; gates may be removed, never added;
    binding it is refused with ``409`` ("pod P has non-empty .spec.schedulingGates")."""
    cluster = make_cluster()
    add_node(cluster, "node-a", gpus=1)
    gated = pod("gated", "0.5")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    made = create(cluster, gated)
    condition = made["status"]["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "PodScheduled",
        "False",
        "SchedulingGated",
    )
    with pytest.raises(KubeError) as err:
        cluster.api.bind(cluster.namespace, "gated", made["metadata"]["uid"], "node-a", {})
    assert err.value.status == 409
    assert "pod gated has non-empty .spec.schedulingGates" in err.value.message
    s = K8sScheduler(cluster.scheduler_api, env_without_isolation=True)
    s.sync()
    s.run_once()
    now = cluster.api.get_pod(cluster.namespace, "gated")
    assert not now["spec"].get("nodeName")
    assert _message(cluster, cluster.namespace, "gated").startswith("SchedulingGated: ")
    # adding a gate is refused; removing them is allowed
    more = copy.deepcopy(now)
    more["spec"]["schedulingGates"].append({"name": "example.com/more"})
    with pytest.raises(KubeError) as added:
        cluster.api._call(cluster.api.core.replace_namespaced_pod, "gated", cluster.namespace, more)
    assert added.value.status == 422
    assert "spec.schedulingGates: Forbidden: only deletion is allowed" in added.value.message
    now["spec"]["schedulingGates"] = []
    cluster.api._call(cluster.api.core.replace_namespaced_pod, "gated", cluster.namespace, now)
    s.sync()
    s.run_once()
    wait_until(
        lambda: bool(cluster.api.get_pod(cluster.namespace, "gated")["spec"].get("nodeName")),
        "the ungated pod bound",
    )


# -- 6. the agent and the scheduler only change what they own ------------------------------------


def test_the_node_agent_may_change_only_fgpu_keys_of_its_own_node(
    hooked: tuple[Cluster, Recorder],
) -> None:
    """deploy/base/admission-policies.yaml, as a ValidatingAdmissionPolicy is evaluated
    (Kubernetes documentation, "Validating Admission Policy"); the node comes from the
    agent's pod-bound service-account token, whose user extra
    ``authentication.kubernetes.io/node-name`` the API server fills (Kubernetes 1.30+)."""
    cluster, _ = hooked
    add_node(cluster, "node-a", gpus=1)
    add_node(cluster, "node-b", gpus=1)
    agent = _as(cluster, AGENT, **{NODE_NAME_EXTRA: "node-a"})
    agent.patch_node("node-a", {"metadata": {"annotations": {wire.USAGE: "{}"}}})
    agent.patch_node("node-a", {"metadata": {"labels": {wire.COUNT_LABEL: "1"}}})
    with pytest.raises(KubeError) as other:
        agent.patch_node("node-b", {"metadata": {"annotations": {wire.USAGE: "{}"}}})
    assert other.value.status == 403
    assert (
        "ValidatingAdmissionPolicy 'fgpu-node-agent.fgpu.io' with binding "
        "'fgpu-node-agent.fgpu.io' denied request: the fgpu node agent may change only the "
        "Node it runs on, not node-b" in other.value.message
    )
    with pytest.raises(KubeError) as label:
        agent.patch_node("node-a", {"metadata": {"labels": {"team": "a"}}})
    assert "may change only fgpu.io/ labels of its Node" in label.value.message
    with pytest.raises(KubeError) as spec:
        agent.patch_node("node-a", {"spec": {"unschedulable": True}})
    assert "may not change a Node's spec" in spec.value.message
    tokenless = _as(cluster, AGENT)  # a token not bound to a pod carries no node
    with pytest.raises(KubeError):
        tokenless.patch_node("node-a", {"metadata": {"annotations": {wire.USAGE: "{}"}}})
    # anyone else is not matched by the policy (RBAC decides for them)
    cluster.api.patch_node("node-b", {"metadata": {"labels": {"team": "b"}}})


def test_the_real_node_agent_passes_the_policy_on_its_own_node_only(
    hooked: tuple[Cluster, Recorder],
) -> None:
    """The agent's own writes (labels, inventory, usage: all ``fgpu.io/``) pass the policy
    on its node; the same agent pointed at another node's name is refused."""
    cluster, _ = hooked
    add_node(cluster, "node-a", gpus=1)
    add_node(cluster, "node-b", gpus=1)
    api = _as(cluster, AGENT, **{NODE_NAME_EXTRA: "node-a"})
    agent = NodeAgent(api, "node-a", SimulatedBackend("2xA100-40GB"))
    agent.publish()
    agent.report()
    assert cluster.api.get_node("node-a")["metadata"]["labels"][wire.COUNT_LABEL] == "2"
    with pytest.raises(KubeError) as err:
        NodeAgent(api, "node-b", SimulatedBackend("2xA100-40GB")).publish()
    assert err.value.status == 403
    assert err.value.message.startswith('nodes "node-b" is forbidden: ValidatingAdmissionPolicy')


def test_the_scheduler_may_change_only_what_it_writes(hooked: tuple[Cluster, Recorder]) -> None:
    """deploy/base/admission-policies.yaml: the scheduler's Node patches touch only
    ``fgpu.io/mig-request``, its pod patches only ``fgpu.io/`` annotations, its ConfigMaps
    (env-without-isolation) only ``fgpu-env-*``; RBAC alone cannot say this (it grants
    verbs on resource types; ``resourceNames`` cannot limit ``create``)."""
    cluster, _ = hooked
    add_node(cluster, "node-a", gpus=1)
    scheduler = _as(cluster, wire.SCHEDULER_USER)
    scheduler.patch_node("node-a", {"metadata": {"annotations": {wire.MIG_REQUEST: "{}"}}})
    with pytest.raises(KubeError) as node:
        scheduler.patch_node("node-a", {"metadata": {"annotations": {wire.INVENTORY: "{}"}}})
    assert "may change only the fgpu.io/mig-request annotation of a Node" in node.value.message
    _create_in(cluster, "default", pod("p", "0.5"))
    scheduler.patch_pod("default", "p", {"metadata": {"annotations": {wire.HOLD: "{}"}}})
    with pytest.raises(KubeError) as labelled:
        scheduler.patch_pod("default", "p", {"metadata": {"labels": {"x": "y"}}})
    assert "may not change the spec or labels of a pod" in labelled.value.message
    scheduler.create_config_map("default", {"metadata": {"name": "fgpu-env-abc"}, "data": {}})
    with pytest.raises(KubeError) as other:
        scheduler.create_config_map("default", {"metadata": {"name": "settings"}, "data": {}})
    assert "writes only the pods' environment ConfigMaps (fgpu-env-*), not settings" in (
        other.value.message
    )


def test_the_real_scheduler_passes_its_policy(make_cluster: Any) -> None:
    """The scheduler's own writes as its service account (the environment path: bindings,
    ``fgpu-env-*`` ConfigMaps, status) pass the ``fgpu-scheduler-*.fgpu.io`` policies."""
    cluster = make_cluster(admission=load([DEPLOY / "base" / "admission-policies.yaml"]))
    if cluster.real:
        pytest.skip("impersonates the scheduler's service account")
    add_node(cluster, "node-a", gpus=1)
    for i in range(2):
        create(cluster, pod(f"half-{i}", "0.5"))
    s = K8sScheduler(_as(cluster, wire.SCHEDULER_USER), env_without_isolation=True)
    s.sync()
    s.run_once()
    placed = [cluster.api.get_pod(cluster.namespace, f"half-{i}") for i in range(2)]
    assert all(p["spec"].get("nodeName") == "node-a" for p in placed)
    for p in placed:
        name = p["metadata"]["annotations"][wire.ENV_CONFIGMAP]
        assert name.startswith("fgpu-env-")
        assert cluster.api.get_config_map(cluster.namespace, name)["data"]


def test_the_installed_admission_objects_are_the_ones_tested() -> None:
    """The tests above load deploy/base's files; the kustomization installs them."""
    kustomization = (DEPLOY / "base" / "kustomization.yaml").read_text()
    assert "- admission-policies.yaml" in kustomization
    assert "- webhook.yaml" in kustomization
    kinds = sorted(
        c["kind"]
        for c in load(
            [DEPLOY / "base" / "webhook.yaml", DEPLOY / "base" / "admission-policies.yaml"]
        )
    )
    assert kinds == [
        "MutatingWebhookConfiguration",
        *["ValidatingAdmissionPolicy"] * 5,
        *["ValidatingAdmissionPolicyBinding"] * 5,
        "ValidatingWebhookConfiguration",
    ]
    pointed = point_services(
        load([DEPLOY / "base" / "webhook.yaml"]), {"fgpu-system/fgpu-webhook": "https://h"}
    )
    assert sorted(c["webhooks"][0]["clientConfig"]["url"] for c in pointed) == [
        "https://h/mutate",
        "https://h/validate",
    ]
    namespace = (DEPLOY / "base" / "namespace.yaml").read_text()
    assert "pod-security.kubernetes.io/enforce: privileged" in namespace


# -- 9. watch bookmarks and 410 Gone ---------------------------------------------------------------


def test_a_watch_that_allows_bookmarks_gets_one_with_the_latest_version(make_cluster: Any) -> None:
    """Kubernetes API concepts, "Watch bookmarks": with ``allowWatchBookmarks=true`` the
    server sends ``BOOKMARK`` events whose object carries only ``metadata.resourceVersion``,
    so a client watching a quiet resource can resume from a recent version after changes of
    other resources pushed its own out of the history."""
    cluster = make_cluster(bookmark_s=0.2)
    if cluster.real:
        pytest.skip("bookmark timing is the server's")
    start = cluster.api.list_nodes().resource_version
    last = create(cluster, pod("p", "0.5"))["metadata"]["resourceVersion"]
    seen: list[tuple[str, dict[str, Any]]] = []
    for kind, obj in cluster.api.watch("nodes", start, timeout_s=3):  # no node changes
        seen.append((kind, obj))
        if kind == "BOOKMARK":
            break
    assert [kind for kind, _ in seen] == ["BOOKMARK"]
    mark = seen[0][1]
    assert set(mark["metadata"]) == {"resourceVersion"}
    assert int(mark["metadata"]["resourceVersion"]) >= int(last)


def test_the_cache_lists_again_after_410_gone_and_sees_what_it_missed(make_cluster: Any) -> None:
    """Kubernetes API concepts, "Efficient detection of changes": a watch from a version the
    server no longer keeps answers ``410 Gone``; the client must list again (the informer's
    relist). The stand-in keeps 5 changes here; 8 pods are made while the cache is not
    watching, so each watch resumes too late and the cache relists."""
    cluster = make_cluster(history=5)
    if cluster.real:
        pytest.skip("compaction on a real cluster is not under the test's control")
    cache = ClusterCache(cluster.api, watch_timeout_s=2)
    cache.sync()
    before = cache.relists
    for i in range(8):
        create(cluster, pod(f"c-{i}", "0.5"))
    cache.start()
    try:
        wait_until(lambda: len(cache.snapshot().pods) == 8, "the cache to list the 8 pods again")
        assert cache.relists > before
    finally:
        cache.stop()


def test_the_mutating_endpoint_never_refuses_and_the_validating_one_never_patches() -> None:
    """The split of point 5: a bad pod gets no patch from ``/mutate`` (allowed) and a
    refusal from ``/validate``; a good pod gets a patch from ``/mutate`` only."""

    def body(p: dict[str, Any]) -> dict[str, Any]:
        request = {"uid": "u", "operation": "CREATE", "namespace": "default", "object": p}
        return {"request": {**request, "kind": {"kind": "Pod"}}}

    bad = pod("bad", "1.5")
    assert mutate_review(body(bad))["response"] == {"uid": "u", "allowed": True}
    refused = validate(body(bad))["response"]
    assert refused["allowed"] is False
    assert (
        "fgpu.io/gpu: '1.5': above 1 a GPU request is a whole number"
        in refused["status"]["message"]
    )
    good = pod("good", "0.5")
    assert "patch" in mutate_review(body(good))["response"]
    assert validate(body(good))["response"] == {"uid": "u", "allowed": True}


def test_an_unreadable_queue_or_namespace_refuses_rather_than_guesses() -> None:
    """With the API unreachable the webhook cannot know the namespace's default queue or
    who may use a queue: both endpoints refuse (503, try again) instead of admitting the
    pod into a guessed queue."""
    dead = KubeLookup(KubeApi(api_client(host="http://127.0.0.1:9"), timeout_s=2))
    request = {
        "uid": "u",
        "operation": "CREATE",
        "namespace": "team-a",
        "kind": {"kind": "Pod"},
        "object": pod("p", "0.5", queue="team-a"),
    }
    for answer in (mutate_review({"request": request}, lookup=dead),
                   validate({"request": request}, lookup=dead)):  # fmt: skip
        response = answer["response"]
        assert response["allowed"] is False
        assert response["status"]["code"] == 503
        assert "could not read the pod's Namespace or Queue" in response["status"]["message"]


def test_the_node_agent_may_write_only_its_suspend_records_on_pods_of_its_node(
    hooked: tuple[Cluster, Recorder],
) -> None:
    """deploy/base/admission-policies.yaml (``fgpu-node-agent-pods.fgpu.io``) and the
    webhook: the node agent writes ``fgpu.io/suspended`` and ``fgpu.io/restored`` on pods
    bound to its node, nothing else; ``fgpu.io/suspend`` is the scheduler's (a user who
    removed it would have a suspended pod restored onto GPUs given to others)."""
    cluster, _ = hooked
    add_node(cluster, "node-a", gpus=1)
    add_node(cluster, "node-b", gpus=1)
    for name, node in (("here", "node-a"), ("there", "node-b")):
        made = _create_in(cluster, "default", pod(name, "0.5"))
        _as(cluster, wire.SCHEDULER_USER).bind(
            "default", name, made["metadata"]["uid"], node, {wire.SUSPEND: "true"}
        )
    agent = _as(cluster, AGENT, **{NODE_NAME_EXTRA: "node-a"})
    note = {wire.SUSPENDED: '{"pids": [1], "copy_s": 0.1}'}
    agent.patch_pod("default", "here", {"metadata": {"annotations": note}})
    agent.patch_pod(
        "default",
        "here",
        {"metadata": {"annotations": {wire.SUSPENDED: None, wire.RESTORED: '{"copy_s": 0.1}'}}},
    )
    got = wire.annotations_of(cluster.api.get_pod("default", "here"))
    assert (got.get(wire.SUSPENDED), got[wire.RESTORED]) == (None, '{"copy_s": 0.1}')
    with pytest.raises(KubeError) as elsewhere:
        agent.patch_pod("default", "there", {"metadata": {"annotations": note}})
    assert "may change only pods bound to the Node it runs on" in elsewhere.value.message
    with pytest.raises(KubeError) as theirs:
        agent.patch_pod("default", "here", {"metadata": {"annotations": {wire.SUSPEND: None}}})
    assert "may change only the fgpu.io/suspended and fgpu.io/restored" in theirs.value.message
    with pytest.raises(KubeError) as labelled:
        agent.patch_pod("default", "here", {"metadata": {"labels": {"x": "y"}}})
    assert "may not change the spec or labels of a pod" in labelled.value.message
    for key in (wire.SUSPEND, wire.RESTORED):  # a user may remove neither
        with pytest.raises(KubeError) as user:
            cluster.api.patch_pod("default", "here", {"metadata": {"annotations": {key: None}}})
        assert user.value.status == 422, user.value.message
        assert f"{key}: written by the fgpu " in user.value.message
        assert "system:anonymous may not remove it" in user.value.message
