"""fgpu's DRA kubelet plugin (driver ``gpu.fgpu.io``): registration and ``DRAPlugin`` over gRPC.

The kubelet finds plugins by the sockets in its ``plugins_registry`` folder
(``/var/lib/kubelet/plugins_registry/gpu.fgpu.io-reg.sock``): it calls ``GetInfo``
(pluginregistration v1: type ``DRAPlugin``, the driver name, the endpoint of the DRA
service, ``supported_versions`` ``["v1.DRAPlugin"]``), then ``NotifyRegistrationStatus``.
It then calls ``NodePrepareResources`` on the endpoint
(``/var/lib/kubelet/plugins/gpu.fgpu.io/dra.sock``) before it starts a pod whose claims
are allocated and reserved for it, and ``NodeUnprepareResources`` once the pod is gone.

Preparing a claim (:meth:`DraDriver.prepare`): read the claim from the API (its uid must be
the one asked for), take the allocation results of this driver in this node's pool, the
share (:func:`~fgpu.k8s.dra.share.share_of`) and the pod it is reserved for, create the
claim's shared-state segment, write the CDI spec (:mod:`~fgpu.k8s.dra.cdi`), and answer
with the CDI device id on the first device. Preparing again gives the same answer.
Unpreparing removes the spec and the segment.

Sweeping (:meth:`DraDriver.sweep`, every :data:`SWEEP_INTERVAL_S` once started): the
interposer in a container judges only its own pid namespace's entries of a claim's segment,
so the reservations of a container whose processes all died (OOM kill, ``kill -9``, a
restart in a new container) would stay counted against the claim's memory cap until the
claim is unprepared. The driver runs in the node agent, whose pod has ``hostPID``: from the
host's pid namespace the native sweep sees every container's processes and gives back the
entries of those that are gone (``native/interposer/README.md``, pid namespaces).

What a running container was given lives in its runtime, so a driver restart changes nothing
for running pods: the new process serves new sockets, the kubelet registers it again, and
specs on disk stay until their claims are unprepared.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fgpu.k8s import wire
from fgpu.k8s.dra import cdi
from fgpu.k8s.dra.share import DRIVER, ShareError, device_name, results_of, share_of
from fgpu.k8s.kube import KubeError
from fgpu.k8s.resourceapi import ResourceApi

log = logging.getLogger("fgpu.k8s.dra.driver")

REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
SEGMENT_DIR = Path("/run/fgpu/segments")
SWEEP_INTERVAL_S = 10.0
"""Seconds between two sweeps of the claims' segments (module docstring)."""
PLUGIN_TYPE = "DRAPlugin"
SERVICE_VERSIONS = ("v1.DRAPlugin",)
"""What ``PluginInfo.supported_versions`` lists: the gRPC services served, as the kubelet
names them (``k8s.io/kubelet/pkg/apis/dra/v1``'s ``DRAPluginService``)."""

Obj = dict[str, Any]


def sweep_claim_segments(folder: Path) -> int:
    """Give back the reservations of gone processes in every claim's segment in ``folder``
    (module docstring, Sweeping); a segment that cannot be opened (being removed, not a
    segment) is skipped with a log line.

    Returns:
        Bytes given back, over all claims and GPUs.
    """
    from fgpu.agent.interposer.segment import Segment, SegmentError

    total = 0
    for path in sorted(folder.glob("claim-*.seg")):
        try:
            segment = Segment.open(path)
        except SegmentError as exc:
            log.debug("sweep: %s", exc)
            continue
        try:
            freed = segment.sweep()
        finally:
            segment.close()
        if freed:
            log.info("sweep: %s: %d bytes of gone processes given back", path.name, freed)
        total += freed
    return total


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources answers it."""

    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


def create_segment(seg_dir: Path, claim_uid: str, share: Any, uuids: list[str]) -> Path:
    """Create the claim's interposer segment (:mod:`fgpu.agent.interposer`): the claim's
    memory quota on each of its GPUs as a hard cap, launches never held (no governor drives
    claims' gates yet). The file is mode 0666: the containers' user is not known here, and
    only the claim's own containers get it mounted (the folder is 0711, not listable).

    Raises:
        OSError, ValueError: the folder is not usable or the share is malformed.
    """
    from fgpu.agent.interposer.preload import SegmentDir
    from fgpu.agent.interposer.segment import SegmentError

    folder = SegmentDir(seg_dir)
    try:
        segment = folder.create(
            f"claim-{claim_uid}",
            uuids,
            [int(share.memory_mib)] * len(uuids),
            max_inflight=0,
            uid=None,
            gid=None,
            gating=False,
        )
    except SegmentError as exc:
        raise OSError(str(exc)) from exc
    path = segment.path
    segment.close()
    os.chmod(path, 0o666)
    return path


class DraDriver:
    """Prepares and unprepares fgpu claims on one node; serves the kubelet over gRPC.

    Args:
        api: the ``resource.k8s.io`` calls.
        node: this node's name (the pool name).
        inventory: what the agent publishes now (called on every prepare).
        minors: GPU uuid -> device node number (``/dev/nvidia<N>``); a GPU not listed uses
            its inventory index.
        layout: CDI and host paths.
        registry_dir: the kubelet's plugin registration folder.
        plugin_dir: this driver's folder for the DRA socket.
        segment_dir: where claims' segment files are made.
    """

    def __init__(
        self,
        api: ResourceApi,
        node: str,
        inventory: Callable[[], wire.Inventory],
        layout: cdi.Layout,
        *,
        minors: dict[str, int] | None = None,
        registry_dir: Path = REGISTRY_DIR,
        plugin_dir: Path = PLUGINS_DIR / DRIVER,
        segment_dir: Path = SEGMENT_DIR,
    ) -> None:
        self.api = api
        self.node = node
        self.inventory = inventory
        self.layout = layout
        self.minors = dict(minors or {})
        self.registry_socket = registry_dir.absolute() / f"{DRIVER}-reg.sock"
        self.plugin_socket = plugin_dir.absolute() / "dra.sock"
        self.segment_dir = segment_dir.absolute()
        self.registered = threading.Event()
        self.registration_error = ""
        self._servers: list[Any] = []
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    # ------------------------------------------------------------------- logic
    def _devices(self) -> dict[str, cdi.PreparedGpu]:
        out: dict[str, cdi.PreparedGpu] = {}
        for g in self.inventory().gpus:
            minor = self.minors.get(g.uuid, g.index)
            if g.mig is None:
                out[device_name(g.uuid)] = cdi.PreparedGpu(g.uuid, minor)
            else:
                for m in g.mig:
                    out[device_name(m.uuid)] = cdi.PreparedGpu(m.uuid, minor)
        return out

    def prepare(self, namespace: str, name: str, uid: str) -> list[PreparedDevice]:
        """Prepare one claim (module docstring).

        Raises:
            ValueError: the claim cannot be prepared here; the message says why (it goes
                back to the kubelet as the claim's error).
            KubeError: reading the claim failed.
        """
        claim = self.api.get_claim(namespace, name)
        if claim["metadata"].get("uid") != uid:
            raise ValueError(
                f"claim {namespace}/{name} has uid {claim['metadata'].get('uid')}, not {uid}"
            )
        results = [r for r in results_of(claim) if r.get("pool") == self.node]
        if not results:
            raise ValueError(
                f"claim {namespace}/{name} has no device of {DRIVER} allocated on node {self.node}"
            )
        try:
            share = share_of(claim)
        except ShareError as exc:
            raise ValueError(f"claim {namespace}/{name}: {exc}") from None
        if share is None:
            raise ValueError(f"claim {namespace}/{name}: no {DRIVER} share in its allocation")
        pods = [
            r
            for r in (claim.get("status") or {}).get("reservedFor") or []
            if r.get("resource") == "pods"
        ]
        if not pods:
            raise ValueError(f"claim {namespace}/{name} is not reserved for a pod")
        known = self._devices()
        gpus: list[cdi.PreparedGpu] = []
        for r in results:
            found = known.get(r.get("device", ""))
            if found is None:
                raise ValueError(
                    f"claim {namespace}/{name}: device {r.get('device')!r} is not one of this "
                    f"node's ({', '.join(sorted(known)) or 'none'})"
                )
            gpus.append(found)
        segment = create_segment(self.segment_dir, uid, share, [g.uuid for g in gpus])
        spec = cdi.claim_spec(
            self.layout, uid, f"{namespace}/{pods[0]['name']}", gpus, share, segment
        )
        cdi.write_spec(self.layout, uid, spec)
        log.info("prepared claim %s/%s (%s): %s", namespace, name, uid, [g.uuid for g in gpus])
        return [
            PreparedDevice(
                r["request"], r["pool"], r["device"], (cdi.device_id(uid),) if i == 0 else ()
            )
            for i, r in enumerate(results)
        ]

    def unprepare(self, uid: str) -> None:
        """Remove a claim's CDI spec and segment (nothing to do when already gone).

        Raises:
            OSError: a file could not be removed.
        """
        from fgpu.agent.interposer.segment import control_path

        removed = cdi.remove_spec(self.layout, uid)
        (self.segment_dir / f"claim-{uid}.seg").unlink(missing_ok=True)
        control_path(self.segment_dir / f"claim-{uid}.seg").unlink(missing_ok=True)
        if removed:
            log.info("unprepared claim %s", uid)

    def sweep(self) -> int:
        """:func:`sweep_claim_segments` over this driver's segment folder."""
        return sweep_claim_segments(self.segment_dir)

    def _sweep_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.sweep()
            except (OSError, RuntimeError) as exc:  # never let the thread die
                log.warning("sweeping claim segments: %s", exc)

    # -------------------------------------------------------------------- gRPC
    def start(self, sweep_interval_s: float = SWEEP_INTERVAL_S) -> None:
        """Serve the DRA service, then the registration service (so the kubelet never
        finds a registration whose endpoint is not listening yet). Stale sockets of an
        earlier run are replaced.

        Raises:
            RuntimeError: a socket could not be bound.
        """
        import grpc

        from fgpu.k8s.dra.proto import (
            dra_v1_pb2_grpc,
            pluginregistration_pb2_grpc,
        )

        plugin = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_DraService(self), plugin)
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
            _RegistrationService(self), registration
        )
        for server, path in ((plugin, self.plugin_socket), (registration, self.registry_socket)):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            if server.add_insecure_port(f"unix://{path}") == 0:
                raise RuntimeError(f"cannot listen on {path}")
            server.start()
            self._servers.append(server)
        log.info("DRA driver %s: registration at %s", DRIVER, self.registry_socket)
        self._stop.clear()
        self._sweeper = threading.Thread(
            target=self._sweep_loop, args=(sweep_interval_s,), name="fgpu-dra-sweep", daemon=True
        )
        self._sweeper.start()

    def stop(self) -> None:
        """Stop serving and remove the sockets (the kubelet then deregisters the plugin);
        prepared claims' specs stay."""
        self._stop.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout=30)
            self._sweeper = None
        for server in reversed(self._servers):
            server.stop(grace=2).wait()
        self._servers.clear()
        self.registry_socket.unlink(missing_ok=True)
        self.plugin_socket.unlink(missing_ok=True)


class _DraService:
    """The ``DRAPlugin`` servicer: one entry per claim asked, errors per claim."""

    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        from fgpu.k8s.dra.proto import dra_v1_pb2 as pb

        reply = pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            entry = reply.claims[claim.uid]
            try:
                for d in self.driver.prepare(claim.namespace, claim.name, claim.uid):
                    entry.devices.append(
                        pb.Device(
                            request_names=[d.request],
                            pool_name=d.pool,
                            device_name=d.device,
                            cdi_device_ids=list(d.cdi_ids),
                        )
                    )
            except (ValueError, KubeError, OSError) as exc:
                log.warning("preparing claim %s/%s: %s", claim.namespace, claim.name, exc)
                del entry.devices[:]
                entry.error = str(exc)
        return reply

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        from fgpu.k8s.dra.proto import dra_v1_pb2 as pb

        reply = pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            entry = reply.claims[claim.uid]
            try:
                self.driver.unprepare(claim.uid)
            except OSError as exc:
                entry.error = str(exc)
        return reply


class _RegistrationService:
    """The ``pluginregistration.Registration`` servicer."""

    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    def GetInfo(self, request: Any, context: Any) -> Any:
        from fgpu.k8s.dra.proto import pluginregistration_pb2 as pb

        return pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=DRIVER,
            endpoint=str(self.driver.plugin_socket),
            supported_versions=list(SERVICE_VERSIONS),
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        from fgpu.k8s.dra.proto import pluginregistration_pb2 as pb

        if request.plugin_registered:
            log.info("registered with the kubelet")
            self.driver.registration_error = ""
            self.driver.registered.set()
        else:
            log.error("the kubelet refused the registration: %s", request.error)
            self.driver.registration_error = request.error
            self.driver.registered.clear()
        return pb.RegistrationStatusResponse()


__all__ = [
    "PLUGIN_TYPE",
    "REGISTRY_DIR",
    "SERVICE_VERSIONS",
    "SWEEP_INTERVAL_S",
    "DraDriver",
    "PreparedDevice",
    "create_segment",
    "sweep_claim_segments",
]
