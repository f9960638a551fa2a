"""HTTP routes of the API server stand-in (FastAPI).

TEST STAND-IN, NOT A KUBERNETES API SERVER. See :mod:`fgpu_standin`.

Paths follow the API server's: ``/api/v1/...`` for the core group and
``/apis/GROUP/VERSION/...`` for the others; collections, objects, and the subresources
``pods/binding``, ``pods/eviction``, ``pods/status``, ``nodes/status``, ``queues/status``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import ssl
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fgpu_standin import admission, builtin, claims, discovery, fields, quantity, resource, tables
from fgpu_standin.controllers import Controllers
from fgpu_standin.gates import drop_disabled
from fgpu_standin.patch import PatchError, json_patch, merge_patch
from fgpu_standin.rbac import Attributes, Rbac, Recorder, request_attributes
from fgpu_standin.selectors import (
    SelectorError,
    field_selector,
    label_selector,
    match_label_selector_object,
)
from fgpu_standin.store import KINDS, ApiStatusError, Kind, Obj, Store, WatchEvent, now_rfc3339

log = logging.getLogger("fgpu_standin")

_BY_PATH: dict[tuple[str, str, str], Kind] = {(k.group, k.version, k.plural): k for k in KINDS}
_TERMINAL = ("Succeeded", "Failed")


@dataclass
class Options:
    """How the stand-in behaves where a real cluster has other components.

    Attributes:
        kubelet: act as the kubelet of every node: a bound pod becomes ``Running`` and
            ``Ready`` at once, and a deleted running pod is ``Terminating`` (marked with
            ``deletionTimestamp``) until this kubelet finishes it, ``controller_delay_s``
            later. Off: bound pods stay ``Pending`` (no kubelet runs them).
        graceful_delete: without ``kubelet``, deleting a bound pod only marks it
            (``deletionTimestamp``) until a delete with ``gracePeriodSeconds=0`` (as the
            kubelet stand-in, :class:`~fgpu_standin.kubelet.KubeletStandIn`, sends once the
            pod's containers stopped); off: it goes at once.
        controller_delay_s: how long after a request the controllers' part of it happens
            (:mod:`~fgpu_standin.controllers`: a pod's claims made from their templates,
            reservations dropped, garbage collection, the kubelet finishing a pod).
        admission: the admission configurations (``MutatingWebhookConfiguration``,
            ``ValidatingWebhookConfiguration``, ``ValidatingAdmissionPolicy`` and its
            bindings, as objects), honoured as the API server does on every create and
            update (rules, namespace and object selectors, ``matchConditions``; see
            :mod:`~fgpu_standin.admission`). Webhooks are called at their
            ``clientConfig.url`` (:func:`~fgpu_standin.admission.point_services`
            turns a ``service`` into a URL).
        history: how many changes a watch can resume from (older: ``410 Gone``).
        bookmark_s: how often a watch that asked for bookmarks
            (``allowWatchBookmarks=true``) gets one while no event passes.
        webhook_ca: CA bundle file for ``https`` webhook URLs.
        latency_s: seconds every request waits before it is served (watches: before the
            stream starts), to test against the latencies of a real API server, whose
            writes go through etcd (a few to tens of milliseconds each) rather than this
            stand-in's memory. Requests still run concurrently: it delays, it does not
            serialise.
        rbac: authorize every request by these roles and bindings, 403 otherwise, and
            Kubernetes 1.36's ``resourceclaims/binding`` check of claim status writes
            (:class:`~fgpu_standin.rbac.Rbac`); None: everything is allowed.
        record: keep every request's authorization attributes in
            :attr:`StandInApi.requests` (:mod:`~fgpu_standin.rbac`).
        consumable_capacity: the ``DRAConsumableCapacity`` feature gate (on from
            Kubernetes 1.36); off, ResourceSlices are stored without
            ``allowMultipleAllocations``, as 1.34 and 1.35 do (:mod:`~fgpu_standin.gates`).

    The requester's identity (``userInfo`` in the AdmissionReview) comes from the
    ``Impersonate-User`` and ``Impersonate-Group`` headers (what ``kubectl --as`` sends),
    TRUSTED WITHOUT ANY CHECK (test stand-in: no authentication, no RBAC); without them a
    request is ``system:anonymous`` (:data:`ANONYMOUS`).
    """

    kubelet: bool = False
    graceful_delete: bool = False
    admission: list[Obj] = field(default_factory=list)
    webhook_ca: str | None = None
    history: int = 200_000
    bookmark_s: float = 60.0
    latency_s: float = 0.0
    controller_delay_s: float = 0.1
    rbac: Rbac | None = None
    record: bool = False
    consumable_capacity: bool = True


ANONYMOUS = {"username": "system:anonymous", "groups": ["system:unauthenticated"]}
"""The ``userInfo`` of a request without ``Impersonate-User``, as an API server that allows
anonymous requests gives it."""


def user_info(headers: Any) -> dict[str, Any]:
    """The requester, from the impersonation headers (``Impersonate-User``,
    ``Impersonate-Group``, ``Impersonate-Extra-KEY``, KEY percent-encoded, as ``kubectl
    --as``/``--as-group`` and the client libraries send them). TEST ONLY: trusted as they
    come (a real API server authenticates the caller and checks its RBAC ``impersonate``
    permission); the stand-in uses them to play a service account whose token names its
    node (``authentication.kubernetes.io/node-name``)."""
    name = headers.get("impersonate-user")
    if not name:
        return copy.deepcopy(ANONYMOUS)
    groups = [g for g in headers.getlist("impersonate-group") if g]
    extra: dict[str, list[str]] = {}
    for key in headers:
        if key.lower().startswith("impersonate-extra-"):  # percent-encoded extra key
            extra[unquote(key[len("impersonate-extra-") :]).lower()] = headers.getlist(key)
    info: dict[str, Any] = {"username": name, "groups": [*groups, "system:authenticated"]}
    if extra:
        info["extra"] = extra
    return info


def _kind(group: str, version: str, plural: str) -> Kind:
    kind = _BY_PATH.get((group, version, plural))
    if kind is None:
        raise ApiStatusError(
            404, "NotFound", f"the server could not find the requested resource ({plural})"
        )
    return kind


@dataclass(frozen=True, slots=True)
class _Route:
    kind: Kind
    namespace: str | None
    name: str | None
    sub: str | None


def _route(path: str) -> _Route:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ApiStatusError(404, "NotFound", f"no route {path}")
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise ApiStatusError(404, "NotFound", f"no route {path}")
    kind = _kind(group, version, rest[0])
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if namespace is not None and not kind.namespaced:
        raise ApiStatusError(404, "NotFound", f"{kind.plural} are not namespaced")
    if kind.namespaced and namespace is None and name is not None:
        raise ApiStatusError(404, "NotFound", f"{kind.plural} are namespaced")
    return _Route(kind, namespace, name, sub)


def _status_response(exc: ApiStatusError) -> JSONResponse:
    return JSONResponse(exc.status(), status_code=exc.code)


def _check_fields(kind: Kind, obj: Any, query: dict[str, str]) -> dict[str, str]:
    """``fieldValidation``: refuse unknown fields (``Strict``), or the ``Warning`` header
    that names them (``Warn``); nothing for ``Ignore`` or none.

    Raises:
        ApiStatusError: 400 under ``Strict`` when ``obj`` has a field ``kind`` does not.
    """
    mode = query.get("fieldValidation", "")
    if mode not in ("Strict", "Warn"):
        return {}
    unknown = fields.unknown_fields(kind, obj)
    if not unknown:
        return {}
    if mode == "Strict":
        raise ApiStatusError(400, "BadRequest", fields.message(kind, unknown))
    return {"Warning": ", ".join(f'299 - "unknown field \\"{f}\\""' for f in unknown)}


CUSTOM_GROUPS = frozenset({"fgpu.io"})
"""API groups served as custom resources (CustomResourceDefinitions on a real cluster)."""


def _check_custom_kind(kind: Kind, raw: bytes | None, body: Any) -> None:
    """A custom object written whole (create, replace) must say its ``apiVersion`` and
    ``kind``, as the API server's decoder of custom resources requires (built-in kinds
    are decoded by their path and may leave them out).

    Raises:
        ApiStatusError: 400 BadRequest naming the missing field.
    """
    if kind.group not in CUSTOM_GROUPS or not isinstance(body, dict):
        return
    text = (raw or b"").decode("utf-8", "replace")
    if not body.get("kind"):
        raise ApiStatusError(400, "BadRequest", f"Object 'Kind' is missing in '{text}'")
    if not body.get("apiVersion"):
        raise ApiStatusError(400, "BadRequest", f"Object 'apiVersion' is missing in '{text}'")


def _canonical(kind: Kind, obj: Any) -> None:
    """Quantities in canonical form, as the API server decodes and stores them
    (:mod:`~fgpu_standin.quantity`).

    Raises:
        ApiStatusError: 400 BadRequest, a value that is not a quantity.
    """
    if not isinstance(obj, dict):
        return
    try:
        quantity.canonicalize(kind.plural, obj)
    except quantity.QuantityError as exc:
        raise ApiStatusError(
            400,
            "BadRequest",
            f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: {exc}',
        ) from None


GATED = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "SchedulingGated",
    "message": "Scheduling is blocked due to non-empty scheduling gates",
}
"""The condition the API server gives a pod created with ``spec.schedulingGates`` (pod
strategy ``PrepareForCreate``; Kubernetes documentation, "Pod Scheduling Readiness":
``kubectl get pod`` then shows ``SchedulingGated``)."""


def _gated_condition(pod: Obj) -> None:
    """Add :data:`GATED` to a new pod with scheduling gates and no ``PodScheduled``
    condition yet, as the API server does."""
    if not (pod.get("spec") or {}).get("schedulingGates"):
        return
    status = pod.setdefault("status", {})
    conditions = status.setdefault("conditions", [])
    if not any(c.get("type") == "PodScheduled" for c in conditions):
        conditions.append({**GATED, "lastTransitionTime": now_rfc3339()})


def _check_pod_spec_update(name: str, old: Obj, new: Obj) -> None:
    """Pod spec updates: only the removal of scheduling gates (Kubernetes documentation,
    "Pod Scheduling Readiness": gates are set at creation and may only be removed after);
    the other fields the API server lets change (images, tolerations added, ...) are not
    allowed by the stand-in.

    Raises:
        ApiStatusError: 422 naming the field.
    """
    before = old.get("schedulingGates") or []
    after = new.get("schedulingGates") or []
    for gate in after:
        if gate not in before:
            raise ApiStatusError(
                422,
                "Invalid",
                f'Pod "{name}" is invalid: spec.schedulingGates: Forbidden: only deletion is '
                f"allowed, but found new scheduling gate '{gate.get('name', '')}'",
            )
    rest_old = {k: v for k, v in old.items() if k != "schedulingGates"}
    rest_new = {k: v for k, v in new.items() if k != "schedulingGates"}
    if rest_old != rest_new:
        raise ApiStatusError(
            422,
            "Invalid",
            f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields '
            "other than the mutable ones (the stand-in allows only removing scheduling gates)",
        )


HIGHEST_USER_PRIORITY = 1_000_000_000
"""The highest value a PriorityClass that is not a system one may have (scheduling/v1)."""


def _check_priority_class(body: Obj) -> None:
    """The API server's validation of a new PriorityClass's name and value: names with the
    ``system-`` prefix are reserved, and other classes go up to
    :data:`HIGHEST_USER_PRIORITY` (422 Invalid, worded as the API server words it)."""
    name = str((body.get("metadata") or {}).get("name", ""))
    problems = []
    if name.startswith("system-"):
        problems.append(
            "metadata.name: Forbidden: priority class names with 'system-' prefix are reserved "
            "for system use only"
        )
    try:
        value = int(body.get("value", 0))
    except (TypeError, ValueError):
        value = 0
    if value > HIGHEST_USER_PRIORITY and not name.startswith("system-"):
        problems.append(
            "value: Forbidden: maximum allowed value of a user defined priority is "
            f"{HIGHEST_USER_PRIORITY}"
        )
    if problems:
        raise ApiStatusError(
            422,
            "Invalid",
            f'PriorityClass.scheduling.k8s.io "{name}" is invalid: ' + ", ".join(problems),
        )


def _success(code: int = 201) -> JSONResponse:
    return JSONResponse(
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code},
        status_code=code,
    )


class StandInApi:
    """The stand-in's behaviour on top of the :class:`Store`."""

    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()
        self.store = Store(history=self.options.history)
        self.controllers = Controllers(
            self.store, self.options.controller_delay_s, self._delete_dependent
        )
        self.store.on_delete.append(self.controllers.deleted)
        self.claims = claims.ClaimController(self.store, {k.plural: k for k in KINDS})
        self.store.on_delete.append(self._pod_gone)
        self._http: httpx.AsyncClient | None = None
        self.calls = 0
        self.webhook_calls: list[tuple[str, Obj]] = []
        """``(webhook name, AdmissionReview request)`` of every webhook call, in order."""
        self.recorder = Recorder(self.options.rbac, self.options.record)
        self.requests = self.recorder.requests
        """Every request's :class:`~fgpu_standin.rbac.Attributes` (:attr:`Options.record`)."""

    # ----------------------------------------------------------------- helpers
    def _delete_dependent(self, kind: Kind, namespace: str, name: str, uid: str) -> None:
        """The garbage collector's delete of a dependent: as a client's delete (a running
        pod gracefully, a claim kept while it has finalizers), only if it is still the one."""
        preconditions = {"uid": uid}
        if kind.plural == "pods":
            self._delete_pod(namespace, name, {"preconditions": preconditions})
        elif kind.plural == "resourceclaims":
            self.claims.delete(kind, namespace, name, preconditions)
        else:
            self.store.delete(kind, namespace, name, preconditions)

    def _pod_gone(self, plural: str, gone: Obj) -> None:
        """The claim controller's part when a pod goes (:mod:`~fgpu_standin.claims`),
        a moment later."""
        if plural == "pods":
            self.controllers.later(self.claims.pod_done, gone)

    def _kubelet_finish(self, namespace: str, name: str, uid: str) -> None:
        """The pretended kubelet stopped a deleted pod's containers: the pod goes."""
        pod = self.store.peek("pods", namespace, name)
        if pod is not None and pod["metadata"]["uid"] == uid:
            self.store.delete(_kind("", "v1", "pods"), namespace, name, {"uid": uid})

    def _list(self, route: _Route, query: dict[str, str]) -> Obj:
        kind = route.kind
        try:
            labels = label_selector(query.get("labelSelector"))
            fields = field_selector(query.get("fieldSelector"), kind.fields)
        except SelectorError as exc:
            raise ApiStatusError(400, "BadRequest", str(exc)) from None
        items = [
            copy.deepcopy(o)
            for o in self.store.items(kind.plural, route.namespace)
            if labels(o["metadata"].get("labels") or {}) and fields(o)
        ]
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return {
            "apiVersion": kind.api_version,
            "kind": f"{kind.kind}List",
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": items,
        }

    # ------------------------------------------------------------------- pods
    async def _admit(
        self,
        kind: Kind,
        obj: Obj,
        namespace: str,
        user: Obj,
        old: Obj | None = None,
        sub: str = "",
    ) -> Obj:
        """Dynamic admission of a CREATE (``old`` None) or UPDATE (``old``: the object as
        stored) of ``obj`` (:mod:`~fgpu_standin.admission`): the mutated object, or a
        refusal raised as the API server words it."""
        if not self.options.admission:
            return obj
        meta = obj.get("metadata") or {}
        at = admission.Attributes(
            operation="CREATE" if old is None else "UPDATE",
            group=kind.group,
            version=kind.version,
            resource=kind.plural,
            subresource=sub,
            namespaced=kind.namespaced,
            namespace=namespace,
            name=meta.get("name") or "",
            kind=kind.kind,
            user=user,
            old=old,
            namespace_object=self.store.peek("namespaces", "", namespace) if namespace else None,
        )
        return await admission.run(
            self.options.admission, at, obj, self._call_webhook, str(uuid.uuid4())
        )

    async def _call_webhook(self, url: str, hook: Obj, review: Obj) -> Obj:
        """POST one AdmissionReview; its ``response``.

        Raises:
            ApiStatusError: the call failed (the caller applies the failure policy).
        """
        if self._http is None:
            verify: ssl.SSLContext | bool = True
            if self.options.webhook_ca:
                verify = ssl.create_default_context(cafile=self.options.webhook_ca)
            self._http = httpx.AsyncClient(verify=verify, timeout=10.0)
        self.webhook_calls.append((hook.get("name", ""), review["request"]))
        timeout = float(hook.get("timeoutSeconds") or 10)
        try:
            reply = await self._http.post(url, json=review, timeout=timeout)
            reply.raise_for_status()
            answer = reply.json()["response"]
        except (httpx.HTTPError, KeyError, ValueError, TypeError) as exc:
            raise ApiStatusError(500, "InternalError", f"Post {url!r}: {exc}") from None
        if not isinstance(answer, dict):
            raise ApiStatusError(500, "InternalError", f"Post {url!r}: no response object")
        return answer

    def _pod_defaults(self, obj: Obj, namespace: str) -> None:
        """Defaults and the built-in admission plugins of a new pod that run before the
        webhooks: ServiceAccount, Priority, RuntimeClass (:mod:`~fgpu_standin.builtin`).

        Raises:
            ApiStatusError: 403, a plugin refused the pod.
        """
        builtin.service_account(self.store, _kind("", "v1", "serviceaccounts"), namespace, obj)
        builtin.runtime_class(self.store, obj)
        spec = obj.setdefault("spec", {})
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("restartPolicy", "Always")
        status = obj.setdefault("status", {})
        status.setdefault("phase", "Pending")
        pc = spec.get("priorityClassName")
        if pc:  # the Priority admission plugin
            klass = self.store.peek("priorityclasses", "", pc)
            if klass is None:
                raise ApiStatusError(
                    403,
                    "Forbidden",
                    f"pods is forbidden: no PriorityClass with name {pc} was found",
                )
            spec["priority"] = klass.get("value", 0)
        else:
            spec.setdefault("priority", 0)

    def _bind(self, namespace: str, name: str, body: Obj) -> JSONResponse:
        kind = _kind("", "v1", "pods")
        pod = self.store.get(kind, namespace, name)
        meta = body.get("metadata") or {}
        uid = meta.get("uid")
        if uid and uid != pod["metadata"]["uid"]:
            raise ApiStatusError(
                409, "Conflict", f"Precondition failed: UID in precondition: {uid}"
            )
        node = (body.get("target") or {}).get("name")
        if not node:
            raise ApiStatusError(422, "Invalid", "Binding is invalid: target.name: Required value")
        if pod["metadata"].get("deletionTimestamp"):
            raise ApiStatusError(
                409, "Conflict", f"pod {name} is being deleted, cannot be assigned"
            )
        if pod["spec"].get("nodeName"):
            raise ApiStatusError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                f'assigned to node "{pod["spec"]["nodeName"]}"',
            )
        if pod["spec"].get("schedulingGates"):  # the API server's binding storage
            raise ApiStatusError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} has '
                "non-empty .spec.schedulingGates",
            )
        pod["spec"]["nodeName"] = node
        annotations = pod["metadata"].setdefault("annotations", {})
        annotations.update(meta.get("annotations") or {})
        status = pod.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append(
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}
        )
        status["conditions"] = conditions
        if self.options.kubelet:
            status["phase"] = "Running"
            status["conditions"].append(
                {"type": "Ready", "status": "True", "lastTransitionTime": now_rfc3339()}
            )
            status["startTime"] = now_rfc3339()
        pod["metadata"].pop("resourceVersion", None)
        self.store.replace(kind, namespace, name, pod, check_rv=False)
        return _success()

    def _evict(self, namespace: str, name: str, body: Obj) -> JSONResponse:
        kind = _kind("", "v1", "pods")
        pod = self.store.get(kind, namespace, name)
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if phase not in ("Succeeded", "Failed", "Pending") and not pod["metadata"].get(
            "deletionTimestamp"
        ):
            labels = pod["metadata"].get("labels") or {}
            budgets = [
                b
                for b in self.store.items("poddisruptionbudgets", namespace)
                if match_label_selector_object((b.get("spec") or {}).get("selector"), labels)
            ]
            if len(budgets) > 1:
                raise ApiStatusError(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction "
                    "subresource does not support.",
                )
            if budgets:
                self._check_budget(budgets[0], namespace)
        options = body.get("deleteOptions") or {}
        return self._delete_pod(namespace, name, options)

    def _check_budget(self, budget: Obj, namespace: str) -> None:
        spec = budget.get("spec") or {}
        matched = [
            p
            for p in self.store.items("pods", namespace)
            if match_label_selector_object(spec.get("selector"), p["metadata"].get("labels") or {})
            and (p.get("status") or {}).get("phase") not in _TERMINAL
        ]
        healthy = sum(
            1
            for p in matched
            if not p["metadata"].get("deletionTimestamp")
            and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        )
        expected = len(matched)

        def amount(value: Any) -> int:
            if isinstance(value, str) and value.endswith("%"):
                return -(-int(value[:-1]) * expected // 100)
            return int(value)

        if "minAvailable" in spec:
            need = amount(spec["minAvailable"])
            allowed = healthy - need
        else:
            unavailable = amount(spec.get("maxUnavailable", 0))
            need = expected - unavailable
            allowed = unavailable - (expected - healthy)
        if allowed <= 0:
            raise ApiStatusError(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                {
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {budget['metadata']['name']} "
                            f"needs {need} healthy pods and has {healthy} currently",
                        }
                    ]
                },
            )

    def _delete_pod(self, namespace: str, name: str, options: Obj) -> JSONResponse:
        kind = _kind("", "v1", "pods")
        pod = self.store.get(kind, namespace, name)
        grace = options.get("gracePeriodSeconds")
        bound = bool(pod["spec"].get("nodeName"))
        running = (pod.get("status") or {}).get("phase") not in _TERMINAL
        preconditions = options.get("preconditions") or {}
        if (
            (self.options.graceful_delete or self.options.kubelet)
            and bound
            and running
            and grace != 0
        ):
            want = preconditions.get("uid")
            if want and want != pod["metadata"]["uid"]:
                raise ApiStatusError(
                    409,
                    "Conflict",
                    f"Precondition failed: UID in precondition: {want}, UID in object meta: "
                    f"{pod['metadata']['uid']}",
                )
            if not pod["metadata"].get("deletionTimestamp"):
                pod["metadata"]["deletionTimestamp"] = now_rfc3339()
                pod["metadata"]["deletionGracePeriodSeconds"] = 30 if grace is None else grace
                pod["metadata"].pop("resourceVersion", None)
                self.store.replace(kind, namespace, name, pod, check_rv=False, system=True)
                if self.options.kubelet:
                    self.controllers.later(
                        self._kubelet_finish, namespace, name, pod["metadata"]["uid"]
                    )
            return JSONResponse(self.store.get(kind, namespace, name), status_code=200)
        gone = self.store.delete(kind, namespace, name, preconditions)
        return JSONResponse(gone, status_code=200)

    # ---------------------------------------------------------------- handlers
    async def handle(self, request: Request, path: str) -> Response:
        """Serve one request."""
        self.calls += 1
        if self.options.latency_s > 0:
            await asyncio.sleep(self.options.latency_s)
        try:
            host = request.headers.get("host", "")
            if request.method == "GET" and (found := discovery.document(path, KINDS, host)):
                return JSONResponse(found)
            route = _route(path)
            query = dict(request.query_params)
            method = request.method
            self.recorder.request(self._attributes(route, method, query, request.headers))
            body: Any = None
            if method in ("POST", "PUT", "PATCH", "DELETE"):
                raw = await request.body()
                body = json.loads(raw) if raw else None
                if method in ("POST", "PUT") and route.sub is None:
                    _check_custom_kind(route.kind, raw, body)
            as_table = tables.wants_table(request.headers.get("accept", ""))
            if route.name is None:
                if method == "GET":
                    if query.get("watch") in ("true", "1"):
                        return self._watch(route, query, as_table)
                    listed = self._list(route, query)
                    if as_table:
                        rv = listed["metadata"]["resourceVersion"]
                        return JSONResponse(tables.table(route.kind, listed["items"], rv))
                    return JSONResponse(listed)
                if method == "POST":
                    return await self._create(route, body or {}, query, request.headers)
                raise ApiStatusError(405, "MethodNotAllowed", f"{method} on a collection")
            return await self._object(route, method, body, request.headers, query)
        except ApiStatusError as exc:
            return _status_response(exc)
        except json.JSONDecodeError as exc:
            return _status_response(ApiStatusError(400, "BadRequest", f"bad JSON: {exc}"))

    def _attributes(
        self, route: _Route, method: str, query: dict[str, str], headers: Any
    ) -> Attributes:
        user = user_info(headers) if headers.get("impersonate-user") else None
        kind = route.kind
        return request_attributes(
            method, kind.group, kind.plural, route.sub, route.namespace, route.name, query, user
        )

    async def _create(
        self, route: _Route, body: Obj, query: dict[str, str], headers: Any
    ) -> JSONResponse:
        kind = route.kind
        warnings = _check_fields(kind, body, query)
        ns = route.namespace or ""
        if kind.namespaced and not route.namespace:
            raise ApiStatusError(405, "MethodNotAllowed", "create needs a namespace")
        body_ns = (body.get("metadata") or {}).get("namespace")
        if body_ns and kind.namespaced and body_ns != ns:
            raise ApiStatusError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on "
                "the request",
            )
        _canonical(kind, body)
        if kind.plural == "pods":  # defaults and built-in plugins come before webhooks
            self._pod_defaults(body, ns)
        body = await self._admit(kind, body, ns, user_info(headers))
        _canonical(kind, body)  # a webhook's patch is decoded again
        if kind.plural == "pods":
            _gated_condition(body)
        if kind.status_subresource and kind.group == resource.GROUP:
            body = {**body, "status": {}}  # status only through /status
        body = resource.admit(
            kind, drop_disabled(kind.plural, body, self.options.consumable_capacity)
        )
        if kind.plural == "priorityclasses":
            _check_priority_class(body)
        made = self.store.create(kind, ns, body)
        if kind.plural == "pods" and (made.get("spec") or {}).get("resourceClaims"):
            self.controllers.later(self.claims.pod_claims, made)  # the claim controller
        elif kind.plural == "resourceclaimtemplates":
            self.controllers.later(self.claims.template_added, made)
        return JSONResponse(made, status_code=201, headers=warnings)

    async def _object(
        self, route: _Route, method: str, body: Any, headers: Any, query: dict[str, str]
    ) -> Response:
        kind, ns, name, sub = route.kind, route.namespace or "", route.name or "", route.sub
        if sub == "binding" and kind.plural == "pods" and method == "POST":
            return self._bind(ns, name, body or {})
        if sub == "eviction" and kind.plural == "pods" and method == "POST":
            return self._evict(ns, name, body or {})
        if sub is not None and (sub != "status" or not kind.status_subresource):
            raise ApiStatusError(404, "NotFound", f"no subresource {sub} of {kind.plural}")
        if method == "GET":
            found = self.store.get(kind, ns, name)
            if sub is None and tables.wants_table(headers.get("accept", "")):
                return JSONResponse(tables.table(kind, [found], str(self.store.rv)))
            return JSONResponse(found)
        if method == "DELETE":
            options = body or {}
            if "gracePeriodSeconds" in query:
                options["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
            if kind.plural == "pods":
                return self._delete_pod(ns, name, options)
            if kind.plural == "resourceclaims":
                preconditions = options.get("preconditions") or {}
                return JSONResponse(self.claims.delete(kind, ns, name, preconditions))
            return JSONResponse(
                self.store.delete(kind, ns, name, options.get("preconditions") or {})
            )
        old = self.store.get(kind, ns, name)
        if method == "PUT":
            new = body or {}
            check_rv = True
        elif method == "PATCH":
            ctype = headers.get("content-type", "").split(";")[0].strip()
            try:
                if ctype == "application/json-patch+json":
                    new = json_patch(old, body)
                elif ctype == "application/merge-patch+json":
                    new = merge_patch(old, body)
                elif ctype == "application/strategic-merge-patch+json":
                    new = merge_patch(old, body, strategic=True)
                else:
                    raise ApiStatusError(
                        415,
                        "UnsupportedMediaType",
                        f"the body of the request was in an unknown "
                        f"format - accepted media types include: application/json-patch+json, "
                        f"application/merge-patch+json, application/strategic-merge-patch+json "
                        f"(got {ctype})",
                    )
            except PatchError as exc:
                raise ApiStatusError(422, "Invalid", str(exc)) from None
            check_rv = bool(
                ((body or {}) if isinstance(body, dict) else {})
                .get("metadata", {})
                .get("resourceVersion")
            )
        else:
            raise ApiStatusError(405, "MethodNotAllowed", method)
        if not isinstance(new, dict):
            raise ApiStatusError(400, "BadRequest", "the object must be a JSON object")
        warnings = _check_fields(kind, new, query)
        if kind.status_subresource:
            if sub == "status":  # only status changes through /status
                new = {
                    **old,
                    "status": new.get("status", {}),
                    "metadata": {
                        **old["metadata"],
                        "resourceVersion": new.get("metadata", {}).get(
                            "resourceVersion", old["metadata"]["resourceVersion"]
                        ),
                    },
                }
            else:  # and status never through the main resource
                new["status"] = old.get("status", {})
        _canonical(kind, new)
        new = await self._admit(kind, new, ns, user_info(headers), copy.deepcopy(old), sub or "")
        _canonical(kind, new)
        if kind.plural == "pods" and sub is None:
            _check_pod_spec_update(name, old.get("spec") or {}, new.get("spec") or {})
        if kind.plural == "resourceclaims" and sub == "status":
            attrs = self._attributes(route, method, query, headers)
            self.recorder.claim_status(attrs, old, new)
        new = drop_disabled(kind.plural, new, self.options.consumable_capacity)
        new = resource.admit(kind, new, old, status=sub == "status")
        written = self.store.replace(kind, ns, name, new, check_rv=check_rv)
        if kind.plural == "resourceclaims":
            written = self.claims.finish(kind, written)
        if kind.plural == "pods" and (written.get("status") or {}).get("phase") in _TERMINAL:
            self.controllers.later(self.claims.pod_done, written)
        return JSONResponse(written, headers=warnings)

    # ------------------------------------------------------------------- watch
    def _watch(self, route: _Route, query: dict[str, str], as_table: bool = False) -> Response:
        kind = route.kind

        def shape(obj: Obj) -> Obj:
            return (
                tables.table(kind, [obj], obj["metadata"].get("resourceVersion", ""))
                if (as_table)
                else obj
            )

        try:
            labels = label_selector(query.get("labelSelector"))
            fields = field_selector(query.get("fieldSelector"), kind.fields)
        except SelectorError as exc:
            raise ApiStatusError(400, "BadRequest", str(exc)) from None
        namespace = route.namespace

        def visible(obj: Obj | None) -> bool:
            if obj is None:
                return False
            if namespace is not None and obj["metadata"].get("namespace") != namespace:
                return False
            return labels(obj["metadata"].get("labels") or {}) and fields(obj)

        rv_text = query.get("resourceVersion", "")
        start: list[WatchEvent] = []
        watcher = self.store.subscribe(kind.plural)
        initial: list[Obj] = []
        if rv_text in ("", "0"):
            initial = [copy.deepcopy(o) for o in self.store.items(kind.plural, namespace)]
        else:
            try:
                rv = int(rv_text)
            except ValueError:
                self.store.unsubscribe(watcher)
                raise ApiStatusError(
                    400, "BadRequest", f"bad resourceVersion {rv_text!r}"
                ) from None
            found = self.store.since(kind.plural, rv)
            if found is None:
                self.store.unsubscribe(watcher)
                gone = ApiStatusError(410, "Expired", f"too old resource version: {rv}")
                line = json.dumps({"type": "ERROR", "object": gone.status()}) + "\n"
                return Response(line, media_type="application/json")
            start = found
        timeout = float(query.get("timeoutSeconds") or 0) or None
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1") and not as_table

        def bookmark() -> str:
            """A BOOKMARK event: only ``metadata.resourceVersion`` is meaningful; a client
            resumes from it (Kubernetes API concepts, "Watch bookmarks")."""
            obj = {
                "kind": kind.kind,
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self.store.rv)},
            }
            return json.dumps({"type": "BOOKMARK", "object": obj}) + "\n"

        def render(event: WatchEvent) -> str | None:
            was, now = visible(event.old), visible(event.new)
            if event.type == "DELETED":
                type_ = "DELETED" if was else None
            elif was and now:
                type_ = "MODIFIED"
            elif now:
                type_ = "ADDED"
            elif was:
                type_ = "DELETED"
            else:
                type_ = None
            if type_ is None:
                return None
            return json.dumps({"type": type_, "object": shape(event.new)}) + "\n"

        async def stream() -> AsyncIterator[str]:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            try:
                for obj in initial:
                    if visible(obj):
                        yield json.dumps({"type": "ADDED", "object": shape(obj)}) + "\n"
                for past in start:
                    if (line := render(past)) is not None:
                        yield line
                last = start[-1].rv if start else 0
                while True:
                    wait = None if deadline is None else max(0.0, deadline - loop.time())
                    if bookmarks and (wait is None or wait > self.options.bookmark_s):
                        wait = self.options.bookmark_s
                    try:
                        got = await asyncio.wait_for(watcher.queue.get(), wait)
                    except TimeoutError:
                        if deadline is not None and loop.time() >= deadline:
                            return
                        if watcher.queue.empty():  # every change so far was delivered
                            yield bookmark()
                        continue
                    if got is None:
                        return
                    if got.rv <= last:
                        continue
                    if (line := render(got)) is not None:
                        yield line
            finally:
                self.store.unsubscribe(watcher)

        return StreamingResponse(stream(), media_type="application/json")

    def close_watches(self) -> None:
        """End every open watch (the API server does this when it restarts or times out
        a watch; clients must list or resume)."""
        for w in list(self.store.watchers):
            w.queue.put_nowait(None)


def create_app(api: StandInApi) -> FastAPI:
    """The FastAPI application serving ``api``."""
    app = FastAPI(title="fgpu Kubernetes API stand-in (tests only)", openapi_url=None)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def any_path(request: Request, path: str) -> Response:
        return await api.handle(request, path)

    return app


def kinds() -> Sequence[Kind]:
    """The resource types served."""
    return KINDS
