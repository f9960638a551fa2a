"""Fixtures for the Kubernetes tests: a cluster to talk to over HTTP through the official
client.

Without ``KUBECONFIG`` the cluster is the in-repo API server stand-in
(:mod:`fgpu_standin`, a test stand-in, not a Kubernetes API server). With
``KUBECONFIG`` set *and* ``FGPU_K8S_TESTS_MAY_WRITE=1`` (the tests create fake Node objects
labelled ``fgpu.io/test``, a namespace, pods and leases there, and delete them afterwards:
a test cluster only, never one that runs real work), the same tests run against that
cluster in a fresh namespace; ``KUBECONFIG`` alone keeps the stand-in and warns. Tests that need
behaviour only the stand-in can pretend (a kubelet, slow pod termination) skip there.
"""

from __future__ import annotations

import contextlib
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

from fgpu.agent.governor.freezer import cgroup2_mount
from fgpu.k8s.kube import KubeApi, KubeError, api_client
from fgpu_standin import Options, StandIn
from fgpu_standin.admission import load, point_services
from tests.k8s.podtree import Kubelet

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
    """What a test talks to."""

    api: KubeApi
    namespace: str
    standin: StandIn | None
    nodes: list[str]

    @property
    def real(self) -> bool:
        return self.standin is None


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


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., Cluster]]:
    """``make_cluster(**options)``: a cluster; options are the stand-in's
    (:class:`fgpu_standin.Options`) and are ignored on a real cluster."""
    made: list[Cluster] = []

    def make(**options: Any) -> Cluster:
        if REAL:
            api = KubeApi(api_client(os.environ["KUBECONFIG"]))
            namespace = f"fgpu-test-{secrets.token_hex(3)}"
            api.core.create_namespace({"metadata": {"name": namespace}})
            cluster = Cluster(api, namespace, None, [])
        else:
            standin = StandIn(Options(**options)).start()
            api = KubeApi(api_client(host=standin.url, pool_size=16))  # a scheduler's needs
            cluster = Cluster(api, "default", standin, [])
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        if cluster.standin is not None:
            cluster.standin.stop()
            continue
        for node in cluster.nodes:
            with contextlib.suppress(Exception):
                cluster.api.core.delete_node(node)
        with contextlib.suppress(KubeError):
            cluster.api.core.delete_namespace(cluster.namespace)


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
