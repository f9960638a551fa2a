"""The real-cluster mode's own parts (:mod:`tests.k8s.conftest`): fgpu's objects installed
from this checkout, each component's own service-account identity, fake Nodes kept Ready,
every object a test made removed afterwards, and the cluster's fgpu webhook mode.

A kube-apiserver differs from the stand-in in what a kubelet and the controllers do for
it. Here:

- Nodes a test makes have no kubelet. :class:`NodeKeeper` does what a kubelet's heartbeat
  does (the Node's Lease in ``kube-node-lease`` renewed, ``Ready=True`` with a fresh
  ``lastHeartbeatTime``), so the node lifecycle controller never marks them unreachable,
  and lifts the ``node.kubernetes.io/not-ready`` and ``unreachable`` taints the
  controller put on before the Node first said Ready, as the controller itself would.
- Cluster-scoped objects outlive the test's namespace. :class:`Sweep` notes what there was
  before the test and deletes what the test added (Nodes, their Leases and pods in any
  namespace, ResourceSlices, Queues, PersistentVolumes, PriorityClasses, RuntimeClasses,
  DeviceClasses, Namespaces). Pods bound to a Node without a kubelet never finish a
  graceful deletion, so they are deleted with ``gracePeriodSeconds: 0``; claims in the
  namespaces going away lose their finalizers (no scheduler is left to lift fgpu's).
- Components run as fgpu's service accounts of ``deploy/base/rbac.yaml`` with tokens from
  the TokenRequest API (the node agent's bound to a pod on its node, so the token names
  the node as the DaemonSet's would), never as the kubeconfig's user: RBAC,
  ValidatingAdmissionPolicies and NodeRestriction apply to them as in a real install.
- The kubelet stand-in (:mod:`fgpu_standin.kubelet`) runs as its Node,
  ``system:node:<name>`` in ``system:nodes``, with a client certificate the cluster's
  kubelet client signer issued (:func:`node_certificate`): the Node authorizer and
  NodeRestriction apply to it as to a kubelet.
- The fgpu webhook is whatever the cluster has: :func:`webhook_mode` reads it from a
  dry-run pod (``dra``, ``env`` for ``--env-without-isolation``, or ``none``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from fgpu.k8s import wire
from fgpu.k8s.kube import MERGE_PATCH, KubeApi, KubeError, _error

Obj = dict[str, Any]

SYSTEM_NAMESPACE = "fgpu-system"
NODE_LEASES = "kube-node-lease"
NODE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
"""The taints the node lifecycle controller puts on a Node that is not (or no longer) Ready."""

INSTALLED = (
    "namespace.yaml",
    "crd-queue.yaml",
    "priorityclasses.yaml",
    "deviceclass.yaml",
    "rbac.yaml",
    "admission-policies.yaml",
)
"""The files of ``deploy/base`` the real-cluster mode installs from this checkout (so the
tests check this checkout's RBAC and policies). The Deployments, the DaemonSet and the
webhook configurations are not among them: fake Nodes run no containers, and the webhook
(its certificate, its Service or URL) is the cluster's own (docs/kubernetes.md)."""

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


# ------------------------------------------------------------------------------ install
def _path(obj: Obj, namespace: str | None = None) -> str:
    """The collection path of ``obj``'s kind (``namespace``: where a namespaced one goes)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    plural = {
        "ServiceAccount": "serviceaccounts",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "Role": "roles",
        "RoleBinding": "rolebindings",
        "Namespace": "namespaces",
        "CustomResourceDefinition": "customresourcedefinitions",
        "PriorityClass": "priorityclasses",
        "DeviceClass": "deviceclasses",
        "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
        "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
    }[obj["kind"]]
    if namespace:
        return f"{base}/namespaces/{namespace}/{plural}"
    return f"{base}/{plural}"


def apply(admin: KubeApi, objects: Iterable[Obj]) -> list[str]:
    """Create each object, or replace it where it exists (as ``kubectl apply`` would leave
    it; a ServiceAccount that exists is kept, its tokens being the server's). Returns
    ``Kind/name`` of each.

    Raises:
        KubeError: the server refused an object.
    """
    written = []
    for obj in objects:
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding") and not namespace:
            namespace = SYSTEM_NAMESPACE
            obj["metadata"]["namespace"] = namespace
        collection = _path(obj, namespace)
        try:
            rest(admin, "POST", collection, obj)
        except KubeError as exc:
            if exc.status != 409:
                raise
            item = f"{collection}/{obj['metadata']['name']}"
            if obj["kind"] != "ServiceAccount":
                current = rest(admin, "GET", item)
                obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                rest(admin, "PUT", item, obj)
        written.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return written


ENV_COMPONENT = "env-without-isolation"
ENV_PATH_ROLE = "fgpu-scheduler-env-without-isolation"


def env_path_grant(component: Path) -> list[Obj]:
    """The rules ``component`` (``deploy/components/env-without-isolation``) adds to the
    scheduler's ClusterRole, as a ClusterRole of their own bound to the scheduler: the
    tests run the environment path and the DRA path against one cluster, so its
    scheduler holds both grants (the DRA path's tests do not need these)."""
    kustomization = yaml.safe_load((component / "kustomization.yaml").read_text())
    rules = []
    for patch in kustomization.get("patches") or []:
        target = patch.get("target") or {}
        if (target.get("kind"), target.get("name")) != ("ClusterRole", "fgpu-scheduler"):
            continue
        for op in yaml.safe_load(patch["patch"]):
            if op.get("op") == "add" and op.get("path") == "/rules/-":
                rules.append(op["value"])
    assert rules, f"{component}: no rules added to the ClusterRole fgpu-scheduler"
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": ENV_PATH_ROLE},
            "rules": rules,
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": ENV_PATH_ROLE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": ENV_PATH_ROLE,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "fgpu-scheduler", "namespace": SYSTEM_NAMESPACE}
            ],
        },
    ]


def install(admin: KubeApi, base: Path, files: Iterable[str] = INSTALLED) -> list[str]:
    """Create or replace the objects of ``files`` in ``base`` (:func:`apply`) and wait
    until the Queue CRD is established. Returns ``Kind/name`` of each object written.

    Raises:
        KubeError: the server refused an object (a cluster without ``resource.k8s.io/v1``
            refuses the DeviceClass: fgpu's DRA path needs Kubernetes 1.34 or later).
    """
    files = list(files)
    objects = [o for name in files for o in yaml.safe_load_all((base / name).read_text()) if o]
    written = apply(admin, objects)

    def established() -> bool:
        crd = rest(
            admin,
            "GET",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/queues.fgpu.io",
        )
        return any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        )

    if "crd-queue.yaml" in files:
        wait_for(established, "the Queue CRD established")
    return written


# ---------------------------------------------------------------------------- identities
def token_api(admin: KubeApi, token: str) -> KubeApi:
    """A :class:`KubeApi` for the same server as ``admin`` (address, CA, TLS checks) that
    authenticates with the bearer ``token`` alone: no client certificate, no other
    credential of the kubeconfig (the server would take a certificate first)."""
    from kubernetes import client

    made = _same_server(admin)
    made.api_key = {"BearerToken": f"Bearer {token}"}
    return KubeApi(client.ApiClient(made))


def _same_server(admin: KubeApi) -> Any:
    """A client ``Configuration`` for ``admin``'s server (address, CA, TLS checks, proxy)
    with no credential."""
    from kubernetes import client

    source = admin.client.configuration
    made = client.Configuration()
    made.host = source.host
    made.ssl_ca_cert = source.ssl_ca_cert
    made.verify_ssl = source.verify_ssl
    made.assert_hostname = source.assert_hostname
    made.tls_server_name = getattr(source, "tls_server_name", None)
    made.proxy = source.proxy
    made.connection_pool_maxsize = max(16, source.connection_pool_maxsize or 0)
    return made


def request_token(
    admin: KubeApi, account: str, bound_to: Obj | None = None, expiry_s: int = 3600
) -> str:
    """A token of ``fgpu-system/<account>`` from the TokenRequest API; ``bound_to`` (a
    Pod) binds it to that pod, so the server adds the pod's node to the token (the user
    extra ``authentication.kubernetes.io/node-name`` that fgpu's node-agent policy reads).

    Raises:
        KubeError: 404 where the ServiceAccount is missing (``install`` makes it).
    """
    spec: Obj = {"audiences": [], "expirationSeconds": expiry_s}
    if bound_to is not None:
        meta = bound_to["metadata"]
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
        }
    made = rest(
        admin,
        "POST",
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(made["status"]["token"])


def agent_pod(node: str) -> Obj:
    """The pod a node agent's token is bound to: the DaemonSet's pod on ``node``, as far as
    the API server's token binding goes (the account, the namespace, the node)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"fgpu-node-agent-{node}"[:63],
            "namespace": SYSTEM_NAMESPACE,
            "labels": {"app.kubernetes.io/name": "fgpu-node-agent", "fgpu.io/test": "true"},
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": "fgpu-node-agent",
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "agent", "image": "fgpu", "command": ["fgpu"]}],
        },
    }


CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
KUBELET_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"


def node_certificate(admin: KubeApi, node: str, folder: Path) -> tuple[Path, Path]:
    """A client certificate and key for Node ``node`` (``CN=system:node:<node>``,
    ``O=system:nodes``), as a kubelet gets them at bootstrap: a key made here (``openssl``),
    a CertificateSigningRequest for the kubelet client signer approved by ``admin``, the
    certificate the controller-manager's signer writes into its status. Returns the
    certificate's and the key's files in ``folder``.

    Raises:
        KubeError: the server refused the request or the approval.
        AssertionError: no certificate within a minute (no signer running: the
            controller-manager needs ``--cluster-signing-cert-file`` and
            ``--cluster-signing-key-file``).
    """
    key, request, cert = (folder / f"{node}.{ext}" for ext in ("key", "csr", "crt"))
    subprocess.run(
        [
            *("openssl", "req", "-new", "-nodes", "-newkey", "ec"),
            *("-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", str(key)),
            *("-out", str(request), "-subj", f"/O=system:nodes/CN=system:node:{node}"),
        ],
        check=True,
        capture_output=True,
    )
    name = f"fgpu-test-{node}-{secrets.token_hex(3)}"[-63:].lstrip("-")
    body = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64.b64encode(request.read_bytes()).decode(),
            "signerName": KUBELET_SIGNER,
            "usages": ["digital signature", "client auth"],
            "expirationSeconds": 3600,
        },
    }
    made = rest(admin, "POST", CSR_PATH, body)
    made["status"] = {
        "conditions": [
            {
                "type": "Approved",
                "status": "True",
                "reason": "FgpuTests",
                "message": "a fake Node of the fgpu tests",
            }
        ]
    }
    rest(admin, "PUT", f"{CSR_PATH}/{name}/approval", made)
    issued = wait_for(
        lambda: (rest(admin, "GET", f"{CSR_PATH}/{name}").get("status") or {}).get("certificate"),
        f"a certificate for Node {node} (CertificateSigningRequest {name})",
    )
    cert.write_bytes(base64.b64decode(issued))
    return cert, key


def certificate_api(admin: KubeApi, cert: Path, key: Path) -> KubeApi:
    """A :class:`KubeApi` for ``admin``'s server that authenticates with the client
    certificate ``cert`` (and ``key``) alone."""
    from kubernetes import client

    made = _same_server(admin)
    made.cert_file = str(cert)
    made.key_file = str(key)
    return KubeApi(client.ApiClient(made))


class Identities:
    """Each fgpu component's own client: the scheduler and the webhook as their service
    accounts, a node agent as ``fgpu-node-agent`` with a token bound to a pod on its node."""

    def __init__(self, admin: KubeApi, expiry_s: int = 3600) -> None:
        self.admin = admin
        self.expiry_s = expiry_s
        self._made: dict[str, tuple[float, KubeApi]] = {}
        self.folder = Path(tempfile.mkdtemp(prefix="fgpu-test-identities-"))

    def account(self, name: str) -> KubeApi:
        """The client of ``fgpu-system/<name>``, with a fresh token once half of the last
        one's ``expiry_s`` has passed."""
        made = self._made.get(name)
        if made is None or time.monotonic() - made[0] > self.expiry_s / 2:
            token = request_token(self.admin, name, expiry_s=self.expiry_s)
            made = (time.monotonic(), token_api(self.admin, token))
            self._made[name] = made
        return made[1]

    def agent(self, node: str) -> KubeApi:
        """A node agent's client for ``node``: a fresh bound pod and token each time (the
        pod is deleted with the Node by :class:`Sweep`)."""
        body = agent_pod(node)
        path = f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods"
        try:
            made = rest(self.admin, "POST", path, body)
        except KubeError as exc:
            if exc.status != 409:
                raise
            made = rest(self.admin, "GET", f"{path}/{body['metadata']['name']}")
            if (made.get("spec") or {}).get("nodeName") != node or made["metadata"].get(
                "deletionTimestamp"
            ):
                raise
        token = request_token(self.admin, "fgpu-node-agent", made, self.expiry_s)
        return token_api(self.admin, token)

    def kubelet(self, node: str) -> KubeApi:
        """The client of Node ``node`` (:func:`node_certificate`, a fresh one each time)."""
        return certificate_api(self.admin, *node_certificate(self.admin, node, self.folder))

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


# ------------------------------------------------------------------------------- webhook
def webhook_mode(admin: KubeApi, namespace: str) -> str:
    """fgpu's webhook as this cluster runs it, read from a dry-run pod in ``namespace``
    (nothing is stored; ``sideEffects: None`` lets the server call the webhook):
    ``dra`` (the pod got a claim), ``env`` (``--env-without-isolation``: the pod got an
    environment ConfigMap) or ``none`` (no fgpu webhook: the pod kept its scheduler).

    Raises:
        KubeError: the server refused the dry-run pod (the webhook's refusal included).
    """
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "fgpu-webhook-probe-", "annotations": {wire.GPU: "0.5"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    made = rest(
        admin, "POST", f"/api/v1/namespaces/{namespace}/pods", probe, query={"dryRun": "All"}
    )
    if (made.get("spec") or {}).get("schedulerName") != wire.SCHEDULER_NAME:
        return "none"
    if wire.ENV_CONFIGMAP in ((made.get("metadata") or {}).get("annotations") or {}):
        return "env"
    return "dra"


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


# ------------------------------------------------------------------------------- session
@dataclass
class RealCluster:
    """The session's view of the real cluster: the kubeconfig's client (``admin``: it
    installs, makes nodes and pods as a user would, and cleans up), each component's
    identity, the keeper of fake Nodes, and the cluster's webhook mode once read."""

    admin: KubeApi
    identities: Identities
    keeper: NodeKeeper
    installed: list[str] = field(default_factory=list)
    _webhook_mode: str | None = None

    @classmethod
    def connect(cls, admin: KubeApi, base: Path) -> RealCluster:
        installed = install(admin, base)
        installed += apply(admin, env_path_grant(base.parent / "components" / ENV_COMPONENT))
        return cls(admin, Identities(admin), NodeKeeper(admin).start(), installed)

    def webhook_mode(self, namespace: str) -> str:
        """:func:`webhook_mode`, read once a session."""
        if self._webhook_mode is None:
            self._webhook_mode = webhook_mode(self.admin, namespace)
        return self._webhook_mode

    def keep_ready(self, name: str, limit_s: float = 60.0) -> None:
        """Keep Node ``name`` Ready and wait until it is: ``Ready=True`` and untainted."""
        self.keeper.keep(name)

        def ready() -> bool:
            self.keeper.beat_one(name)
            return is_ready(rest(self.admin, "GET", f"/api/v1/nodes/{name}"))

        wait_for(ready, f"Node {name} Ready without not-ready taints", limit_s)

    def close(self) -> None:
        self.keeper.stop()
        self.identities.close()
