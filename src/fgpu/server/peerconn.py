"""The protocol of one API connection: who is on the other end, and the connection limits.

uvicorn serves the app; :class:`PeerCredProtocol` (its HTTP protocol, one instance per
connection) reads ``SO_PEERCRED`` when a connection is made and wraps the app for that
connection so that every request's ASGI scope carries the peer's uid under
:data:`fgpu.server.app.PEER_UID`. Connections without peer credentials (the optional TCP
listener) carry no uid, and the app then asks for a bearer token. Every request also
carries its connection's client key under :data:`fgpu.server.app.CLIENT_KEY` (the uid on
the socket and for a local TCP client's socket, :mod:`fgpu.loopback_peer`; else the
address), under which its connections and its wrong tokens are counted.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from fgpu.loopback_peer import OwnerLookup, is_local_peer
from fgpu.server.app import CLIENT_KEY, PEER_UID
from fgpu.server.connlimit import (
    ConnectionGuard,
    Peer,
    closing_response,
    describe,
    peer_of,
)

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;} (socket(7))
LINGER_S = 2.0
"""Seconds a connection cut off with 408, or refused, still reads (and drops) what its
client sends after the answer, before it is closed: closing a socket with unread data makes
the client's next read fail (``ECONNRESET``, TCP and Unix sockets alike) instead of
returning the answer and the end. Two seconds is Apache httpd's short lingering close
(``SECONDS_TO_LINGER``), kept short against clients that would hold the connection."""

MAX_LINGERING_REFUSALS = 64
"""Refused connections (429, 503) that linger at once at most (:data:`LINGER_S`, so that a
client that sent its request first still reads the refusal); past that a refusal is closed
at once, so a flood of refused connections cannot hold the descriptors the caps keep."""

_owners = OwnerLookup()


def peer_uid(sock: Any) -> int | None:
    """The uid of the process at the other end of a Unix stream socket, or None for other
    sockets (TCP) and when the kernel does not say (``SO_PEERCRED``, Linux socket(7))."""
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    _pid, uid, _gid = _UCRED.unpack(raw)
    return int(uid)


def local_owner(transport: asyncio.BaseTransport) -> int | None:
    """The uid owning the client's socket of a TCP connection from this machine (a
    loopback client address, or the server's own address; :mod:`fgpu.loopback_peer`);
    None for a remote client, a Unix socket, or when the socket is not found (the client
    already closed it)."""
    peer, local = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
    if not (isinstance(peer, tuple) and isinstance(local, tuple)):
        return None
    if len(peer) < 2 or len(local) < 2 or not is_local_peer(str(peer[0]), str(local[0])):
        return None
    scope_id = int(peer[3]) if len(peer) >= 4 else 0  # IPv6: (host, port, flow, scope)
    return _owners.owner_uid((str(peer[0]), int(peer[1])), (str(local[0]), int(local[1])), scope_id)


def with_peer_uid(
    app: ASGIApp,
    uid: int | None,
    client_key: str | None = None,
    keep_alive_s: float | None = None,
) -> ASGIApp:
    """``app`` with, on every HTTP request of one connection, ``scope[PEER_UID] = uid``
    (the caller's identity; only a Unix socket's peer credentials) when ``uid`` is given,
    and ``scope[CLIENT_KEY] = client_key`` (what failed tokens are counted under:
    ``uid 1001`` or ``address 192.0.2.7``) when that is given. With ``keep_alive_s``
    (seconds an idle connection stays open), every answer says it in a ``Keep-Alive:
    timeout=N`` header (whole seconds, rounded down), so that a client stops reusing the
    connection before the server closes it under a request in flight."""
    keep_alive = None
    if keep_alive_s is not None:
        keep_alive = (b"keep-alive", b"timeout=%d" % max(0, int(keep_alive_s)))

    async def tagged(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if uid is not None:
            scope[PEER_UID] = uid
        if client_key is not None:
            scope[CLIENT_KEY] = client_key
        if keep_alive is None:
            await app(scope, receive, send)
            return

        async def said(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), keep_alive]
            await send(message)

        await app(scope, receive, said)

    return tagged


try:  # httptools parses HTTP in C: about twice the requests per second of pure-Python h11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _HttpBase
except ImportError:  # pragma: no cover - httptools is a dependency; h11 is the fallback
    _HttpBase = H11Protocol  # type: ignore[misc, assignment]


class PeerCredProtocol(_HttpBase):
    """uvicorn's HTTP protocol, tagging the connection's requests with the peer's uid and
    its client key (:func:`~fgpu.server.connlimit.peer_of`: the uid on the Unix socket or
    of a local TCP client's socket, else the address).

    With a :attr:`guard` (:class:`~fgpu.server.connlimit.ConnectionGuard`) it also applies
    the connection limits: a connection over a cap is answered (429 or 503) and closed before
    uvicorn sees it, and a request that has not fully arrived within the guard's
    ``request_timeout_s`` of its first byte (of the connection, for the first request) is
    answered 408 and closed. Both close lingering (:data:`LINGER_S`; refusals up to
    :data:`MAX_LINGERING_REFUSALS` at once): the write side is shut after the answer, so the
    client reads it and then the end, and what it still sends is read and dropped until it
    closes or :data:`LINGER_S` has passed.
    """

    guard: ConnectionGuard | None = None
    _peer: Peer | None = None
    _refused = False
    _deadline: asyncio.TimerHandle | None = None
    _linger: asyncio.TimerHandle | None = None
    _lingering = False
    _counted_linger = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        uid = peer_uid(transport.get_extra_info("socket"))
        owner = uid if uid is not None else local_owner(transport)
        peer = peer_of(owner, transport.get_extra_info("peername"))
        guard = self.guard
        if guard is not None:
            refusal = guard.admit(peer)
            if refusal is not None:
                self._refused = True
                transport.write(closing_response(refusal[0], "connection", refusal[1]))
                if guard.lingering < MAX_LINGERING_REFUSALS:
                    guard.lingering += 1
                    self._counted_linger = True
                    self._close_lingering(transport)
                else:
                    transport.close()
                return
            self._peer = peer
        super().connection_made(transport)
        # the identity is the Unix socket's peer uid alone: a TCP caller is who its token
        # says, whoever owns its socket
        self.app = with_peer_uid(self.app, uid, describe(peer), self.timeout_keep_alive)
        self._arm_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._refused:
            if self._counted_linger and self.guard is not None:
                self.guard.lingering -= 1
            return
        self._disarm_deadline()
        if self._peer is not None and self.guard is not None:
            self.guard.release(self._peer)
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # after the 408: read and dropped
        if self._deadline is None:
            self._arm_deadline()
        super().data_received(data)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm_deadline()

    def _arm_deadline(self) -> None:
        if self.guard is None or self._deadline is not None:
            return
        self._deadline = self.loop.call_later(
            self.guard.limits.request_timeout_s, self._request_timed_out
        )

    def _disarm_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _request_timed_out(self) -> None:
        self._deadline = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.guard is not None and self._peer is not None:
            self.guard.note_timeout(self._peer)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.response_started:
            # its head came, its body stalls: the application waiting for the body hears
            # that the client went, and nothing it answers is written after the 408
            cycle.disconnected = True
            cycle.message_event.set()
        elif cycle is not None and not cycle.response_complete:  # an answer under way
            transport.close()
            return
        seconds = self.guard.limits.request_timeout_s if self.guard else 0
        transport.write(  # no answer on this request yet
            closing_response(
                408,
                "request",
                f"no complete request within {seconds:g} s of its first byte (--request-timeout)",
            )
        )
        self._close_lingering(transport)

    def _close_lingering(self, transport: asyncio.Transport) -> None:
        """Shut the write side once the answer is out, drop what arrives, close on the
        client's end or after :data:`LINGER_S` (TLS, which cannot shut one side: at once)."""
        if not transport.can_write_eof():
            transport.close()
            return
        self._lingering = True
        transport.write_eof()
        transport.resume_reading()
        self._linger = self.loop.call_later(LINGER_S, transport.close)


__all__ = ["LINGER_S", "MAX_LINGERING_REFUSALS", "PeerCredProtocol", "local_owner", "peer_uid"]
