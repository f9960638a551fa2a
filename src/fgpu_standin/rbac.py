"""Request recording and RBAC authorization for the API server stand-in.

TEST STAND-IN, NOT A KUBERNETES API SERVER. See :mod:`fgpu_standin`.

Every resource request has authorization attributes as the API server computes them
(Kubernetes documentation, "Authorization": verb from the HTTP method — ``get``, ``list``,
``watch``, ``create``, ``update``, ``patch``, ``delete``, ``deletecollection`` — the API
group, the resource and subresource, the namespace and the object's name) and a requester
(:func:`fgpu_standin.app.user_info`). With :attr:`fgpu_standin.app.Options.record` the
stand-in keeps them (:attr:`fgpu_standin.app.StandInApi.requests`), so a test can derive
what each component calls; with :attr:`fgpu_standin.app.Options.rbac` it evaluates them
against Roles, ClusterRoles, RoleBindings and ClusterRoleBindings given as objects (the
manifests' own) and refuses what they do not grant with ``403 Forbidden``, worded as the
RBAC authorizer words it.

Kubernetes 1.36's granular status authorization (feature gate
``DRAResourceClaimGranularStatusAuthorization``, beta and on by default in 1.36): a write of
a ResourceClaim's status that changes ``status.allocation`` or ``status.reservedFor`` also
needs the request's verb on the synthetic subresource ``resourceclaims/binding``, checked
cluster-wide (no namespace, no name: only a ClusterRoleBinding grants it); without it the
API server's validation refuses the write with ``422 Invalid`` on field ``status``
(kubernetes/kubernetes PR 134947, ``AuthorizedForBinding``). Changing ``status.devices``
needs ``resourceclaims/driver`` with node-aware verbs; fgpu never writes ``status.devices``,
so the stand-in does not check that.

Requests in group ``system:masters``, and requests without ``Impersonate-User`` (the tests'
own client, which plays the cluster's administrator), are allowed without evaluation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from fgpu_standin.store import ApiStatusError

Obj = dict[str, Any]

ADMIN_GROUP = "system:masters"


@dataclass(frozen=True, slots=True)
class Attributes:
    """One request's authorization attributes.

    Attributes:
        user: the requester's user name (``system:serviceaccount:NS:NAME`` for a service
            account; ``""`` for the tests' own unimpersonated client).
        groups: its groups.
        verb: ``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``
            or ``deletecollection``.
        group: the API group (``""``: core).
        resource: the resource type (plural).
        subresource: ``status``, ``binding``, ``eviction``... or ``""``.
        namespace: the namespace (``""``: cluster scope).
        name: the object's name (``""`` for collections and creates).
        synthetic: a check the server makes beyond the request itself (the 1.36
            ``resourceclaims/binding`` check), not a request of its own.
    """

    user: str
    groups: tuple[str, ...]
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    synthetic: bool = False

    @property
    def full_resource(self) -> str:
        """``resource/subresource`` or ``resource``."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    @property
    def permission(self) -> tuple[str, str, str]:
        """``(group, resource[/subresource], verb)``: what an RBAC rule must name."""
        return (self.group, self.full_resource, self.verb)


def request_attributes(
    method: str,
    group: str,
    resource: str,
    subresource: str | None,
    namespace: str | None,
    name: str | None,
    query: dict[str, str],
    user: dict[str, Any] | None,
) -> Attributes:
    """The attributes of one resource request, as the API server's request-info resolver
    derives them (``user`` None: the tests' own unimpersonated client)."""
    watch = query.get("watch") in ("true", "1")
    if method == "GET":
        verb = "get" if name else ("watch" if watch else "list")
    elif method == "POST":
        verb = "create"
    elif method == "PUT":
        verb = "update"
    elif method == "PATCH":
        verb = "patch"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = method.lower()
    return Attributes(
        user=(user or {}).get("username", ""),
        groups=tuple((user or {}).get("groups") or ()),
        verb=verb,
        group=group,
        resource=resource,
        subresource=subresource or "",
        namespace=namespace or "",
        name=name or "",
    )


def forbidden_message(a: Attributes) -> str:
    """The RBAC authorizer's refusal, as the API server words it
    (``pods "p" is forbidden: User "u" cannot get resource "pods" in API group "" in the
    namespace "default"``)."""
    target = f"{a.resource}.{a.group}" if a.group else a.resource
    where = f' in the namespace "{a.namespace}"' if a.namespace else " at the cluster scope"
    why = (
        f'User "{a.user}" cannot {a.verb} resource "{a.full_resource}" in API group '
        f'"{a.group}"{where}'
    )
    return f'{target} "{a.name}" is forbidden: {why}' if a.name else f"{target} is forbidden: {why}"


@dataclass(frozen=True, slots=True)
class _Rule:
    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    names: frozenset[str]

    def allows(self, a: Attributes) -> bool:
        if "*" not in self.groups and a.group not in self.groups:
            return False
        if "*" not in self.resources and a.full_resource not in self.resources:
            return False
        if "*" not in self.verbs and a.verb not in self.verbs:
            return False
        return not self.names or (bool(a.name) and a.name in self.names)


def _rules(role: Obj) -> list[_Rule]:
    return [
        _Rule(
            frozenset(r.get("apiGroups") or ()),
            frozenset(r.get("resources") or ()),
            frozenset(r.get("verbs") or ()),
            frozenset(r.get("resourceNames") or ()),
        )
        for r in role.get("rules") or []
    ]


def _subject_matches(subject: Obj, binding_ns: str, user: str, groups: Iterable[str]) -> bool:
    kind = subject.get("kind")
    name = subject.get("name")
    if kind == "User":
        return bool(user) and name == user
    if kind == "Group":
        return name in set(groups)
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return user == f"system:serviceaccount:{ns}:{name}"
    return False


class Rbac:
    """RBAC evaluation over role and binding objects (the manifests' ``Role``,
    ``ClusterRole``, ``RoleBinding`` and ``ClusterRoleBinding``; other kinds ignored).

    Args:
        objects: the objects (namespaced ones carry ``metadata.namespace``).
        granular_claim_status: Kubernetes 1.36's ``resourceclaims/binding`` check
            (module docstring); False: as 1.34 and 1.35, or 1.36 with the gate off.
    """

    def __init__(self, objects: Iterable[Obj], granular_claim_status: bool = True) -> None:
        self.granular_claim_status = granular_claim_status
        self.cluster_roles: dict[str, list[_Rule]] = {}
        self.roles: dict[tuple[str, str], list[_Rule]] = {}
        self.bindings: list[tuple[str, Obj]] = []  # (namespace or "" for cluster-wide, binding)
        for obj in objects:
            kind = obj.get("kind")
            meta = obj.get("metadata") or {}
            if kind == "ClusterRole":
                self.cluster_roles[meta["name"]] = _rules(obj)
            elif kind == "Role":
                self.roles[(meta.get("namespace") or "", meta["name"])] = _rules(obj)
            elif kind == "ClusterRoleBinding":
                self.bindings.append(("", obj))
            elif kind == "RoleBinding":
                self.bindings.append((meta.get("namespace") or "", obj))

    def _granted(self, a: Attributes) -> Iterable[_Rule]:
        for ns, binding in self.bindings:
            if ns and ns != a.namespace:
                continue
            subjects = binding.get("subjects") or []
            if not any(_subject_matches(s, ns, a.user, a.groups) for s in subjects):
                continue
            ref = binding.get("roleRef") or {}
            if ref.get("kind") == "ClusterRole":
                yield from self.cluster_roles.get(ref.get("name", ""), [])
            elif ns:
                yield from self.roles.get((ns, ref.get("name", "")), [])

    def allows(self, a: Attributes) -> bool:
        """Whether the bindings grant ``a`` (always for the administrator, see the module
        docstring)."""
        if not a.user or ADMIN_GROUP in a.groups:
            return True
        return any(rule.allows(a) for rule in self._granted(a))

    def check(self, a: Attributes) -> None:
        """Refuse what is not granted.

        Raises:
            ApiStatusError: 403 Forbidden, worded as :func:`forbidden_message`.
        """
        if self.allows(a):
            return
        kind = {"group": a.group, "kind": a.resource}
        raise ApiStatusError(
            403, "Forbidden", forbidden_message(a), {"name": a.name, **kind} if a.name else kind
        )


class Recorder:
    """What the stand-in keeps of each request: a list of :class:`Attributes` (in order of
    arrival, synthetic checks included) with the :class:`Rbac` to apply, if any."""

    def __init__(self, rbac: Rbac | None, record: bool) -> None:
        self.rbac = rbac
        self.record = record
        self.requests: list[Attributes] = []

    def request(self, a: Attributes) -> None:
        """Record ``a`` and authorize it.

        Raises:
            ApiStatusError: 403 (see :meth:`Rbac.check`).
        """
        if self.record:
            self.requests.append(a)
        if self.rbac is not None:
            self.rbac.check(a)

    def claim_status(self, a: Attributes, old: Obj, new: Obj) -> None:
        """Kubernetes 1.36's check of a ResourceClaim status write (module docstring): the
        request's verb on ``resourceclaims/binding`` at the cluster scope when the write
        changes ``status.allocation`` or ``status.reservedFor``.

        Raises:
            ApiStatusError: 422 Invalid on field ``status``, as the API server's validation
                answers.
        """
        was, now = old.get("status") or {}, new.get("status") or {}
        if was.get("allocation") == now.get("allocation") and (
            was.get("reservedFor") == now.get("reservedFor")
        ):
            return
        if self.rbac is not None and not self.rbac.granular_claim_status:
            return
        check = replace(a, subresource="binding", namespace="", name="", synthetic=True)
        if self.record:
            self.requests.append(check)
        if self.rbac is None or self.rbac.allows(check):
            return
        detail = (
            f'changing status.allocation or status.reservedFor requires resource="resourceclaims/'
            f'binding", verb="{a.verb}" permission: {forbidden_message(check)}'
        )
        raise ApiStatusError(
            422,
            "Invalid",
            f'ResourceClaim.resource.k8s.io "{a.name}" is invalid: status: Forbidden: {detail}',
            {
                "name": a.name,
                "group": "resource.k8s.io",
                "kind": "ResourceClaim",
                "causes": [{"reason": "FieldValueForbidden", "message": detail, "field": "status"}],
            },
        )


__all__ = [
    "ADMIN_GROUP",
    "Attributes",
    "Rbac",
    "Recorder",
    "forbidden_message",
    "request_attributes",
]
