"""``fgpu k8s webhook``: the admission webhook for fgpu pods.

On pod creation it checks the ``fgpu.io/*`` annotations with the rules and the wording of
the CLI and the API (:func:`fgpu.k8s.objects.pod_ask`, which calls
:func:`fgpu.server.requests.parse_resources`), and refuses a bad pod naming the annotation
and the reason. A good pod gets, as one JSON patch:

- ``spec.schedulerName: fgpu``;
- ``fgpu.io/queue`` when absent (``default``);
- ``fgpu.io/env-configmap: fgpu-env-<random>``: the name of the pod's environment
  ConfigMap. It is chosen here, not from the pod's name, because a pod made from
  ``generateName`` has no name yet when admission runs;
- in every container and init container, ``envFrom`` that ConfigMap (not optional: the
  kubelet does not start the container before the scheduler has written it, and the
  scheduler writes it before the bind).

A pod that sets ``NVIDIA_VISIBLE_DEVICES``, ``CUDA_VISIBLE_DEVICES`` or ``FGPU_*`` in a
container's own ``env`` is refused: ``env`` wins over ``envFrom``, and the container would
see GPUs it was not given.

Which pods come here is the webhook configuration's choice (deploy/: pods whose
``schedulerName`` is ``fgpu`` or that carry an ``fgpu.io/`` annotation).
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from fgpu.k8s import wire
from fgpu.k8s.objects import PodRequestError, pod_ask

log = logging.getLogger("fgpu.k8s.webhook")

Obj = Mapping[str, Any]


def _escape(key: str) -> str:
    """A JSON pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def wants_fgpu(pod: Obj) -> bool:
    """Whether the pod is fgpu's: ``schedulerName: fgpu`` or an ``fgpu.io/`` user annotation."""
    if (pod.get("spec") or {}).get("schedulerName") == wire.SCHEDULER_NAME:
        return True
    return any(k in wire.USER_ANNOTATIONS for k in wire.annotations_of(pod))


def mutate(pod: Obj, configmap_name: str | None = None) -> list[dict[str, Any]]:
    """The JSON patch that admits ``pod`` (empty for a pod that is not fgpu's).

    Args:
        pod: the pod as submitted.
        configmap_name: the environment ConfigMap's name (default: ``fgpu-env-`` and 10
            random hex digits).

    Raises:
        PodRequestError: a bad annotation (naming it and the reason, as the CLI would), or
            a container that sets a variable the ConfigMap owns.
    """
    if not wants_fgpu(pod):
        return []
    pod_ask(pod)  # the same checks as `fgpu submit`
    spec = pod.get("spec") or {}
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            for env in c.get("env") or []:
                name = env.get("name", "")
                if name in wire.RESERVED_ENV:
                    raise PodRequestError(
                        f"spec.{group}[{i}].env",
                        f"{name} is set by fgpu from the GPUs the pod is given; remove it",
                    )
    notes = wire.annotations_of(pod)
    ops: list[dict[str, Any]] = []
    if not (pod.get("metadata") or {}).get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    if wire.QUEUE not in notes:
        ops.append(
            {
                "op": "add",
                "path": f"/metadata/annotations/{_escape(wire.QUEUE)}",
                "value": wire.DEFAULT_QUEUE,
            }
        )
    name = notes.get(wire.ENV_CONFIGMAP) or configmap_name or f"fgpu-env-{secrets.token_hex(5)}"
    ops.append(
        {"op": "add", "path": f"/metadata/annotations/{_escape(wire.ENV_CONFIGMAP)}", "value": name}
    )
    ops.append({"op": "add", "path": "/spec/schedulerName", "value": wire.SCHEDULER_NAME})
    source = {"configMapRef": {"name": name, "optional": False}}
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            refs = c.get("envFrom") or []
            if any((r.get("configMapRef") or {}).get("name") == name for r in refs):
                continue
            if refs:
                ops.append({"op": "add", "path": f"/spec/{group}/{i}/envFrom/-", "value": source})
            else:
                ops.append({"op": "add", "path": f"/spec/{group}/{i}/envFrom", "value": [source]})
    return ops


def review(body: Obj) -> dict[str, Any]:
    """Answer an ``AdmissionReview`` (admission.k8s.io/v1)."""
    request = body.get("request") or {}
    uid = request.get("uid", "")
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    pod = request.get("object") or {}
    if (
        request.get("operation", "CREATE") == "CREATE"
        and request.get("kind", {}).get("kind", "Pod") == "Pod"
    ):
        try:
            ops = mutate(pod)
        except PodRequestError as exc:
            response = {
                "uid": uid,
                "allowed": False,
                "status": {"code": 422, "reason": "Invalid", "message": str(exc)},
            }
        else:
            if ops:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def create_app() -> FastAPI:
    """The webhook's HTTP application: ``POST /mutate`` and ``GET /healthz``."""
    app = FastAPI(title="fgpu admission webhook", openapi_url=None)

    @app.post("/mutate")
    async def mutate_route(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"detail": "not an AdmissionReview"}, status_code=400)
        return JSONResponse(review(body))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def serve(host: str, port: int, cert_file: str | None, key_file: str | None) -> None:
    """Serve the webhook (HTTPS when a certificate and key are given, as the API server
    requires; the files come from a Secret mounted in the pod).

    Raises:
        ValueError: only one of ``cert_file`` and ``key_file``.
    """
    import uvicorn

    if (cert_file is None) != (key_file is None):
        raise ValueError("--tls-cert-file and --tls-key-file go together")
    uvicorn.run(
        create_app(),
        host=host,
        port=port,
        ssl_certfile=cert_file,
        ssl_keyfile=key_file,
        log_level="info",
    )
