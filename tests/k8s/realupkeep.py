"""The upkeep of the real-cluster mode (:mod:`tests.k8s.realcluster`): raw calls to the
API server, fake Nodes kept Ready, and everything a test added removed afterwards.

A kube-apiserver differs from the stand-in in what a kubelet and the controllers do for
it. Here:

- Nodes a test makes have no kubelet. :class:`NodeKeeper` does what a kubelet's heartbeat
  does (the Node's Lease in ``kube-node-lease`` renewed, ``Ready=True`` with a fresh
  ``lastHeartbeatTime``), so the node lifecycle controller never marks them unreachable,
  and lifts the ``node.kubernetes.io/not-ready`` and ``unreachable`` taints the
  controller put on before the Node first said Ready, as the controller itself would.
- Cluster-scoped objects outlive the test's namespace. :class:`Sweep` notes what there was
  before the test and deletes what the test added (Nodes, their Leases and pods in any
  namespace, ResourceSlices, CertificateSigningRequests, Queues, PersistentVolumes,
  PriorityClasses, RuntimeClasses, DeviceClasses, Namespaces). Pods bound to a Node without
  a kubelet never finish a graceful deletion, so they are deleted with
  ``gracePeriodSeconds: 0``; claims in the namespaces going away lose their finalizers (no
  scheduler is left to lift fgpu's).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fgpu.k8s.kube import MERGE_PATCH, KubeApi, KubeError, _error

Obj = dict[str, Any]

NODE_LEASES = "kube-node-lease"
NODE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
"""The taints the node lifecycle controller puts on a Node that is not (or no longer) Ready."""

SWEPT = (
    # (path of the list, what it is), in deletion order: what uses a Node before the Node
    ("/apis/resource.k8s.io/v1/resourceslices", "ResourceSlice"),
    ("/api/v1/nodes", "Node"),
    ("/apis/certificates.k8s.io/v1/certificatesigningrequests", "CertificateSigningRequest"),
    ("/apis/fgpu.io/v1alpha1/queues", "Queue"),
    ("/api/v1/persistentvolumes", "PersistentVolume"),
    ("/apis/scheduling.k8s.io/v1/priorityclasses", "PriorityClass"),
    ("/apis/node.k8s.io/v1/runtimeclasses", "RuntimeClass"),
    ("/apis/resource.k8s.io/v1/deviceclasses", "DeviceClass"),
    ("/api/v1/namespaces", "Namespace"),
)
"""The cluster-scoped kinds a test may add, which :class:`Sweep` deletes afterwards."""


# --------------------------------------------------------------------------- raw calls
def rest(
    api: KubeApi,
    method: str,
    path: str,
    body: Any = None,
    query: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> Any:
    """One call to the API server as plain JSON, through ``api``'s client and credentials.

    Raises:
        KubeError: the server's refusal (status, reason, message) or no connection.
    """
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    client = api.client
    headers = {"Accept": "application/json", "Content-Type": content_type}
    call = client.param_serialize(
        method,
        path,
        query_params=list((query or {}).items()),
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    try:
        response = client.call_api(*call, _request_timeout=api.timeout_s)
        data = response.read()
    except ApiException as exc:
        raise _error(exc) from None
    except (OSError, HTTPError) as exc:
        raise KubeError(0, "Unreachable", str(exc)) from None
    if not 200 <= response.status <= 299:
        raise _error(ApiException(status=response.status, reason=response.reason, body=data))
    return json.loads(data) if data else None


def now_micro() -> str:
    """The time now as the API server writes a ``MicroTime`` (RFC 3339, microseconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_seconds() -> str:
    """The time now as a ``Time`` (RFC 3339, seconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_for(check: Any, what: str, limit_s: float = 60.0) -> Any:
    """Poll ``check`` until it returns something true and return that; fail naming
    ``what`` if it never does (a guard against hanging, not a speed assertion)."""
    deadline = time.monotonic() + limit_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


# ---------------------------------------------------------------------------- node keeper
class NodeKeeper:
    """Keeps the test's Nodes Ready as their kubelets would (module docstring): every
    ``period_s`` a beat renews each kept Node's Lease, writes ``Ready=True`` with a fresh
    heartbeat and lifts the lifecycle controller's not-ready/unreachable taints.

    Args:
        admin: the client that writes (Node status and Leases are the kubelet's; the
            harness stands in for it).
        period_s: seconds between beats; well under the node lifecycle controller's
            grace period (40 s to 50 s by default) so a Node never looks lost.
    """

    def __init__(self, admin: KubeApi, period_s: float = 10.0) -> None:
        self.admin = admin
        self.period_s = period_s
        self.kept: dict[str, str] = {}  # name: lastTransitionTime of its Ready
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def keep(self, name: str) -> None:
        """Keep ``name`` Ready from now on, beating once at once."""
        with self._lock:
            self.kept.setdefault(name, now_seconds())
        self.beat_one(name)

    def forget(self, name: str) -> None:
        with self._lock:
            self.kept.pop(name, None)

    def beat(self) -> None:
        """One beat for every kept Node (a missing one is forgotten)."""
        with self._lock:
            names = list(self.kept)
        for name in names:
            try:
                self.beat_one(name)
            except KubeError as exc:
                if exc.status == 404:
                    self.forget(name)
                else:
                    self.errors.append(f"{name}: {exc.status} {exc.reason}")

    def beat_one(self, name: str) -> None:
        """The Lease renewed, ``Ready=True`` with a fresh heartbeat, the controller's
        taints lifted (under the Node's resourceVersion: a write in between wins).

        Raises:
            KubeError: 404 for a Node that is gone; any other refusal.
        """
        node = rest(self.admin, "GET", f"/api/v1/nodes/{name}")
        self._renew_lease(node)
        since = self.kept.get(name) or now_seconds()
        status = {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "a fake Node of the fgpu tests, kept Ready by their harness",
                        "lastHeartbeatTime": now_seconds(),
                        "lastTransitionTime": since,
                    }
                ]
            }
        }
        node = rest(
            self.admin, "PATCH", f"/api/v1/nodes/{name}/status", status, content_type=MERGE_PATCH
        )
        taints = (node.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t.get("key") not in NODE_TAINTS]
        if len(kept) != len(taints):
            lift = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": kept or None},
            }
            with contextlib.suppress(KubeError):  # 409: changed since; the next beat
                rest(self.admin, "PATCH", f"/api/v1/nodes/{name}", lift, content_type=MERGE_PATCH)

    def _renew_lease(self, node: Obj) -> None:
        meta = node["metadata"]
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASES}/leases"
        spec = {
            "holderIdentity": meta["name"],
            "leaseDurationSeconds": 40,
            "renewTime": now_micro(),
        }
        try:
            lease = rest(self.admin, "GET", f"{path}/{meta['name']}")
        except KubeError as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": meta["name"],
                    "namespace": NODE_LEASES,
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Node",
                            "name": meta["name"],
                            "uid": meta["uid"],
                        }
                    ],
                },
                "spec": spec,
            }
            rest(self.admin, "POST", path, body)
            return
        lease["spec"] = {**(lease.get("spec") or {}), **spec}
        with contextlib.suppress(KubeError):  # 409: renewed in between; the next beat
            rest(self.admin, "PUT", f"{path}/{meta['name']}", lease)

    def start(self) -> NodeKeeper:
        def run() -> None:
            while not self._stop.wait(self.period_s):
                self.beat()

        self._thread = threading.Thread(target=run, name="fgpu-node-keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def is_ready(node: Obj) -> bool:
    """``Ready=True`` and none of the lifecycle controller's not-ready taints."""
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )
    taints = (node.get("spec") or {}).get("taints") or []
    return ready and not any(t.get("key") in NODE_TAINTS for t in taints)


# ----------------------------------------------------------------------------------- sweep
@dataclass
class Sweep:
    """What the cluster had before a test (uids per kind of :data:`SWEPT`), so what the
    test added can be deleted afterwards (:meth:`clean`)."""

    admin: KubeApi
    before: dict[str, set[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def note(self) -> Sweep:
        """Note the uids there are now."""
        for path, _kind in SWEPT:
            self.before[path] = {o["metadata"]["uid"] for o in self._list(path)}
        return self

    def _list(self, path: str) -> list[Obj]:
        try:
            return list(rest(self.admin, "GET", path).get("items") or [])
        except KubeError as exc:
            if exc.status == 404:  # a kind this cluster does not serve (no CRD yet)
                return []
            raise

    def added(self, path: str) -> list[Obj]:
        """The objects of ``path`` made since :meth:`note`."""
        seen = self.before.get(path, set())
        return [o for o in self._list(path) if o["metadata"]["uid"] not in seen]

    def clean(self, namespaces: Iterable[str] = (), limit_s: float = 120.0) -> list[str]:
        """Delete what the test added, and in ``namespaces`` (going away with the test)
        lift claims' finalizers; then wait until each cluster-scoped object deleted is
        gone (a Namespace or a PersistentVolume stays Terminating until a controller
        finishes it, and a later test may make one of the same name), except the
        ``namespaces`` (named once). Returns ``Kind/name`` of each object deleted; what
        could not be deleted, or was still there after ``limit_s``, is in
        :attr:`problems`."""
        namespaces = list(namespaces)
        gone: list[str] = []
        added = {path: self.added(path) for path, _ in SWEPT}
        new_nodes = [o["metadata"]["name"] for o in added["/api/v1/nodes"]]
        new_namespaces = [o["metadata"]["name"] for o in added["/api/v1/namespaces"]]
        for node in new_nodes:  # pods on a Node without a kubelet never finish terminating
            pods = rest(
                self.admin, "GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={node}"}
            )
            for p in pods.get("items") or []:
                meta = p["metadata"]
                self._delete(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", gone, "Pod", 0
                )
            self._delete(
                f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASES}/leases/{node}",
                gone,
                "Lease",
            )
        for namespace in [*namespaces, *new_namespaces]:
            self._release(namespace, gone)
        waited: list[str] = []
        for path, kind in SWEPT:
            for obj in added[path]:
                name = obj["metadata"]["name"]
                self._delete(f"{path}/{name}", gone, kind)
                if not (kind == "Namespace" and name in namespaces):
                    waited.append(f"{path}/{name}")
        deadline = time.monotonic() + limit_s
        for item in waited:
            while True:
                try:
                    rest(self.admin, "GET", item)
                except KubeError as exc:
                    if exc.status == 404:
                        break
                    raise
                if time.monotonic() > deadline:
                    self.problems.append(f"{item}: still there {limit_s:.0f} s after its deletion")
                    break
                time.sleep(0.2)
        return gone

    def _release(self, namespace: str, gone: list[str]) -> None:
        """Pods force-deleted and claims' finalizers lifted in ``namespace``, so it can go."""
        base = f"/api/v1/namespaces/{namespace}"
        try:
            pods = rest(self.admin, "GET", f"{base}/pods").get("items") or []
        except KubeError as exc:
            self.problems.append(f"pods of {namespace}: {exc.status} {exc.reason}")
            return
        for p in pods:
            self._delete(f"{base}/pods/{p['metadata']['name']}", gone, "Pod", 0)
        claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
        for claim in self._list(claims):
            if claim["metadata"].get("finalizers"):
                patch = {"metadata": {"finalizers": None}}
                try:
                    rest(
                        self.admin,
                        "PATCH",
                        f"{claims}/{claim['metadata']['name']}",
                        patch,
                        content_type=MERGE_PATCH,
                    )
                except KubeError as exc:
                    if exc.status != 404:
                        self.problems.append(
                            f"ResourceClaim {namespace}/{claim['metadata']['name']}: "
                            f"{exc.status} {exc.reason}"
                        )

    def _delete(self, path: str, gone: list[str], kind: str, grace_s: int | None = None) -> None:
        query = {} if grace_s is None else {"gracePeriodSeconds": str(grace_s)}
        try:
            rest(self.admin, "DELETE", path, query=query)
        except KubeError as exc:
            if exc.status != 404:
                self.problems.append(f"{kind} {path}: {exc.status} {exc.reason}")
            return
        gone.append(f"{kind}/{path.rsplit('/', 1)[-1]}")
