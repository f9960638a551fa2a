"""What the scheduler knows of the cluster: nodes, pods, ``Queue`` objects and
ResourceClaims, kept by list-then-watch (an informer).

Nothing is kept anywhere else: on start, and whenever a watch cannot resume (``410 Gone``
or a broken connection), the resource is listed again and the cache replaced, so a pod
deleted while the scheduler was away is simply absent and its capacity free.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fgpu.k8s.kube import KubeApi, KubeError, Listed

log = logging.getLogger("fgpu.k8s.cache")

Obj = dict[str, Any]
RESOURCES = ("nodes", "pods", "queues", "resourceclaims")


def _key(obj: Obj) -> str:
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The objects at one moment (shared dicts: read, never change them)."""

    nodes: list[Obj]
    pods: list[Obj]
    queues: list[Obj]
    claims: dict[str, Obj] | None = None
    """``namespace/name`` -> ResourceClaim (None: not kept)."""


class ClusterCache:
    """Nodes, pods and queues by list and watch.

    Args:
        api: the Kubernetes API.
        on_change: called (from a watch thread) after every change.
        watch_timeout_s: how long one watch request lasts before it is renewed.
    """

    def __init__(
        self,
        api: KubeApi,
        on_change: Callable[[], None] = lambda: None,
        watch_timeout_s: int = 60,
    ) -> None:
        self.api = api
        self.on_change = on_change
        self.watch_timeout_s = watch_timeout_s
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Obj]] = {r: {} for r in RESOURCES}
        self._versions: dict[str, str | None] = dict.fromkeys(RESOURCES)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failing: dict[str, str] = {}  # resource -> why its last list or watch failed
        self.relists = 0

    def _list(self, resource: str) -> Listed:
        if resource == "nodes":
            return self.api.list_nodes()
        if resource == "pods":
            return self.api.list_pods()
        try:
            if resource == "resourceclaims":
                from fgpu.k8s.resourceapi import ResourceApi

                return ResourceApi(self.api).list_claims()
            return self.api.list_queues()
        except KubeError as exc:
            if exc.status == 404:  # no Queue CRD, or no resource.k8s.io/v1 (before 1.34)
                return Listed([], "")
            raise

    def relist(self, resource: str) -> None:
        """List one resource and replace what the cache holds of it.

        Raises:
            KubeError: the list failed.
        """
        listed = self._list(resource)
        with self._lock:
            self._objects[resource] = {_key(o): o for o in listed.items}
            self._versions[resource] = listed.resource_version
            self._failing.pop(resource, None)
            self.relists += 1
        self.on_change()

    def failing(self) -> dict[str, str]:
        """Resources whose last list or watch failed (resource -> the error), until one
        succeeds again: the cache may miss their changes meanwhile."""
        with self._lock:
            return dict(self._failing)

    def _failed(self, resource: str, exc: Exception) -> None:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        with self._lock:
            self._failing[resource] = text

    def sync(self) -> None:
        """List everything (what a start does).

        Raises:
            KubeError: a list failed.
        """
        for resource in RESOURCES:
            self.relist(resource)

    def snapshot(self) -> Snapshot:
        """The objects now."""
        with self._lock:
            return Snapshot(
                list(self._objects["nodes"].values()),
                list(self._objects["pods"].values()),
                list(self._objects["queues"].values()),
                dict(self._objects["resourceclaims"]),
            )

    def apply(self, resource: str, kind: str, obj: Obj) -> None:
        """Apply one watch event (also used to record the scheduler's own writes early)."""
        if kind == "BOOKMARK":
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                with self._lock:
                    self._versions[resource] = version
            return
        key = _key(obj)
        with self._lock:
            held = self._objects[resource]
            if kind == "DELETED":
                held.pop(key, None)
            else:
                old = held.get(key)
                if old is not None and _newer(old, obj):
                    return  # an older version arriving late
                held[key] = obj
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self._versions[resource] = version
        self.on_change()

    # ------------------------------------------------------------------ threads
    def start(self) -> None:
        """List everything, then keep each resource current from a watch thread."""
        self._stop.clear()
        for resource in RESOURCES:
            t = threading.Thread(
                target=self._watch_loop, args=(resource,), name=f"watch-{resource}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        """Stop the watch threads (they end when their current watch does)."""
        self._stop.set()

    def _watch_loop(self, resource: str) -> None:
        while not self._stop.is_set():
            try:
                version = self._versions[resource]
                if not version:
                    self.relist(resource)
                    version = self._versions[resource]
                    if not version:  # no such resource (CRD absent): look again later
                        self._stop.wait(10)
                        continue
                for kind, obj in self.api.watch(resource, version, self.watch_timeout_s):
                    if self._stop.is_set():
                        return
                    self.apply(resource, kind, obj)
            except KubeError as exc:
                if exc.status == 410:
                    log.info("watch of %s expired; listing again", resource)
                else:
                    log.warning("watch of %s failed (%s); listing again", resource, exc)
                    self._failed(resource, exc)
                    self._stop.wait(1)
                self._versions[resource] = None
            except Exception as exc:  # a broken connection: list again, never give up
                log.warning("watch of %s broke (%s); listing again", resource, exc)
                self._failed(resource, exc)
                self._versions[resource] = None
                self._stop.wait(1)
            else:
                if self._stop.is_set():
                    return
                time.sleep(0)  # the server ended the watch; resume from the last version


def _newer(old: Obj, new: Obj) -> bool:
    """Whether ``old`` is a later version than ``new`` of the same object."""
    try:
        a = int(old["metadata"]["resourceVersion"])
        b = int(new["metadata"]["resourceVersion"])
    except (KeyError, ValueError, TypeError):
        return False  # versions are opaque in general; only compare what compares
    same = old["metadata"].get("uid") == new["metadata"].get("uid")
    return same and a > b
