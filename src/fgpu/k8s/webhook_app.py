"""The admission webhook's HTTP side: the ``AdmissionReview`` answers of ``fgpu k8s
webhook``, the reads of Namespaces and Queues they need, the FastAPI application and
:func:`serve`. The rules themselves are :mod:`fgpu.k8s.webhook` (what a pod gets and what
is refused) and :mod:`fgpu.k8s.tenancy` (queue access and priority).

**Two endpoints.** ``POST /mutate`` (:func:`mutate_review`, the MutatingWebhookConfiguration)
only adds: it never refuses, and a pod it cannot read gets no patch. ``POST /validate``
(:func:`validate`, the ValidatingWebhookConfiguration) only refuses, on the object as every
mutating webhook left it (the API server calls validating webhooks last), so a later
mutating webhook cannot undo a check. Validation adds the tenancy rules of
:mod:`fgpu.k8s.tenancy` (queue access, the priority ceiling, non-preemptible work), with
the Namespace and Queue read through a :class:`Lookup`, and on the DRA path refuses a pod
that names a claim of fgpu's device class of its own (the claims and templates it names
read through the same :class:`Lookup`; :func:`fgpu.k8s.webhook_dra.check_user_claims`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from fgpu.k8s import tenancy, wire
from fgpu.k8s.kube import KubeApi, KubeError
from fgpu.k8s.objects import PodRequestError, pod_ask
from fgpu.k8s.webhook import SCHEDULER_USER, check_update, mutate, wants_fgpu
from fgpu.k8s.webhook_dra import check_privileged, check_user_claims

Obj = Mapping[str, Any]


def _refusal(uid: str, exc: PodRequestError) -> dict[str, Any]:
    return {
        "uid": uid,
        "allowed": False,
        "status": {"code": 422, "reason": "Invalid", "message": str(exc)},
    }


class Lookup(Protocol):
    """What the webhook reads from the API: a Namespace (its default queue), a Queue (who
    may use it), and the ResourceClaims and ResourceClaimTemplates a pod names (whether
    they ask for fgpu's device class). None when there is no such object."""

    def namespace(self, name: str) -> Obj | None: ...

    def queue(self, name: str) -> Obj | None: ...

    def claim(self, namespace: str, name: str) -> Obj | None: ...

    def claim_template(self, namespace: str, name: str) -> Obj | None: ...


class NoLookup:
    """No API access: every namespace's default queue is ``default`` and no Queue is
    found, so queue access is checked by the scheduler only."""

    def namespace(self, name: str) -> Obj | None:
        return None

    def queue(self, name: str) -> Obj | None:
        return None

    def claim(self, namespace: str, name: str) -> Obj | None:
        return None

    def claim_template(self, namespace: str, name: str) -> Obj | None:
        return None


class KubeLookup:
    """:class:`Lookup` through the API (one GET each; the webhook's RBAC allows ``get`` on
    namespaces, queues, resourceclaims and resourceclaimtemplates, deploy/base/rbac.yaml).

    Raises (from both methods):
        KubeError: any failure but 404 (the review then fails, and the API server applies
            the webhook's ``failurePolicy``).
    """

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def namespace(self, name: str) -> Obj | None:
        return self._get(self.api.core.read_namespace, name)

    def queue(self, name: str) -> Obj | None:
        from fgpu.k8s.kube import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION

        return self._get(
            self.api.custom.get_cluster_custom_object,
            QUEUE_GROUP,
            QUEUE_VERSION,
            QUEUE_PLURAL,
            name,
        )

    def claim(self, namespace: str, name: str) -> Obj | None:
        from fgpu.k8s.resourceapi import ResourceApi

        return self._get(
            ResourceApi(self.api).resource.read_namespaced_resource_claim, name, namespace
        )

    def claim_template(self, namespace: str, name: str) -> Obj | None:
        from fgpu.k8s.resourceapi import ResourceApi

        return self._get(
            ResourceApi(self.api).resource.read_namespaced_resource_claim_template, name, namespace
        )

    def _get(self, method: Any, *args: Any) -> Obj | None:
        try:
            found: Obj | None = self.api._call(method, *args)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        except Exception as exc:  # urllib3's connection errors (MaxRetryError, ...)
            raise KubeError(0, "Unreachable", f"{type(exc).__name__}: {exc}") from None
        return found


def _request(body: Obj) -> tuple[Obj, str, Obj, str, str | None, bool]:
    request = body.get("request") or {}
    pod = request.get("object") or {}
    sub = request.get("subResource")
    is_pod = request.get("kind", {}).get("kind", "Pod") == "Pod" and not sub
    return request, request.get("uid", ""), pod, request.get("operation", "CREATE"), sub, is_pod


def _answer(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


TENANCY_ANNOTATIONS = (wire.QUEUE, wire.PRIORITY, wire.PREEMPTIBLE)
"""User annotations whose change on update is checked again (queue access, priority)."""


def validate(
    body: Obj,
    *,
    agent_socket_volume: bool = True,
    scheduler_user: str = SCHEDULER_USER,
    env_without_isolation: bool = False,
    lookup: Lookup | None = None,
) -> dict[str, Any]:
    """Answer an ``AdmissionReview`` for the ValidatingWebhookConfiguration: refusals only,
    never a patch, on the object as every mutating webhook left it.

    - pod CREATE of an fgpu pod: every check of :func:`mutate` (annotations, spec, agent
      socket, DRA path) and :func:`fgpu.k8s.tenancy.check` (queue access, priority ceiling,
      non-preemptible work) with the Queue from ``lookup``;
    - pod UPDATE: :func:`check_update`, and the tenancy checks again when ``fgpu.io/queue``,
      ``fgpu.io/priority`` or ``fgpu.io/preemptible`` changed;
    - ``ephemeralcontainers`` of an fgpu pod: no privileged one.
    """
    request, uid, pod, operation, sub, is_pod = _request(body)
    lookup = lookup or NoLookup()
    try:
        if sub == "ephemeralcontainers" and wants_fgpu(pod):
            check_privileged(pod.get("spec") or {}, ("ephemeralContainers",))
        if is_pod and operation == "CREATE" and wants_fgpu(pod):
            mutate(
                pod,
                agent_socket_volume=agent_socket_volume,
                env_without_isolation=env_without_isolation,
            )
            _check_tenancy(pod, lookup, str(request.get("namespace") or ""))
            if not env_without_isolation:
                _check_claims(pod, lookup, str(request.get("namespace") or ""))
        elif is_pod and operation == "UPDATE":
            old = request.get("oldObject") or {}
            user = str((request.get("userInfo") or {}).get("username") or "")
            check_update(old, pod, user, scheduler_user=scheduler_user)
            before, after = wire.annotations_of(old), wire.annotations_of(pod)
            if wants_fgpu(pod) and any(before.get(k) != after.get(k) for k in TENANCY_ANNOTATIONS):
                _check_tenancy(pod, lookup, str(request.get("namespace") or ""))
    except PodRequestError as exc:
        return _answer(_refusal(uid, exc))
    except KubeError as exc:  # the Queue could not be read: refuse rather than guess
        return _answer(_unreadable(uid, exc))
    return _answer({"uid": uid, "allowed": True})


def _unreadable(uid: str, exc: KubeError) -> dict[str, Any]:
    return {
        "uid": uid,
        "allowed": False,
        "status": {
            "code": 503,
            "reason": "ServiceUnavailable",
            "message": f"the fgpu webhook could not read the pod's Namespace or Queue from "
            f"the API ({exc}); try again",
        },
    }


def _check_tenancy(pod: Obj, lookup: Lookup, namespace: str) -> None:
    ask = pod_ask(pod)
    try:
        tenancy.check(pod, ask, lookup.queue(ask.queue), namespace or None)
    except PodRequestError as exc:
        if exc.field != wire.QUEUE:
            raise
        ns = namespace or str((pod.get("metadata") or {}).get("namespace") or "default")
        notes = ((lookup.namespace(ns) or {}).get("metadata") or {}).get("annotations") or {}
        if str(notes.get(tenancy.DEFAULT_QUEUE_ANNOTATION) or "").strip() != ask.queue:
            raise
        raise PodRequestError(
            exc.field,
            f"{ask.queue} is the default queue of Namespace {ns} (its "
            f"{tenancy.DEFAULT_QUEUE_ANNOTATION} annotation, which a pod naming no queue "
            f"gets); {exc.reason}; or ask an administrator to fix that annotation",
        ) from None


def _check_claims(pod: Obj, lookup: Lookup, namespace: str) -> None:
    ns = namespace or str((pod.get("metadata") or {}).get("namespace") or "default")

    def claim_of(entry: Obj) -> tuple[str, Obj | None]:
        if entry.get("resourceClaimName"):
            name = str(entry["resourceClaimName"])
            return f"ResourceClaim {name}", lookup.claim(ns, name)
        name = str(entry.get("resourceClaimTemplateName") or "")
        return f"ResourceClaimTemplate {name}", lookup.claim_template(ns, name) if name else None

    check_user_claims(pod, claim_of)


def mutate_review(
    body: Obj,
    *,
    agent_socket_volume: bool = True,
    env_without_isolation: bool = False,
    lookup: Lookup | None = None,
) -> dict[str, Any]:
    """Answer an ``AdmissionReview`` for the MutatingWebhookConfiguration: on pod CREATE the
    patch of :func:`mutate` (the queue default from the namespace through ``lookup``). It
    refuses nothing about the pod: a pod it cannot read gets no patch, and the validating
    webhook refuses it with the reason. Only when the Namespace cannot be read is the
    request refused (503), since the pod's queue would otherwise be guessed."""
    request, uid, pod, operation, _, is_pod = _request(body)
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if is_pod and operation == "CREATE" and wants_fgpu(pod):
        namespace = str(request.get("namespace") or "")
        try:
            queue = tenancy.default_queue((lookup or NoLookup()).namespace(namespace))
        except KubeError as exc:  # a pod in the wrong queue is worse than a retry
            return _answer(_unreadable(uid, exc))
        try:
            ops = mutate(
                pod,
                agent_socket_volume=agent_socket_volume,
                env_without_isolation=env_without_isolation,
                queue=queue,
            )
        except PodRequestError:
            ops = []
        if ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return _answer(response)


def review(
    body: Obj,
    *,
    agent_socket_volume: bool = True,
    scheduler_user: str = SCHEDULER_USER,
    env_without_isolation: bool = False,
    lookup: Lookup | None = None,
) -> dict[str, Any]:
    """Both in one answer, as one webhook that checks and mutates: :func:`validate` of the
    object as sent, and when allowed :func:`mutate_review`'s patch (for tests and callers
    that send one review; a cluster calls ``/validate`` and ``/mutate`` separately)."""
    checked = validate(
        body,
        agent_socket_volume=agent_socket_volume,
        scheduler_user=scheduler_user,
        env_without_isolation=env_without_isolation,
        lookup=lookup,
    )
    if not checked["response"]["allowed"]:
        return checked
    return mutate_review(
        body,
        agent_socket_volume=agent_socket_volume,
        env_without_isolation=env_without_isolation,
        lookup=lookup,
    )


def create_app(
    *,
    agent_socket_volume: bool = True,
    scheduler_user: str = SCHEDULER_USER,
    env_without_isolation: bool = False,
    lookup: Lookup | None = None,
) -> FastAPI:
    """The webhook's HTTP application: ``POST /mutate`` (:func:`mutate_review`),
    ``POST /validate`` (:func:`validate`) and ``GET /healthz``; ``agent_socket_volume`` and
    ``env_without_isolation`` as in :func:`mutate`, ``scheduler_user`` as in
    :func:`check_update`, ``lookup`` as in :func:`validate` (None: :class:`NoLookup`)."""
    from starlette.concurrency import run_in_threadpool

    app = FastAPI(title="fgpu admission webhook", openapi_url=None)

    async def answer(request: Request, review: Callable[[Obj], Obj]) -> JSONResponse:
        """``review`` of the request's AdmissionReview, off the event loop; 400 when the
        body is not a JSON object."""
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return JSONResponse({"detail": "not an AdmissionReview"}, status_code=400)
        return JSONResponse(await run_in_threadpool(review, body))

    @app.post("/mutate")
    async def mutate_route(request: Request) -> JSONResponse:
        return await answer(
            request,
            lambda body: mutate_review(
                body,
                agent_socket_volume=agent_socket_volume,
                env_without_isolation=env_without_isolation,
                lookup=lookup,
            ),
        )

    @app.post("/validate")
    async def validate_route(request: Request) -> JSONResponse:
        return await answer(
            request,
            lambda body: validate(
                body,
                agent_socket_volume=agent_socket_volume,
                scheduler_user=scheduler_user,
                env_without_isolation=env_without_isolation,
                lookup=lookup,
            ),
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def serve(
    host: str,
    port: int,
    cert_file: str | None,
    key_file: str | None,
    *,
    agent_socket_volume: bool = True,
    scheduler_user: str = SCHEDULER_USER,
    env_without_isolation: bool = False,
    lookup: Lookup | None = None,
) -> None:
    """Serve the webhook (HTTPS when a certificate and key are given, as the API server
    requires; the files come from a Secret mounted in the pod, and are read again when they
    change: :class:`fgpu.k8s.tlsreload.CertReloader`). ``agent_socket_volume`` as in
    :func:`fgpu.k8s.webhook.mutate`, ``scheduler_user`` as in
    :func:`fgpu.k8s.webhook.check_update`, ``lookup`` as in :func:`validate`.

    Raises:
        ValueError: only one of ``cert_file`` and ``key_file``.
    """
    import uvicorn

    server, reloader = make_server(
        host,
        port,
        cert_file,
        key_file,
        agent_socket_volume=agent_socket_volume,
        scheduler_user=scheduler_user,
        env_without_isolation=env_without_isolation,
        lookup=lookup,
    )
    if reloader is not None:
        reloader.start()
    assert isinstance(server, uvicorn.Server)
    server.run()


def make_server(
    host: str,
    port: int,
    cert_file: str | None,
    key_file: str | None,
    *,
    reload_interval_s: float = 30.0,
    **options: Any,
) -> tuple[Any, Any]:
    """The webhook's ``uvicorn.Server`` (not started) and, with TLS, the
    :class:`~fgpu.k8s.tlsreload.CertReloader` of its certificate (not started); ``options``
    as for :func:`create_app`.

    Raises:
        ValueError: only one of ``cert_file`` and ``key_file``.
    """
    import uvicorn

    from fgpu.k8s.tlsreload import CertReloader

    if (cert_file is None) != (key_file is None):
        raise ValueError("--tls-cert-file and --tls-key-file go together")
    config = uvicorn.Config(
        create_app(**options),
        host=host,
        port=port,
        ssl_certfile=cert_file,
        ssl_keyfile=key_file,
        log_level="info",
    )
    config.load()  # makes config.ssl, which the reloader keeps current
    reloader = None
    if cert_file is not None and key_file is not None and config.ssl is not None:
        reloader = CertReloader(config.ssl, cert_file, key_file, reload_interval_s)
    return uvicorn.Server(config), reloader
