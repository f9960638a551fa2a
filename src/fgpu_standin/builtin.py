"""The API server's built-in admission plugins for pods that the stand-in imitates:
``ServiceAccount`` and ``RuntimeClass`` (``Priority`` is in :mod:`fgpu_standin.app`).

TEST STAND-IN. See :mod:`fgpu_standin`.

- **ServiceAccount**: a pod without ``spec.serviceAccountName`` gets ``default``; a pod
  naming a service account that does not exist in its namespace is refused (403
  Forbidden, ``error looking up service account NS/NAME: serviceaccount "NAME" not
  found``). The ``default`` account of a namespace is made when first needed, as the
  service account controller has made it in every namespace of a real cluster. Not
  imitated: the projected token volume the plugin adds.
- **RuntimeClass**: a pod naming a RuntimeClass that does not exist is refused (403
  Forbidden, ``pod rejected: RuntimeClass "NAME" not found``); the class's
  ``overhead.podFixed`` becomes the pod's ``spec.overhead`` (a pod that set another
  overhead, or an overhead where its class has none, is refused), and its
  ``scheduling.nodeSelector`` and ``tolerations`` are added to the pod's (a node selector
  that conflicts is refused).

Refusals are worded as the plugins word them (``pods "NAME" is forbidden: ...``); clients
should go by the code and reason.
"""

from __future__ import annotations

from typing import Any

from fgpu_standin.store import ApiStatusError, Kind, Store

Obj = dict[str, Any]


def _forbidden(name: str, why: str) -> ApiStatusError:
    return ApiStatusError(403, "Forbidden", f'pods "{name}" is forbidden: {why}')


def service_account(store: Store, accounts: Kind, namespace: str, pod: Obj) -> None:
    """The ServiceAccount plugin on a new pod (module docstring), in place.

    Raises:
        ApiStatusError: 403, the account does not exist.
    """
    spec = pod.setdefault("spec", {})
    name = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccountName"] = name
    spec["serviceAccount"] = name  # the deprecated alias, as the API server fills it
    if store.peek("serviceaccounts", namespace, name) is not None:
        return
    if name == "default":  # the service account controller makes it in every namespace
        store.create(accounts, namespace, {"metadata": {"name": "default"}})
        return
    pod_name = (pod.get("metadata") or {}).get("name", "")
    raise _forbidden(
        pod_name,
        f'error looking up service account {namespace}/{name}: serviceaccount "{name}" not found',
    )


def runtime_class(store: Store, pod: Obj) -> None:
    """The RuntimeClass plugin on a new pod (module docstring), in place.

    Raises:
        ApiStatusError: 403, the class does not exist or the pod's overhead or node
            selector disagrees with it.
    """
    spec = pod.setdefault("spec", {})
    pod_name = (pod.get("metadata") or {}).get("name", "")
    class_name = spec.get("runtimeClassName")
    klass = store.peek("runtimeclasses", "", class_name) if class_name else None
    if class_name and klass is None:
        raise _forbidden(pod_name, f'pod rejected: RuntimeClass "{class_name}" not found')
    fixed = ((klass or {}).get("overhead") or {}).get("podFixed")
    if fixed is not None:
        if spec.get("overhead") and spec["overhead"] != fixed:
            raise _forbidden(
                pod_name,
                "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead",
            )
        spec["overhead"] = dict(fixed)
    elif spec.get("overhead") is not None:
        raise _forbidden(
            pod_name,
            "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead",
        )
    scheduling = (klass or {}).get("scheduling") or {}
    wanted = scheduling.get("nodeSelector") or {}
    selector = dict(spec.get("nodeSelector") or {})
    for key, value in wanted.items():
        if key in selector and selector[key] != value:
            raise _forbidden(
                pod_name,
                f"pod rejected: conflict: runtimeClass.scheduling.nodeSelector[{key}] = "
                f"{value}; pod.spec.nodeSelector[{key}] = {selector[key]}",
            )
        selector[key] = value
    if wanted:
        spec["nodeSelector"] = selector
    extra = [
        t for t in scheduling.get("tolerations") or [] if t not in (spec.get("tolerations") or [])
    ]
    if extra:
        spec["tolerations"] = [*(spec.get("tolerations") or []), *extra]


__all__ = ["runtime_class", "service_account"]
