"""fgpu's DRA driver against the kubelet stand-in, over real gRPC on Unix sockets: plugin
registration, NodePrepareResources writing a CDI spec that holds only the claim's GPU,
the interposer and the hint socket, unprepare, driver restarts, the ResourceSlice."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fgpu.agent.interposer.segment import Segment
from fgpu.k8s import wire
from fgpu.k8s.dra import cdi
from fgpu.k8s.dra.driver import DraDriver
from fgpu.k8s.dra.node import AGENT_STATUS, publish_nothing, real_backend
from fgpu.k8s.dra.share import DRIVER, GpuShare, allocation, device_name
from fgpu.k8s.dra.slices import SlicePublisher, devices_of
from fgpu.k8s.resourceapi import ResourceApi
from fgpu_standin.kubelet import KubeletStandIn
from tests.k8s.test_agent import bare_node
from tests.unit.test_agent_nvml import FakeGpu, FakeNvml

pytestmark = pytest.mark.k8s

NODE = "gpu-1"


def inventory(gpus: int = 8, mig: bool = False) -> wire.Inventory:
    instances = (
        (
            wire.InventoryMigInstance("MIG-a", "3g.40gb", 0),
            wire.InventoryMigInstance("MIG-b", "3g.40gb", 4),
        )
        if mig
        else None
    )
    return wire.Inventory(
        tuple(
            wire.InventoryGpu(i, f"GPU-{NODE}-{i:02d}", "A100-80GB", 81920, instances)
            for i in range(gpus)
        ),
        "simulated",
    )


class Node:
    """A node's host folders (short paths: Unix socket paths are limited to 107 bytes)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fgpu-dra-"))
        self.registry = self.root / "reg"
        self.plugins = self.root / "plug"
        self.layout = cdi.Layout(
            cdi_dir=self.root / "cdi",
            lib_dir=self.root / "lib",
            hint_dir=self.root / "hint",
            agent_socket=str(self.root / "hint" / "agent.sock"),
        )
        self.segments = self.root / "seg"

    def driver(self, cluster: Any, inv: wire.Inventory | None = None) -> DraDriver:
        made = inv or inventory()
        driver = DraDriver(
            ResourceApi(cluster.api),
            NODE,
            lambda: made,
            self.layout,
            registry_dir=self.registry,
            plugin_dir=self.plugins,
            segment_dir=self.segments,
        )
        driver.start()
        return driver

    def kubelet(self, cluster: Any) -> KubeletStandIn:
        return KubeletStandIn(
            cluster.kubelet_api(NODE),
            NODE,
            self.registry,
            [self.layout.cdi_dir],
            image_env={"NVIDIA_VISIBLE_DEVICES": "all"},
        )


@pytest.fixture
def node() -> Iterator[Node]:
    made = Node()
    yield made
    shutil.rmtree(made.root, ignore_errors=True)


def claimed_pod(cluster: Any, name: str, devices: list[str] | None, share: GpuShare) -> dict:
    """A pod with its own claim, allocated to ``devices`` of NODE (None: not allocated),
    reserved for it, and bound to NODE."""
    api = ResourceApi(cluster.api)
    pod = cluster.api.core.create_namespaced_pod(
        cluster.namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "containers": [{"name": "main", "image": "cuda"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
            },
        },
    )
    claim = api.create_claim(
        cluster.namespace,
        {
            "metadata": {"name": f"{name}-gpu"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
            },
        },
    )
    if devices is not None:
        claim["status"] = {
            "allocation": allocation(NODE, devices, share),
            "reservedFor": [{"resource": "pods", "name": name, "uid": pod.metadata.uid}],
        }
        api.replace_claim_status(cluster.namespace, f"{name}-gpu", claim)
    cluster.api.bind(cluster.namespace, name, pod.metadata.uid, NODE, {})
    return api.get_claim(cluster.namespace, f"{name}-gpu")


def test_the_kubelet_registers_the_driver_and_a_claim_gets_only_its_gpu(cluster, node) -> None:
    driver = node.driver(cluster)
    kubelet = node.kubelet(cluster)
    try:
        kubelet.discover()
        assert set(kubelet.plugins) == {DRIVER}
        assert driver.registered.is_set()
        claim = claimed_pod(cluster, "train", [device_name("GPU-gpu-1-03")], GpuShare(500, 40960))
        kubelet.sync()
        assert kubelet.waiting == {}
        main = kubelet.containers[f"{cluster.namespace}/train"]["main"]
        uid = claim["metadata"]["uid"]
        assert main.cdi_devices == [f"{DRIVER}/claim={uid}"]
        assert main.device_nodes == [
            "/dev/nvidia3",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
        ]
        env = main.env
        assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "GPU-gpu-1-03"
        assert env["FGPU_WORKLOAD_ID"] == f"{cluster.namespace}/train"
        assert (env["FGPU_GPU_COMPUTE_MILLI"], env["FGPU_GPU_MEMORY_MIB"]) == ("500", "40960")
        lib = str(node.layout.lib_dir)
        assert env["LD_PRELOAD"] == f"{lib}/libfgpu.so"
        segment = env["FGPU_SEG"]
        seg = Segment.open(Path(segment))  # the interposer's segment with the claim's cap
        st = seg.stats()
        seg.close()
        assert [(g.uuid, g.memory_limit) for g in st.gpus] == [("GPU-gpu-1-03", 40960 << 20)]
        assert Path(segment).stat().st_mode & 0o777 == 0o666
        assert env["FGPU_AGENT_SOCKET"] == node.layout.agent_socket
        mounts = {m["containerPath"]: m for m in main.mounts}
        assert mounts[lib]["hostPath"] == lib
        assert "ro" in mounts[lib]["options"]
        assert mounts[segment]["hostPath"] == segment
        assert mounts[str(node.layout.hint_dir)]["hostPath"] == str(node.layout.hint_dir)
        spec = cdi.read_spec(cdi.spec_path(node.layout, uid))  # the file the runtime reads
        assert spec["kind"] == f"{DRIVER}/claim"
        assert [d["name"] for d in spec["devices"]] == [uid]
        pod = cluster.api.get_pod(cluster.namespace, "train")
        assert pod["status"]["phase"] == "Running"

        cluster.api.delete_pod(cluster.namespace, "train", grace_s=0)
        kubelet.sync()
        assert not cdi.spec_path(node.layout, uid).exists()
        assert not Path(segment).exists()
    finally:
        driver.stop()


def test_a_pod_whose_claim_is_not_allocated_does_not_start(cluster, node) -> None:
    driver = node.driver(cluster)
    kubelet = node.kubelet(cluster)
    try:
        claimed_pod(cluster, "early", None, GpuShare(500, 40960))
        kubelet.sync()
        assert kubelet.waiting[f"{cluster.namespace}/early"] == ("claim early-gpu is not allocated")
        assert kubelet.prepare_calls == 0
        assert cluster.api.get_pod(cluster.namespace, "early")["status"]["phase"] == "Pending"
    finally:
        driver.stop()


def test_a_pod_without_a_claim_gets_no_gpu_whatever_its_image_says(cluster, node) -> None:
    driver = node.driver(cluster)
    kubelet = node.kubelet(cluster)
    try:
        pod = cluster.api.core.create_namespaced_pod(
            cluster.namespace,
            {
                "metadata": {"name": "plain"},
                "spec": {"containers": [{"name": "c", "image": "cuda"}]},
            },
        )
        cluster.api.bind(cluster.namespace, "plain", pod.metadata.uid, NODE, {})
        kubelet.sync()
        box = kubelet.containers[f"{cluster.namespace}/plain"]["c"]
        assert box.env["NVIDIA_VISIBLE_DEVICES"] == "all"  # the image's, honoured by nothing
        assert box.device_nodes == []
        assert box.cdi_devices == []
    finally:
        driver.stop()


def test_a_claim_for_a_device_the_node_lacks_is_refused_with_the_reason(cluster, node) -> None:
    driver = node.driver(cluster)
    kubelet = node.kubelet(cluster)
    try:
        claimed_pod(cluster, "far", [device_name("GPU-gpu-1-09")], GpuShare(500, 40960))
        kubelet.sync()
        why = kubelet.waiting[f"{cluster.namespace}/far"]
        assert "could not prepare claim far-gpu" in why
        assert "device 'gpu-gpu-1-09' is not one of this node's" in why
    finally:
        driver.stop()


def test_a_driver_restart_leaves_running_pods_and_registers_again(cluster, node) -> None:
    driver = node.driver(cluster)
    kubelet = node.kubelet(cluster)
    claim = claimed_pod(cluster, "long", [device_name("GPU-gpu-1-00")], GpuShare(250, 20480))
    kubelet.sync()
    uid = claim["metadata"]["uid"]
    before = cdi.spec_path(node.layout, uid).read_text()
    driver.stop()
    kubelet.discover()
    assert kubelet.plugins == {}  # its socket is gone: deregistered
    assert cdi.spec_path(node.layout, uid).read_text() == before  # the pod keeps its GPU
    again = node.driver(cluster)
    try:
        kubelet.discover()
        assert set(kubelet.plugins) == {DRIVER}
        assert again.registered.is_set()
        assert f"{cluster.namespace}/long" in kubelet.containers
        cluster.api.delete_pod(cluster.namespace, "long", grace_s=0)
        kubelet.sync()  # the new process unprepares what the old one prepared
        assert not cdi.spec_path(node.layout, uid).exists()
    finally:
        again.stop()


def test_the_node_publishes_one_slice_with_gpus_and_mig_instances(cluster) -> None:
    bare_node(cluster, NODE)  # the slice's owner
    api = ResourceApi(cluster.api)
    publisher = SlicePublisher(api, NODE)
    made = publisher.publish(inventory(2))
    assert made["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in made["spec"]["devices"]] == ["gpu-gpu-1-00", "gpu-gpu-1-01"]
    first = made["spec"]["devices"][0]
    assert first["attributes"]["uuid"] == {"string": "GPU-gpu-1-00"}
    assert first["capacity"] == {"memory": {"value": "80Gi"}, "compute": {"value": "1k"}}
    assert publisher.publish(inventory(2))["spec"]["pool"]["generation"] == 1  # unchanged
    grown = publisher.publish(inventory(3))
    assert grown["spec"]["pool"]["generation"] == 2
    mig = devices_of(inventory(1, mig=True))
    assert [d["name"] for d in mig] == ["mig-a", "mig-b"]
    assert mig[1]["attributes"]["parentUUID"] == {"string": "GPU-gpu-1-00"}
    publisher.withdraw()
    assert api.list_slices(f"spec.nodeName={NODE}").items == []


def test_the_committed_grpc_modules_match_the_protos(tmp_path) -> None:
    from fgpu.k8s.dra.proto import regenerate

    regenerate.regenerate(tmp_path)
    here = Path(regenerate.__file__).parent
    made = sorted((tmp_path / "fgpu/k8s/dra/proto").glob("*_pb2*.py*"))
    assert [p.name for p in made] == sorted(p.name for p in here.glob("*_pb2*.py*"))
    for path in made:
        assert path.read_text() == (here / path.name).read_text(), path.name


@pytest.mark.parametrize(
    ("nvml", "says"),
    [
        (FakeNvml([], init_error="NVML Shared Library Not Found"), "NVML is unavailable"),
        (FakeNvml([]), "NVML reports no GPUs"),
    ],
    ids=["no-driver", "no-gpus"],
)
def test_an_agent_without_nvml_publishes_nothing_and_says_why(cluster, nvml, says) -> None:
    api = ResourceApi(cluster.api)
    cluster.api.core.create_node({"metadata": {"name": NODE}})
    publisher = SlicePublisher(api, NODE)
    publisher.publish(inventory(2))  # what an earlier run published
    chosen = real_backend(None, NODE, nvml=nvml)
    assert isinstance(chosen, str)
    assert says in chosen
    publish_nothing(cluster.api, publisher, NODE, chosen)
    assert api.list_slices(f"spec.nodeName={NODE}").items == []
    notes = cluster.api.get_node(NODE)["metadata"]["annotations"]
    assert notes[AGENT_STATUS] == chosen
    assert wire.INVENTORY not in notes
    simulated = real_backend("2xA100-80GB", NODE, nvml=nvml)  # asked for on purpose
    assert not isinstance(simulated, str)
    assert len(simulated.gpus()) == 2


def test_real_gpus_are_published_from_nvml(cluster) -> None:
    chosen = real_backend(None, NODE, nvml=FakeNvml([FakeGpu()]))
    assert not isinstance(chosen, str)
    assert [d.uuid for d in chosen.gpus()] == [FakeGpu().uuid]


def test_a_pod_waits_while_its_driver_is_not_registered(cluster, node) -> None:
    kubelet = node.kubelet(cluster)
    claimed_pod(cluster, "orphan", [device_name("GPU-gpu-1-00")], GpuShare(500, 40960))
    kubelet.sync()
    assert kubelet.waiting[f"{cluster.namespace}/orphan"] == (
        f"preparing claims with {DRIVER} failed: DRA driver {DRIVER} is not registered"
    )
    driver = node.driver(cluster)
    try:
        kubelet.sync()  # registered now: it starts
        assert f"{cluster.namespace}/orphan" not in kubelet.waiting
        assert f"{cluster.namespace}/orphan" in kubelet.containers
    finally:
        driver.stop()
