"""The admission webhook over HTTP(S), called by the API server (stand-in) on pod
creation: bad fgpu annotations are refused with the CLI's and API's reason."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from fgpu.k8s import wire
from fgpu.k8s.kube import KubeApi, KubeError, api_client
from fgpu.k8s.objects import PodRequestError, pod_ask
from fgpu.k8s.webhook import mutate
from fgpu.k8s.webhook_app import (
    TENANCY_ANNOTATIONS,
    create_app,
    mutate_review,
    review,
    validate,
)
from fgpu.rules.errors import BadRequest
from fgpu.rules.requests import parse_submission
from fgpu.wire import SubmitRequest
from fgpu_standin.patch import json_patch
from tests.k8s.conftest import Served, fgpu_admission
from tests.k8s.kube import create, pod

pytestmark = pytest.mark.k8s

BAD = [
    pytest.param({"gpu": "1.5"}, "gpu", wire.GPU, id="fraction-above-one"),
    pytest.param({"gpu": "0"}, "gpu", wire.GPU, id="zero"),
    pytest.param({"gpu": "half"}, "gpu", wire.GPU, id="not-a-number"),
    pytest.param({"gpu_memory": "5 potatoes"}, "gpu_memory", wire.GPU_MEMORY, id="memory-unit"),
    pytest.param({"gpu": "2", "gpu_memory": "5Gi"}, "gpu_memory", wire.GPU_MEMORY, id="whole-mem"),
    pytest.param({"gpu": "0.5", "gpu_model": "Z9000"}, "gpu_model", wire.GPU_MODEL, id="model"),
    pytest.param({"gpu": "0.5", "priority": "urgent"}, "priority", wire.PRIORITY, id="priority"),
    pytest.param({"gpu": "0.5", "priority": "-7"}, "priority", wire.PRIORITY, id="priority-neg"),
    pytest.param(
        {"gpu": "0.5", "priority": "5000"}, "priority", wire.PRIORITY, id="priority-above-max"
    ),
    pytest.param(
        {"mig_profile": "3g.40gb", "gpu": "0.5"}, "mig_profile", wire.MIG_PROFILE, id="mig-with-gpu"
    ),
]


@pytest.mark.parametrize(("fields", "api_field", "annotation"), BAD)
def test_bad_annotations_get_the_cli_and_api_reason(fields, api_field, annotation) -> None:
    api_fields = {k: [v] if k == "gpu_model" else v for k, v in fields.items()}
    with pytest.raises(BadRequest) as api:
        parse_submission(SubmitRequest(command=["true"], **api_fields))
    assert api.value.field == api_field
    notes = {f"fgpu.io/{k.replace('_', '-')}": v for k, v in fields.items()}
    body = pod("p", None)
    body["metadata"]["annotations"] = notes
    with pytest.raises(PodRequestError) as k8s:
        pod_ask(body)
    assert k8s.value.field == annotation
    # the same reason, led by the value written where the reason does not quote it
    written = notes[annotation]
    assert k8s.value.reason in (api.value.reason, f"{written!r}: {api.value.reason}")


def test_a_queue_annotation_that_is_not_a_queue_name_is_refused() -> None:
    body = pod("p", None)
    body["metadata"]["annotations"] = {"fgpu.io/gpu": "0.5", wire.QUEUE: "team-a\nx"}
    with pytest.raises(PodRequestError) as caught:
        pod_ask(body)
    assert caught.value.field == wire.QUEUE
    assert "cannot name a Queue object" in caught.value.reason


def test_a_bad_annotation_is_refused_at_admission_with_field_and_reason(make_cluster) -> None:
    with Served(create_app(env_without_isolation=True)) as webhook:
        cluster = make_cluster(admission=fgpu_admission(webhook.url))
        if cluster.real:
            pytest.skip("a real cluster calls the webhook through its own configuration")
        with pytest.raises(KubeError) as err:
            create(cluster, pod("bad", "1.5"), admit=False)
        good = create(cluster, pod("good", "0.5"), admit=False)
    assert err.value.status == 422
    assert "denied the request" in err.value.message
    assert (
        "fgpu.io/gpu: '1.5': above 1 a GPU request is a whole number of GPUs" in err.value.message
    )
    assert [p["metadata"]["name"] for p in cluster.api.list_pods().items] == ["good"]
    notes = good["metadata"]["annotations"]
    assert notes[wire.QUEUE] == "default"
    assert notes[wire.ENV_CONFIGMAP].startswith("fgpu-env-")
    assert good["spec"]["schedulerName"] == "fgpu"
    assert good["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": notes[wire.ENV_CONFIGMAP], "optional": False}}
    ]
    assert good["spec"]["volumes"] == [
        {"name": "fgpu-agent", "hostPath": {"path": "/run/fgpu", "type": "DirectoryOrCreate"}}
    ]
    assert good["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "fgpu-agent", "mountPath": "/run/fgpu", "readOnly": True}
    ]


def test_pods_created_from_generate_name_get_distinct_configmaps() -> None:
    body = pod("", "0.5")
    body["metadata"].pop("name")
    body["metadata"]["generateName"] = "job-"
    names = set()
    for _ in range(50):
        ops = mutate(body, env_without_isolation=True)
        names.update(op["value"] for op in ops if op["path"].endswith("env-configmap"))
    assert len(names) == 50


def test_a_container_may_not_choose_its_own_gpus() -> None:
    body = pod("sneaky", "0.5")
    body["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    with pytest.raises(PodRequestError) as err:
        mutate(body, env_without_isolation=True)
    assert err.value.field == "spec.containers[0].env"
    assert "NVIDIA_VISIBLE_DEVICES is set by fgpu" in err.value.reason


def test_pods_that_are_not_fgpus_pass_untouched() -> None:
    body = pod("plain", None)
    body["spec"].pop("schedulerName")
    assert mutate(body, env_without_isolation=True) == []


def test_gpu_count_with_a_fraction_is_a_share_on_each_gpu() -> None:
    ask = pod_ask(pod("two", "0.3", gpu_count="2"))
    assert (ask.request.gpu_count, ask.request.gpu_milli) == (2, 300)
    assert (ask.request.cpu_milli, ask.request.memory_mib) == (100, 128)
    with pytest.raises(PodRequestError) as err:
        pod_ask(pod("two", "1.5", gpu_count="2"))
    assert err.value.field == wire.GPU


def test_priority_comes_from_the_annotation_then_the_priority_class() -> None:
    body = pod("p", "0.5")
    body["spec"]["priorityClassName"] = "fgpu-high"
    body["spec"]["priority"] = 100
    assert pod_ask(body).priority == 100
    body["metadata"]["annotations"][wire.PRIORITY] = "low"
    assert pod_ask(body).priority == 40
    assert pod_ask(pod("q", "0.5")).priority == 50


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_webhook_serves_tls_from_certificate_files(make_cluster, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    with Served(
        create_app(env_without_isolation=True), ssl_certfile=str(cert), ssl_keyfile=str(key)
    ) as webhook:
        assert webhook.url.startswith("https://")
        cluster = make_cluster(admission=fgpu_admission(webhook.url), webhook_ca=str(cert))
        if cluster.real:
            pytest.skip("a real cluster calls the webhook through its own configuration")
        with pytest.raises(KubeError) as err:
            create(cluster, pod("bad", None, gpu_memory="lots"), admit=False)
        good = create(cluster, pod("good", "0.5"), admit=False)
    assert "fgpu.io/gpu-memory" in err.value.message
    assert good["spec"]["schedulerName"] == "fgpu"


# -- the node agent's socket folder ------------------------------------------------------------

AGENT_VOLUME = {
    "name": "fgpu-agent",
    "hostPath": {"path": "/run/fgpu", "type": "DirectoryOrCreate"},
}
AGENT_MOUNT = {"name": "fgpu-agent", "mountPath": "/run/fgpu", "readOnly": True}


def busy_pod() -> dict[str, Any]:
    """A pod with an init container, two containers, a volume and a mount of its own."""
    body = pod("p", "0.5")
    body["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    body["spec"]["containers"].append(
        {
            "name": "side",
            "image": "busybox",
            "volumeMounts": [{"name": "data", "mountPath": "/run"}],  # above /run/fgpu: fine
        }
    )
    body["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    return body


def test_the_agent_socket_folder_is_mounted_read_only_in_every_container() -> None:
    from kubernetes import client

    admitted = json_patch(busy_pod(), mutate(busy_pod(), env_without_isolation=True))
    spec = admitted["spec"]
    assert spec["volumes"] == [{"name": "data", "emptyDir": {}}, AGENT_VOLUME]
    assert spec["initContainers"][0]["volumeMounts"] == [AGENT_MOUNT]
    assert spec["containers"][0]["volumeMounts"] == [AGENT_MOUNT]
    assert spec["containers"][1]["volumeMounts"] == [
        {"name": "data", "mountPath": "/run"},
        AGENT_MOUNT,
    ]
    # the environment the scheduler writes names the socket in that folder
    assert wire.AGENT_SOCKET == "/run/fgpu/agent.sock"
    # a valid pod for the official client's model (no field lost in a round trip)
    api = client.ApiClient()
    model = api.deserialize(json.dumps(admitted), "V1Pod", "application/json")
    assert api.sanitize_for_serialization(model)["spec"]["volumes"][1] == AGENT_VOLUME


def placed_copy() -> dict[str, Any]:
    """``kubectl get pod -o json`` of an admitted pod the scheduler placed, with the fields
    the API server refuses on creation (and ``spec.nodeName``, refused below) taken out."""
    admitted = json_patch(busy_pod(), mutate(busy_pod(), env_without_isolation=True))
    notes = admitted["metadata"]["annotations"]
    notes[wire.ASSIGNMENT] = '{"node":"n1"}'
    notes[wire.GPU_UUIDS] = "GPU-1"
    notes[wire.HOLD] = '{"node":"n1"}'
    notes[wire.SUSPEND] = "true"
    notes[wire.SUSPENDED] = '{"pids": [1], "copy_s": 0.1}'
    notes[wire.RESTORED] = '{"copy_s": 0.1}'
    return admitted


def test_a_pod_copied_from_a_placed_one_gets_its_own_configmap_and_no_placement() -> None:
    copy = placed_copy()
    given = copy["metadata"]["annotations"][wire.ENV_CONFIGMAP]
    again = json_patch(copy, mutate(copy, env_without_isolation=True))
    notes = again["metadata"]["annotations"]
    fresh = notes[wire.ENV_CONFIGMAP]
    assert fresh.startswith("fgpu-env-")
    assert fresh != given
    assert not set(wire.SCHEDULER_ANNOTATIONS) & set(notes)
    assert not set(wire.AGENT_ANNOTATIONS) & set(notes)
    assert notes[wire.GPU] == "0.5"
    ref = {"configMapRef": {"name": fresh, "optional": False}}
    for group in ("initContainers", "containers"):
        for c in again["spec"][group]:
            assert c["envFrom"] == [ref]  # the copied reference replaced, not duplicated
    # the rest is as it was: the agent socket's volume and mounts are not added twice
    assert again["spec"]["volumes"] == copy["spec"]["volumes"]
    for group in ("initContainers", "containers"):
        for old, new in zip(copy["spec"][group], again["spec"][group], strict=True):
            assert new["volumeMounts"] == old["volumeMounts"]


def test_a_given_configmap_name_is_replaced_and_other_env_sources_kept() -> None:
    body = pod("p", "0.5")
    body["metadata"]["annotations"][wire.ENV_CONFIGMAP] = "someone-elses"
    mine = {"configMapRef": {"name": "settings"}}
    body["spec"]["containers"][0]["envFrom"] = [
        mine,
        {"configMapRef": {"name": "someone-elses", "optional": False}},
    ]
    admitted = json_patch(body, mutate(body, "fgpu-env-new", env_without_isolation=True))
    assert admitted["metadata"]["annotations"][wire.ENV_CONFIGMAP] == "fgpu-env-new"
    assert admitted["spec"]["containers"][0]["envFrom"] == [
        mine,
        {"configMapRef": {"name": "fgpu-env-new", "optional": False}},
    ]


def test_a_copied_reference_in_another_spelling_is_replaced_too() -> None:
    # kubectl output edited by hand: the "optional" field dropped, or an older pod's name
    body = pod("p", "0.5")
    body["metadata"]["annotations"][wire.ENV_CONFIGMAP] = "fgpu-env-0123456789"
    body["spec"]["containers"][0]["envFrom"] = [
        {"configMapRef": {"name": "fgpu-env-0123456789"}},
        {"configMapRef": {"name": "fgpu-env-aaaaaaaaaa", "optional": True}},
    ]
    admitted = json_patch(body, mutate(body, "fgpu-env-new", env_without_isolation=True))
    assert admitted["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": "fgpu-env-new", "optional": False}},
    ]


def test_a_copied_pod_is_admitted_through_the_api_and_gets_a_fresh_configmap(
    make_cluster,
) -> None:
    with Served(create_app(env_without_isolation=True)) as webhook:
        cluster = make_cluster(admission=fgpu_admission(webhook.url))
        if cluster.real:
            pytest.skip("a real cluster calls the webhook through its own configuration")
        first = create(cluster, pod("first", "0.5"), admit=False)
        copy = json.loads(json.dumps(first))
        for field in ("uid", "resourceVersion", "creationTimestamp"):
            copy["metadata"].pop(field, None)
        copy["metadata"]["name"] = "second"
        copy["metadata"]["annotations"][wire.ASSIGNMENT] = '{"node":"n1"}'
        copy.pop("status", None)
        second = create(cluster, copy, admit=False)
    a, b = (p["metadata"]["annotations"] for p in (first, second))
    assert b[wire.ENV_CONFIGMAP] != a[wire.ENV_CONFIGMAP]
    assert wire.ASSIGNMENT not in b
    assert second["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": b[wire.ENV_CONFIGMAP], "optional": False}}
    ]


def test_without_the_socket_volume_nothing_is_mounted() -> None:
    admitted = json_patch(
        busy_pod(), mutate(busy_pod(), agent_socket_volume=False, env_without_isolation=True)
    )
    assert admitted["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}]
    assert "volumeMounts" not in admitted["spec"]["containers"][0]
    assert admitted["spec"]["containers"][0]["envFrom"]  # the environment is still there


def _with_volume(volume: dict[str, Any]) -> dict[str, Any]:
    body = pod("p", "0.5")
    body["spec"]["volumes"] = [volume]
    return body


def _with_mount(mount: dict[str, Any], group: str = "containers") -> dict[str, Any]:
    body = pod("p", "0.5")
    body["spec"]["volumes"] = [{"name": "mine", "emptyDir": {}}]
    if group == "initContainers":
        body["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    body["spec"][group][0]["volumeMounts"] = [{"name": "other", "mountPath": "/data"}, mount]
    return body


CONFLICTS = [
    pytest.param(
        _with_volume({"name": "fgpu-agent", "emptyDir": {}}),
        "spec.volumes[0].name",
        "fgpu-agent is the volume fgpu adds for the node agent's socket (hostPath /run/fgpu, "
        "DirectoryOrCreate); rename this volume",
        id="volume-name-taken",
    ),
    pytest.param(
        _with_volume({"name": "fgpu-agent", "hostPath": {"path": "/"}}),
        "spec.volumes[0].name",
        "fgpu-agent is the volume fgpu adds",
        id="volume-name-other-host-path",
    ),
    pytest.param(
        _with_mount({"name": "mine", "mountPath": "/run/fgpu"}),
        "spec.containers[0].volumeMounts[1].mountPath",
        "/run/fgpu is where fgpu mounts the node agent's socket folder "
        "(FGPU_AGENT_SOCKET=/run/fgpu/agent.sock, volume fgpu-agent, read only); mount this "
        "volume elsewhere",
        id="another-volume-at-run-fgpu",
    ),
    pytest.param(
        _with_mount({"name": "mine", "mountPath": "/run/fgpu/cache"}),
        "spec.containers[0].volumeMounts[1].mountPath",
        "/run/fgpu is where fgpu mounts",
        id="below-run-fgpu",
    ),
    pytest.param(
        _with_mount({"name": "fgpu-agent", "mountPath": "/run/fgpu/"}),
        "spec.containers[0].volumeMounts[1].mountPath",
        "/run/fgpu is where fgpu mounts",
        id="writable",
    ),
    pytest.param(
        _with_mount({"name": "mine", "mountPath": "/run//fgpu"}, group="initContainers"),
        "spec.initContainers[0].volumeMounts[1].mountPath",
        "/run/fgpu is where fgpu mounts",
        id="init-container",
    ),
    pytest.param(
        _with_mount({"name": "mine", "mountPath": "//run//fgpu"}),
        "spec.containers[0].volumeMounts[1].mountPath",
        "/run/fgpu is where fgpu mounts",
        id="leading-double-slash",
    ),
    pytest.param(
        _with_mount({"name": "mine", "mountPath": "/run/fgpu/../fgpu"}),
        "spec.containers[0].volumeMounts[1].mountPath",
        "/run/fgpu is where fgpu mounts",
        id="dot-dot",
    ),
    pytest.param(
        _with_mount({"name": "mine", "mountPath": "/var/run/fgpu"}),
        "spec.containers[0].volumeMounts[1].mountPath",
        "/run/fgpu is where fgpu mounts",
        id="var-run-link",
    ),
    pytest.param(
        _with_mount({"name": "fgpu-agent", "mountPath": "//run/fgpu/x", "readOnly": True}),
        "spec.containers[0].volumeMounts[1].mountPath",
        "/run/fgpu is where fgpu mounts",
        id="agent-volume-below",
    ),
]


@pytest.mark.parametrize(("body", "field", "reason"), CONFLICTS)
def test_a_volume_or_mount_in_the_agent_sockets_place_is_refused(
    body: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(PodRequestError) as err:
        mutate(body, env_without_isolation=True)
    assert err.value.field == field
    assert err.value.reason.startswith(reason)
    assert mutate(
        body, agent_socket_volume=False, env_without_isolation=True
    )  # admitted when the webhook adds nothing


def test_a_conflicting_mount_is_refused_at_admission_and_the_switch_turns_it_off(
    make_cluster,
) -> None:
    body = _with_mount({"name": "mine", "mountPath": "/run/fgpu"})
    with Served(create_app(env_without_isolation=True)) as webhook:
        cluster = make_cluster(admission=fgpu_admission(webhook.url))
        if cluster.real:
            pytest.skip("a real cluster calls the webhook through its own configuration")
        with pytest.raises(KubeError) as err:
            create(cluster, body, admit=False)
    assert err.value.status == 422
    assert (
        "denied the request: spec.containers[0].volumeMounts[1].mountPath: /run/fgpu is where "
        "fgpu mounts the node agent's socket folder" in err.value.message
    )
    with Served(create_app(agent_socket_volume=False, env_without_isolation=True)) as webhook:
        cluster = make_cluster(admission=fgpu_admission(webhook.url))
        made = create(cluster, body, admit=False)
    assert made["spec"]["volumes"] == [{"name": "mine", "emptyDir": {}}]


# -- what an fgpu pod may not ask for ----------------------------------------------------------


def _pod_with(change: Any) -> dict[str, Any]:
    body = pod("p", "0.5")
    change(body)
    return body


def _resources(group: str, part: str, resource: str) -> Any:
    def change(body: dict[str, Any]) -> None:
        if group == "initContainers":
            body["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
        body["spec"][group][0]["resources"] = {part: {resource: "1"}}

    return change


REFUSED = [
    pytest.param(
        _pod_with(lambda b: b["spec"].update(nodeName="gpu-node-1")),
        "spec.nodeName",
        "'gpu-node-1' is set: a pod that names its node skips the scheduler",
        id="node-name",
    ),
    pytest.param(
        _pod_with(lambda b: b["spec"].update(schedulerName="volcano")),
        "spec.schedulerName",
        "'volcano' is another scheduler, but the pod's fgpu.io/ annotations ask for the fgpu "
        "scheduler (fgpu); remove the fgpu.io/ annotations or the schedulerName",
        id="other-scheduler",
    ),
    pytest.param(
        _pod_with(_resources("containers", "limits", "nvidia.com/gpu")),
        "spec.containers[0].resources.limits",
        "nvidia.com/gpu comes from the NVIDIA device plugin; a pod takes its GPUs from fgpu",
        id="device-plugin-limit",
    ),
    pytest.param(
        _pod_with(_resources("containers", "requests", "nvidia.com/gpu")),
        "spec.containers[0].resources.requests",
        "nvidia.com/gpu comes from the NVIDIA device plugin",
        id="device-plugin-request",
    ),
    pytest.param(
        _pod_with(_resources("initContainers", "limits", "nvidia.com/gpu")),
        "spec.initContainers[0].resources.limits",
        "nvidia.com/gpu comes from the NVIDIA device plugin",
        id="device-plugin-init-container",
    ),
    pytest.param(
        _pod_with(_resources("containers", "limits", "nvidia.com/mig-3g.40gb")),
        "spec.containers[0].resources.limits",
        "nvidia.com/mig-3g.40gb comes from the NVIDIA device plugin",
        id="device-plugin-mig",
    ),
]


@pytest.mark.parametrize(("body", "field", "reason"), REFUSED)
def test_an_fgpu_pod_that_bypasses_fgpu_is_refused(
    body: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(PodRequestError) as err:
        mutate(body, env_without_isolation=True)
    assert err.value.field == field
    assert err.value.reason.startswith(reason)


@pytest.mark.parametrize("scheduler", [None, "", "default-scheduler", "fgpu"])
def test_the_default_scheduler_or_fgpu_becomes_fgpu(scheduler: str | None) -> None:
    body = pod("p", "0.5")
    body["spec"].pop("schedulerName")
    if scheduler is not None:
        body["spec"]["schedulerName"] = scheduler
    assert (
        json_patch(body, mutate(body, env_without_isolation=True))["spec"]["schedulerName"]
        == "fgpu"
    )


def test_a_plain_pod_may_name_its_node_scheduler_and_device_plugin_gpus() -> None:
    body = pod("plain", None)
    body["spec"].update(nodeName="n1", schedulerName="volcano")
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert mutate(body, env_without_isolation=True) == []


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("fgpu.io/gpus", "fgpu.io/gpu"),
        ("fgpu.io/GPU", "fgpu.io/gpu"),
        ("fgpu.io/gpu-modle", "fgpu.io/gpu-model"),
        ("fgpu.io/Queue", "fgpu.io/queue"),
        ("fgpu.io/inventory", None),
    ],
)
def test_an_unknown_fgpu_annotation_is_refused_with_the_closest_one(
    key: str, suggestion: str | None
) -> None:
    body = pod("p", None)
    body["spec"].pop("schedulerName")
    body["metadata"]["annotations"] = {key: "0.5"}  # the typo alone makes it fgpu's
    with pytest.raises(PodRequestError) as err:
        mutate(body, env_without_isolation=True)
    assert err.value.field == key
    assert err.value.reason.startswith("not an fgpu annotation; ")
    if suggestion:
        assert f"did you mean {suggestion}? " in err.value.reason
    else:
        assert "did you mean" not in err.value.reason
    assert "fgpu reads fgpu.io/gpu, fgpu.io/gpu-count" in err.value.reason


def test_the_bypasses_are_refused_at_admission(make_cluster) -> None:
    with Served(create_app(env_without_isolation=True)) as webhook:
        cluster = make_cluster(admission=fgpu_admission(webhook.url))
        if cluster.real:
            pytest.skip("a real cluster calls the webhook through its own configuration")
        body = pod("typo", None)
        body["spec"].pop("schedulerName")
        body["metadata"]["annotations"] = {"fgpu.io/gpus": "0.5"}
        with pytest.raises(KubeError) as typo:
            create(cluster, body, admit=False)
        with pytest.raises(KubeError) as pinned:
            create(cluster, _pod_with(lambda b: b["spec"].update(nodeName="n1")), admit=False)
    assert typo.value.status == 422
    assert (
        "denied the request: fgpu.io/gpus: not an fgpu annotation; did you mean fgpu.io/gpu?"
        in typo.value.message
    )
    assert "denied the request: spec.nodeName: 'n1' is set" in pinned.value.message
    assert cluster.api.list_pods().items == []


# -- updates: the annotations fgpu writes --------------------------------------------------------


def _review(old: dict[str, Any], new: dict[str, Any], user: str) -> dict[str, Any]:
    body = {
        "request": {
            "uid": "u1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "UPDATE",
            "userInfo": {"username": user},
            "object": new,
            "oldObject": old,
        }
    }
    response: dict[str, Any] = review(body, env_without_isolation=True)["response"]
    return response


def _placed() -> dict[str, Any]:
    admitted = json_patch(pod("p", "0.5"), mutate(pod("p", "0.5"), env_without_isolation=True))
    admitted["spec"]["nodeName"] = "n1"
    admitted["metadata"]["annotations"][wire.ASSIGNMENT] = '{"node":"n1"}'
    admitted["metadata"]["annotations"][wire.GPU_UUIDS] = "GPU-1"
    return admitted


@pytest.mark.parametrize(
    ("key", "value", "change"),
    [
        (wire.ASSIGNMENT, None, "remove"),
        (wire.ASSIGNMENT, '{"node":"n1","gpu_milli":[1]}', "change"),
        (wire.GPU_UUIDS, None, "remove"),
        (wire.ENV_CONFIGMAP, "fgpu-env-other", "change"),
        (wire.HOLD, '{"node":"n1"}', "add"),
        (wire.SUSPEND, "true", "add"),
    ],
)
def test_only_the_scheduler_may_change_what_fgpu_wrote(
    key: str, value: str | None, change: str
) -> None:
    old = _placed()
    new = json.loads(json.dumps(old))
    if value is None:
        del new["metadata"]["annotations"][key]
    else:
        new["metadata"]["annotations"][key] = value
    refused = _review(old, new, "alice")
    assert refused["allowed"] is False
    message = refused["status"]["message"]
    assert message.startswith(f"{key}: written by the fgpu ")
    assert f"only the fgpu scheduler ({wire.SCHEDULER_USER}) may change it" in message
    assert message.endswith(f"so alice may not {change} it")
    allowed = _review(old, new, wire.SCHEDULER_USER)
    assert allowed == {"uid": "u1", "allowed": True}  # never a patch on UPDATE


@pytest.mark.parametrize("key", [wire.SUSPENDED, wire.RESTORED])
def test_the_node_agent_may_write_its_suspend_records_and_nothing_else_of_fgpu(key: str) -> None:
    old = _placed()
    new = json.loads(json.dumps(old))
    new["metadata"]["annotations"][key] = '{"copy_s": 0.1}'
    assert _review(old, new, wire.AGENT_USER) == {"uid": "u1", "allowed": True}
    assert _review(old, new, wire.SCHEDULER_USER) == {"uid": "u1", "allowed": True}
    refused = _review(old, new, "alice")["status"]["message"]
    assert refused.startswith(f"{key}: written by the fgpu node agent")
    assert f"and node agent ({wire.AGENT_USER}) may change it, so alice may not add it" in (refused)
    theirs = json.loads(json.dumps(old))
    theirs["metadata"]["annotations"][wire.SUSPEND] = "true"
    assert _review(old, theirs, wire.AGENT_USER)["allowed"] is False


def test_other_updates_are_allowed_without_a_patch() -> None:
    old = _placed()
    new = json.loads(json.dumps(old))
    new["metadata"]["annotations"][wire.QUEUE] = "team-b"  # counted by the assignment
    new["metadata"]["annotations"][wire.GPU] = "1"
    new["metadata"]["labels"] = {"app": "x"}
    assert _review(old, new, "alice") == {"uid": "u1", "allowed": True}
    plain = pod("plain", None)
    plain["spec"].pop("schedulerName")
    assert _review(plain, plain, "") == {"uid": "u1", "allowed": True}


class Recorder:
    """The webhook's app, recording the AdmissionReview requests it answers (``paths``:
    which endpoint got each)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.app = FastAPI()

        @self.app.post("/mutate")
        async def mutating(request: Request) -> dict[str, Any]:
            body = json.loads(await request.body())
            self.requests.append(body["request"])
            self.paths.append("mutate")
            return mutate_review(body, env_without_isolation=True)

        @self.app.post("/validate")
        async def validating(request: Request) -> dict[str, Any]:
            body = json.loads(await request.body())
            self.requests.append(body["request"])
            self.paths.append("validate")
            return validate(body, env_without_isolation=True)


def _as(cluster: Any, user: str) -> KubeApi:
    """The cluster's API as ``user`` (the stand-in trusts ``Impersonate-User``)."""
    client = api_client(host=cluster.standin.url)
    client.set_default_header("Impersonate-User", user)
    return KubeApi(client)


def test_the_standin_sends_pod_updates_and_a_user_cannot_edit_the_assignment(
    make_cluster,
) -> None:
    hook = Recorder()
    with Served(hook.app) as webhook:
        cluster = make_cluster(admission=fgpu_admission(webhook.url))
        if cluster.real:
            pytest.skip("a real cluster calls the webhook through its own configuration")
        made = create(cluster, pod("p", "0.5"), admit=False)
        # mutation first, then validation of the mutated pod (the API server's order)
        assert [r["operation"] for r in hook.requests] == ["CREATE", "CREATE"]
        assert hook.paths == ["mutate", "validate"]
        assert hook.requests[1]["object"]["spec"]["schedulerName"] == wire.SCHEDULER_NAME
        assert hook.requests[0]["userInfo"]["username"] == "system:anonymous"
        assert hook.requests[0]["oldObject"] is None
        # the Binding (pods/binding) and status writes (pods/status) are subresources
        cluster.api.bind("default", "p", made["metadata"]["uid"], "n1", {wire.ASSIGNMENT: "{}"})
        cluster.api.patch_pod_status("default", "p", {"status": {"message": "hi"}})
        assert len(hook.requests) == 2
        with pytest.raises(KubeError) as err:  # kubectl annotate pod p fgpu.io/assignment-
            cluster.api.patch_pod(
                "default", "p", {"metadata": {"annotations": {wire.ASSIGNMENT: None}}}
            )
        assert err.value.status == 422
        assert (
            "denied the request: fgpu.io/assignment: written by the fgpu scheduler"
            in err.value.message
        )
        assert "so system:anonymous may not remove it" in err.value.message
        update = hook.requests[-1]
        assert update["operation"] == "UPDATE"
        assert update["oldObject"]["metadata"]["annotations"][wire.ASSIGNMENT] == "{}"
        assert wire.ASSIGNMENT not in update["object"]["metadata"]["annotations"]
        # a user annotation and a label may change; the scheduler may write the hold
        cluster.api.patch_pod("default", "p", {"metadata": {"annotations": {wire.QUEUE: "b"}}})
        alice = _as(cluster, "alice")
        with pytest.raises(KubeError):
            alice.patch_pod("default", "p", {"metadata": {"annotations": {wire.HOLD: "{}"}}})
        assert hook.requests[-1]["userInfo"]["username"] == "alice"
        _as(cluster, wire.SCHEDULER_USER).patch_pod(
            "default", "p", {"metadata": {"annotations": {wire.HOLD: "{}"}}}
        )
        # a replace (PUT) goes through the webhook too
        now = cluster.api.get_pod("default", "p")
        now["metadata"]["annotations"][wire.ENV_CONFIGMAP] = "fgpu-env-mine"
        with pytest.raises(KubeError) as put:
            cluster.api._call(cluster.api.core.replace_namespaced_pod, "p", "default", now)
        assert "fgpu.io/env-configmap: written by the fgpu webhook" in put.value.message
    notes = cluster.api.get_pod("default", "p")["metadata"]["annotations"]
    assert notes[wire.ASSIGNMENT] == "{}"
    assert notes[wire.QUEUE] == "b"
    assert notes[wire.HOLD] == "{}"
    assert notes[wire.ENV_CONFIGMAP] == made["metadata"]["annotations"][wire.ENV_CONFIGMAP]


# -- the webhook configuration (deploy/base/webhook.yaml) ----------------------------------------

DEPLOY_WEBHOOK = Path(__file__).resolve().parents[2] / "deploy" / "base" / "webhook.yaml"


def _configured_webhook() -> dict[str, Any]:
    import yaml

    docs = list(yaml.safe_load_all(DEPLOY_WEBHOOK.read_text()))
    config = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")
    (hook,) = config["webhooks"]  # one entry: the overlays set its caBundle
    return dict(hook)


def test_the_configuration_sends_pod_creates_and_updates_but_no_subresources() -> None:
    hook = _configured_webhook()
    rule, debug = hook["rules"]
    assert rule["operations"] == ["CREATE", "UPDATE"]
    assert rule["resources"] == ["pods"]  # not pods/status (the kubelet) nor pods/binding
    assert (debug["operations"], debug["resources"]) == (["UPDATE"], ["pods/ephemeralcontainers"])
    assert hook["failurePolicy"] == "Fail"
    update = next(c for c in hook["matchConditions"] if "UPDATE" in c["expression"])
    # the annotations the UPDATE condition watches are the ones the webhook guards
    named = set(re.findall(r"'(fgpu\.io/[a-z-]+)'", update["expression"]))
    assert named == set(wire.FGPU_ANNOTATIONS) | set(TENANCY_ANNOTATIONS)


def _condition_cases() -> list[Any]:
    def p(notes: dict[str, str] | None, scheduler: str = "default-scheduler") -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "p"} if notes is None else {"annotations": notes}
        return {"metadata": meta, "spec": {"schedulerName": scheduler}}

    a = {wire.ASSIGNMENT: "x"}
    return [
        pytest.param("CREATE", p(None), None, False, "", id="create-plain"),
        pytest.param("CREATE", p({"app": "x"}), None, False, "", id="create-other-annotation"),
        pytest.param("CREATE", p({"fgpu.io/gpus": "1"}), None, True, "", id="create-fgpu-typo"),
        pytest.param("CREATE", p(None, "fgpu"), None, True, "", id="create-fgpu-scheduler"),
        pytest.param("UPDATE", p(None), p(None), False, "", id="update-plain"),
        pytest.param("UPDATE", p({**a, "x": "1"}), p(a), False, "", id="update-label-like"),
        pytest.param("UPDATE", p({**a, wire.QUEUE: "b"}), p(a), False, "", id="update-queue"),
        pytest.param(
            "UPDATE", p({wire.QUEUE: "b"}, "fgpu"), p(None, "fgpu"), True, "", id="fgpu-queue"
        ),
        pytest.param("UPDATE", p({}), p(a), True, "", id="update-remove-assignment"),
        pytest.param("UPDATE", p(None), p(a), True, "", id="update-remove-all-annotations"),
        pytest.param("UPDATE", p({wire.ASSIGNMENT: "y"}), p(a), True, "", id="update-change"),
        pytest.param("UPDATE", p({wire.HOLD: ""}), p(None), True, "", id="update-add-empty-hold"),
        pytest.param(
            "UPDATE", p(None, "fgpu"), p(None, "fgpu"), True, "ephemeralcontainers", id="debug-fgpu"
        ),
        pytest.param("UPDATE", p(None), p(None), False, "ephemeralcontainers", id="debug-other"),
    ]


@pytest.mark.parametrize(("operation", "new", "old", "called", "sub"), _condition_cases())
def test_the_match_conditions_send_only_fgpu_creates_and_fgpu_annotation_changes(
    operation: str, new: dict[str, Any], old: dict[str, Any] | None, called: bool, sub: str
) -> None:
    """With a CEL interpreter (``pip install cel-python``; skipped without): an outage of
    the webhook blocks nothing but these (failurePolicy Fail)."""
    celpy = pytest.importorskip("celpy")
    env = celpy.Environment()
    activation = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({"operation": operation, "subResource": sub}),
    }
    results = [
        bool(env.program(env.compile(c["expression"])).evaluate(activation))
        for c in _configured_webhook()["matchConditions"]
    ]
    assert all(results) is called
