"""The Kubernetes API as fgpu's components use it, through the official client.

:class:`KubeApi` wraps the calls of ``kubernetes.client`` that the scheduler, the webhook's
helpers and the node agent make, and gives plain JSON objects (``dict``) back: the
components read a few fields of many objects, and the client's typed models would cost
more than the decisions (the list and watch calls ask for the raw response). Every
refusal by the API server becomes a :class:`KubeError` with its HTTP status and reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

QUEUE_GROUP = "fgpu.io"
QUEUE_VERSION = "v1alpha1"
QUEUE_PLURAL = "queues"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class KubeError(Exception):
    """The API server refused a call (or could not be reached: status 0).

    Attributes:
        status: HTTP status (409 conflict, 404 not found, 429 too many requests...).
        reason: the Status object's reason (``Conflict``, ``AlreadyExists``...).
        message: the Status object's message.
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}: {message}")


def _error(exc: Exception) -> KubeError:
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None)
    reason = str(getattr(exc, "reason", "") or type(exc).__name__)
    message = str(exc)
    if body:
        try:
            data = json.loads(body)
            reason = data.get("reason") or reason
            message = data.get("message") or message
        except (ValueError, TypeError):
            message = str(body)
    return KubeError(status, reason, message)


@dataclass(frozen=True, slots=True)
class Listed:
    """A list answer: the items and the collection's ``resourceVersion`` to watch from."""

    items: list[Obj]
    resource_version: str


def api_client(
    kubeconfig: str | None = None, host: str | None = None, pool_size: int | None = None
) -> Any:
    """An official ``ApiClient``.

    Args:
        kubeconfig: a kubeconfig file (None: ``$KUBECONFIG`` or ``~/.kube/config``, else
            the in-cluster service account).
        host: an API server URL without credentials (the test stand-in); wins over the rest.
        pool_size: connections kept open to the API server (urllib3's pool ``maxsize``);
            None: the client's default, 5 per CPU. Size it to the threads that call at
            once (every open watch holds one): past it, urllib3 opens a connection per
            call and discards it afterwards ("Connection pool is full, discarding
            connection"), a new TCP and TLS handshake each time.

    Raises:
        KubeError: no configuration could be loaded (status 0).
        ValueError: ``pool_size`` below 1.
    """
    from kubernetes import client, config

    if pool_size is not None and pool_size < 1:
        raise ValueError(f"pool_size: {pool_size} is not a positive number of connections")
    if host is not None:
        configuration = client.Configuration()
        configuration.host = host
        if pool_size is not None:
            configuration.connection_pool_maxsize = pool_size
        return client.ApiClient(configuration)
    try:
        if kubeconfig is not None:
            config.load_kube_config(config_file=kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
    except Exception as exc:  # the client raises several kinds
        raise KubeError(
            0, "NoConfiguration", f"cannot configure the Kubernetes client: {exc}"
        ) from None
    configuration = client.Configuration.get_default_copy()
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def pool_size(api: KubeApi) -> int:
    """The connections ``api``'s client keeps open to the API server (urllib3 ``maxsize``)."""
    return int(api.client.rest_client.pool_manager.connection_pool_kw.get("maxsize") or 1)


class KubeApi:
    """The calls fgpu makes, as plain JSON.

    Args:
        client: an official ``kubernetes.client.ApiClient`` (see :func:`api_client`).
        timeout_s: per-request timeout in seconds (watches use their own).
    """

    def __init__(self, client: Any, timeout_s: float = 30.0) -> None:
        from kubernetes import client as k8s

        self.client = client
        self.core = k8s.CoreV1Api(client)
        self.coordination = k8s.CoordinationV1Api(client)
        self.policy = k8s.PolicyV1Api(client)
        self.custom = k8s.CustomObjectsApi(client)
        self.timeout_s = timeout_s

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        kwargs.setdefault("_request_timeout", self.timeout_s)
        try:
            response = method(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise _error(exc) from None
        except (OSError, HTTPError) as exc:  # urllib3 wraps a refused connection in its own
            raise KubeError(0, "Unreachable", str(exc)) from None
        data = response.data
        return json.loads(data) if data else None

    # --------------------------------------------------------------- listing
    def list_nodes(
        self,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
    ) -> Listed:
        """Nodes (optionally by label or field selector).

        ``resource_version="0"`` lets the API server answer from its watch cache instead of
        a quorum read from etcd (what informers ask for their first list); None: the most
        recent data, read through etcd.
        """
        out = self._call(
            self.core.list_node,
            label_selector=label_selector,
            field_selector=field_selector,
            resource_version=resource_version,
        )
        return Listed(out["items"], out["metadata"]["resourceVersion"])

    def list_pods(
        self,
        field_selector: str | None = None,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> Listed:
        """Pods in every namespace (or one), optionally by field selector
        (``resource_version`` as for :meth:`list_nodes`)."""
        if namespace is None:
            out = self._call(
                self.core.list_pod_for_all_namespaces,
                field_selector=field_selector,
                resource_version=resource_version,
            )
        else:
            out = self._call(
                self.core.list_namespaced_pod,
                namespace,
                field_selector=field_selector,
                resource_version=resource_version,
            )
        return Listed(out["items"], out["metadata"]["resourceVersion"])

    def list_queues(self) -> Listed:
        """``Queue`` objects (``fgpu.io/v1alpha1``, cluster-scoped)."""
        out = self._call(
            self.custom.list_cluster_custom_object, QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL
        )
        return Listed(out["items"], out["metadata"]["resourceVersion"])

    def watch(
        self,
        resource: str,
        resource_version: str,
        timeout_s: int = 300,
        field_selector: str | None = None,
    ) -> Iterator[tuple[str, Obj]]:
        """``(type, object)`` changes of ``nodes``, ``pods``, ``queues`` or
        ``resourceclaims`` after a version (only those matching ``field_selector`` when
        given: an object leaving the selection comes as DELETED);
        type is ADDED, MODIFIED, DELETED or BOOKMARK (only a newer version to resume from).

        Ends when the server closes the watch (``timeout_s``, or a restart).

        Raises:
            KubeError: 410 when the version is too old (list again), others as they come.
        """
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        args: tuple[Any, ...]
        if resource == "nodes":
            func: Any = self.core.list_node
            args = ()
        elif resource == "pods":
            func = self.core.list_pod_for_all_namespaces
            args = ()
        elif resource == "queues":
            func = self.custom.list_cluster_custom_object
            args = (QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL)
        elif resource == "resourceclaims":
            from kubernetes import client as k8s

            func = k8s.ResourceV1Api(self.client).list_resource_claim_for_all_namespaces
            args = ()
        else:
            raise ValueError(f"resource: cannot watch {resource!r}")
        # The client's Watch helper fails on ERROR events when it does not deserialize
        # (it looks for a key only its deserializing path sets), so the stream is read here.
        extra: dict[str, Any] = {}
        if field_selector is not None:
            extra["field_selector"] = field_selector
        try:
            response = func(
                *args,
                **extra,
                watch=True,
                resource_version=resource_version,
                timeout_seconds=timeout_s,
                allow_watch_bookmarks=True,
                _preload_content=False,
                _request_timeout=(10, timeout_s + 30),
            )
        except ApiException as exc:
            raise _error(exc) from None
        try:
            for line in iter_resp_lines(response):
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event["type"]
                obj = event["object"]
                if kind == "ERROR":
                    code = int(obj.get("code") or 500)
                    raise KubeError(code, obj.get("reason", ""), obj.get("message", ""))
                yield kind, obj
        finally:
            response.close()
            response.release_conn()

    # ----------------------------------------------------------------- pods
    def get_pod(self, namespace: str, name: str) -> Obj:
        """One pod. Raises KubeError (404 when gone)."""
        result: Obj = self._call(self.core.read_namespaced_pod, name, namespace)
        return result

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        """Bind a pod to a node through the Binding subresource; the annotations are written
        with the node name in the same write (the API server copies them onto the pod).

        The pod's ``uid`` is a precondition: a pod deleted and created again under the same
        name is not bound by mistake.

        Raises:
            KubeError: 409 when the pod is bound already or is another pod, 404 when gone.
        """
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "annotations": dict(annotations),
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self._call(self.core.create_namespaced_pod_binding, name, namespace, body)

    def patch_pod(self, namespace: str, name: str, patch: Obj) -> None:
        """Merge patch of a pod's metadata (annotations; ``None`` values remove)."""
        self._call(
            self.core.patch_namespaced_pod, name, namespace, patch, _content_type=MERGE_PATCH
        )

    def patch_pod_status(self, namespace: str, name: str, patch: Obj) -> None:
        """Strategic merge patch of a pod's status (conditions merge by type)."""
        self._call(
            self.core.patch_namespaced_pod_status,
            name,
            namespace,
            patch,
            _content_type=STRATEGIC_PATCH,
        )

    def evict(self, namespace: str, name: str, uid: str) -> None:
        """Ask for a pod's eviction (PodDisruptionBudgets apply).

        Raises:
            KubeError: 429 when a disruption budget forbids it now, 404 when gone.
        """
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        self._call(self.core.create_namespaced_pod_eviction, name, namespace, body)

    def delete_pod(self, namespace: str, name: str, grace_s: int | None = None) -> None:
        """Delete a pod (404 ignored)."""
        try:
            self._call(
                self.core.delete_namespaced_pod, name, namespace, grace_period_seconds=grace_s
            )
        except KubeError as exc:
            if exc.status != 404:
                raise

    # ------------------------------------------------------------ config maps
    def create_config_map(self, namespace: str, body: Obj) -> Obj:
        """Create a ConfigMap. Raises KubeError (409 AlreadyExists)."""
        result: Obj = self._call(self.core.create_namespaced_config_map, namespace, body)
        return result

    def get_config_map(self, namespace: str, name: str) -> Obj:
        """One ConfigMap. Raises KubeError (404)."""
        result: Obj = self._call(self.core.read_namespaced_config_map, name, namespace)
        return result

    def delete_config_map(self, namespace: str, name: str) -> None:
        """Delete a ConfigMap (404 ignored)."""
        try:
            self._call(self.core.delete_namespaced_config_map, name, namespace)
        except KubeError as exc:
            if exc.status != 404:
                raise

    # ----------------------------------------------------------------- events
    def create_event(self, namespace: str, body: Obj) -> None:
        """Record a core/v1 Event."""
        self._call(self.core.create_namespaced_event, namespace, body)

    def patch_event(self, namespace: str, name: str, patch: Obj) -> None:
        """Merge-patch an Event (a series' ``count`` and ``lastTimestamp``)."""
        self._call(
            self.core.patch_namespaced_event, name, namespace, patch, _content_type=MERGE_PATCH
        )

    # ------------------------------------------------------------------ nodes
    def get_node(self, name: str) -> Obj:
        """One node. Raises KubeError (404)."""
        result: Obj = self._call(self.core.read_node, name)
        return result

    def patch_node(self, name: str, patch: Obj) -> Obj:
        """Merge patch of a node's metadata (labels, annotations)."""
        result: Obj = self._call(self.core.patch_node, name, patch, _content_type=MERGE_PATCH)
        return result

    # ---------------------------------------------------------------- volumes
    def get_volume_claim(self, namespace: str, name: str) -> Obj:
        """One PersistentVolumeClaim. Raises KubeError (404)."""
        result: Obj = self._call(self.core.read_namespaced_persistent_volume_claim, name, namespace)
        return result

    def get_volume(self, name: str) -> Obj:
        """One PersistentVolume. Raises KubeError (404)."""
        result: Obj = self._call(self.core.read_persistent_volume, name)
        return result

    # ----------------------------------------------------------------- leases
    def get_lease(self, namespace: str, name: str) -> Obj | None:
        """The Lease, or None when there is none."""
        try:
            result: Obj = self._call(self.coordination.read_namespaced_lease, name, namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    def create_lease(self, namespace: str, body: Obj) -> Obj:
        """Create a Lease. Raises KubeError (409 when another replica made it first)."""
        result: Obj = self._call(self.coordination.create_namespaced_lease, namespace, body)
        return result

    def replace_lease(self, namespace: str, name: str, body: Obj) -> Obj:
        """Replace a Lease; ``body.metadata.resourceVersion`` must be current.

        Raises:
            KubeError: 409 when another replica wrote it since it was read.
        """
        result: Obj = self._call(self.coordination.replace_namespaced_lease, name, namespace, body)
        return result

    # ---------------------------------------------------------------- queues
    def create_queue(self, body: Obj) -> Obj:
        """Create a ``Queue`` object."""
        result: Obj = self._call(
            self.custom.create_cluster_custom_object,
            QUEUE_GROUP,
            QUEUE_VERSION,
            QUEUE_PLURAL,
            body,
        )
        return result
