"""What a node agent knows of the cluster: its own Node and the pods bound to it, kept by
list then watch (an informer narrowed by field selectors), so the agent reads them from
memory instead of asking the API server every interval.

The API semantics relied on (Kubernetes API concepts, "Efficient detection of changes" and
"Resource versions"):

- the first list asks for ``resourceVersion=0``, which the API server may answer from its
  watch cache ("any resource version; the newest available is preferred") instead of a
  quorum read through etcd, as client-go's reflector does for its first list;
- the watch resumes from the list's ``resourceVersion`` and sends every later change; a
  watch with a field selector sends an object that stops matching (a pod that is deleted,
  or whose ``spec.nodeName`` is not this node) as ``DELETED``;
- a watch whose version the server no longer has answers ``410 Gone``: the resource is
  listed again (this time without ``resourceVersion``, the most recent data, as the reflector
  does after an expired version) and the view replaced; other failures also list again,
  after a pause.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from fgpu.k8s.kube import KubeApi, KubeError, Listed

log = logging.getLogger("fgpu.k8s.nodeview")

Obj = dict[str, Any]


def _key(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


class Informer:
    """One resource, narrowed by a field selector, kept current by list then watch.

    Args:
        api: the Kubernetes API.
        resource: ``nodes`` or ``pods``.
        field_selector: e.g. ``metadata.name=gpu-1`` or ``spec.nodeName=gpu-1``.
        on_change: called (from the watch thread) after every change.
        watch_timeout_s: how long one watch request lasts before it is renewed.
    """

    def __init__(
        self,
        api: KubeApi,
        resource: str,
        field_selector: str,
        on_change: Callable[[], None] = lambda: None,
        watch_timeout_s: int = 300,
    ) -> None:
        if resource not in ("nodes", "pods"):
            raise ValueError(f"resource: {resource!r} is not nodes or pods")
        self.api = api
        self.resource = resource
        self.field_selector = field_selector
        self.on_change = on_change
        self.watch_timeout_s = watch_timeout_s
        self._lock = threading.Lock()
        self._objects: dict[str, Obj] = {}
        self._version: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lists = 0
        """Lists made (the first, then one per expired or broken watch)."""

    def _list(self, resource_version: str | None) -> Listed:
        if self.resource == "nodes":
            return self.api.list_nodes(
                field_selector=self.field_selector, resource_version=resource_version
            )
        return self.api.list_pods(
            field_selector=self.field_selector, resource_version=resource_version
        )

    def relist(self, fresh: bool = False) -> None:
        """List and replace what is held.

        Args:
            fresh: ask for the most recent data (after an expired watch); else
                ``resourceVersion=0`` (the API server's cache is enough).

        Raises:
            KubeError: the list failed.
        """
        listed = self._list(None if fresh else "0")
        with self._lock:
            self._objects = {_key(o): o for o in listed.items}
            self._version = listed.resource_version
            self.lists += 1
        self.on_change()

    @property
    def watching(self) -> bool:
        """Whether the watch thread runs (else :meth:`items` is as of the last list)."""
        return self._thread is not None and self._thread.is_alive()

    def items(self) -> list[Obj]:
        """The objects now (shared dicts: read, never change them)."""
        with self._lock:
            return list(self._objects.values())

    def apply(self, kind: str, obj: Obj, resume: bool = False) -> None:
        """Apply one change: a watch event (``resume``: the watch resumes after its
        version), or the agent's own write, seen at once but not moving the version a
        watch resumes from (changes before it may still be on their way)."""
        version = (obj.get("metadata") or {}).get("resourceVersion") if resume else None
        with self._lock:
            if kind == "BOOKMARK":
                if version:
                    self._version = version
                return
            if kind == "DELETED":
                self._objects.pop(_key(obj), None)
            else:
                old = self._objects.get(_key(obj))
                if old is not None and _newer(old, obj):
                    return
                self._objects[_key(obj)] = obj
            if version:
                self._version = version
        self.on_change()

    def start(self) -> None:
        """List (when never listed), then keep the objects current from a thread (once:
        a second call while it runs does nothing)."""
        if self.watching:
            return
        if self._version is None:
            self.relist()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, name=f"watch-{self.resource}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the thread ends when its current watch does)."""
        self._stop.set()

    def _loop(self) -> None:
        fresh = False
        while not self._stop.is_set():
            try:
                if self._version is None:
                    self.relist(fresh)
                version = self._version
                assert version is not None
                for kind, obj in self.api.watch(
                    self.resource, version, self.watch_timeout_s, self.field_selector
                ):
                    if self._stop.is_set():
                        return
                    self.apply(kind, obj, resume=True)
            except KubeError as exc:
                if exc.status == 410:
                    log.info("watch of %s expired; listing again", self.resource)
                else:
                    log.warning("watch of %s failed (%s); listing again", self.resource, exc)
                    self._stop.wait(1)
                self._version, fresh = None, True
            except Exception as exc:  # a broken connection: list again, never give up
                log.warning("watch of %s broke (%s); listing again", self.resource, exc)
                self._version, fresh = None, True
                self._stop.wait(1)


def _newer(old: Obj, new: Obj) -> bool:
    """Whether ``old`` is a later version than ``new`` of the same object."""
    try:
        a = int(old["metadata"]["resourceVersion"])
        b = int(new["metadata"]["resourceVersion"])
    except (KeyError, ValueError, TypeError):
        return False  # versions are opaque in general; only compare what compares
    return old["metadata"].get("uid") == new["metadata"].get("uid") and a > b


class NodeView:
    """This node's Node object and the pods bound to it.

    Until :meth:`start`, each read lists again (a caller that never starts the view, such
    as a one-off report, still sees current objects); once started, reads come from the
    watches.

    Args:
        api: the Kubernetes API.
        node: the node's name.
        on_change: called after every change seen by a watch.
    """

    def __init__(
        self, api: KubeApi, node: str, on_change: Callable[[], None] = lambda: None
    ) -> None:
        self.node_name = node
        self.nodes = Informer(api, "nodes", f"metadata.name={node}", on_change)
        self.pods = Informer(api, "pods", f"spec.nodeName={node}", on_change)

    def start(self) -> None:
        """List both, then watch both. Raises KubeError when a list fails."""
        self.nodes.start()
        self.pods.start()

    def stop(self) -> None:
        """Stop watching."""
        self.nodes.stop()
        self.pods.stop()

    def node(self) -> Obj | None:
        """The Node (None when it does not exist). Raises KubeError (not started: the list
        failed)."""
        if not self.nodes.watching:
            self.nodes.relist()
        items = self.nodes.items()
        return items[0] if items else None

    def bound_pods(self) -> list[Obj]:
        """The pods bound to this node. Raises KubeError (not started: the list failed)."""
        if not self.pods.watching:
            self.pods.relist()
        return self.pods.items()
