"""!!! TEST STAND-IN FOR THE KUBERNETES API SERVER — NOT FOR PRODUCTION, NOT A CLUSTER !!!

fgpu's Kubernetes components (scheduler, admission webhook, node agent) are tested against
the Kubernetes API over HTTP through the official Python client. No cluster is available
where the tests run, so this package serves the *subset* of the API those components use,
with the semantics they rely on:

- objects with ``uid``, ``resourceVersion`` (one counter, as etcd's revision) and
  ``creationTimestamp``; ``409 Conflict`` on a stale ``resourceVersion`` or a failed
  ``uid`` precondition, ``409 AlreadyExists`` on a taken name, ``generateName``;
- list and watch with label and field selectors; watch from a version, ``410 Gone`` once
  the bounded history (:attr:`Options.history` changes) no longer reaches it; objects
  moving in or out of a selector appear as ``ADDED``/``DELETED``; ``BOOKMARK`` events for
  watches that allow them (:attr:`Options.bookmark_s`);
- JSON patch, merge patch, strategic merge patch (for the lists fgpu patches);
- status subresources (status only through ``/status``, never through the object);
- ``pods/binding`` (node name and annotations written together; refused if already bound
  or the uid precondition fails), ``pods/eviction`` with PodDisruptionBudgets
  (``minAvailable``/``maxUnavailable``, integer or percent; pending pods ignore budgets);
- Leases, Events, PersistentVolumes and PersistentVolumeClaims (stored only: no volume
  binder or provisioner), ConfigMaps, ServiceAccounts, RuntimeClasses,
  PriorityClasses (a pod's ``priorityClassName`` sets ``spec.priority``), Namespaces, and
  the ``Queue`` custom resource (``fgpu.io/v1alpha1``, cluster-scoped; written whole only
  with its ``apiVersion`` and ``kind``, else 400 as for any custom resource);
- quantities stored in canonical form (``81920Mi`` comes back ``80Gi``;
  :mod:`~fgpu_standin.quantity`);
- the built-in admission plugins ServiceAccount (``default`` assigned, a missing account
  refused) and RuntimeClass (a missing class refused, its overhead and scheduling applied)
  (:mod:`~fgpu_standin.builtin`);
- controllers, a moment after the request (``Options.controller_delay_s``,
  :mod:`~fgpu_standin.controllers`): garbage collection by ``ownerReferences`` (a deleted
  Node's ResourceSlices too), the resource claim controller, and with ``Options.kubelet``
  a deleted running pod ``Terminating`` until that kubelet finishes it;
- ``resource.k8s.io/v1`` (Dynamic Resource Allocation, Kubernetes 1.34): DeviceClass,
  ResourceSlice, ResourceClaim (with ``/status``) and ResourceClaimTemplate with the API
  server's validation (1.36's where versions differ), and the resource claim controller's
  part (a claim per pod from its template; reservations and allocations dropped when pods
  go)
  (:mod:`~fgpu_standin.resource`, :mod:`~fgpu_standin.claims`);
- dynamic admission as configured (:attr:`Options.admission`,
  :mod:`~fgpu_standin.admission`): mutating then validating webhooks (AdmissionReview
  v1 over HTTP or HTTPS, JSON patch responses) by their rules, namespace and object
  selectors, ``matchConditions`` and failure policy, and ValidatingAdmissionPolicies with
  their bindings, on every create and update; denials worded as the API server words them;
  the requester named by ``Impersonate-User`` (with ``Impersonate-Group`` and
  ``Impersonate-Extra-*``), trusted unchecked, else ``system:anonymous``;
- scheduling gates: a pod created with ``spec.schedulingGates`` gets ``PodScheduled=False``
  ``SchedulingGated``, gates may only be removed, and its Binding is refused (409);
- enough for ``kubectl``: discovery (``/api``, ``/apis``, resource lists, ``/version``),
  ``Table`` answers for ``kubectl get``, event field selectors for ``kubectl describe``,
  and ``fieldValidation`` (unknown fields, from the official client's models) with the
  OpenAPI v3 documents that tell ``kubectl`` the server checks them
  (:mod:`~fgpu_standin.discovery`, :mod:`~fgpu_standin.tables`,
  :mod:`~fgpu_standin.fields`).

- on request, the authorization attributes of every request (verb, resource, subresource,
  namespace, name, requester), and RBAC evaluated from Role/ClusterRole objects and their
  bindings with Kubernetes 1.36's ``resourceclaims/binding`` check of claim status writes
  (:attr:`Options.record`, :attr:`Options.rbac`, :mod:`~fgpu_standin.rbac`); the
  ``DRAConsumableCapacity`` gate off as on 1.34 and 1.35 (:mod:`~fgpu_standin.gates`).

Everything else — authentication, RBAC unless asked for, most validation, schema checks of
custom resources, a kubelet (unless :attr:`Options.kubelet` asks it to pretend), the other
controllers (no node lifecycle, no pod garbage collector, no service account tokens) — is
absent. Run the same tests against a real cluster by setting ``KUBECONFIG``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn

from fgpu_standin.app import Options, StandInApi, create_app

__all__ = ["Options", "StandIn", "StandInApi"]


class StandIn:
    """The stand-in served by uvicorn on a loopback port, in a background thread.

    Args:
        options: behaviour (see :class:`Options`).
        port: TCP port on 127.0.0.1 (0: a free one).

    Use as a context manager, or :meth:`start` and :meth:`stop`.
    """

    def __init__(self, options: Options | None = None, port: int = 0) -> None:
        self.api = StandInApi(options)
        if port == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            create_app(self.api),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> StandIn:
        """Serve; returns when the port accepts connections.

        Raises:
            RuntimeError: the server did not come up within 20 seconds.
        """

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._server.serve())

        self._thread = threading.Thread(target=run, name="k8s-standin", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the Kubernetes API stand-in did not start")
            time.sleep(0.01)
        return self

    def close_watches(self) -> None:
        """End every open watch, as an API server restart does."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.api.close_watches)

    def stop(self) -> None:
        """Stop serving."""
        self._server.should_exit = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.api.close_watches)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
