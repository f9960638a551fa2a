"""``fgpu ui``: the dashboard of a server on its Unix socket, in the local user's browser.

A browser cannot speak to a Unix socket, and the socket's identity is the peer's uid. So
``fgpu ui`` runs a small HTTP server on loopback that forwards the dashboard's ``GET``
requests (``/ui`` and below) to the socket as the user who ran it: the API sees that user,
and shows exactly what it would show them (another user's logs stay refused).

Anyone on the machine can reach a loopback port, so the port alone proves nothing: the URL
``fgpu ui`` prints carries a random key, which the first request trades for a cookie
(HttpOnly, SameSite=Strict); a request with neither gets 403. Only ``GET`` and ``HEAD`` are
forwarded (the dashboard is read-only).
"""

from __future__ import annotations

import hmac
import secrets
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

KEY_COOKIE = "fgpu_ui_key"
FORWARDED_HEADERS = ("content-type", "location", "cache-control", "last-modified", "etag")


class UiProxy:
    """ASGI application: forwards dashboard ``GET`` requests to the server's socket.

    Args:
        socket_path: the server's Unix socket.
        key: the secret the printed URL carries (``?key=``).
    """

    def __init__(self, socket_path: Path, key: str) -> None:
        self.socket_path = socket_path
        self.key = key
        self._client: httpx.AsyncClient | None = None

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
        path: str = scope["path"]
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
        cookies = _cookies(scope)
        given = dict(query).get("key")
        if method not in ("GET", "HEAD"):
            await _plain(send, 405, "the dashboard is read-only: GET only")
            return
        if not (path == "/ui" or path.startswith("/ui/")):
            await _plain(send, 404, f"fgpu ui serves the dashboard only (/ui), not {path}")
            return
        if given is not None:
            if not hmac.compare_digest(given, self.key):
                await _plain(send, 403, "wrong key: open the URL fgpu ui printed")
                return
            rest = urlencode([(k, v) for k, v in query if k != "key"])
            location = path + (f"?{rest}" if rest else "")
            cookie = f"{KEY_COOKIE}={self.key}; HttpOnly; SameSite=Strict; Path=/ui"
            await send(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode())],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        if not hmac.compare_digest(cookies.get(KEY_COOKIE, ""), self.key):
            await _plain(send, 403, "open the URL fgpu ui printed (it carries the key)")
            return
        try:
            answer = await self._http().request(
                method, path, params=query, headers={"accept": "text/html"}
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
    config = uvicorn.Config(UiProxy(socket_path, key), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    announce(f"http://{shown}:{bound}/ui?key={key}")
    server.run(sockets=[sock])
