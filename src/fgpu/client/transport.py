"""HTTP/1.1 over a Unix socket with the standard library (:mod:`http.client`): what
:class:`fgpu.client.Client` uses on the socket, where loading httpx would take longer than a
short command's whole work. A client keeps its connection between requests
(:class:`UnixSession`, keep-alive); the answer as :class:`Answer`, the form the client also
gives httpx's answers."""

from __future__ import annotations

import http.client
import json
import select
import socket as sockets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fgpu.wire_basics import IDEMPOTENCY_HEADER


class ConnectFailed(Exception):
    """The connection could not be made; the ``OSError`` is the ``__cause__`` (httpcore's
    ``ConnectError``: any ``OSError`` while connecting)."""


def unix_exchange(
    path: str,
    timeout: float,
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: Any = None,
) -> Answer:
    """Send one request (``body``, when not None, as JSON the way httpx sends ``json=``) to
    the server on the socket ``path`` and read its answer, ``timeout`` seconds at most for
    each step.

    Raises:
        ConnectFailed: no connection (no socket, refused, no permission, timed out).
        TimeoutError: no answer in time.
        http.client.RemoteDisconnected: the server closed the connection without answering.
        OSError, http.client.HTTPException: the exchange broke.
    """
    sent, content = _encoded(headers, body)
    connection = _connect(path, timeout)
    try:
        answer, _ = _exchange_on(connection, method, target, sent, content)
    finally:
        connection.close()
    return answer


def _encoded(headers: Mapping[str, str], body: Any) -> tuple[dict[str, str], bytes | None]:
    """The headers and bytes of a request with ``body`` (None: no body) sent as JSON the
    way httpx sends ``json=``."""
    sent = dict(headers)
    if body is None:
        return sent, None
    sent["content-type"] = "application/json"
    return sent, json_text(body).encode()


def _connect(path: str, timeout: float) -> UnixConnection:
    connection = UnixConnection(path, timeout)
    try:
        connection.connect()
    except OSError as exc:
        raise ConnectFailed(str(exc)) from exc
    return connection


def _exchange_on(
    connection: UnixConnection,
    method: str,
    target: str,
    headers: Mapping[str, str],
    content: bytes | None,
) -> tuple[Answer, bool]:
    """One request on an open connection; the answer, and whether the connection may carry
    another (the server did not say it closes)."""
    connection.request(method, target, body=content, headers=dict(headers))
    response = connection.getresponse()
    data = response.read()
    answer = Answer(
        response.status,
        response.reason,
        {name.lower(): value for name, value in response.getheaders()},
        data,
    )
    return answer, not response.will_close


def _still_open(connection: UnixConnection) -> bool:
    """Whether a kept connection can carry a request: the server has not closed it (an idle
    connection is closed after its keep-alive timeout) and sent nothing unasked."""
    sock = connection.sock
    if sock is None:
        return False
    poller = select.poll()  # (a socket with a timeout waits in recv even with MSG_DONTWAIT)
    poller.register(sock, select.POLLIN)
    # readable: the server closed it (or failed it), or sent bytes nobody asked for
    return not poller.poll(0)


KEEP_WITHOUT_HEADER_S = 2.0
"""How long an idle connection is reused when the server's answer does not say how long it
keeps one open (its ``Keep-Alive: timeout=N`` header); fgpu's server keeps one 5 s by
default (``--idle-timeout``)."""

KEEP_MARGIN_S = 1.0
"""A connection is reused only this long before the server's timeout says it closes: the
request must reach the server before its idle timer runs out."""


def _reuse_window(keep_alive: str | None) -> float:
    """Seconds an idle connection may be reused, from the answer's ``Keep-Alive`` header
    (``timeout=N``: the server keeps an idle connection N seconds; MDN, "Keep-Alive")."""
    if keep_alive is None:
        return KEEP_WITHOUT_HEADER_S
    for part in keep_alive.split(","):
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "timeout":
            try:
                return max(0.0, float(value) - KEEP_MARGIN_S)
            except ValueError:
                break
    return KEEP_WITHOUT_HEADER_S


_CLOSED_UNDER_US = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


def _may_repeat(method: str, headers: Mapping[str, str]) -> bool:
    """Whether sending a request twice does no harm: a read, or a submission with an
    ``Idempotency-Key`` (the server answers a repeat with the first's workload)."""
    key = IDEMPOTENCY_HEADER.lower()
    return method in ("GET", "HEAD") or any(k.lower() == key for k in headers)


class UnixSession:
    """Requests to the server on socket ``path`` over one kept connection (HTTP/1.1
    keep-alive): a connection per request cost the server an accept, its peer credentials
    and a close each time (``bench/service.py``: 5.5 against 3.4 ms of server CPU per
    submission from 8 clients). A kept connection is used only within the time the server's
    ``Keep-Alive: timeout=N`` allows, less :data:`KEEP_MARGIN_S` (a cancel sent just as
    the server closed an idle connection failed as "no fgpu server"), and only while the
    server has not closed it; a read or keyed submission that still meets a close is sent
    again once. A request made while another thread uses the kept connection gets one of
    its own. ``timeout`` seconds at most for each step."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._kept: UnixConnection | None = None
        self._kept_until = 0.0  # time.monotonic() after which the kept one is not used
        self._turn = threading.Lock()

    def exchange(
        self, method: str, target: str, headers: Mapping[str, str], body: Any = None
    ) -> Answer:
        """As :func:`unix_exchange`, on the kept connection.

        Raises:
            as :func:`unix_exchange`.
        """
        if not self._turn.acquire(blocking=False):
            return unix_exchange(self.path, self.timeout, method, target, headers, body)
        try:
            sent, content = _encoded(headers, body)
            connection, self._kept = self._kept, None
            if connection is not None and (
                time.monotonic() >= self._kept_until or not _still_open(connection)
            ):
                connection.close()
                connection = None
            reused = connection is not None
            if connection is None:
                connection = _connect(self.path, self.timeout)
            try:
                answer, reusable = _exchange_on(connection, method, target, sent, content)
            except _CLOSED_UNDER_US:
                connection.close()
                # the server closed the kept connection as the request went (its keep-alive
                # timeout): it never read it. Sent again once where a repeat is harmless.
                if not (reused and _may_repeat(method, sent)):
                    raise
                connection = _connect(self.path, self.timeout)
                try:
                    answer, reusable = _exchange_on(connection, method, target, sent, content)
                except BaseException:
                    connection.close()
                    raise
            except BaseException:
                connection.close()
                raise
            reuse_s = _reuse_window(answer.headers.get("keep-alive"))
            if reusable and reuse_s > 0:
                self._kept = connection
                self._kept_until = time.monotonic() + reuse_s
            else:
                connection.close()
            return answer
        finally:
            self._turn.release()

    def close(self) -> None:
        """Close the kept connection (a request after this opens a new one)."""
        with self._turn:
            connection, self._kept = self._kept, None
        if connection is not None:
            connection.close()


def json_text(value: Any) -> str:
    """``value`` as the JSON httpx sends for ``json=``: compact, UTF-8 characters as they
    are, no NaN or infinity.

    Raises:
        ValueError: a NaN or an infinity.
    """
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, whichever way it came. Header names are lower case."""

    status_code: int
    reason_phrase: str
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        """The body as JSON.

        Raises:
            ValueError: the body is not JSON.
        """
        return json.loads(self.content)

    @property
    def text(self) -> str:
        """The body as text (UTF-8, undecodable bytes replaced)."""
        return self.content.decode("utf-8", errors="replace")


class UnixConnection(http.client.HTTPConnection):
    """An HTTP/1.1 connection to a Unix socket (the ``Host`` header says ``fgpu``)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("fgpu", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
