"""The real-cluster mode's own parts (:mod:`tests.k8s.conftest`): fgpu's objects installed
from this checkout, each component's own identity, and the cluster's fgpu webhook mode
(fake Nodes kept Ready and the cleanup: :mod:`tests.k8s.realupkeep`).

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
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fgpu.k8s import wire
from fgpu.k8s.kube import KubeApi, KubeError
from tests.k8s.realupkeep import NodeKeeper, is_ready, rest, wait_for

Obj = dict[str, Any]

SYSTEM_NAMESPACE = "fgpu-system"

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
