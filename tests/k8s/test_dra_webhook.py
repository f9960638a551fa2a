"""The webhook on the DRA path: a claim from fgpu's ResourceClaimTemplate, the toleration of
the fgpu taint, no hostPath, privileged fgpu pods refused; an admitted pod still meets Pod
Security ``restricted``."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fgpu.k8s import claims, wire
from fgpu.k8s.objects import PodRequestError
from fgpu.k8s.webhook import mutate
from fgpu.k8s.webhook_app import review
from fgpu.k8s.webhook_dra import TOLERATION
from fgpu_standin.patch import json_patch
from tests.k8s.kube import pod

pytestmark = pytest.mark.k8s

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(p: dict[str, Any]) -> list[str]:
    """What the Pod Security ``restricted`` profile (v1.34 levels, kubernetes.io/docs/
    concepts/security/pod-security-standards) refuses in a pod: host namespaces, volume
    types outside its list, privileged or escalating containers, added capabilities
    other than NET_BIND_SERVICE, not dropping ALL, running as root allowed, seccomp not
    RuntimeDefault or Localhost."""
    spec = p["spec"]
    found = [f"spec.{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {v['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod_sc = spec.get("securityContext") or {}
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(group) or []:
            sc = c.get("securityContext") or {}
            if sc.get("privileged"):
                found.append(f"{c['name']}: privileged")
            if sc.get("allowPrivilegeEscalation") is not False:
                found.append(f"{c['name']}: allowPrivilegeEscalation not false")
            caps = sc.get("capabilities") or {}
            if "ALL" not in (caps.get("drop") or []):
                found.append(f"{c['name']}: capabilities not dropping ALL")
            if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
                found.append(f"{c['name']}: capabilities added")
            if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
                found.append(f"{c['name']}: runAsNonRoot not true")
            seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}
            if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
                found.append(f"{c['name']}: seccompProfile")
    return found


def restricted_pod(name: str) -> dict[str, Any]:
    body = pod(name, "0.5")
    body["spec"]["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    body["spec"]["containers"][0]["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    return body


def test_an_fgpu_pod_gets_a_claim_from_the_template_and_the_toleration() -> None:
    admitted = json_patch(pod("p", "0.5"), mutate(pod("p", "0.5")))
    spec = admitted["spec"]
    assert spec["schedulerName"] == wire.SCHEDULER_NAME
    assert spec["resourceClaims"] == [
        {"name": claims.POD_CLAIM, "resourceClaimTemplateName": claims.TEMPLATE}
    ]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": claims.POD_CLAIM}]
    assert spec["tolerations"] == [
        {"key": "fgpu.io/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert "volumes" not in spec  # no hostPath: the CDI spec mounts the hint folder
    assert "envFrom" not in spec["containers"][0]
    assert wire.ENV_CONFIGMAP not in admitted["metadata"]["annotations"]
    again = json_patch(admitted, mutate(admitted))  # a copy of an admitted pod
    assert again["spec"]["resourceClaims"] == spec["resourceClaims"]
    assert again["spec"]["tolerations"] == [TOLERATION]
    assert again["spec"]["containers"][0]["resources"]["claims"] == [{"name": claims.POD_CLAIM}]


def test_a_fgpu_gpu_entry_other_than_fgpus_own_is_refused() -> None:
    for entry in ({"resourceClaimName": "mine"}, {"resourceClaimTemplateName": "x"}):
        body = pod("own", "0.5")
        body["spec"]["resourceClaims"] = [{"name": claims.POD_CLAIM, **entry}]
        with pytest.raises(PodRequestError) as err:
            mutate(body)
        assert str(err.value).startswith(
            "spec.resourceClaims[0]: 'fgpu-gpu' is the claim entry fgpu adds"
        )
        assert "never allocates a claim a user wrote" in str(err.value)


def test_a_cpu_only_fgpu_pod_gets_no_claim() -> None:
    admitted = json_patch(pod("cpu", None, queue="a"), mutate(pod("cpu", None, queue="a")))
    assert "resourceClaims" not in admitted["spec"]
    assert admitted["spec"]["tolerations"] == [TOLERATION]


@pytest.mark.parametrize("group", ["containers", "initContainers"])
def test_privileged_fgpu_pods_are_refused(group) -> None:
    body = pod("root", "0.5")
    body["spec"][group] = [
        {"name": "c", "image": "x", "securityContext": {"privileged": True}},
    ]
    with pytest.raises(PodRequestError) as err:
        mutate(body)
    assert str(err.value).startswith(f"spec.{group}[0].securityContext.privileged: true:")
    assert mutate(body, env_without_isolation=True)  # the path that isolates nothing anyway


def test_a_privileged_debug_container_on_an_fgpu_pod_is_refused() -> None:
    admitted = json_patch(pod("p", "0.5"), mutate(pod("p", "0.5")))
    debugged = copy.deepcopy(admitted)
    debugged["spec"]["ephemeralContainers"] = [
        {"name": "debugger", "image": "busybox", "securityContext": {"privileged": True}}
    ]
    body = {
        "request": {
            "uid": "u1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "UPDATE",
            "subResource": "ephemeralcontainers",
            "object": debugged,
            "oldObject": admitted,
            "userInfo": {"username": "alice"},
        }
    }
    answer = review(body)["response"]
    assert answer["allowed"] is False
    assert "ephemeralContainers[0].securityContext.privileged" in answer["status"]["message"]
    debugged["spec"]["ephemeralContainers"][0]["securityContext"] = {}
    assert review(body)["response"]["allowed"] is True


def test_the_interposer_variables_are_refused_in_a_pods_own_env() -> None:
    body = pod("p", "0.5")
    body["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": ""}]
    with pytest.raises(PodRequestError) as err:
        mutate(body)
    assert str(err.value).startswith("spec.containers[0].env: LD_PRELOAD is set by fgpu's DRA")


def test_an_admitted_pod_still_meets_pod_security_restricted() -> None:
    body = restricted_pod("r")
    assert restricted_violations(body) == []
    admitted = json_patch(body, mutate(body))
    assert restricted_violations(admitted) == []
    old_path = json_patch(body, mutate(body, env_without_isolation=True))
    assert restricted_violations(old_path) == ["volume fgpu-agent: ['hostPath']"]
