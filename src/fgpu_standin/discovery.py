"""Discovery documents of the API server stand-in, so that ``kubectl`` can talk to it.

TEST STAND-IN, NOT A KUBERNETES API SERVER. See :mod:`fgpu_standin`.

``kubectl`` learns which resources a server has before anything else: ``/version``,
``/api`` (core versions), ``/apis`` (groups) and one ``APIResourceList`` per group version
(``/api/v1``, ``/apis/GROUP/VERSION``). These are the legacy (unaggregated) documents; a
client that asks for aggregated discovery gets them too and falls back, as it does with
older API servers. The resources listed are exactly :data:`~fgpu_standin.store.KINDS`
and the subresources the stand-in serves.

``kubectl create`` and ``apply`` validate what they send (``--validate=strict``, the
default): they read ``/openapi/v3`` and, when the server's PATCH operations of a kind take
the ``fieldValidation`` query parameter, leave the check to the server. The OpenAPI
documents here say only that (paths, operations, that parameter; no schemas), and the
stand-in checks fields itself (:mod:`fgpu_standin.fields`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fgpu_standin.store import Kind

Obj = dict[str, Any]

SERVER_VERSION = {"major": "1", "minor": "34"}
"""The Kubernetes version the stand-in claims (its behaviour follows this API)."""

_SHORT_NAMES = {
    "namespaces": ["ns"],
    "nodes": ["no"],
    "pods": ["po"],
    "configmaps": ["cm"],
    "events": ["ev"],
    "poddisruptionbudgets": ["pdb"],
    "priorityclasses": ["pc"],
    "queues": ["fq"],  # as deploy/base/crd-queue.yaml
}
_CATEGORIES = {"pods": ["all"]}  # `kubectl get all`
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
_SUBRESOURCES = {
    "pods": [("binding", "Binding", ["create"]), ("eviction", "Eviction", ["create"])],
}


def version() -> Obj:
    """``/version``."""
    return {
        **SERVER_VERSION,
        "gitVersion": _GIT_VERSION,
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": "",
        "compiler": "",
        "platform": "linux/amd64",
    }


def _group_versions(kinds: Sequence[Kind]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for kind in kinds:
        versions = out.setdefault(kind.group, [])
        if kind.version not in versions:
            versions.append(kind.version)
    return out


def document(path: str, kinds: Sequence[Kind], server: str = "") -> Obj | None:
    """The discovery document at ``path`` (no leading slash), or None when ``path`` is not
    a discovery path of these ``kinds``; ``server`` is the ``host:port`` clients reached."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["openapi"]:
        return openapi(path, kinds)
    groups = _group_versions(kinds)
    if parts == ["version"]:
        return version()
    if parts == ["api"]:
        return {
            "kind": "APIVersions",
            "versions": groups.get("", []),
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}],
        }
    if parts == ["apis"]:
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": group,
                    "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{group}/{vs[0]}", "version": vs[0]},
                }
                for group, vs in groups.items()
                if group
            ],
        }
    if len(parts) == 2 and parts[0] == "api" and parts[1] in groups.get("", []):
        return _resources("", parts[1], kinds)
    if len(parts) == 3 and parts[0] == "apis" and parts[2] in groups.get(parts[1], []):
        return _resources(parts[1], parts[2], kinds)
    if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups and parts[1]:
        vs = groups[parts[1]]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": parts[1],
            "versions": [{"groupVersion": f"{parts[1]}/{v}", "version": v} for v in vs],
            "preferredVersion": {"groupVersion": f"{parts[1]}/{vs[0]}", "version": vs[0]},
        }
    return None


def openapi(path: str, kinds: Sequence[Kind]) -> Obj | None:
    """The OpenAPI v3 document at ``path`` (``openapi/v3`` or ``openapi/v3/<group
    version path>``), or None."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] != ["openapi", "v3"]:
        return None
    groups = _group_versions(kinds)
    keys = {
        (f"api/{v}" if not g else f"apis/{g}/{v}"): (g, v) for g, vs in groups.items() for v in vs
    }
    if len(parts) == 2:
        return {
            "paths": {key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={_HASH}"} for key in keys}
        }
    found = keys.get("/".join(parts[2:]))
    if found is None:
        return None
    return _openapi_spec(found[0], found[1], kinds)


_HASH = "fgpu-standin-1"
_GIT_VERSION = f"v{SERVER_VERSION['major']}.{SERVER_VERSION['minor']}.0-fgpu-standin"


def _openapi_spec(group: str, version_: str, kinds: Sequence[Kind]) -> Obj:
    prefix = f"/api/{version_}" if not group else f"/apis/{group}/{version_}"
    validation = {
        "name": "fieldValidation",
        "in": "query",
        "description": "Strict: refuse unknown fields; Warn: accept with a warning; Ignore.",
        "schema": {"type": "string", "uniqueItems": True},
    }
    paths: Obj = {}
    for kind in kinds:
        if (kind.group, kind.version) != (group, version_):
            continue
        collection = (
            f"{prefix}/namespaces/{{namespace}}/{kind.plural}"
            if kind.namespaced
            else f"{prefix}/{kind.plural}"
        )
        gvk = {"group": group, "version": version_, "kind": kind.kind}

        def operation(action: str, kind: Kind = kind, gvk: Obj = gvk) -> Obj:
            return {
                "operationId": f"{action}{kind.kind}",
                "parameters": [validation],
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
            }

        paths[collection] = {"post": operation("post")}
        paths[f"{collection}/{{name}}"] = {"put": operation("put"), "patch": operation("patch")}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes API TEST STAND-IN (fgpu)", "version": _GIT_VERSION},
        "paths": paths,
        "components": {"schemas": {}},
    }


def _resources(group: str, version_: str, kinds: Sequence[Kind]) -> Obj:
    resources: list[Obj] = []
    for kind in kinds:
        if (kind.group, kind.version) != (group, version_):
            continue
        entry: Obj = {
            "name": kind.plural,
            "singularName": kind.kind.lower(),
            "namespaced": kind.namespaced,
            "kind": kind.kind,
            "verbs": _VERBS,
        }
        if kind.plural in _SHORT_NAMES:
            entry["shortNames"] = _SHORT_NAMES[kind.plural]
        if kind.plural in _CATEGORIES:
            entry["categories"] = _CATEGORIES[kind.plural]
        resources.append(entry)
        if kind.status_subresource:
            resources.append(
                {
                    "name": f"{kind.plural}/status",
                    "singularName": "",
                    "namespaced": kind.namespaced,
                    "kind": kind.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        for sub, sub_kind, verbs in _SUBRESOURCES.get(kind.plural, []):
            resources.append(
                {
                    "name": f"{kind.plural}/{sub}",
                    "singularName": "",
                    "namespaced": kind.namespaced,
                    "kind": sub_kind,
                    "verbs": verbs,
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version_}" if group else version_,
        "resources": resources,
    }


__all__ = ["SERVER_VERSION", "document", "openapi", "version"]
