"""The ``resource.k8s.io/v1`` calls fgpu makes (Dynamic Resource Allocation), as plain JSON.

A thin layer over :class:`fgpu.k8s.kube.KubeApi` (same client, same errors: every call
raises :class:`~fgpu.k8s.kube.KubeError` with the API server's status and reason), through
the official client's ``ResourceV1Api`` (Kubernetes 1.34, where DRA is generally available).
"""

from __future__ import annotations

from typing import Any

from fgpu.k8s.kube import KubeApi, Listed

Obj = dict[str, Any]

GROUP = "resource.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"


class ResourceApi:
    """DeviceClasses, ResourceSlices, ResourceClaims and ResourceClaimTemplates.

    Args:
        api: the connection (its client and timeout are used).
    """

    def __init__(self, api: KubeApi) -> None:
        from kubernetes import client as k8s

        self.api = api
        self.resource = k8s.ResourceV1Api(api.client)

    # --------------------------------------------------------------- classes
    def create_device_class(self, body: Obj) -> Obj:
        """Create a DeviceClass."""
        out: Obj = self.api._call(self.resource.create_device_class, body)
        return out

    def get_device_class(self, name: str) -> Obj:
        """One DeviceClass."""
        out: Obj = self.api._call(self.resource.read_device_class, name)
        return out

    # ---------------------------------------------------------------- slices
    def list_slices(self, field_selector: str | None = None) -> Listed:
        """ResourceSlices (``spec.nodeName=N,spec.driver=D`` selects)."""
        kwargs = {"field_selector": field_selector} if field_selector else {}
        data = self.api._call(self.resource.list_resource_slice, **kwargs)
        return Listed(data["items"], data["metadata"].get("resourceVersion", ""))

    def create_slice(self, body: Obj) -> Obj:
        """Create a ResourceSlice."""
        out: Obj = self.api._call(self.resource.create_resource_slice, body)
        return out

    def replace_slice(self, name: str, body: Obj) -> Obj:
        """Replace a ResourceSlice (``metadata.resourceVersion`` checked when given)."""
        out: Obj = self.api._call(self.resource.replace_resource_slice, name, body)
        return out

    def delete_slice(self, name: str) -> None:
        """Delete a ResourceSlice."""
        self.api._call(self.resource.delete_resource_slice, name)

    # ---------------------------------------------------------------- claims
    def get_claim(self, namespace: str, name: str) -> Obj:
        """One ResourceClaim."""
        out: Obj = self.api._call(self.resource.read_namespaced_resource_claim, name, namespace)
        return out

    def list_claims(self, namespace: str | None = None) -> Listed:
        """ResourceClaims in a namespace, or in all."""
        if namespace is None:
            data = self.api._call(self.resource.list_resource_claim_for_all_namespaces)
        else:
            data = self.api._call(self.resource.list_namespaced_resource_claim, namespace)
        return Listed(data["items"], data["metadata"].get("resourceVersion", ""))

    def create_claim(self, namespace: str, body: Obj) -> Obj:
        """Create a ResourceClaim."""
        out: Obj = self.api._call(self.resource.create_namespaced_resource_claim, namespace, body)
        return out

    def replace_claim(self, namespace: str, name: str, body: Obj) -> Obj:
        """Replace a claim's object (its finalizers; the spec cannot change); the body's
        ``metadata.resourceVersion`` is a precondition (409 Conflict when stale)."""
        out: Obj = self.api._call(
            self.resource.replace_namespaced_resource_claim, name, namespace, body
        )
        return out

    def replace_claim_status(self, namespace: str, name: str, body: Obj) -> Obj:
        """Write a claim's status (allocation, ``reservedFor``); the body's
        ``metadata.resourceVersion`` is a precondition (409 Conflict when stale)."""
        out: Obj = self.api._call(
            self.resource.replace_namespaced_resource_claim_status, name, namespace, body
        )
        return out

    def delete_claim(self, namespace: str, name: str) -> None:
        """Delete a ResourceClaim."""
        self.api._call(self.resource.delete_namespaced_resource_claim, name, namespace)

    def create_claim_template(self, namespace: str, body: Obj) -> Obj:
        """Create a ResourceClaimTemplate."""
        out: Obj = self.api._call(
            self.resource.create_namespaced_resource_claim_template, namespace, body
        )
        return out

    def get_claim_template(self, namespace: str, name: str) -> Obj:
        """One ResourceClaimTemplate."""
        out: Obj = self.api._call(
            self.resource.read_namespaced_resource_claim_template, name, namespace
        )
        return out


__all__ = ["API_VERSION", "GROUP", "VERSION", "ResourceApi"]
