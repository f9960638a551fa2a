"""The object store of the API server stand-in: versions, UIDs, conflicts, watches.

TEST STAND-IN, NOT A KUBERNETES API SERVER. See :mod:`fgpu_standin`.

Every write takes the next ``resourceVersion`` (one counter for all objects, as etcd's
revision) and appends a watch event to a bounded history; a watch that asks for a version
older than the history answers ``410 Gone``, as the API server does once etcd compacted.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Kind:
    """A resource type the stand-in serves."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    fields: frozenset[str] = frozenset({"metadata.name", "metadata.namespace"})
    status_subresource: bool = False

    @property
    def api_version(self) -> str:
        """``v1`` or ``group/version``."""
        return self.version if not self.group else f"{self.group}/{self.version}"


POD_FIELDS = frozenset(
    {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.schedulerName", "status.phase"}
)

EVENT_FIELDS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "type",
    }
)
"""The field selectors the API server supports on events (``kubectl describe`` uses the
``involvedObject`` ones)."""

KINDS: tuple[Kind, ...] = (
    Kind("", "v1", "namespaces", "Namespace", False, status_subresource=True),
    Kind("", "v1", "nodes", "Node", False, status_subresource=True),
    Kind("", "v1", "pods", "Pod", True, POD_FIELDS, status_subresource=True),
    Kind("", "v1", "configmaps", "ConfigMap", True),
    Kind("", "v1", "persistentvolumes", "PersistentVolume", False, status_subresource=True),
    Kind(
        "", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, status_subresource=True
    ),
    Kind("", "v1", "events", "Event", True, EVENT_FIELDS),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", True),
    Kind("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", True),
    Kind(
        "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, status_subresource=True
    ),
    Kind("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False),
    Kind("fgpu.io", "v1alpha1", "queues", "Queue", False, status_subresource=True),
    Kind("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False),
    Kind(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "ResourceSlice",
        False,
        frozenset({"metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"}),
    ),
    Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, status_subresource=True),
    Kind("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True),
)


class ApiStatusError(Exception):
    """A refusal, answered as a ``Status`` object with ``code`` and ``reason``."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        super().__init__(message)

    def status(self) -> Obj:
        """The ``Status`` object."""
        out: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            out["details"] = self.details
        return out


def not_found(kind: Kind, name: str) -> ApiStatusError:
    """``404 NotFound`` as the API server words it."""
    group = f".{kind.group}" if kind.group else ""
    return ApiStatusError(
        404,
        "NotFound",
        f'{kind.plural}{group} "{name}" not found',
        {"name": name, "kind": kind.plural},
    )


def now_rfc3339() -> str:
    """The current time as the API server writes timestamps."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class WatchEvent:
    """One change: ``type`` (ADDED, MODIFIED, DELETED), the object before and after."""

    rv: int
    plural: str
    type: str
    old: Obj | None
    new: Obj


@dataclass(slots=True)
class Watcher:
    """A subscriber: gets every event of one resource type on its queue."""

    plural: str
    queue: asyncio.Queue[WatchEvent | None]


@dataclass
class Store:
    """Objects by resource type, namespace and name.

    Args:
        history: how many events a watch can resume from.
    """

    history: int = 200_000
    rv: int = 1
    objects: dict[str, dict[tuple[str, str], Obj]] = field(default_factory=dict)
    events: deque[WatchEvent] = field(default_factory=deque)
    watchers: list[Watcher] = field(default_factory=list)
    on_delete: list[Callable[[str, Obj], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.events = deque(maxlen=self.history)
        for kind in KINDS:
            self.objects.setdefault(kind.plural, {})

    # ------------------------------------------------------------------ reads
    def get(self, kind: Kind, namespace: str, name: str) -> Obj:
        """A copy of one object. Raises ApiStatusError 404."""
        obj = self.objects[kind.plural].get((namespace, name))
        if obj is None:
            raise not_found(kind, name)
        return copy.deepcopy(obj)

    def peek(self, plural: str, namespace: str, name: str) -> Obj | None:
        """The stored object itself (not a copy), or None."""
        return self.objects[plural].get((namespace, name))

    def items(self, plural: str, namespace: str | None = None) -> Iterator[Obj]:
        """Stored objects (not copies) of a type, in one namespace or all."""
        for (ns, _), obj in self.objects[plural].items():
            if namespace is None or ns == namespace:
                yield obj

    # ----------------------------------------------------------------- writes
    def _next(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, plural: str, type_: str, old: Obj | None, new: Obj) -> None:
        event = WatchEvent(self.rv, plural, type_, old, new)
        self.events.append(event)
        for w in self.watchers:
            if w.plural == plural:
                w.queue.put_nowait(event)

    def create(self, kind: Kind, namespace: str, obj: Obj) -> Obj:
        """Store a new object: name (or generateName), uid, resourceVersion, timestamp.

        Raises:
            ApiStatusError: 409 AlreadyExists, 422 Invalid (no name).
        """
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise ApiStatusError(
                    422, "Invalid", f"{kind.kind} is invalid: metadata.name: Required value"
                )
            meta["name"] = prefix + uuid.uuid4().hex[:5]
        name = meta["name"]
        ns = namespace if kind.namespaced else ""
        if (ns, name) in self.objects[kind.plural]:
            group = f".{kind.group}" if kind.group else ""
            raise ApiStatusError(
                409,
                "AlreadyExists",
                f'{kind.plural}{group} "{name}" already exists',
                {"name": name, "kind": kind.plural},
            )
        if kind.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["resourceVersion"] = self._next()
        meta.pop("deletionTimestamp", None)
        obj["apiVersion"] = kind.api_version
        obj["kind"] = kind.kind
        self.objects[kind.plural][(ns, name)] = obj
        self._emit(kind.plural, "ADDED", None, copy.deepcopy(obj))
        return copy.deepcopy(obj)

    def replace(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        obj: Obj,
        *,
        check_rv: bool,
        system: bool = False,
    ) -> Obj:
        """Write a new version of an existing object.

        With ``check_rv`` and a ``metadata.resourceVersion`` in ``obj`` that is not the
        stored one, nothing is written (optimistic concurrency). Clients cannot change
        ``uid``, ``creationTimestamp`` or ``deletionTimestamp``; the server itself
        (``system``) sets the last when a graceful deletion starts.

        Raises:
            ApiStatusError: 404 NotFound, 409 Conflict.
        """
        ns = namespace if kind.namespaced else ""
        old = self.objects[kind.plural].get((ns, name))
        if old is None:
            raise not_found(kind, name)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        want = meta.get("resourceVersion")
        if check_rv and want and want != old["metadata"]["resourceVersion"]:
            group = f".{kind.group}" if kind.group else ""
            raise ApiStatusError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind.plural}{group} "{name}": the object '
                "has been modified; please apply your changes to the latest version and try "
                "again",
                {"name": name, "kind": kind.plural},
            )
        if meta.get("uid") and meta["uid"] != old["metadata"]["uid"]:
            raise ApiStatusError(
                409, "Conflict", f"Precondition failed: UID in object meta: {meta['uid']}"
            )
        kept = ("uid", "creationTimestamp", "name", "namespace")
        for key in kept if system else (*kept, "deletionTimestamp"):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        obj["apiVersion"] = kind.api_version
        obj["kind"] = kind.kind
        same_version = {**meta, "resourceVersion": old["metadata"]["resourceVersion"]}
        if {**obj, "metadata": same_version} == old:
            return copy.deepcopy(old)  # no change: no new version, no event (as the API)
        meta["resourceVersion"] = self._next()
        self.objects[kind.plural][(ns, name)] = obj
        self._emit(kind.plural, "MODIFIED", copy.deepcopy(old), copy.deepcopy(obj))
        return copy.deepcopy(obj)

    def delete(
        self, kind: Kind, namespace: str, name: str, preconditions: Mapping[str, Any]
    ) -> Obj:
        """Remove an object now (preconditions ``uid``/``resourceVersion`` checked).

        Raises:
            ApiStatusError: 404 NotFound, 409 Conflict (a precondition failed).
        """
        ns = namespace if kind.namespaced else ""
        old = self.objects[kind.plural].get((ns, name))
        if old is None:
            raise not_found(kind, name)
        for key in ("uid", "resourceVersion"):
            want = preconditions.get(key)
            if want and want != old["metadata"][key]:
                raise ApiStatusError(
                    409,
                    "Conflict",
                    f"Precondition failed: {key} in precondition: {want}, {key} in object meta: "
                    f"{old['metadata'][key]}",
                )
        del self.objects[kind.plural][(ns, name)]
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = self._next()
        self._emit(kind.plural, "DELETED", copy.deepcopy(old), gone)
        for hook in self.on_delete:
            hook(kind.plural, gone)
        return gone

    # ------------------------------------------------------------------ watch
    def subscribe(self, plural: str) -> Watcher:
        """A new watcher of one resource type."""
        w = Watcher(plural, asyncio.Queue())
        self.watchers.append(w)
        return w

    def unsubscribe(self, watcher: Watcher) -> None:
        """Stop delivering events to ``watcher``."""
        if watcher in self.watchers:
            self.watchers.remove(watcher)

    def since(self, plural: str, rv: int) -> list[WatchEvent] | None:
        """Events of a type after version ``rv``, or None when the history no longer
        reaches back that far (the caller answers 410 Gone)."""
        if self.events and self.events[0].rv > rv + 1 and len(self.events) == self.events.maxlen:
            return None
        return [e for e in self.events if e.rv > rv and e.plural == plural]
