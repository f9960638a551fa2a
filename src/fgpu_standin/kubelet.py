"""A kubelet stand-in for one node: DRA plugin registration, claim preparation, CDI.

TEST STAND-IN, NOT A KUBELET. See :mod:`fgpu_standin`.

It does what the kubelet does around Dynamic Resource Allocation, over the same wire:

- **registration**: every socket in the plugin registration folder is asked ``GetInfo``
  (gRPC, pluginregistration v1); a ``DRAPlugin`` that lists ``v1.DRAPlugin`` is told
  ``NotifyRegistrationStatus(plugin_registered=true)`` and its endpoint is used from then on;
  anything else is told why not. A socket that appears again (a restarted driver) is asked
  again.
- **starting a pod** bound to this node (:meth:`KubeletStandIn.sync`): only when every
  claim of ``spec.resourceClaims`` exists (templates resolved through
  ``status.resourceClaimStatuses``), is allocated and is reserved for the pod (else the pod
  stays ``Pending`` and :attr:`KubeletStandIn.waiting` says why); then
  ``NodePrepareResources`` of each claim's driver (gRPC over its Unix socket), then the CDI
  devices it returned are resolved in the CDI folders as a container runtime does. The
  container's environment is the image's, then the pod's ``env``, then the CDI edits; its
  device nodes and mounts come only from the CDI edits (no device reaches a container by
  environment variable: the NVIDIA toolkit's ``accept-nvidia-visible-devices-envvar-when-
  unprivileged = false``). The pod becomes ``Running``.
- **a pod gone** (deleted, or finished): ``NodeUnprepareResources`` of its claims; a pod
  marked deleted (``Terminating``, ``deletionTimestamp``) is then deleted for good
  (``gracePeriodSeconds=0``), as the kubelet does once its containers stopped.

What each container got is kept in :attr:`KubeletStandIn.containers` for tests to read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fgpu.k8s import wire
from fgpu.k8s.dra import cdi
from fgpu.k8s.kube import KubeApi, KubeError
from fgpu.k8s.resourceapi import ResourceApi

log = logging.getLogger("fgpu_standin.kubelet")

Obj = dict[str, Any]
_DRA_VERSION = "v1.DRAPlugin"


@dataclass
class Container:
    """What one container was started with."""

    env: dict[str, str] = field(default_factory=dict)
    device_nodes: list[str] = field(default_factory=list)
    mounts: list[Obj] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)


@dataclass
class _Plugin:
    name: str
    endpoint: str
    registry_socket: str
    inode: int


@dataclass
class _Prepared:
    uid: str
    claims: list[tuple[str, Obj]]  # driver -> claim ref (namespace, uid, name)


class KubeletStandIn:
    """The kubelet's DRA part for ``node`` (module docstring).

    Args:
        api: the Kubernetes API.
        node: the node's name.
        registry_dir: the plugin registration folder.
        cdi_dirs: folders the "runtime" reads CDI specs from.
        image_env: environment every image sets (``{"NVIDIA_VISIBLE_DEVICES": "all"}`` as
            CUDA base images do).
    """

    def __init__(
        self,
        api: KubeApi,
        node: str,
        registry_dir: Path,
        cdi_dirs: list[Path],
        image_env: dict[str, str] | None = None,
    ) -> None:
        self.api = api
        self.resources = ResourceApi(api)
        self.node = node
        self.registry_dir = registry_dir.absolute()
        self.cdi_dirs = [d.absolute() for d in cdi_dirs]
        self.image_env = dict(image_env or {})
        self.plugins: dict[str, _Plugin] = {}
        self.refused: dict[str, str] = {}  # socket -> why not registered
        self.containers: dict[str, dict[str, Container]] = {}  # pod key -> name -> container
        self.waiting: dict[str, str] = {}  # pod key -> why it has not started
        self.prepare_calls = 0
        self._prepared: dict[str, _Prepared] = {}  # pod key -> claims prepared

    # ----------------------------------------------------------- registration
    def discover(self) -> None:
        """Register the plugins whose sockets are in the registration folder (again when a
        socket was replaced); forget those whose socket is gone."""
        import grpc

        from fgpu.k8s.dra.proto import pluginregistration_pb2 as pb
        from fgpu.k8s.dra.proto import pluginregistration_pb2_grpc as rpc

        present = {str(p): p for p in sorted(self.registry_dir.glob("*.sock"))}
        for name, plugin in list(self.plugins.items()):
            path = Path(plugin.registry_socket)
            if str(path) not in present or path.stat().st_ino != plugin.inode:
                del self.plugins[name]
        known = {p.registry_socket for p in self.plugins.values()}
        for text, path in present.items():
            if text in known:
                continue
            with grpc.insecure_channel(f"unix://{path}") as channel:
                stub = rpc.RegistrationStub(channel)
                try:
                    info = stub.GetInfo(pb.InfoRequest(), timeout=10)
                except grpc.RpcError as exc:
                    self.refused[text] = f"GetInfo failed: {exc}"
                    continue
                why = ""
                if info.type != "DRAPlugin":
                    why = f"plugin type {info.type!r} is not DRAPlugin"
                elif _DRA_VERSION not in info.supported_versions:
                    why = f"none of {list(info.supported_versions)} is {_DRA_VERSION}"
                stub.NotifyRegistrationStatus(
                    pb.RegistrationStatus(plugin_registered=not why, error=why), timeout=10
                )
            if why:
                self.refused[text] = why
                continue
            self.refused.pop(text, None)
            self.plugins[info.name] = _Plugin(info.name, info.endpoint, text, path.stat().st_ino)

    # ------------------------------------------------------------------- pods
    def _claims_of(self, pod: Obj) -> tuple[list[Obj], str]:
        """The pod's claims, or why they are not ready."""
        ns = pod["metadata"].get("namespace", "default")
        uid = pod["metadata"]["uid"]
        statuses = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        out: list[Obj] = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            name = entry.get("resourceClaimName") or statuses.get(entry.get("name"))
            if not name:
                return [], f"claim {entry.get('name')!r} not created yet"
            try:
                claim = self.resources.get_claim(ns, name)
            except KubeError as exc:
                return [], f"claim {name}: {exc.reason}"
            status = claim.get("status") or {}
            if not status.get("allocation"):
                return [], f"claim {name} is not allocated"
            if not any(r.get("uid") == uid for r in status.get("reservedFor") or []):
                return [], f"claim {name} is not reserved for the pod"
            out.append(claim)
        return out, ""

    def _call(self, driver: str, method: str, refs: list[Obj]) -> dict[str, Any]:
        import grpc

        from fgpu.k8s.dra.proto import dra_v1_pb2 as pb
        from fgpu.k8s.dra.proto import dra_v1_pb2_grpc as rpc

        plugin = self.plugins.get(driver)
        if plugin is None:
            raise LookupError(f"DRA driver {driver} is not registered")
        claims = [pb.Claim(namespace=r["namespace"], uid=r["uid"], name=r["name"]) for r in refs]
        with grpc.insecure_channel(f"unix://{plugin.endpoint}") as channel:
            stub = rpc.DRAPluginStub(channel)
            if method == "prepare":
                self.prepare_calls += 1
                reply = stub.NodePrepareResources(
                    pb.NodePrepareResourcesRequest(claims=claims), timeout=30
                )
            else:
                reply = stub.NodeUnprepareResources(
                    pb.NodeUnprepareResourcesRequest(claims=claims), timeout=30
                )
        return dict(reply.claims)

    def _start(self, key: str, pod: Obj, claims: list[Obj]) -> str:
        """Prepare and start; returns why not, or ''."""
        by_driver: dict[str, list[Obj]] = {}
        for claim in claims:
            meta = claim["metadata"]
            ref = {"namespace": meta["namespace"], "uid": meta["uid"], "name": meta["name"]}
            results = (claim["status"]["allocation"].get("devices") or {}).get("results") or []
            for driver in sorted({r["driver"] for r in results}):
                by_driver.setdefault(driver, []).append(ref)
        import grpc

        cdi_ids: list[str] = []
        prepared: list[tuple[str, Obj]] = []
        for driver, refs in sorted(by_driver.items()):
            try:
                answers = self._call(driver, "prepare", refs)
            except (LookupError, grpc.RpcError) as exc:  # not registered, or the call failed
                return f"preparing claims with {driver} failed: {exc}"
            for ref in refs:
                answer = answers.get(ref["uid"])
                if answer is None:
                    return f"{driver} did not answer for claim {ref['name']}"
                if answer.error:
                    return f"{driver} could not prepare claim {ref['name']}: {answer.error}"
                for d in answer.devices:
                    cdi_ids.extend(i for i in d.cdi_device_ids if i not in cdi_ids)
                prepared.append((driver, ref))
        self._prepared[key] = _Prepared(pod["metadata"]["uid"], prepared)
        edits: list[Obj] = []
        for qualified in cdi_ids:
            try:
                found = cdi.find_device(self.cdi_dirs, qualified)
            except LookupError as exc:
                return str(exc)
            edits.append(found["spec"].get("containerEdits") or {})
            edits.append(found["device"].get("containerEdits") or {})
        made: dict[str, Container] = {}
        for c in (pod.get("spec") or {}).get("containers") or []:
            box = Container(env=dict(self.image_env), cdi_devices=list(cdi_ids))
            for e in c.get("env") or []:
                box.env[e["name"]] = str(e.get("value", ""))
            for edit in edits:
                for text in edit.get("env") or []:
                    k, _, v = text.partition("=")
                    box.env[k] = v
                box.device_nodes += [d["path"] for d in edit.get("deviceNodes") or []]
                box.mounts += list(edit.get("mounts") or [])
            made[c["name"]] = box
        self.containers[key] = made
        meta = pod["metadata"]
        self.api.patch_pod_status(
            meta.get("namespace", "default"),
            meta["name"],
            {
                "status": {
                    "phase": "Running",
                    "conditions": [
                        *[
                            c
                            for c in (pod.get("status") or {}).get("conditions") or []
                            if c.get("type") != "Ready"
                        ],
                        {"type": "Ready", "status": "True"},
                    ],
                }
            },
        )
        return ""

    def sync(self) -> None:
        """One pass: register plugins, start the bound pods that can start, unprepare the
        claims of pods that are gone or finished.

        Raises:
            KubeError: listing pods failed.
        """
        self.discover()
        pods = {
            wire.pod_key(p): p
            for p in self.api.list_pods(field_selector=f"spec.nodeName={self.node}").items
        }
        for key in list(self._prepared):
            pod = pods.get(key)
            done = pod is None or pod["metadata"]["uid"] != self._prepared[key].uid
            if not done and pod is not None:
                done = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if done:
                self._unprepare(key)
        for key, pod in sorted(pods.items()):
            if pod["metadata"].get("deletionTimestamp"):
                self._finish(key, pod)
                continue
            if key in self.containers:
                continue
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            claims, why = self._claims_of(pod)
            if not why:
                why = self._start(key, pod, claims)
            if why:
                self.waiting[key] = why
            else:
                self.waiting.pop(key, None)

    def _finish(self, key: str, pod: Obj) -> None:
        """A deleted pod (``Terminating``): its containers stop, its claims are unprepared,
        then it is deleted for good (``gracePeriodSeconds=0``, only that pod: its uid),
        as the kubelet does once a pod's containers ended."""
        if key in self._prepared:
            self._unprepare(key)
            if key in self._prepared:  # the driver failed: again next pass
                return
        self.containers.pop(key, None)
        self.waiting.pop(key, None)
        namespace, name = pod["metadata"].get("namespace", ""), pod["metadata"]["name"]
        try:
            self.api._call(
                self.api.core.delete_namespaced_pod,
                name,
                namespace,
                grace_period_seconds=0,
                body={"preconditions": {"uid": pod["metadata"]["uid"]}},
            )
        except KubeError as exc:
            if exc.status not in (404, 409):  # gone already, or another pod by that name
                raise

    def _unprepare(self, key: str) -> None:
        prepared = self._prepared.pop(key)
        self.containers.pop(key, None)
        by_driver: dict[str, list[Obj]] = {}
        for driver, ref in prepared.claims:
            by_driver.setdefault(driver, []).append(ref)
        for driver, refs in by_driver.items():
            try:
                answers = self._call(driver, "unprepare", refs)
            except Exception as exc:  # keep it to try again next pass, as the kubelet does
                log.warning("unpreparing %s with %s failed: %s", key, driver, exc)
                self._prepared[key] = prepared
                return
            for ref in refs:
                answer = answers.get(ref["uid"])
                if answer is not None and answer.error:
                    log.warning("unpreparing claim %s: %s", ref["name"], answer.error)


__all__ = ["Container", "KubeletStandIn"]
