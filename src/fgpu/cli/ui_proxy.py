"""``fgpu ui``: the dashboard of a server on its Unix socket, in the local user's browser.

A browser cannot speak to a Unix socket, and the socket's identity is the peer's uid. So
``fgpu ui`` runs a small HTTP server on loopback that forwards the dashboard's ``GET``
requests (``/ui`` and below) to the socket as the user who ran it: the API sees that user,
and shows exactly what it would show them (another user's logs stay refused).

Anyone on the machine can reach a loopback port, so the port alone proves nothing:

- on Linux every connection's client socket must belong to the user who ran ``fgpu ui``
  (its owner is read from ``/proc/net/tcp*``, :mod:`fgpu.loopback_peer`); another user,
  root included, gets 403;
- the URL ``fgpu ui`` prints carries a random key, usable once: the first request trades it
  for a fresh random session cookie (HttpOnly, SameSite=Strict; not the key), and the key is
  refused after that; a request with neither gets 403;
- only ``GET`` and ``HEAD`` of a path under ``/ui/`` are forwarded: a path with a dot
  segment, an empty segment or a percent-encoded ``.``, ``/``, ``\\`` or ``%`` is refused
  (400) before anything is forwarded, so the API outside the dashboard stays out of reach;
- a request line or headers past :data:`MAX_TARGET_BYTES` get 414 at once.
"""

from __future__ import annotations

import hmac
import os
import posixpath
import secrets
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

import httpx

from fgpu import loopback_peer

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SESSION_COOKIE = "fgpu_ui_session"
MAX_TARGET_BYTES = 8192
"""Longest path plus query string forwarded (the dashboard's own links are far shorter)."""
_REFUSED_IN_RAW_PATH = ("%2e", "%2f", "%5c", "%25", "%00", "\\")


def dashboard_path(scope: Scope) -> str | None:
    """The request's path when it is provably ``/ui`` or under ``/ui/``, else None.

    Refused: a percent-encoded ``.``, ``/``, ``\\``, ``%`` or NUL in the raw path, a
    backslash, a ``.`` or ``..`` segment, an empty segment (``//``), and anything whose
    normalised form is not the path itself.
    """
    raw = scope.get("raw_path") or scope["path"].encode("utf-8")
    raw_text = raw.decode("latin-1")
    if any(bad in raw_text.lower() for bad in _REFUSED_IN_RAW_PATH):
        return None
    path = unquote(raw_text)
    segments = path.split("/")
    if any(segment in (".", "..") for segment in segments) or "//" in path:
        return None
    if posixpath.normpath(path) != (path.rstrip("/") or "/"):
        return None
    if not (path == "/ui" or path.startswith("/ui/")):
        return None
    return path


FORWARDED_HEADERS = ("content-type", "location", "cache-control", "last-modified", "etag")


class UiProxy:
    """ASGI application: forwards dashboard ``GET`` requests to the server's socket.

    Args:
        socket_path: the server's Unix socket.
        key: the secret the printed URL carries (``?key=``), good for one use.
        owner_uid: the only uid whose loopback connections are served (Linux); None: do
            not check (no ``/proc/net/tcp``).
    """

    def __init__(self, socket_path: Path, key: str, owner_uid: int | None = None) -> None:
        self.socket_path = socket_path
        self.key: str | None = key
        self.owner_uid = owner_uid
        self.sessions: set[str] = set()
        self._client: httpx.AsyncClient | None = None

    def _refused_peer(self, scope: Scope) -> str | None:
        """Why this connection is not served (None: it is): its client socket is not the
        owner's."""
        if self.owner_uid is None:
            return None
        client, server = scope.get("client"), scope.get("server")
        if not client or not server:
            return "cannot tell who connects (no peer address)"
        uids = loopback_peer.peer_uids((client[0], client[1]), (server[0], server[1]))
        if uids == {self.owner_uid}:
            return None
        who = ", ".join(f"uid {u}" for u in sorted(uids)) or "an unknown user"
        return (
            f"this dashboard is served to uid {self.owner_uid} only (the user who ran "
            f"fgpu ui); this connection belongs to {who}: run fgpu ui yourself"
        )

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            transport = httpx.AsyncHTTPTransport(uds=str(self.socket_path))
            self._client = httpx.AsyncClient(
                transport=transport, base_url="http://fgpu", timeout=30.0
            )
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if self._client is not None:
                        await self._client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        method = scope["method"]
        query_bytes: bytes = scope.get("query_string", b"")
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        if len(raw_path) + len(query_bytes) > MAX_TARGET_BYTES:
            await _plain(send, 414, f"the URL is longer than {MAX_TARGET_BYTES} bytes")
            return
        refused = self._refused_peer(scope)
        if refused is not None:
            await _plain(send, 403, refused)
            return
        if method not in ("GET", "HEAD"):
            await _plain(send, 405, "the dashboard is read-only: GET only")
            return
        path = dashboard_path(scope)
        if path is None:
            shown = raw_path.decode("latin-1")[:200]
            await _plain(
                send,
                400 if scope["path"].startswith("/ui") else 404,
                f"fgpu ui serves the dashboard only (/ui and plain paths below it), not {shown}",
            )
            return
        query = parse_qsl(query_bytes.decode("latin-1"))
        cookies = _cookies(scope)
        given = dict(query).get("key")
        if given is not None:
            if self.key is None or not hmac.compare_digest(given, self.key):
                await _plain(
                    send,
                    403,
                    "this key is wrong or was already used (it is good for one use): "
                    "run fgpu ui again for a new link",
                )
                return
            self.key = None  # used once
            session = secrets.token_urlsafe(32)
            self.sessions.add(session)
            rest = urlencode([(k, v) for k, v in query if k != "key"])
            location = quote(path) + (f"?{rest}" if rest else "")
            cookie = f"{SESSION_COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/ui"
            await send(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode())],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        session = cookies.get(SESSION_COOKIE, "")
        if not any(hmac.compare_digest(session, known) for known in self.sessions):
            await _plain(send, 403, "open the URL fgpu ui printed (it carries a one-time key)")
            return
        try:
            answer = await self._http().request(
                method,
                quote(path),
                params=tuple(query),
                headers={"accept": "text/html"},
            )
        except httpx.HTTPError as exc:
            await _plain(send, 502, f"the fgpu server on {self.socket_path} did not answer: {exc}")
            return
        headers = [
            (name.encode(), answer.headers[name].encode())
            for name in FORWARDED_HEADERS
            if name in answer.headers
        ]
        await send(
            {"type": "http.response.start", "status": answer.status_code, "headers": headers}
        )
        await send({"type": "http.response.body", "body": answer.content})


def _cookies(scope: Scope) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, text = part.strip().partition("=")
                found[key] = text
    return found


async def _plain(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def bind_loopback(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free one).

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def serve_ui(socket_path: Path, host: str, port: int, announce: Callable[[str], None]) -> None:
    """Serve the dashboard of the server on ``socket_path`` at ``http://host:port/ui`` until
    interrupted; ``announce`` gets the URL with its key once the port is bound.

    Raises:
        OSError: the address cannot be bound.
    """
    import uvicorn

    key = secrets.token_urlsafe(24)
    sock = bind_loopback(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    owner = os.geteuid() if loopback_peer.supported() else None
    config = uvicorn.Config(UiProxy(socket_path, key, owner), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    announce(f"http://{shown}:{bound}/ui?key={key}")
    server.run(sockets=[sock])
