"""Unknown-field checks of the API server stand-in (``fieldValidation``).

TEST STAND-IN, NOT A KUBERNETES API SERVER. See :mod:`fgpu_standin`.

The API server refuses an object with a field its schema does not have when the client asks
for ``fieldValidation=Strict`` (what ``kubectl`` asks for by default), warns with ``Warn``,
and drops it silently otherwise. The stand-in has no schemas of its own: it reads them from
the official Python client's models (each model lists its fields), so it needs the
``kubernetes`` package (the ``k8s`` extra); without it, or for kinds without a model (the
``Queue`` custom resource), nothing is checked. Only unknown fields are found, not types
or required fields.
"""

from __future__ import annotations

import json
from typing import Any

from fgpu_standin.store import Kind

_MODELS = {
    "Namespace": "V1Namespace",
    "Node": "V1Node",
    "Pod": "V1Pod",
    "ConfigMap": "V1ConfigMap",
    "Event": "CoreV1Event",
    "Lease": "V1Lease",
    "PodDisruptionBudget": "V1PodDisruptionBudget",
    "PriorityClass": "V1PriorityClass",
    "DeviceClass": "V1DeviceClass",
    "ResourceSlice": "V1ResourceSlice",
    "ResourceClaim": "ResourceV1ResourceClaim",
    "ResourceClaimTemplate": "V1ResourceClaimTemplate",
    "ServiceAccount": "V1ServiceAccount",
    "RuntimeClass": "V1RuntimeClass",
}
_client: Any = None


def _api_client() -> Any:
    global _client
    if _client is None:
        from kubernetes import client

        config = client.Configuration()
        config.client_side_validation = False  # only unknown fields, as documented
        _client = client.ApiClient(config)
    return _client


def unknown_fields(kind: Kind, obj: Any) -> list[str]:
    """The paths of the fields of ``obj`` that ``kind`` does not have, as the API server
    names them (``spec.containers[0].imagee``); empty when none or when nothing can be
    checked (module docstring)."""
    model = _MODELS.get(kind.kind)
    if model is None or not isinstance(obj, dict):
        return []
    try:
        api = _api_client()
    except ImportError:
        return []
    try:  # the client's own decoder (the public deserialize's signature varies by version)
        decoded = api._ApiClient__deserialize(json.loads(json.dumps(obj)), model)
        back = api.sanitize_for_serialization(decoded)
    except Exception:  # a value of the wrong type: not what this check is about
        return []
    found: list[str] = []
    _compare(obj, back, "", found)
    return found


def _compare(sent: Any, kept: Any, path: str, found: list[str]) -> None:
    if isinstance(sent, dict):
        for key, value in sent.items():
            where = f"{path}.{key}" if path else key
            if value is None:
                continue
            if not isinstance(kept, dict) or key not in kept:
                found.append(where)
                continue
            _compare(value, kept[key], where, found)
    elif isinstance(sent, list) and isinstance(kept, list):
        for i, (a, b) in enumerate(zip(sent, kept, strict=False)):
            _compare(a, b, f"{path}[{i}]", found)


def message(kind: Kind, fields: list[str]) -> str:
    """The API server's refusal for ``fields`` (unknown) under ``Strict``."""
    listed = ", ".join(f'unknown field "{f}"' for f in fields)
    return (
        f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: '
        f"strict decoding error: {listed}"
    )


__all__ = ["message", "unknown_fields"]
