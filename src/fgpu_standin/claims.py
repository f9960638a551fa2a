"""The resource claim controller of the API server stand-in (kube-controller-manager's part
of Dynamic Resource Allocation).

TEST STAND-IN, NOT A KUBERNETES CONTROLLER. See :mod:`fgpu_standin`.

Imitated here, a moment after the API server's requests (:mod:`fgpu_standin.controllers`:
the stand-in calls these methods ``Options.controller_delay_s`` later, as a controller
catches up with its watch):

- for every ``spec.resourceClaims`` entry of a pod naming a ``resourceClaimTemplateName``
  it creates a ResourceClaim from the template: ``generateName`` ``<pod>-<claim>-`` (each
  part cut to 28 characters when together they pass 57), the annotation
  ``resource.kubernetes.io/pod-claim-name``, the template's labels and annotations, owned
  by the pod as its controller; and records it in the pod's
  ``status.resourceClaimStatuses``. A template created later is used when it appears.
- when a pod is deleted or finishes, it is removed from the ``reservedFor`` of its claims;
  a claim reserved by nobody any more that carries the finalizer
  ``resource.kubernetes.io/delete-protection`` (which the allocating scheduler adds) is
  deallocated (its ``status.allocation`` removed) and the finalizer removed, as the
  controller does. Generated claims go with their pod (garbage collection,
  :mod:`fgpu_standin.controllers`); a claim with finalizers is only marked
  (``deletionTimestamp``) until they are gone, as the API server does.
"""

from __future__ import annotations

import copy
from typing import Any

from fgpu_standin.resource import admit
from fgpu_standin.store import Kind, Store, now_rfc3339

Obj = dict[str, Any]

POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
"""Annotation the claim controller puts on a generated claim: the pod's claim entry name."""
FINALIZER = "resource.kubernetes.io/delete-protection"
"""The finalizer of allocated claims (``resourceapi.Finalizer``): the allocator adds it, the
claim controller removes it once the claim is deallocated."""


def generate_name(pod_name: str, claim_name: str) -> str:
    """The ``generateName`` of a claim made for a pod's claim entry, as the resource claim
    controller makes it: ``<pod>-<claim>-``, each part cut to 28 characters when together
    they pass 57 (room for the 5 random characters in 63)."""
    name = f"{pod_name}-{claim_name}-"
    if len(name) > 57:
        name = f"{pod_name[:28]}-{claim_name[:28]}-"
    return name


class ClaimController:
    """The resource claim controller's behaviour over a :class:`Store` (module docstring).

    Args:
        store: the stand-in's objects.
        kinds: plural -> :class:`Kind` of every kind served.
    """

    def __init__(self, store: Store, kinds: dict[str, Kind]) -> None:
        self.store = store
        self.kinds = kinds

    def pod_claims(self, pod: Obj) -> None:
        """Create the missing claims of a pod's template entries and record them in its
        ``status.resourceClaimStatuses``."""
        meta = pod["metadata"]
        ns = meta.get("namespace", "")
        entries = (pod.get("spec") or {}).get("resourceClaims") or []
        stored = self.store.peek("pods", ns, meta["name"])
        if stored is None or stored["metadata"]["uid"] != meta["uid"]:
            return
        statuses = list((stored.get("status") or {}).get("resourceClaimStatuses") or [])
        known = {s.get("name") for s in statuses}
        changed = False
        for entry in entries:
            template_name = entry.get("resourceClaimTemplateName")
            if not template_name or entry.get("name") in known:
                continue
            template = self.store.peek("resourceclaimtemplates", ns, template_name)
            if template is None:
                continue  # the controller waits for it (see template_added)
            tmeta = (template.get("spec") or {}).get("metadata") or {}
            claim: Obj = {
                "metadata": {
                    "generateName": generate_name(meta["name"], entry["name"]),
                    "labels": dict(tmeta.get("labels") or {}),
                    "annotations": {
                        **(tmeta.get("annotations") or {}),
                        POD_CLAIM_NAME: entry["name"],
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": copy.deepcopy((template.get("spec") or {}).get("spec") or {}),
                "status": {},
            }
            kind = self.kinds["resourceclaims"]
            made = self.store.create(kind, ns, admit(kind, claim))
            statuses.append({"name": entry["name"], "resourceClaimName": made["metadata"]["name"]})
            changed = True
        if changed:
            new = copy.deepcopy(stored)
            new.setdefault("status", {})["resourceClaimStatuses"] = statuses
            new["metadata"].pop("resourceVersion", None)
            self.store.replace(self.kinds["pods"], ns, meta["name"], new, check_rv=False)

    def template_added(self, template: Obj) -> None:
        """Give pods waiting for this template their claims."""
        ns = template["metadata"].get("namespace", "")
        name = template["metadata"]["name"]
        waiting = [
            copy.deepcopy(p)
            for p in self.store.items("pods", ns)
            if any(
                e.get("resourceClaimTemplateName") == name
                for e in (p.get("spec") or {}).get("resourceClaims") or []
            )
        ]
        for pod in waiting:
            self.pod_claims(pod)

    def delete(self, kind: Kind, namespace: str, name: str, preconditions: Any) -> Obj:
        """Delete a claim: at once without finalizers, else mark it (``deletionTimestamp``)
        and leave it to whoever removes the last finalizer.

        Raises:
            ApiStatusError: 404, 409 (a precondition).
        """
        claim = self.store.get(kind, namespace, name)
        if not claim["metadata"].get("finalizers"):
            return self.store.delete(kind, namespace, name, preconditions or {})
        if not claim["metadata"].get("deletionTimestamp"):
            claim["metadata"]["deletionTimestamp"] = now_rfc3339()
            claim["metadata"].pop("resourceVersion", None)
            return self.store.replace(kind, namespace, name, claim, check_rv=False, system=True)
        return claim

    def finish(self, kind: Kind, written: Obj) -> Obj:
        """After a write: a marked claim whose last finalizer went is deleted now."""
        meta = written["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self.store.delete(kind, meta.get("namespace", ""), meta["name"], {})
        return written

    def pod_done(self, pod: Obj) -> None:
        """A pod was deleted or finished: take it out of its claims' ``reservedFor`` and
        deallocate a claim nobody reserves any more."""
        uid = pod["metadata"].get("uid")
        ns = pod["metadata"].get("namespace", "")
        kind = self.kinds["resourceclaims"]
        touched = [
            copy.deepcopy(c)
            for c in self.store.items("resourceclaims", ns)
            if any(r.get("uid") == uid for r in (c.get("status") or {}).get("reservedFor") or [])
        ]
        for claim in touched:
            name = claim["metadata"]["name"]
            status = claim.setdefault("status", {})
            left = [r for r in status.get("reservedFor") or [] if r.get("uid") != uid]
            protected = FINALIZER in (claim["metadata"].get("finalizers") or [])
            if left:
                status["reservedFor"] = left
            else:
                status.pop("reservedFor", None)
                if protected:  # allocated by a scheduler: deallocate
                    status.pop("allocation", None)
            claim["metadata"].pop("resourceVersion", None)
            written = self.store.replace(kind, ns, name, claim, check_rv=False)
            if not left and protected and not written["status"].get("allocation"):
                written["metadata"]["finalizers"] = [
                    f for f in written["metadata"]["finalizers"] if f != FINALIZER
                ]
                written["metadata"].pop("resourceVersion", None)
                self.finish(kind, self.store.replace(kind, ns, name, written, check_rv=False))


__all__ = ["FINALIZER", "POD_CLAIM_NAME", "ClaimController", "generate_name"]
