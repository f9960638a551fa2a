"""``resource.k8s.io/v1`` through the official client: the validation fgpu's objects meet and
the resource claim controller's behaviour (a claim per pod from its template, owned and
named as the real controller does, ``status.resourceClaimStatuses``; reservations dropped and
claims deallocated when pods go). The same tests hold against a real 1.34 to 1.36 API
server: refusals are checked by code, field and cause (``details.causes``), not by wording,
and whatever a controller does is waited for."""

from __future__ import annotations

from typing import Any

import pytest

from fgpu.k8s.kube import KubeError
from fgpu.k8s.resourceapi import ResourceApi
from fgpu_standin.claims import FINALIZER, POD_CLAIM_NAME, generate_name
from tests.k8s.kube import wait_until

pytestmark = pytest.mark.k8s

DRIVER = "gpu.fgpu.io"


def claim_spec(count: int | None = None, klass: str = DRIVER) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": klass}
    if count is not None:
        exactly["count"] = count
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def slice_body(node: str, devices: list[dict[str, Any]] | None = None, **spec: Any) -> dict:
    body = {
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices
            if devices is not None
            else [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}}}],
        },
    }
    body["spec"].update(spec)
    return body


class Refused(KubeError):
    """A refusal with its ``details.causes`` (``reason``, ``field``, ``message`` each)."""

    def __init__(self, status: int, reason: str, message: str, causes: list[dict]) -> None:
        super().__init__(status, reason, message)
        self.causes = causes

    def fields(self) -> set[tuple[str, str]]:
        """(field, cause reason) of every cause."""
        return {(c.get("field", ""), c.get("reason", "")) for c in self.causes}


def error_of(call: Any) -> KubeError:
    with pytest.raises(KubeError) as err:
        call()
    assert (err.value.status, err.value.reason) == (422, "Invalid"), err.value
    return err.value


def post(cluster, path: str, body: dict) -> dict:
    """POST as it comes (the official client checks its typed arguments itself, so a body it
    would refuse is sent past it, as other clients and ``kubectl`` may send it).

    Raises:
        KubeError: the server's refusal."""
    import json

    client = cluster.api.client
    method, url, headers, data, _ = client.param_serialize(
        "POST", path, header_params={"Content-Type": "application/json"}, body=body
    )
    reply = client.call_api(method, url, headers, data)
    payload = json.loads(reply.read() or b"{}")
    if reply.status >= 400:
        causes = (payload.get("details") or {}).get("causes") or []
        raise Refused(reply.status, payload.get("reason", ""), payload.get("message", ""), causes)
    return payload


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        pytest.param(
            slice_body("n1", pool={"name": "n1", "generation": 1, "resourceSliceCount": 0}),
            ("spec.pool.resourceSliceCount", "FieldValueInvalid"),
            id="slice-count-zero",
        ),
        pytest.param(
            slice_body("n1", allNodes=True),
            ("spec", "FieldValueInvalid"),
            id="two-node-choices",
        ),
        pytest.param(
            slice_body("n1", [{"name": "gpu-0"}, {"name": "gpu-0"}]),
            ("spec.devices[1].name", "FieldValueDuplicate"),
            id="duplicate-device",
        ),
        pytest.param(
            slice_body("n1", [{"name": "GPU_0"}]),
            ("spec.devices[0].name", "FieldValueInvalid"),
            id="device-not-a-label",
        ),
        pytest.param(
            slice_body("n1", [{"name": "g", "attributes": {"uuid": {"string": "a", "int": 1}}}]),
            ("spec.devices[0].attributes[uuid]", "FieldValueInvalid"),
            id="attribute-two-types",
        ),
    ],
)
def test_resource_slices_are_checked(cluster, body, cause) -> None:
    err = error_of(lambda: post(cluster, "/apis/resource.k8s.io/v1/resourceslices", body))
    assert isinstance(err, Refused)
    assert cause in err.fields(), err.causes
    assert "n1-gpu.fgpu.io" in err.message  # the object is named


def test_a_capacity_without_value_and_a_zero_count_are_stored_as_1_36_stores_them(
    cluster,
) -> None:
    """A device capacity without ``value`` is a zero quantity (the field is not a pointer),
    and a request's ``count: 0`` reads as unset and is defaulted to 1 (an integer left out
    when zero), as 1.36 stores them rather than refusing."""
    api = ResourceApi(cluster.api)
    body = slice_body("n1", [{"name": "g", "capacity": {"memory": {}}}])
    made = post(cluster, "/apis/resource.k8s.io/v1/resourceslices", body)
    assert made["spec"]["devices"][0]["capacity"]["memory"] == {"value": "0"}
    path = f"/apis/resource.k8s.io/v1/namespaces/{cluster.namespace}/resourceclaims"
    post(cluster, path, {"metadata": {"name": "c"}, "spec": claim_spec(count=0)})
    exactly = api.get_claim(cluster.namespace, "c")["spec"]["devices"]["requests"][0]["exactly"]
    assert (exactly["allocationMode"], exactly["count"]) == ("ExactCount", 1)


def test_quantities_are_stored_in_canonical_form(cluster) -> None:
    """The API server stores quantities canonically: the largest suffix of the kind written
    (binary or decimal) that loses nothing (``81920Mi`` -> ``80Gi``, ``0.5`` -> ``500m``)."""
    devices = [
        {
            "name": "gpu-0",
            "capacity": {"memory": {"value": "81920Mi"}, "compute": {"value": "1000m"}},
        }
    ]
    made = ResourceApi(cluster.api).create_slice(slice_body("n1", devices))
    assert made["spec"]["devices"][0]["capacity"] == {
        "memory": {"value": "80Gi"},
        "compute": {"value": "1"},
    }
    pod = cluster.api.core.create_namespaced_pod(
        cluster.namespace,
        {
            "metadata": {"name": "sized"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "resources": {
                            "requests": {"cpu": "0.5", "memory": "1.5Gi"},
                            "limits": {"cpu": "2000m", "memory": "2048Mi"},
                        },
                    }
                ]
            },
        },
    )
    resources = cluster.api.get_pod(cluster.namespace, pod.metadata.name)["spec"]["containers"][0][
        "resources"
    ]
    assert resources == {
        "requests": {"cpu": "500m", "memory": "1536Mi"},
        "limits": {"cpu": "2", "memory": "2Gi"},
    }


def test_a_slice_keeps_its_node_and_driver(cluster) -> None:
    api = ResourceApi(cluster.api)
    made = api.create_slice(slice_body("n1"))
    moved = {**made, "spec": {**made["spec"], "nodeName": "n2"}}
    err = error_of(lambda: api.replace_slice(made["metadata"]["name"], moved))
    assert "spec.nodeName" in err.message  # the field named
    listed = api.list_slices(f"spec.nodeName=n1,spec.driver={DRIVER}")
    assert [s["metadata"]["name"] for s in listed.items] == ["n1-gpu.fgpu.io"]
    assert api.list_slices("spec.nodeName=n2").items == []


@pytest.mark.parametrize(
    ("spec", "cause"),
    [
        pytest.param(
            {"devices": {"requests": [{"name": "gpu"}]}},
            ("spec.devices.requests[0]", "FieldValueInvalid"),
            id="no-exactly",
        ),
        pytest.param(
            {"devices": {"requests": [{"name": "gpu", "exactly": {}}]}},
            ("spec.devices.requests[0].exactly.deviceClassName", "FieldValueRequired"),
            id="no-class",
        ),
        pytest.param(
            claim_spec(count=-1),
            ("spec.devices.requests[0].exactly.count", "FieldValueInvalid"),
            id="count-negative",
        ),
        pytest.param(
            {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
                    "config": [
                        {"requests": ["other"], "opaque": {"driver": DRIVER, "parameters": {}}}
                    ],
                }
            },
            ("spec.devices.config[0].requests[0]", "FieldValueInvalid"),
            id="config-names-no-request",
        ),
    ],
)
def test_claims_are_checked(cluster, spec, cause) -> None:
    path = f"/apis/resource.k8s.io/v1/namespaces/{cluster.namespace}/resourceclaims"
    err = error_of(lambda: post(cluster, path, {"metadata": {"name": "c"}, "spec": spec}))
    assert isinstance(err, Refused)
    assert cause in err.fields(), err.causes


def test_a_claim_is_defaulted_and_its_allocation_is_written_once(cluster) -> None:
    api = ResourceApi(cluster.api)
    made = api.create_claim(cluster.namespace, {"metadata": {"name": "c"}, "spec": claim_spec()})
    exactly = made["spec"]["devices"]["requests"][0]["exactly"]
    assert (exactly["allocationMode"], exactly["count"]) == ("ExactCount", 1)
    reserved = {"resource": "pods", "name": "p", "uid": "u-1"}
    made["status"] = {"reservedFor": [reserved]}
    err = error_of(lambda: api.replace_claim_status(cluster.namespace, "c", made))
    assert "status.reservedFor" in err.message  # the field named
    result = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}
    made["status"] = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [reserved],
    }
    written = api.replace_claim_status(cluster.namespace, "c", made)
    assert written["status"]["allocation"]["devices"]["results"] == [result]
    written["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-1"
    err = error_of(lambda: api.replace_claim_status(cluster.namespace, "c", written))
    assert "status.allocation" in err.message  # the field named
    stale = dict(made, metadata={**made["metadata"]})  # the version before the allocation
    with pytest.raises(KubeError) as conflict:
        api.replace_claim_status(cluster.namespace, "c", stale)
    assert conflict.value.status == 409


def test_a_pod_gets_a_claim_from_its_template(cluster) -> None:
    api = ResourceApi(cluster.api)
    api.create_claim_template(
        cluster.namespace,
        {
            "metadata": {"name": "half"},
            "spec": {"metadata": {"labels": {"team": "a"}}, "spec": claim_spec()},
        },
    )
    pod = cluster.api.core.create_namespaced_pod(
        cluster.namespace,
        {
            "metadata": {"name": "train-1"},
            "spec": {
                "containers": [
                    {"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "half"}],
            },
        },
    )
    uid = pod.metadata.uid
    statuses = claim_statuses(cluster, "train-1")
    assert [s["name"] for s in statuses] == ["gpu"]
    name = statuses[0]["resourceClaimName"]
    assert name.startswith("train-1-gpu-")
    assert len(name) == len("train-1-gpu-") + 5
    claim = api.get_claim(cluster.namespace, name)
    assert claim["metadata"]["annotations"][POD_CLAIM_NAME] == "gpu"
    assert claim["metadata"]["labels"] == {"team": "a"}
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Pod",
        "train-1",
        uid,
        True,
    )
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == DRIVER
    cluster.api.delete_pod(cluster.namespace, "train-1", grace_s=0)
    wait_until(lambda: not exists(api, cluster.namespace, name), "the garbage collector")


def test_a_pod_waits_for_its_template_then_gets_its_claim(cluster) -> None:
    api = ResourceApi(cluster.api)
    cluster.api.core.create_namespaced_pod(
        cluster.namespace,
        {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [{"name": "main", "image": "x"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "later"}],
            },
        },
    )
    assert "resourceClaimStatuses" not in cluster.api.get_pod(cluster.namespace, "p")["status"]
    api.create_claim_template(
        cluster.namespace, {"metadata": {"name": "later"}, "spec": {"spec": claim_spec()}}
    )
    (status,) = claim_statuses(cluster, "p")
    assert api.get_claim(cluster.namespace, status["resourceClaimName"])


@pytest.mark.parametrize("protected", [True, False], ids=["finalizer", "no-finalizer"])
def test_a_deleted_pod_leaves_its_claims_reservation(cluster, protected) -> None:
    """The claim controller takes the pod out of ``reservedFor``; it deallocates only a
    claim with the allocator's finalizer (and then removes the finalizer)."""
    api = ResourceApi(cluster.api)
    pod = cluster.api.core.create_namespaced_pod(
        cluster.namespace,
        {
            "metadata": {"name": "user"},
            "spec": {
                "containers": [{"name": "main", "image": "x"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "mine"}],
            },
        },
    )
    claim = api.create_claim(
        cluster.namespace, {"metadata": {"name": "mine"}, "spec": claim_spec()}
    )
    if protected:
        claim["metadata"]["finalizers"] = [FINALIZER]
        claim = api.replace_claim(cluster.namespace, "mine", claim)
    result = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}
    claim["status"] = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": "user", "uid": pod.metadata.uid}],
    }
    api.replace_claim_status(cluster.namespace, "mine", claim)
    cluster.api.delete_pod(cluster.namespace, "user", grace_s=0)
    wait_until(
        lambda: (
            "reservedFor" not in api.get_claim(cluster.namespace, "mine")["status"]
            and not api.get_claim(cluster.namespace, "mine")["metadata"].get("finalizers")
        ),
        "the claim controller to release the claim",
    )
    left = api.get_claim(cluster.namespace, "mine")  # a claim the user wrote stays
    assert ("allocation" in left["status"]) is not protected
    assert not left["metadata"].get("finalizers")


def test_a_claim_with_a_finalizer_goes_once_it_is_removed(cluster) -> None:
    api = ResourceApi(cluster.api)
    claim = api.create_claim(
        cluster.namespace,
        {"metadata": {"name": "kept", "finalizers": ["example.com/hold"]}, "spec": claim_spec()},
    )
    api.delete_claim(cluster.namespace, "kept")
    marked = api.get_claim(cluster.namespace, "kept")
    assert marked["metadata"]["deletionTimestamp"]
    marked["metadata"]["finalizers"] = []
    api.replace_claim(cluster.namespace, "kept", marked)
    with pytest.raises(KubeError) as gone:
        api.get_claim(cluster.namespace, "kept")
    assert gone.value.status == 404
    assert claim["metadata"]["name"] == "kept"


def claim_statuses(cluster, pod: str) -> list[dict[str, Any]]:
    """The pod's ``status.resourceClaimStatuses`` once the claim controller wrote them."""
    found: list[dict[str, Any]] = []

    def written() -> bool:
        got = cluster.api.get_pod(cluster.namespace, pod)
        found[:] = (got.get("status") or {}).get("resourceClaimStatuses") or []
        return bool(found)

    wait_until(written, f"the claim controller to give {pod} its claim")
    return found


def exists(api: ResourceApi, namespace: str, name: str) -> bool:
    try:
        api.get_claim(namespace, name)
    except KubeError as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.mark.parametrize(
    ("pod", "claim", "expected"),
    [
        ("train-1", "gpu", "train-1-gpu-"),
        ("p" * 40, "c" * 40, "p" * 28 + "-" + "c" * 28 + "-"),
    ],
    ids=["short", "cut"],
)
def test_generated_claim_names(pod, claim, expected) -> None:
    assert generate_name(pod, claim) == expected
