"""The admission webhook over HTTP(S), called by the API server (stand-in) on pod
creation: bad fgpu annotations are refused with the CLI's and API's reason."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fgpu.k8s import wire
from fgpu.k8s.kube import KubeError
from fgpu.k8s.objects import PodRequestError, pod_ask
from fgpu.k8s.standin.patch import json_patch
from fgpu.k8s.webhook import create_app, mutate
from fgpu.server.errors import BadRequest
from fgpu.server.requests import parse_submission
from fgpu.wire import SubmitRequest
from tests.k8s.conftest import Served
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
    assert k8s.value.reason == api.value.reason


def test_a_queue_annotation_that_is_not_a_queue_name_is_refused() -> None:
    body = pod("p", None)
    body["metadata"]["annotations"] = {"fgpu.io/gpu": "0.5", wire.QUEUE: "team-a\nx"}
    with pytest.raises(PodRequestError) as caught:
        pod_ask(body)
    assert caught.value.field == wire.QUEUE
    assert "cannot name a Queue object" in caught.value.reason


def test_a_bad_annotation_is_refused_at_admission_with_field_and_reason(make_cluster) -> None:
    with Served(create_app()) as webhook:
        cluster = make_cluster(webhooks=[f"{webhook.url}/mutate"])
        if cluster.real:
            pytest.skip("a real cluster calls the webhook through its own configuration")
        with pytest.raises(KubeError) as err:
            create(cluster, pod("bad", "1.5"), admit=False)
        good = create(cluster, pod("good", "0.5"), admit=False)
    assert err.value.status == 422
    assert "denied the request" in err.value.message
    assert "fgpu.io/gpu: above 1 a GPU request is a whole number of GPUs" in err.value.message
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
        ops = mutate(body)
        names.update(op["value"] for op in ops if op["path"].endswith("env-configmap"))
    assert len(names) == 50


def test_a_container_may_not_choose_its_own_gpus() -> None:
    body = pod("sneaky", "0.5")
    body["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    with pytest.raises(PodRequestError) as err:
        mutate(body)
    assert err.value.field == "spec.containers[0].env"
    assert "NVIDIA_VISIBLE_DEVICES is set by fgpu" in err.value.reason


def test_pods_that_are_not_fgpus_pass_untouched() -> None:
    body = pod("plain", None)
    body["spec"].pop("schedulerName")
    assert mutate(body) == []


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
    with Served(create_app(), ssl_certfile=str(cert), ssl_keyfile=str(key)) as webhook:
        assert webhook.url.startswith("https://")
        cluster = make_cluster(webhooks=[f"{webhook.url}/mutate"], webhook_ca=str(cert))
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

    admitted = json_patch(busy_pod(), mutate(busy_pod()))
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


def test_a_pod_copied_from_an_admitted_one_is_admitted_unchanged() -> None:
    admitted = json_patch(busy_pod(), mutate(busy_pod()))
    again = json_patch(admitted, mutate(admitted))
    assert again == admitted


def test_without_the_socket_volume_nothing_is_mounted() -> None:
    admitted = json_patch(busy_pod(), mutate(busy_pod(), agent_socket_volume=False))
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
]


@pytest.mark.parametrize(("body", "field", "reason"), CONFLICTS)
def test_a_volume_or_mount_in_the_agent_sockets_place_is_refused(
    body: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(PodRequestError) as err:
        mutate(body)
    assert err.value.field == field
    assert err.value.reason.startswith(reason)
    assert mutate(body, agent_socket_volume=False)  # admitted when the webhook adds nothing


def test_a_conflicting_mount_is_refused_at_admission_and_the_switch_turns_it_off(
    make_cluster,
) -> None:
    body = _with_mount({"name": "mine", "mountPath": "/run/fgpu"})
    with Served(create_app()) as webhook:
        cluster = make_cluster(webhooks=[f"{webhook.url}/mutate"])
        if cluster.real:
            pytest.skip("a real cluster calls the webhook through its own configuration")
        with pytest.raises(KubeError) as err:
            create(cluster, body, admit=False)
    assert err.value.status == 422
    assert (
        "denied the request: spec.containers[0].volumeMounts[1].mountPath: /run/fgpu is where "
        "fgpu mounts the node agent's socket folder" in err.value.message
    )
    with Served(create_app(agent_socket_volume=False)) as webhook:
        cluster = make_cluster(webhooks=[f"{webhook.url}/mutate"])
        made = create(cluster, body, admit=False)
    assert made["spec"]["volumes"] == [{"name": "mine", "emptyDir": {}}]
