"""Server-side printing of the API server stand-in: ``Table`` answers for ``kubectl get``.

TEST STAND-IN, NOT A KUBERNETES API SERVER. See :mod:`fgpu_standin`.

``kubectl get`` asks for ``application/json;as=Table;v=v1;g=meta.k8s.io`` and prints the
columns the server chooses. The stand-in answers with the API server's columns for pods
(``NAME READY STATUS RESTARTS AGE``, and with ``-o wide`` ``IP NODE NOMINATED NODE
READINESS GATES``), nodes and events, and ``NAME AGE`` for the other kinds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from fgpu_standin.store import Kind

Obj = dict[str, Any]


def wants_table(accept: str) -> bool:
    """Whether an ``Accept`` header asks for a ``Table`` (meta.k8s.io v1)."""
    return any(
        "as=Table" in part and "g=meta.k8s.io" in part and "v=v1;" in part + ";"
        for part in accept.split(",")
    )


def human_duration(seconds: float) -> str:
    """A duration as ``kubectl`` shows ages (``45s``, ``3m20s``, ``5h``, ``2d4h``)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    return f"{hours // (24 * 365)}y"


def _age(stamp: str | None) -> str:
    if not stamp:
        return "<unknown>"
    try:  # RFC 3339: "Z" or an offset, with or without fractions of a second
        then = dt.datetime.fromisoformat(stamp)
    except ValueError:
        return "<unknown>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=dt.UTC)
    return human_duration((dt.datetime.now(dt.UTC) - then).total_seconds())


def _column(name: str, kind: str = "string", priority: int = 0, fmt: str = "") -> Obj:
    return {"name": name, "type": kind, "format": fmt, "description": name, "priority": priority}


def _condition(obj: Obj, type_: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


def _pod(obj: Obj) -> list[Any]:
    spec, status, meta = obj.get("spec") or {}, obj.get("status") or {}, obj["metadata"]
    containers = len(spec.get("containers") or [])
    ready = containers if _condition(obj, "Ready") else 0
    phase = status.get("reason") or status.get("phase") or "Pending"
    if meta.get("deletionTimestamp"):
        phase = "Terminating"
    return [
        meta["name"],
        f"{ready}/{containers}",
        phase,
        0,
        _age(meta.get("creationTimestamp")),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        "<none>",
    ]


def _node(obj: Obj) -> list[Any]:
    meta = obj["metadata"]
    state = "Ready" if _condition(obj, "Ready") else "NotReady"
    if (obj.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    prefix = "node-role.kubernetes.io/"
    roles = sorted(k[len(prefix) :] for k in meta.get("labels") or {} if k.startswith(prefix))
    info = (obj.get("status") or {}).get("nodeInfo") or {}
    return [
        meta["name"],
        state,
        ",".join(roles) or "<none>",
        _age(meta.get("creationTimestamp")),
        info.get("kubeletVersion", ""),
    ]


def _event(obj: Obj) -> list[Any]:
    involved = obj.get("involvedObject") or {}
    seen = obj.get("lastTimestamp") or obj.get("eventTime") or obj.get("firstTimestamp")
    return [
        _age(seen),
        obj.get("type", ""),
        obj.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        obj.get("message", ""),
    ]


def _plain(obj: Obj) -> list[Any]:
    meta = obj["metadata"]
    return [meta["name"], _age(meta.get("creationTimestamp"))]


_LAYOUTS: dict[str, tuple[list[Obj], Callable[[Obj], list[Any]]]] = {
    "pods": (
        [
            _column("Name", fmt="name"),
            _column("Ready"),
            _column("Status"),
            _column("Restarts", "integer"),
            _column("Age"),
            _column("IP", priority=1),
            _column("Node", priority=1),
            _column("Nominated Node", priority=1),
            _column("Readiness Gates", priority=1),
        ],
        _pod,
    ),
    "nodes": (
        [
            _column("Name", fmt="name"),
            _column("Status"),
            _column("Roles"),
            _column("Age"),
            _column("Version"),
        ],
        _node,
    ),
    "events": (
        [
            _column("Last Seen"),
            _column("Type"),
            _column("Reason"),
            _column("Object"),
            _column("Message"),
        ],
        _event,
    ),
}
_PLAIN = ([_column("Name", fmt="name"), _column("Age")], _plain)


def table(kind: Kind, objects: Sequence[Obj], resource_version: str = "") -> Obj:
    """The ``Table`` of ``objects`` of ``kind`` (rows carry each object's metadata)."""
    columns, cells = _LAYOUTS.get(kind.plural, _PLAIN)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": [
            {
                "cells": cells(o),
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o["metadata"],
                },
            }
            for o in objects
        ],
    }


__all__ = ["human_duration", "table", "wants_table"]
