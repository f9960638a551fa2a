"""The controllers of the API server stand-in: work a real cluster does after a request has
been answered (kube-controller-manager's garbage collector and resource claim controller,
the kubelet finishing a pod), done here a little later, in the server's event loop.

TEST STAND-IN, NOT KUBERNETES CONTROLLERS. See :mod:`fgpu_standin`.

A client therefore sees what it sees on a real cluster: a pod's ResourceClaim appears a
moment after the pod (0.2 to 1.7 s on a real 1.36 cluster), a deleted owner's dependents go
a moment after it, and a deleted running pod stays ``Terminating`` until its kubelet
finishes it. Tests wait for these (on watches or by polling with a deadline); they never
rely on them having happened when a request returns.

- :meth:`Controllers.later` runs a piece of work after :attr:`Controllers.delay_s` (pieces
  due at the same time in no set order: each is complete on its own) and logs (never
  raises) what fails;
- :meth:`Controllers.collect_garbage` is the garbage collector (background propagation):
  every object with an ``ownerReferences`` entry naming the deleted object's uid is deleted
  once none of its owners exists any more, or loses that entry while another owner
  remains. A namespaced owner's dependents are looked for in its namespace; a
  cluster-scoped owner's (a Node's ResourceSlices) everywhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fgpu_standin.store import KINDS, ApiStatusError, Kind, Store

log = logging.getLogger("fgpu_standin.controllers")

Obj = dict[str, Any]
_BY_KIND = {k.kind: k for k in KINDS}


class Controllers:
    """Work done after a request, in the event loop of the server.

    Args:
        store: the stand-in's objects.
        delay_s: how long after the request the work runs (0: at the next turn of the loop,
            still after the answer is sent).
        delete: how a dependent is deleted (``(kind, namespace, name, uid)``; the API's own
            deletion, so a pod is deleted gracefully and a claim keeps its finalizers).
    """

    def __init__(
        self,
        store: Store,
        delay_s: float,
        delete: Callable[[Kind, str, str, str], None],
    ) -> None:
        self.store = store
        self.delay_s = delay_s
        self._delete = delete

    def later(self, work: Callable[..., Any], *args: Any) -> None:
        """Run ``work(*args)`` after :attr:`delay_s` in the running event loop (called from
        request handlers, which run there)."""

        def run() -> None:
            try:
                work(*args)
            except ApiStatusError as exc:  # the object changed meanwhile: as a retry finds
                log.info("controller work %s: %s", getattr(work, "__name__", work), exc)
            except Exception:
                log.exception("controller work %s failed", getattr(work, "__name__", work))

        asyncio.get_running_loop().call_later(self.delay_s, run)

    def deleted(self, plural: str, gone: Obj) -> None:
        """A ``Store.on_delete`` hook: collect ``gone``'s dependents later."""
        self.later(self.collect_garbage, plural, gone)

    def _exists(self, ref: Obj, namespace: str) -> bool:
        kind = _BY_KIND.get(str(ref.get("kind", "")))
        if kind is None:
            return True  # a kind the stand-in does not serve: assume it is there
        found = self.store.peek(kind.plural, namespace if kind.namespaced else "", ref["name"])
        return found is not None and found["metadata"].get("uid") == ref.get("uid")

    def collect_garbage(self, plural: str, gone: Obj) -> None:
        """Delete (or release) the dependents of ``gone`` (module docstring)."""
        uid = gone["metadata"].get("uid")
        owner_ns = gone["metadata"].get("namespace")
        owner_namespaced = bool(owner_ns)
        for kind in KINDS:
            if owner_namespaced and not kind.namespaced:
                continue  # a cluster-scoped object cannot have a namespaced owner
            dependents = [
                o
                for o in self.store.items(kind.plural, owner_ns if owner_namespaced else None)
                if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
            ]
            for dep in dependents:
                meta = dep["metadata"]
                ns = meta.get("namespace", "")
                others = [r for r in meta.get("ownerReferences") or [] if r.get("uid") != uid]
                try:
                    if any(self._exists(r, ns) for r in others):
                        released = {**dep, "metadata": {**meta, "ownerReferences": others}}
                        released["metadata"].pop("resourceVersion", None)
                        self.store.replace(kind, ns, meta["name"], released, check_rv=False)
                    else:
                        self._delete(kind, ns, meta["name"], meta["uid"])
                except ApiStatusError as exc:  # gone or replaced meanwhile: the next one
                    log.info("garbage collection of %s/%s: %s", ns, meta["name"], exc)


__all__ = ["Controllers"]
