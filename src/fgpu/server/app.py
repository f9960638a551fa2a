"""The REST API (``/v1``, DESIGN.md section 9): FastAPI routes over the service use-cases.

Routes are thin: they find out who calls, call one :class:`ServiceApi` method and return its
wire model (:mod:`fgpu.wire`). The service methods are synchronous (SQLite store), so the
routes are plain ``def`` functions that FastAPI runs in its thread pool, never on the event
loop.

Identity:

- on the Unix socket, the caller's uid comes from the connection's peer credentials, which
  :mod:`fgpu.server.peerconn` puts in the ASGI scope under :data:`PEER_UID`; the caller is an
  admin when the uid is 0 or one of the service's admins;
- without peer credentials (the TCP listener), a bearer token is required, compared in
  constant time; the caller is then the server's own uid, as an admin. With no token
  configured, such requests are refused. Wrong tokens are limited per client key
  (:mod:`fgpu.server.guesses`): a client past the limit gets 429 with ``Retry-After``,
  its token not looked at. Only ``/v1/healthz`` and ``/v1/readyz`` answer
  without it; the
  OpenAPI document (``/openapi.json``), ``/docs``, ``/metrics`` (Prometheus) and the
  dashboard (``/ui``, :mod:`fgpu.server.dashboard`) need it too.

Every refusal has the body ``{"detail": {"field": ..., "reason": ...}}``: service refusals
(:class:`fgpu.rules.errors.ServiceError`) with their status, request validation errors
(malformed JSON, wrong types, unknown fields) with 422, a missing or wrong token with 401,
a client over the limit of wrong tokens with 429.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal, Protocol

from fastapi import (
    APIRouter,
    Depends,
    FastAPI,
    Header,
    HTTPException,
    Path,
    Query,
    Request,
    Response,
)
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from fgpu import __version__
from fgpu.log_files import PLAIN_LOGS, read_log, read_stream
from fgpu.metrics import CONTENT_TYPE, Exporter
from fgpu.rules.errors import BadRequest, ServiceError, Unavailable
from fgpu.rules.names import ECHO_LENGTH, shorten
from fgpu.server.dashboard import SESSION_COOKIE, mount_dashboard, session_valid
from fgpu.server.guesses import GuessThrottle
from fgpu.server.idempotent import check_one_key
from fgpu.server.listing import (
    BRIEF_COMMAND_CHARS,
    DEFAULT_PAGE,
    MAX_PAGE,
    SKIPPED_IDS_SHOWN,
    ListingAnswer,
)
from fgpu.server.service import Caller
from fgpu.store.errors import RowDamaged, StoreUnwritable
from fgpu.store.idempotency import KEY_TTL_S
from fgpu.store.schema import ID_LENGTH, IDEMPOTENCY_KEY_LENGTH, NAME_LENGTH
from fgpu.wire import (
    API_PREFIX,
    LOG_OFFSET_HEADER,
    NEXT_CURSOR_HEADER,
    SKIPPED_ROWS_HEADER,
    ErrorResponse,
    EventView,
    Health,
    NodeView,
    QueueBody,
    QueueView,
    SubmitRequest,
    WorkloadDetail,
    WorkloadView,
)
from fgpu.wire_basics import IDEMPOTENCY_HEADER

PEER_UID = "fgpu.peer_uid"
"""ASGI scope key holding the uid of the process on the other end of a Unix socket."""
CLIENT_KEY = "fgpu.client_key"
"""ASGI scope key holding what the connection is counted under (``uid 1001`` on the Unix
socket and for a local TCP client's socket, else ``address 192.0.2.7``;
:func:`fgpu.server.connlimit.peer_of`): never an identity, only the key of the limits."""

LOG_CHUNK_MAX = 8 * 2**20
"""Most log bytes one ``GET .../logs`` answers (the client asks again from the next offset)."""

MAX_CURSOR = 200
"""Longest cursor text a request may give (one is a time and an id)."""

MAX_ID = 2**63 - 1
"""Largest event id and log offset a request may name (a signed 64-bit integer, what the
store's columns and file offsets hold)."""

_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})


class ServiceApi(Protocol):
    """What the routes need from :class:`fgpu.server.service.Service` (tests pass fakes)."""

    admins: frozenset[int]

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def submit(
        self, caller: Caller, body: SubmitRequest, idempotency_key: str | None = None
    ) -> WorkloadView: ...
    def list_workloads(self, include_done: bool = False) -> list[WorkloadView]: ...
    def workload_page(
        self,
        caller: Caller,
        *,
        include_done: bool = False,
        mine: bool = False,
        limit: int | None = None,
        cursor: str | None = None,
        brief: bool = False,
    ) -> ListingAnswer: ...
    def get_workload(self, workload_id: str, caller: Caller | None = None) -> WorkloadDetail: ...
    def cancel(self, caller: Caller, workload_id: str, *, now: bool = False) -> WorkloadView: ...
    def log_path(self, caller: Caller, workload_id: str, stream: str) -> FilePath: ...
    def list_queues(self) -> list[QueueView]: ...
    def create_queue(self, caller: Caller, body: QueueBody) -> QueueView: ...
    def update_queue(self, caller: Caller, name: str, body: QueueBody) -> QueueView: ...
    def delete_queue(self, caller: Caller, name: str) -> None: ...
    def nodes(self) -> list[NodeView]: ...
    def events(
        self,
        after_id: int | None = None,
        limit: int = 1000,
        caller: Caller | None = None,
        all_users: bool = False,
    ) -> list[EventView]: ...
    def change_token(self) -> tuple[object, ...]: ...


def _refusal(status: int, field: str, reason: str) -> Any:
    return JSONResponse({"detail": {"field": field, "reason": reason}}, status_code=status)


def echo(value: object) -> str:
    """A refused value as a reason echoes it: a string quoted and shortened when long
    (:func:`fgpu.rules.names.shorten`), another value as JSON would write it, shortened
    the same way (``10001``, ``'abc…' (256 characters)``)."""
    if isinstance(value, str):
        return shorten(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return repr(value)
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) <= ECHO_LENGTH:
        return text
    return f"{text[:ECHO_LENGTH]}… ({len(text)} characters as JSON)"


def field_of(location: Sequence[int | str]) -> str:
    """Dotted field name of a pydantic error location, without FastAPI's ``body``/``query``
    prefix: ``("body", "command", 0)`` -> ``"command.0"``; ``("body",)`` -> ``"body"``."""
    parts = [str(p) for p in location]
    if len(parts) > 1 and parts[0] in _LOCATIONS:
        parts = parts[1:]
    return ".".join(parts) or "body"


def _install_error_handlers(app: FastAPI) -> None:
    async def service_error(request: Request, exc: Exception) -> Any:
        assert isinstance(exc, ServiceError)
        answer = _refusal(exc.status, exc.field, exc.reason)
        if isinstance(exc, Unavailable):
            answer.headers["Retry-After"] = str(exc.retry_after_s)
        return answer

    async def row_damaged(request: Request, exc: Exception) -> Any:
        assert isinstance(exc, RowDamaged)
        return _refusal(409, "id", str(exc))

    async def validation_error(request: Request, exc: Exception) -> Any:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        if not errors:
            return _refusal(422, "body", "invalid request")
        first = errors[0]
        field = field_of(first.get("loc", ()))
        reason = str(first.get("msg", "invalid value"))
        if first.get("type") != "missing" and "input" in first:
            reason = f"{echo(first['input'])}: {reason}"
        if first.get("type") == "json_invalid":
            field = "body"
            reason = f"malformed JSON: {first.get('ctx', {}).get('error', reason)}"
        if len(errors) > 1:
            reason += f" (and {len(errors) - 1} more)"
        return _refusal(422, field, reason)

    async def http_error(request: Request, exc: Exception) -> Any:
        assert isinstance(exc, StarletteHTTPException)
        detail: Any = exc.detail
        if exc.status_code == 400:
            # FastAPI's answer to a body it cannot decode (not UTF-8, not JSON): the routes
            # list 422 for every malformed body, so that is what it gets
            return _refusal(422, "body", f"malformed JSON: {detail} (UTF-8 JSON expected)")
        if exc.status_code == 405:
            allowed = allowed_methods(request)
            reason = f"{request.method} is not allowed here; allowed: {', '.join(allowed)}"
            return JSONResponse(
                {"detail": {"field": "method", "reason": reason}},
                status_code=405,
                headers={"Allow": ", ".join(allowed)},
            )
        if exc.status_code == 401 and request.url.path in ("/ui", "/ui/"):
            return RedirectResponse("/ui/login", status_code=303)  # a browser: type the token
        if not (isinstance(detail, dict) and {"field", "reason"} <= detail.keys()):
            detail = {"field": "path" if exc.status_code == 404 else "", "reason": detail}
        return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)

    async def store_unwritable(request: Request, exc: Exception) -> Any:
        assert isinstance(exc, StoreUnwritable)
        return _refusal(507, "store", exc.cause)

    async def internal_error(request: Request, exc: Exception) -> Any:
        # Starlette raises the exception again after this answer, and uvicorn logs it.
        return _refusal(500, "", f"internal error ({type(exc).__name__}); see the server log")

    app.add_exception_handler(ServiceError, service_error)
    app.add_exception_handler(StoreUnwritable, store_unwritable)
    app.add_exception_handler(RowDamaged, row_damaged)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path (the ``Allow`` header of a 405,
    RFC 9110 section 15.5.6); Starlette's own names only the first matching route's. Each
    method is tried against every route through the public ``matches`` contract (included
    routers answer it too)."""
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


async def current_caller(request: Request) -> Caller:
    """Who calls: the peer uid on the Unix socket, else the bearer token's owner. ``async``
    though it never waits: FastAPI runs a plain ``def`` dependency in a worker thread, a
    thread hop per request for a few dictionary reads.

    Raises:
        HTTPException: 401 without peer credentials and without the right token.
    """
    settings: _Settings = request.app.state.fgpu
    uid = request.scope.get(PEER_UID)
    if isinstance(uid, int):
        if settings.server_uid != 0 and uid not in (0, settings.server_uid):
            # a server that is not root runs every workload as its own user: serving another
            # user would let them run commands as this one
            raise HTTPException(
                403,
                {
                    "field": "caller",
                    "reason": f"this server runs as uid {settings.server_uid} and serves only "
                    f"that user (uid {uid} asked); run fgpu serve as root to share a machine",
                },
            )
        return Caller(uid=uid, admin=settings.is_admin(uid))
    unauthorized = {"WWW-Authenticate": "Bearer"}
    session = request.cookies.get(SESSION_COOKIE)
    if (
        session is not None
        and settings.token is not None
        and request.method == "GET"
        and request.url.path.startswith("/ui")
        and "authorization" not in request.headers
        and session_valid(session, settings.token)
    ):  # the dashboard's cookie (unexpired): read-only pages only
        return Caller(uid=settings.token_uid, admin=settings.is_admin(settings.token_uid))
    if settings.token is None:
        closed = {"field": "authorization", "reason": "this server answers only on its Unix socket"}
        raise HTTPException(401, closed, unauthorized)
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        missing = {"field": "authorization", "reason": "a bearer token is required"}
        raise HTTPException(401, missing, unauthorized)
    client = client_key(request)
    wait = settings.guesses.check(settings.account, client)
    if wait is not None:  # refused before the token is looked at
        limited = {"field": "authorization", "reason": wait.reason}
        raise HTTPException(429, limited, {"Retry-After": str(wait.seconds)})
    if not hmac.compare_digest(given.strip().encode(), settings.token):
        settings.guesses.failed(settings.account, client)
        raise HTTPException(401, {"field": "authorization", "reason": "wrong token"}, unauthorized)
    settings.guesses.succeeded(settings.account, client)
    return Caller(uid=settings.token_uid, admin=settings.is_admin(settings.token_uid))


def client_key(request: Request) -> str:
    """What a request's failed tokens count under: its connection's
    :data:`CLIENT_KEY`, else ``uid N`` for a Unix socket peer, else ``address HOST``."""
    key = request.scope.get(CLIENT_KEY)
    if isinstance(key, str):
        return key
    uid = request.scope.get(PEER_UID)
    if isinstance(uid, int):
        return f"uid {uid}"
    return f"address {request.client.host if request.client is not None else '?'}"


CallerDep = Annotated[Caller, Depends(current_caller)]
WorkloadId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=max(ID_LENGTH, NAME_LENGTH),
        description="the workload's id, a unique prefix of it, or its name",
    ),
]
QueueName = Annotated[
    str, Path(min_length=1, max_length=NAME_LENGTH, description="the queue's name")
]


@dataclass(frozen=True)
class _Settings:
    service: ServiceApi
    token: bytes | None
    server_uid: int
    token_uid: int
    guesses: GuessThrottle = field(default_factory=GuessThrottle)
    """Wrong tokens (API and dashboard login together) per (account, client key)."""

    @property
    def account(self) -> str:
        """The account a token logs in as (the token user's uid; one per server)."""
        return f"uid {self.token_uid}"

    def is_admin(self, uid: int) -> bool:
        """Root, the server's own user and the configured admins manage everything."""
        return uid in (0, self.server_uid) or uid in self.service.admins


MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body (a submission's command and environment are limited to 1 MiB)."""


class BodyLimit:
    """ASGI middleware: a request body above ``limit`` bytes gets 413 (field ``body``) before
    it is read into memory: at once when ``Content-Length`` says so, else as soon as the
    received chunks pass the limit (the application then sees the client disconnect, and
    whatever it answers is dropped)."""

    def __init__(self, app: Any, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(send)
            return
        seen = 0
        refused = False

        async def limited() -> Any:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    refused = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Any) -> None:
            if not refused:
                await send(message)

        await self.app(scope, limited, guarded)

    async def _refuse(self, send: Any) -> None:
        reason = f"the request body is larger than {self.limit} bytes"
        response = JSONResponse({"detail": {"field": "body", "reason": reason}}, status_code=413)
        await response({"type": "http"}, _no_body, send)


async def _no_body() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def create_app(
    service: ServiceApi,
    *,
    token: str | None = None,
    server_uid: int | None = None,
    token_uid: int | None = None,
) -> FastAPI:
    """The API application over ``service``.

    Identity: on the Unix socket the caller is the peer's uid. A server that is not root
    serves only its own user and root (403 ``caller`` for anyone else). With a token (TCP)
    the caller is ``token_uid``. Root, the server's user and the service's admins are
    admins.

    Args:
        service: the use-cases; started and stopped by the application's lifespan.
        token: bearer token for requests without peer credentials (TCP); None refuses them.
        server_uid: the uid the server runs as (default: this process's effective uid).
        token_uid: the uid a token caller acts as (default: ``server_uid``).
    """
    own_uid = os.geteuid() if server_uid is None else server_uid
    as_uid = own_uid if token_uid is None else token_uid
    secret = token.encode() if token else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(
        title="fgpu",
        version=__version__,
        summary="Fractional GPU sharing on one machine",
        lifespan=lifespan,
        # served below behind the caller check: on TCP only /v1/healthz answers without the
        # token
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.fgpu = _Settings(service, secret, own_uid, as_uid)
    app.add_middleware(BodyLimit)
    _install_error_handlers(app)

    refusals: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorResponse} for code in (401, 403, 404, 409, 422, 429, 507)
    }
    too_large: dict[int | str, dict[str, Any]] = {
        413: {"model": ErrorResponse, "description": f"the body is over {MAX_BODY_BYTES} bytes"}
    }
    open_routes = APIRouter(prefix=API_PREFIX, tags=["health"])
    api = APIRouter(prefix=API_PREFIX, dependencies=[Depends(current_caller)], responses=refusals)

    unhealthy: dict[int | str, dict[str, Any]] = {
        503: {
            "model": ErrorResponse,
            "description": "the service cannot store its work now (field store: the cause)",
        }
    }

    busy: dict[int | str, dict[str, Any]] = {
        503: {
            "model": ErrorResponse,
            "description": "too many listings at once, or of the caller's uid at once (field "
            "listing; Retry-After says when to try again)",
        }
    }

    def check_health() -> None:
        problem = getattr(service, "health_problem", None)
        cause = problem() if callable(problem) else None
        if cause is not None:
            raise HTTPException(503, {"field": "store", "reason": cause})

    @open_routes.get("/healthz", responses=unhealthy)
    def healthz(request: Request) -> Health:
        """The server answers and can store its work (503 with the cause when its database
        cannot write or its state disk is full); shows the caller's uid as the server sees
        it."""
        check_health()
        uid = request.scope.get(PEER_UID)
        settings: _Settings = request.app.state.fgpu
        return Health(
            version=__version__,
            server_uid=own_uid,
            caller_uid=uid if isinstance(uid, int) else None,
            caller_admin=settings.is_admin(uid) if isinstance(uid, int) else None,
        )

    @open_routes.get("/readyz", responses=unhealthy)
    def readyz() -> dict[str, bool]:
        """Ready to take work: ``{"ready": true}``, or 503 with the cause (as ``healthz``)."""
        check_health()
        return {"ready": True}

    @api.get("/workloads", tags=["workloads"], response_model=list[WorkloadView], responses=busy)
    def list_workloads(
        caller: CallerDep,
        include_done: Annotated[
            bool, Query(alias="all", description="also finished workloads")
        ] = False,
        mine: Annotated[
            bool,
            Query(
                description="only the caller's workloads and others' running ones (others' "
                "pending work left out), what fgpu ls shows by default"
            ),
        ] = False,
        limit: Annotated[
            int,
            Query(
                ge=1,
                le=MAX_PAGE,
                description=f"at most this many (a page; {DEFAULT_PAGE} unless given: one "
                "answer never holds every workload of a large backlog)",
            ),
        ] = DEFAULT_PAGE,
        cursor: Annotated[
            str | None,
            Query(
                max_length=MAX_CURSOR,
                description=f"the next page after the one whose {NEXT_CURSOR_HEADER} "
                "header gave this",
            ),
        ] = None,
        brief: Annotated[
            bool,
            Query(
                description=f"each command cut to {BRIEF_COMMAND_CHARS} characters in all "
                "(the last argument kept ending in ...): what fgpu ls's table needs"
            ),
        ] = False,
    ) -> Response:
        """Workloads, oldest first; active ones unless ``all=true``, a page of at most
        ``limit``: the header ``X-Fgpu-Next-Cursor`` (absent on the last page) is the
        ``cursor`` of the next. A page also ends before the workload that would make it
        longer than the server's byte budget (``fgpu serve --listing-max-bytes``, 8 MiB).
        Rows of the store that cannot be decoded are left out and named in the header
        ``X-Fgpu-Skipped-Rows`` (JSON: ``{"count": N, "ids": [...]}``). 503 with
        ``Retry-After`` when too many listings are made at once, or the caller already has
        their share (one made and two waiting per uid)."""
        answer = service.workload_page(
            caller,
            include_done=include_done,
            mine=mine,
            limit=limit,
            cursor=cursor,
            brief=brief,
        )
        headers = {}
        if answer.cursor is not None:
            headers[NEXT_CURSOR_HEADER] = answer.cursor
        if answer.skipped:
            headers[SKIPPED_ROWS_HEADER] = json.dumps(
                {"count": len(answer.skipped), "ids": answer.skipped[:SKIPPED_IDS_SHOWN]}
            )
        headers["content-length"] = str(answer.size)

        async def pieces() -> AsyncIterator[bytes]:  # in the event loop: no thread per piece
            for piece in answer.drain():
                yield piece

        return StreamingResponse(pieces(), media_type="application/json", headers=headers)

    @api.post("/workloads", status_code=201, tags=["workloads"], responses=too_large)
    def submit(
        request: Request,
        body: SubmitRequest,
        caller: CallerDep,
        idempotency_key: Annotated[
            str | None,
            Header(
                alias=IDEMPOTENCY_HEADER,
                min_length=1,
                max_length=IDEMPOTENCY_KEY_LENGTH,
                description="makes the submission idempotent for the caller: a retry with the "
                "same key and body gets the workload the first one created (kept "
                f"{KEY_TTL_S / 3600:g} hours); the same key with another body gets 422",
            ),
        ] = None,
    ) -> WorkloadView:
        """Submit a workload owned by the caller."""
        check_one_key(request.headers.getlist(IDEMPOTENCY_HEADER))
        return service.submit(caller, body, idempotency_key)

    @api.get("/workloads/{workload_id}", tags=["workloads"])
    def get_workload(workload_id: WorkloadId, caller: CallerDep) -> WorkloadDetail:
        """One workload: request, placement, events and, while pending, why it waits."""
        return service.get_workload(workload_id, caller)

    @api.post("/workloads/{workload_id}/cancel", tags=["workloads"])
    def cancel(workload_id: WorkloadId, caller: CallerDep, now: bool = False) -> WorkloadView:
        """Cancel a workload (the caller's own, or any as an admin). ``now=true``: a running
        one gets SIGKILL at once instead of SIGTERM and its grace period (also one already
        stopping)."""
        return service.cancel(caller, workload_id, now=now)

    @api.get(
        "/workloads/{workload_id}/logs",
        tags=["workloads"],
        response_class=Response,
        responses={200: {"content": {"application/octet-stream": {}}}},
    )
    def logs(
        workload_id: WorkloadId,
        caller: CallerDep,
        stream: Literal["stdout", "stderr", "all"] = "stdout",
        offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
        limit: Annotated[int, Query(ge=1, le=LOG_CHUNK_MAX)] = LOG_CHUNK_MAX,
    ) -> Response:
        """Log bytes from ``offset`` (at most ``limit``); the header ``X-Fgpu-Log-Offset``
        is the offset to ask for next. Empty while the workload has not written anything.
        ``stream=all``: both streams in the order written, as records (stream, time, bytes;
        the format is in ``fgpu.wire_logs``); a chunk may end inside a record. ``stdout``
        and ``stderr`` are read back from that log (output is stored once): their offset is
        a cursor, 0 or what the header gave."""
        path = service.log_path(caller, workload_id, stream)
        data, next_offset = read_from(path, offset, limit)
        return Response(
            data,
            media_type="application/octet-stream",
            headers={LOG_OFFSET_HEADER: str(next_offset)},
        )

    @api.get("/queues", tags=["queues"])
    def list_queues() -> list[QueueView]:
        """Every queue with quota, limit, fair share and use."""
        return service.list_queues()

    @api.post("/queues", status_code=201, tags=["queues"], responses=too_large)
    def create_queue(body: QueueBody, caller: CallerDep) -> QueueView:
        """Create a queue (admins)."""
        return service.create_queue(caller, body)

    @api.put("/queues/{name}", tags=["queues"], responses=too_large)
    def update_queue(name: QueueName, body: QueueBody, caller: CallerDep) -> QueueView:
        """Replace a queue's settings (admins); the body's name must be the path's."""
        if body.name != name:
            raise BadRequest("name", f"the body names {body.name!r}, the path {name!r}")
        return service.update_queue(caller, name, body)

    @api.delete("/queues/{name}", status_code=204, tags=["queues"])
    def delete_queue(name: QueueName, caller: CallerDep) -> Response:
        """Remove an empty queue (admins)."""
        service.delete_queue(caller, name)
        return Response(status_code=204)

    @api.get("/nodes", tags=["nodes"])
    def nodes() -> list[NodeView]:
        """Nodes and their GPUs with the shares each holds, and live use where known."""
        return service.nodes()

    @api.get("/events", tags=["events"])
    def events(
        caller: CallerDep,
        after: Annotated[
            int | None, Query(ge=0, le=MAX_ID, description="only events after this id")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1000,
        all_users: Annotated[
            bool,
            Query(
                description="everyone's workloads' events; without it a caller who is not an "
                "admin gets those of their own workloads and of no workload"
            ),
        ] = False,
    ) -> list[EventView]:
        """Events, oldest first, at most ``limit``; page on with ``after`` = the last id.
        Like events of one workload close together come as one with a ``count``."""
        return service.events(after, limit, caller, all_users)

    app.include_router(open_routes)
    app.include_router(api)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(current_caller)])
    def openapi_document() -> dict[str, Any]:
        """The OpenAPI document (the caller must be known, as for ``/v1``)."""
        return app.openapi()

    exporter = getattr(service, "metrics", None)
    if isinstance(exporter, Exporter):

        @app.get("/metrics", include_in_schema=False, dependencies=[Depends(current_caller)])
        def metrics() -> Response:
            """Prometheus series (``fgpu_*``, :mod:`fgpu.server.metrics`)."""
            return Response(exporter.exposition(), media_type=CONTENT_TYPE)

    mount_dashboard(app, service)

    @app.get("/docs", include_in_schema=False, dependencies=[Depends(current_caller)])
    def docs() -> HTMLResponse:
        """Swagger UI over the document (a browser on TCP must send the token itself)."""
        return get_swagger_ui_html(openapi_url="/openapi.json", title="fgpu API")

    _build_routes(app)
    return app


def _build_routes(app: FastAPI) -> None:
    """Have FastAPI build what it keeps per route (the body and parameter models) now, not on
    the first request: an included router builds them for all its routes at its first match,
    which made the first request after a start take 0.2-0.8 s (``bench/service.py``,
    ``first_submission_ms``). A path no route has walks every router without running any."""
    probe: dict[str, Any] = {
        "type": "http",
        "method": "GET",
        "path": "/\x00",
        "root_path": "",
        "headers": [],
        "query_string": b"",
    }
    for route in app.router.routes:
        route.matches(dict(probe))


def read_from(path: FilePath, offset: int, limit: int) -> tuple[bytes, int]:
    """At most ``limit`` bytes of the log ``path`` from ``offset``, and the offset to read
    next (:func:`fgpu.log_files.read_log`: a capped log's head and tail, and the notice of
    the cut where bytes were dropped).

    A missing file reads as empty. When the log is shorter than ``offset`` (it was started
    again), the next offset is its current end, so a follower goes on with new output.

    ``stdout.log`` or ``stderr.log`` that the wrapper did not write (it writes each stream
    once, into the framed ``output.log`` beside them) is read from the framed log
    (:func:`fgpu.log_files.read_stream`; the offset is then a cursor that answer gives).
    """
    stream = PLAIN_LOGS.get(path.name)
    if stream is not None and not path.exists():
        return read_stream(path.with_name("output.log"), stream, offset, limit)
    return read_log(path, offset, limit)
