"""HTTP/1.1 over a Unix socket with the standard library (:mod:`http.client`): what
:class:`fgpu.client.Client` uses on the socket, where loading httpx would take longer than a
short command's whole work. One connection per request; the answer as :class:`Answer`, the
form the client also gives httpx's answers."""

from __future__ import annotations

import http.client
import json
import socket as sockets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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
    sent = dict(headers)
    content = None
    if body is not None:
        content = json_text(body).encode()
        sent["content-type"] = "application/json"
    connection = UnixConnection(path, timeout)
    try:
        try:
            connection.connect()
        except OSError as exc:
            raise ConnectFailed(str(exc)) from exc
        connection.request(method, target, body=content, headers=sent)
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    return Answer(
        response.status,
        response.reason,
        {name.lower(): value for name, value in response.getheaders()},
        data,
    )


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
