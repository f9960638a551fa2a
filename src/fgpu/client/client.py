"""Typed HTTP client of the fgpu API (``/v1``), over the Unix socket or TCP with a token.

Every method returns wire models (:mod:`fgpu.wire`); a refusal from the server is raised as
:class:`ClientError` with the status, the field and the reason the server gave; a server
that cannot be reached is :class:`ServerUnavailable`, whose message says how to start one.

The wire models (pydantic) are loaded by the first method that returns one; the ``*_plain``
methods (``fgpu ls``, ``submit``, ``describe``, ``logs``, ``cancel``, ``top``) need none
(:mod:`fgpu.client.plain`). On
the Unix socket the requests go through the standard library (:mod:`http.client`, one
connection kept between requests: :class:`fgpu.client.transport.UnixSession`), which a short
command loads in a fraction of httpx's time; over
TCP (and TLS) and with an injected transport they go through httpx. Both give the same
answers and the same errors.
"""

from __future__ import annotations

import http.client
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar
from urllib.parse import urlencode

from fgpu.addresses import SOCKET_ENV, SYSTEM_SOCKET, default_socket_path
from fgpu.client.plain import (
    PlainNodeView,
    PlainWorkloadDetail,
    PlainWorkloadView,
    plain_list,
    plain_of,
    plain_workloads,
)
from fgpu.client.transport import Answer, ConnectFailed, UnixSession
from fgpu.wire_basics import (
    API_PREFIX,
    IDEMPOTENCY_HEADER,
    LOG_OFFSET_HEADER,
    NEXT_CURSOR_HEADER,
    SKIPPED_ROWS_HEADER,
)

PAGE = 1000
"""Workloads the client asks for per page of a listing."""

if TYPE_CHECKING:
    import httpx
    from pydantic import BaseModel, TypeAdapter

    from fgpu.wire import (
        EventView,
        Health,
        NodeView,
        QueueBody,
        QueueView,
        SubmitRequest,
        WorkloadDetail,
        WorkloadView,
    )

DEFAULT_TIMEOUT_S = 30.0
USER_AGENT = "fgpu-client"

T = TypeVar("T")


class ClientError(Exception):
    """The server refused a request (status 4xx/5xx), or could not be reached (status 0).

    Attributes:
        status: HTTP status, 0 when no answer came.
        field: the request field concerned ("" when none).
        reason: why, as the server said it.
        answer_lost: the request was sent (or may have been) but its answer never came (the
            connection broke, or no answer within the timeout): the server may have acted
            on it. False when it surely did not (no connection, or a refusal).
    """

    def __init__(self, status: int, field: str, reason: str, *, answer_lost: bool = False) -> None:
        self.status = status
        self.field = field
        self.reason = reason
        self.answer_lost = answer_lost
        super().__init__(f"{field}: {reason}" if field else reason)


class ServerUnavailable(ClientError):
    """No server answers at the address."""

    def __init__(self, reason: str, *, answer_lost: bool = False) -> None:
        super().__init__(0, "", reason, answer_lost=answer_lost)


def resolve_socket(
    socket: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    uid: int | None = None,
    system: Path = SYSTEM_SOCKET,
) -> Path:
    """The socket to call: ``socket`` if given, else ``$FGPU_SOCKET``, else this user's
    default (:func:`fgpu.addresses.default_socket_path` for ``uid``) when a socket is there
    and it and its folder belong to the user or to root, else the system server's socket
    (``system``) when that one is there or this user's default belongs to someone else, else
    this user's default.

    Another user can create ``/tmp/fgpu-UID/`` before its user does and serve there; such a
    default is skipped (see :func:`foreign_default`), so that it cannot shadow the system
    server. A socket named explicitly is used as given (a submission to one that belongs to
    another user is still refused, :meth:`Client.submit`)."""
    env = os.environ if env is None else env
    if socket:
        return Path(socket)
    if env.get(SOCKET_ENV):
        return Path(env[SOCKET_ENV])
    own = default_socket_path(env, uid)
    if foreign_default(own, uid) is not None:
        return system
    if not own.exists() and system.exists():
        return system
    return own


def foreign_default(own: Path, uid: int | None = None) -> str | None:
    """Why the default socket ``own`` is not this user's (``uid``, default the effective
    uid), or None: the socket or its folder exists and belongs to another user than the
    user and root (``'/tmp/fgpu-1001 belongs to uid 1002'``)."""
    uid = os.geteuid() if uid is None else uid
    for path in (own.parent, own):
        try:
            owner = path.lstat().st_uid
        except OSError:
            continue
        if owner not in (0, uid):
            return f"{path} belongs to uid {owner}"
    return None


def _check_url(url: str) -> None:
    """Refuse a server URL that is not ``http(s)://HOST[:PORT]``.

    Raises:
        ClientError: field ``url`` (status 0), the reason echoing no more than httpx says.
    """
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ClientError(0, "url", f"not a valid URL ({exc})") from None
    if parsed.scheme not in ("http", "https"):
        raise ClientError(0, "url", "must start with http:// or https://")
    if not parsed.host:
        raise ClientError(0, "url", "names no host (http://HOST:PORT)")


class Client:
    """The API client.

    Args:
        socket: Unix socket path (see :func:`resolve_socket` when None and no ``base_url``).
        base_url: ``http://HOST:PORT`` of a server's TCP listener instead of the socket.
        token: bearer token for ``base_url``.
        timeout: seconds to wait for an answer.
        transport: an httpx transport to use instead (tests).

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        socket: str | Path | None = None,
        *,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._headers = {"user-agent": USER_AGENT}
        self._timeout = timeout
        self.skipped_rows: dict[str, None] = {}
        """Ids of damaged store rows the server left out of the latest listing (the
        ``X-Fgpu-Skipped-Rows`` header of its pages), in the order named."""
        self.skipped_count = 0
        """How many damaged rows the latest listing's pages said they left out."""
        self._http: httpx.Client | None = None
        self._socket: Path | None = None
        self._session: UnixSession | None = None
        if base_url:
            _check_url(base_url)
            self.address = base_url.rstrip("/")
            root = self.address
            if token:
                self._headers["authorization"] = f"Bearer {token}"
            self._start_hint = f"no fgpu server answers at {self.address}"
        else:
            path = resolve_socket(socket)
            self.address = str(path)
            root = "http://fgpu"
            self._socket = path
            self._start_hint = f"no fgpu server at {path}; start one with `fgpu serve`"
            if not socket and not os.environ.get(SOCKET_ENV):
                skipped = foreign_default(default_socket_path())
                if skipped is not None:
                    self._start_hint += f" (skipped the default socket: {skipped})"
            if path.exists() and not os.access(path, os.W_OK):
                self._start_hint = f"no permission to use the fgpu socket {path}"
            if transport is None:  # the standard library's HTTP over the socket
                self._session = UnixSession(str(path), timeout)
                return
        import httpx

        if transport is None and root.startswith("http://"):
            # plain HTTP: no TLS, so no certificate store to load (most of a short
            # command's time)
            transport = httpx.HTTPTransport(verify=False)
        self._http = httpx.Client(
            base_url=root + API_PREFIX, headers=self._headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        """Close the kept connection (on the socket) or the connection pool (httpx)."""
        if self._http is not None:
            self._http.close()
        if self._session is not None:
            self._session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -------------------------------------------------------------------- plumbing
    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """One request to ``/v1{path}``; a refusal (4xx/5xx) is raised as :class:`ClientError`.

        Raises:
            ServerUnavailable: nothing answers (no socket, refused, no permission, the
                connection broke before an answer).
            ClientError: status 0 when the server did not answer within the timeout.
        """
        if self._http is None:
            answer = self._unix_request(method, path, params, json, headers or {})
        else:
            answer = self._httpx_request(method, path, params, json, headers or {})
        if answer.status_code >= 400:
            raise _refusal(answer)
        return answer

    def _timed_out(self, *, answer_lost: bool = True) -> ClientError:
        return ClientError(
            0,
            "",
            f"the fgpu server at {self.address} did not answer in time",
            answer_lost=answer_lost,
        )

    def _httpx_request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str | int] | None,
        body: Any,
        headers: Mapping[str, str],
    ) -> Answer:
        import httpx

        assert self._http is not None
        try:
            response = self._http.request(
                method, path, params=params, json=body, headers=dict(headers)
            )
        except httpx.ConnectError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, PermissionError):
                raise ServerUnavailable(
                    f"no permission to use the fgpu socket {self.address}"
                ) from None
            raise ServerUnavailable(self._start_hint) from None
        except httpx.ConnectTimeout:
            raise self._timed_out(answer_lost=False) from None
        except httpx.TimeoutException:
            raise self._timed_out() from None
        except httpx.TransportError as exc:
            raise ServerUnavailable(f"{self._start_hint} ({exc})", answer_lost=True) from None
        return Answer(
            response.status_code,
            response.reason_phrase,
            {name.lower(): value for name, value in response.headers.items()},
            response.content,
        )

    def _unix_request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str | int] | None,
        body: Any,
        headers: Mapping[str, str],
    ) -> Answer:
        """The request over the Unix socket with :mod:`http.client`, its failures mapped as
        httpx's are in :meth:`_httpx_request` (httpcore: an ``OSError`` while connecting is
        a connect error, a timeout anywhere is a timeout, any other failure a transport
        error)."""
        assert self._session is not None
        target = API_PREFIX + path + (f"?{urlencode(params)}" if params else "")
        try:
            return self._session.exchange(method, target, {**self._headers, **headers}, body)
        except ConnectFailed as exc:
            if isinstance(exc.__cause__, TimeoutError):
                raise self._timed_out(answer_lost=False) from None
            if isinstance(exc.__cause__, PermissionError):
                raise ServerUnavailable(
                    f"no permission to use the fgpu socket {self.address}"
                ) from None
            raise ServerUnavailable(self._start_hint) from None
        except TimeoutError:
            raise self._timed_out() from None
        except http.client.RemoteDisconnected:  # httpx's words for it
            raise ServerUnavailable(
                f"{self._start_hint} (Server disconnected without sending a response.)",
                answer_lost=True,
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise ServerUnavailable(f"{self._start_hint} ({exc})", answer_lost=True) from None

    def _json(
        self,
        method: str,
        path: str,
        kind: type[T],
        *,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> T:
        answer = self._request(method, path, params=params, json=json, headers=headers)
        return _parsed(answer, lambda data: _adapter(kind).validate_python(data))

    @staticmethod
    def _body(model: BaseModel) -> dict[str, Any]:
        for name, value in model.model_dump().items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ClientError(422, name, f"must be a finite number (got {value})")
        return model.model_dump(mode="json")

    # ------------------------------------------------------------------ use-cases
    def health(self) -> Health:
        """``GET /v1/healthz``."""
        from fgpu.wire import Health

        return self._json("GET", "/healthz", Health)

    def submit(self, request: SubmitRequest, *, idempotency_key: str | None = None) -> WorkloadView:
        """Submit a workload; raises :class:`ClientError` (422) with the field when invalid.

        A submission carries the command and its environment (which may hold secrets), so on
        a Unix socket it goes only to a socket owned by this user or by root: anyone may
        create a socket where another user's server would be (``/tmp/fgpu-UID``).

        Every submission carries an ``Idempotency-Key`` (``idempotency_key``, else a new
        random UUID); when its answer is lost (the connection broke after the request went
        out, or no answer came in time) it is sent once more with the same key, so the
        server stores it at most once and the retry gets the workload the first one made.

        Raises:
            ClientError: field ``socket`` when the socket belongs to another user; the
                retry's error when that one fails too.
        """
        import uuid

        from fgpu.wire import WorkloadView

        self._check_socket_owner()
        headers = {IDEMPOTENCY_HEADER: idempotency_key or str(uuid.uuid4())}
        body = self._body(request)
        try:
            return self._json("POST", "/workloads", WorkloadView, json=body, headers=headers)
        except ClientError as exc:
            if not exc.answer_lost:
                raise
        return self._json("POST", "/workloads", WorkloadView, json=body, headers=headers)

    def submit_plain(
        self, body: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> PlainWorkloadView:
        """:meth:`submit` of a request body as JSON values (the fields of
        :class:`fgpu.wire.SubmitRequest`, which the server checks), answered as a
        :class:`~fgpu.client.plain.PlainWorkloadView`; neither side loads pydantic here.
        Sent with an ``Idempotency-Key`` and once more on a lost answer, as :meth:`submit`.

        Raises:
            ClientError: field ``socket`` as :meth:`submit`; 422 naming a field whose value
                the server refuses, or a number that is not finite (JSON has none); the
                retry's error when that one fails too.
        """
        import uuid

        for name, value in body.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ClientError(422, name, f"must be a finite number (got {value})")
        self._check_socket_owner()
        headers = {IDEMPOTENCY_HEADER: idempotency_key or str(uuid.uuid4())}
        try:
            answer = self._request("POST", "/workloads", json=dict(body), headers=headers)
        except ClientError as exc:
            if not exc.answer_lost:
                raise
            answer = self._request("POST", "/workloads", json=dict(body), headers=headers)
        return _parsed(answer, lambda data: plain_of(PlainWorkloadView, data))

    def _check_socket_owner(self) -> None:
        if self._socket is None:
            return
        try:
            owner = self._socket.stat().st_uid
        except OSError:
            return  # nothing there: the request reports that no server answers
        if owner not in (0, os.geteuid()):
            raise ClientError(
                0,
                "socket",
                f"refusing to send the command and its environment to {self._socket}: the "
                f"socket belongs to uid {owner}, neither you (uid {os.geteuid()}) nor root",
            )

    def list_workloads(
        self, include_done: bool = False, *, mine: bool = False
    ) -> list[WorkloadView]:
        """Active workloads (all with ``include_done``), oldest first, read a page of
        :data:`PAGE` at a time. ``mine``: only the caller's and others' running ones.
        Damaged rows the server left out are in :attr:`skipped_rows` afterwards."""
        from fgpu.wire import WorkloadView

        adapter = _adapter(list[WorkloadView])
        return [
            view
            for answer in self._workload_pages(include_done, mine)
            for view in _parsed(answer, adapter.validate_python)
        ]

    def list_workloads_plain(
        self, include_done: bool = False, *, mine: bool = False, brief: bool = False
    ) -> list[PlainWorkloadView]:
        """:meth:`list_workloads` as :class:`fgpu.client.plain.PlainWorkloadView` objects (the
        same fields), read without pydantic when the answer is well typed. ``brief``: each
        command cut short by the server (what a table shows)."""
        return [
            view
            for answer in self._workload_pages(include_done, mine, brief)
            for view in _parsed(answer, plain_workloads)
        ]

    def _workload_pages(
        self, include_done: bool, mine: bool, brief: bool = False
    ) -> Iterator[Answer]:
        """``GET /v1/workloads`` a page at a time, following the next-page cursor; the
        damaged rows each page names go to :attr:`skipped_rows`."""
        params: dict[str, str | int] = {"limit": PAGE}
        if include_done:
            params["all"] = "true"
        if mine:
            params["mine"] = "true"
        if brief:
            params["brief"] = "true"
        self.skipped_rows = {}
        self.skipped_count = 0
        while True:
            answer = self._request("GET", "/workloads", params=params)
            self._note_skipped(answer.headers.get(SKIPPED_ROWS_HEADER.lower()))
            yield answer
            following = answer.headers.get(NEXT_CURSOR_HEADER.lower())
            if not following:
                return
            params["cursor"] = following

    def _note_skipped(self, header: str | None) -> None:
        if not header:
            return
        try:
            named = json.loads(header)
            count, ids = int(named["count"]), [str(i) for i in named["ids"]]
        except (ValueError, KeyError, TypeError):
            return  # not what this client knows: the listing itself is still good
        new = [i for i in ids if i not in self.skipped_rows]
        self.skipped_rows.update(dict.fromkeys(ids))
        self.skipped_count += max(count - (len(ids) - len(new)), 0)

    def get_workload(self, workload_id: str) -> WorkloadDetail:
        """One workload with its events."""
        from fgpu.wire import WorkloadDetail

        return self._json("GET", f"/workloads/{_segment(workload_id)}", WorkloadDetail)

    def get_workload_plain(self, workload_id: str) -> PlainWorkloadDetail:
        """:meth:`get_workload` as a :class:`~fgpu.client.plain.PlainWorkloadDetail`."""
        answer = self._request("GET", f"/workloads/{_segment(workload_id)}")
        return _parsed(answer, lambda data: plain_of(PlainWorkloadDetail, data))

    def cancel_plain(self, workload_id: str, *, now: bool = False) -> PlainWorkloadView:
        """:meth:`cancel`, answered as a :class:`~fgpu.client.plain.PlainWorkloadView`."""
        answer = self._request(
            "POST",
            f"/workloads/{_segment(workload_id)}/cancel",
            params={"now": "true"} if now else None,
        )
        return _parsed(answer, lambda data: plain_of(PlainWorkloadView, data))

    def cancel(self, workload_id: str, *, now: bool = False) -> WorkloadView:
        """Cancel a workload (``now``: a running one gets SIGKILL at once)."""
        from fgpu.wire import WorkloadView

        path = f"/workloads/{_segment(workload_id)}/cancel" + ("?now=true" if now else "")
        return self._json("POST", path, WorkloadView)

    def logs(self, workload_id: str, stream: str = "stdout", offset: int = 0) -> tuple[bytes, int]:
        """Log bytes from ``offset`` and the offset to ask for next."""
        response = self._request(
            "GET",
            f"/workloads/{_segment(workload_id)}/logs",
            params={"stream": stream, "offset": offset},
        )
        try:
            following = int(response.headers.get(LOG_OFFSET_HEADER.lower(), ""))
        except ValueError:
            following = offset + len(response.content)
        return response.content, following

    def list_queues(self) -> list[QueueView]:
        """Every queue."""
        from fgpu.wire import QueueView

        return self._json("GET", "/queues", list[QueueView])

    def create_queue(self, body: QueueBody) -> QueueView:
        """Create a queue (admins)."""
        from fgpu.wire import QueueView

        return self._json("POST", "/queues", QueueView, json=self._body(body))

    def update_queue(self, body: QueueBody) -> QueueView:
        """Replace a queue's settings (admins)."""
        from fgpu.wire import QueueView

        return self._json(
            "PUT", f"/queues/{_segment(body.name, 'name')}", QueueView, json=self._body(body)
        )

    def delete_queue(self, name: str) -> None:
        """Remove an empty queue (admins)."""
        self._request("DELETE", f"/queues/{_segment(name, 'name')}")

    def nodes(self) -> list[NodeView]:
        """Nodes and their GPUs."""
        from fgpu.wire import NodeView

        return self._json("GET", "/nodes", list[NodeView])

    def nodes_plain(self) -> list[PlainNodeView]:
        """:meth:`nodes` as :class:`~fgpu.client.plain.PlainNodeView` objects."""
        answer = self._request("GET", "/nodes")
        return _parsed(answer, lambda data: plain_list(PlainNodeView, data))

    def events(
        self, after: int | None = None, limit: int = 1000, *, all_users: bool = False
    ) -> list[EventView]:
        """Events after id ``after``, oldest first (for a caller who is not an admin, those
        of their own workloads and of none unless ``all_users``)."""
        from fgpu.wire import EventView

        params: dict[str, int | str] = {"limit": limit}
        if after is not None:
            params["after"] = after
        if all_users:
            params["all_users"] = "true"
        return self._json("GET", "/events", list[EventView], params=params)


def _segment(text: str, field: str = "id") -> str:
    """A path segment, percent-encoded (an id or a name never changes the route).

    Raises:
        ClientError: an empty id or name (``field``): it would name another route.
    """
    from urllib.parse import quote

    if not text.strip():
        what = "a workload id (fgpu ls lists them)" if field == "id" else "a queue name"
        raise ClientError(0, field, f"empty; give {what}")
    return quote(text, safe="")


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(kind: type[T]) -> TypeAdapter[T]:
    """Pydantic's validator of ``kind``, built once."""
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        from pydantic import TypeAdapter

        adapter = _ADAPTERS[kind] = TypeAdapter(kind)
    return adapter


def _parsed(answer: Answer, parse: Callable[[Any], T]) -> T:
    """``parse`` of the answer's JSON; a body that is not JSON, or not what ``parse`` wants
    (``ValueError``, of which pydantic's ``ValidationError`` is one), is a
    :class:`ClientError` of the answer's status."""
    try:
        return parse(answer.json())
    except ValueError as exc:
        raise ClientError(
            answer.status_code, "", f"unexpected answer from the server: {exc}"
        ) from None


def _refusal(response: Answer) -> ClientError:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, dict) and "reason" in detail:
        return ClientError(
            response.status_code, str(detail.get("field", "")), str(detail["reason"])
        )
    if isinstance(detail, str):
        return ClientError(response.status_code, "", detail)
    text = response.text.strip() or response.reason_phrase
    return ClientError(response.status_code, "", f"HTTP {response.status_code}: {text[:200]}")
