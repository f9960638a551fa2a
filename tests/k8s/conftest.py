"""Fixtures for the Kubernetes tests: a cluster to talk to over HTTP through the official
client.

Without ``KUBECONFIG`` the cluster is the in-repo API server stand-in
(:mod:`fgpu_standin`, a test stand-in, not a Kubernetes API server). With
``KUBECONFIG`` set *and* ``FGPU_K8S_TESTS_MAY_WRITE=1`` (a test cluster only, never one that
runs real work: the tests install fgpu's CRD, RBAC, policies and classes from this checkout,
create fake Nodes, namespaces, pods, Queues and volumes there, and delete what they made
afterwards), the same tests run against that cluster in a fresh namespace each
(:mod:`tests.k8s.realcluster`: each component as its own identity, the cluster's webhook
mode; :mod:`tests.k8s.realupkeep`: fake Nodes kept Ready, the cleanup); ``KUBECONFIG``
alone keeps the stand-in and warns. Tests that need behaviour only the stand-in can
pretend (a kubelet, slow pod termination) skip there, saying why. docs/kubernetes.md
("Testing against a real cluster") says what the cluster needs.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from fgpu.agent.checkpoint import CheckpointDriver
from fgpu.agent.governor.freezer import cgroup2_mount
from fgpu.k8s.kube import KubeApi, KubeError, api_client
from fgpu.native import ensure_built
from fgpu_standin import Options, StandIn
from fgpu_standin.admission import load, point_services
from tests.k8s.podtree import Kubelet
from tests.k8s.realcluster import RealCluster
from tests.k8s.realupkeep import Sweep, rest, wait_for
from tests.native.fakecuda_support import GPU_A, FakeGpus

pytestmark = pytest.mark.k8s

REAL = bool(os.environ.get("KUBECONFIG")) and os.environ.get("FGPU_K8S_TESTS_MAY_WRITE") == "1"
if os.environ.get("KUBECONFIG") and not REAL:
    warnings.warn(
        "KUBECONFIG is set but FGPU_K8S_TESTS_MAY_WRITE is not 1: the Kubernetes tests use "
        "the in-repo API stand-in, not that cluster",
        stacklevel=1,
    )


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def fgpu_admission(url: str) -> list[dict[str, Any]]:
    """fgpu's admission configurations as deploy/base installs them (the mutating and the
    validating webhook, the admission policies), the webhook's Service reached at ``url``
    (the stand-in's ``admission`` option)."""
    found = load([DEPLOY / "base" / "webhook.yaml", DEPLOY / "base" / "admission-policies.yaml"])
    return point_services(found, {"fgpu-system/fgpu-webhook": url})


@dataclass
class Cluster:
    """What a test talks to. ``api`` is the user's client (the kubeconfig's on a real
    cluster); fgpu's components get their own (:meth:`component`, :meth:`agent_api`)."""

    api: KubeApi
    namespace: str
    standin: StandIn | None
    nodes: list[str]
    session: RealCluster | None = None

    @property
    def real(self) -> bool:
        return self.standin is None

    def component(self, account: str) -> KubeApi:
        """The client of fgpu's service account ``fgpu-system/<account>`` on a real
        cluster (RBAC and admission policies apply to it); ``api`` on the stand-in."""
        if self.session is None:
            return self.api
        return self.session.identities.account(account)

    @property
    def scheduler_api(self) -> KubeApi:
        return self.component("fgpu-scheduler")

    @property
    def webhook_api(self) -> KubeApi:
        return self.component("fgpu-webhook")

    def agent_api(self, node: str) -> KubeApi:
        """The node agent's client for ``node`` (a token bound to a pod on it, which names
        the node as the DaemonSet's would); ``api`` on the stand-in. Make the Node first."""
        if self.session is None:
            return self.api
        return self.session.identities.agent(node)

    def kubelet_api(self, node: str) -> KubeApi:
        """The client of the kubelet of ``node`` (its Node's identity,
        ``system:node:<node>``, by a client certificate from the cluster's kubelet signer:
        the Node authorizer and NodeRestriction apply); ``api`` on the stand-in."""
        if self.session is None:
            return self.api
        return self.session.identities.kubelet(node)

    def made_node(self, name: str) -> None:
        """Note a Node the test made (deleted afterwards); on a real cluster, keep it Ready
        as its kubelet would and wait until it is (no not-ready taint)."""
        self.nodes.append(name)
        if self.session is not None:
            self.session.keep_ready(name)

    @property
    def webhook_mode(self) -> str | None:
        """fgpu's webhook on a real cluster (``dra``, ``env`` or ``none``, read from the
        cluster: :func:`tests.k8s.realcluster.webhook_mode`); None on the stand-in, whose
        admission is what each test configures."""
        if self.session is None:
            return None
        return self.session.webhook_mode(self.namespace)

    def require_webhook(self, *modes: str) -> None:
        """Skip on a real cluster whose fgpu webhook is in none of ``modes``."""
        mode = self.webhook_mode
        if mode is not None and mode not in modes:
            pytest.skip(f"needs fgpu's webhook {' or '.join(modes)}; this cluster's is {mode}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """An ASGI app served by uvicorn on loopback in a thread (the webhook in tests)."""

    def __init__(self, app: Any, **ssl: Any) -> None:
        self.port = free_port()
        scheme = "https" if ssl else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", **ssl)
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster | None]:
    """The real cluster of ``KUBECONFIG`` with fgpu's objects installed from this checkout
    (None on the stand-in)."""
    if not REAL:
        yield None
        return
    session = RealCluster.connect(
        KubeApi(api_client(os.environ["KUBECONFIG"], pool_size=16)), DEPLOY / "base"
    )
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def make_cluster(real_cluster: RealCluster | None) -> Iterator[Callable[..., Cluster]]:
    """``make_cluster(**options)``: a cluster; options are the stand-in's
    (:class:`fgpu_standin.Options`) and are ignored on a real cluster, where each cluster
    is a fresh namespace and whatever the test added to the cluster is deleted afterwards
    (:class:`tests.k8s.realupkeep.Sweep`)."""
    made: list[Cluster] = []
    sweeps: list[Sweep] = []

    def make(**options: Any) -> Cluster:
        if real_cluster is not None:
            api = real_cluster.admin
            sweeps.append(Sweep(api).note())
            namespace = f"fgpu-test-{secrets.token_hex(3)}"
            api.core.create_namespace({"metadata": {"name": namespace}})
            # pods need the namespace's default ServiceAccount, which a controller makes
            wait_for(
                lambda: _exists(api, f"/api/v1/namespaces/{namespace}/serviceaccounts/default"),
                f"the ServiceAccount default of namespace {namespace}",
            )
            cluster = Cluster(api, namespace, None, [], real_cluster)
        else:
            standin = StandIn(Options(**options)).start()
            api = KubeApi(api_client(host=standin.url, pool_size=16))  # a scheduler's needs
            cluster = Cluster(api, "default", standin, [])
        made.append(cluster)
        return cluster

    yield make
    problems: list[str] = []
    for cluster in made:
        if cluster.standin is not None:
            cluster.standin.stop()
    for sweep, cluster in zip(sweeps, [c for c in made if c.standin is None], strict=True):
        if real_cluster is not None:
            for node in cluster.nodes:
                real_cluster.keeper.forget(node)
        sweep.clean([cluster.namespace])
        problems.extend(sweep.problems)
    if real_cluster is not None:
        problems.extend(real_cluster.keeper.errors)
        real_cluster.keeper.errors.clear()
    assert not problems, f"cleaning the real cluster up: {problems}"


def _exists(api: KubeApi, path: str) -> bool:
    try:
        rest(api, "GET", path)
    except KubeError as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    """A cluster with the stand-in's default behaviour."""
    return make_cluster()


@pytest.fixture(params=["cgroupfs", "systemd"])
def kubelet(request: pytest.FixtureRequest) -> Iterator[Kubelet]:
    """An imitation of the kubelet's pod cgroups (:class:`tests.k8s.podtree.Kubelet`) in each
    layout, in a directory of its own under the cgroup v2 mount, removed afterwards. Skips
    where that cannot be made (no cgroup v2, not root, no ``cgroup.freeze``)."""
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy here")
    if os.geteuid() != 0:
        pytest.skip("making cgroups under the cgroup v2 mount needs root")
    root = mount / f"fgpu-k8s-test-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        root.mkdir()
    except OSError as exc:
        pytest.skip(f"cgroup v2 not writable here: {exc}")
    made = Kubelet(root, request.param)
    if not (root / "cgroup.freeze").exists():
        made.cleanup()
        pytest.skip("no cgroup.freeze (kernel before 5.2)")
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture(scope="session")
def in_process_fake(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[FakeGpus, CheckpointDriver]:
    """One fake machine for the whole session, whose driver is loaded into the test process
    (a library loaded once keeps its first state file: every test here uses this one)."""
    native = ensure_built()
    fake = FakeGpus(
        native, tmp_path_factory.mktemp("fake") / "fakegpu.state", f"{GPU_A}=A100-80GB:1024"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FGPU_FAKE_GPU_STATE", str(fake.state))
        patch.setenv("FGPU_FAKE_GPUS", fake.gpus)
        return fake, CheckpointDriver(str(native / "fakecuda" / "libcuda.so.1"))
