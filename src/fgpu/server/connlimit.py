"""Limits on the API's connections, so that one caller cannot take the service from others.

Without them one local user holding many half-open connections (a partial request head, one
more line every few seconds) took every file descriptor of the server: other users' requests
failed, the governor could not open its freezer files, and every refused ``accept`` was
logged. Three rules, applied by :class:`ConnectionGuard` where a connection is accepted
(:class:`fgpu.server.peerconn.PeerCredProtocol`):

- **per peer:** at most :attr:`ConnectionLimits.per_peer` open connections per caller (its
  *client key*, :func:`peer_of`): the peer's uid on the Unix socket (``SO_PEERCRED``); on
  TCP from this machine (a loopback address, or the server's own address) the uid owning
  the client's socket (:mod:`fgpu.loopback_peer`), so that local users, who all come from
  ``127.0.0.1`` or ``::1``, each have their own count, shared with their socket
  connections; else the remote address. One more is answered at once with HTTP 429 and
  closed. The uid only counts connections (and failed tokens,
  :mod:`fgpu.server.guesses`): it never grants anything, a TCP caller is still who its
  token says.
- **in total:** at most :attr:`ConnectionLimits.total` open connections, by default the
  process's file limit (``RLIMIT_NOFILE``, soft, which the service raises to the hard limit
  at start: :mod:`fgpu.server.fdbudget`) less :attr:`ConnectionLimits.reserve`
  descriptors kept for the store, the governor and the memory guard and the workloads' logs,
  less the descriptors its running workloads hold (:attr:`ConnectionGuard.workload_fds`).
  One more is answered with HTTP 503 and closed.
- **time:** a request (head and body) must arrive completely within
  :attr:`ConnectionLimits.request_timeout_s` of its first byte (of the connection, for the
  first request); else the connection gets HTTP 408 and is closed. An idle keep-alive
  connection is closed after :attr:`ConnectionLimits.idle_timeout_s` (uvicorn's
  ``timeout_keep_alive``).

Refusals and cut-offs are logged through :class:`ThrottledLog`: the first at once, then at
most one line per :data:`LOG_INTERVAL_S` with the count since, so a flood of connections
cannot grow the log.
"""

from __future__ import annotations

import json
import logging
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("fgpu.server")

DEFAULT_PER_PEER = 64
"""Open connections per uid (Unix socket) or per address (TCP): far above what the CLI
(one at a time) or a browser on the dashboard (about six) opens."""
DEFAULT_RESERVE = 256
"""File descriptors kept free of connections: the store, the governor's freezer files and
hint socket, the memory guard, the workloads' log files."""
MIN_TOTAL = 16
"""The fewest connections a server may be limited to (else the file limit is too low)."""
DEFAULT_REQUEST_TIMEOUT_S = 10.0
"""Seconds a request (head and body) may take to arrive from its first byte."""
DEFAULT_IDLE_TIMEOUT_S = 5.0
"""Seconds an idle keep-alive connection is kept open after its last answer."""
LOG_INTERVAL_S = 60.0
"""At most one log line per this many seconds for refused or cut-off connections."""


class LimitError(ValueError):
    """Connection limits that cannot work (the message names the flag and the value)."""


def file_limit() -> int:
    """The process's soft limit on open file descriptors (``RLIMIT_NOFILE``); a large
    stand-in when unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The connection limits of one server (see the module docstring).

    Attributes:
        per_peer: open connections per uid (Unix socket) or remote address (TCP).
        total: open connections in all; None: :func:`file_limit` less ``reserve``.
        reserve: file descriptors kept from connections when ``total`` is None.
        request_timeout_s: seconds from a request's first byte to its last.
        idle_timeout_s: seconds an idle keep-alive connection stays open.
    """

    per_peer: int = DEFAULT_PER_PEER
    total: int | None = None
    reserve: int = DEFAULT_RESERVE
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S

    def resolved_total(self, nofile: int | None = None) -> int:
        """The total cap: ``total``, or the file limit (``nofile``, default
        :func:`file_limit`) less ``reserve``.

        Raises:
            LimitError: a cap under :data:`MIN_TOTAL`, or a ``total`` that would leave less
                than ``reserve`` descriptors under the file limit.
        """
        limit = file_limit() if nofile is None else nofile
        if self.total is None:
            total = limit - self.reserve
            if total < MIN_TOTAL:
                raise LimitError(
                    f"--connection-reserve: {self.reserve} leaves {total} of the file limit "
                    f"(RLIMIT_NOFILE {limit}) for connections, fewer than {MIN_TOTAL}: raise "
                    "the limit (ulimit -n) or lower the reserve"
                )
            return total
        if self.total < MIN_TOTAL:
            raise LimitError(f"--max-connections: {self.total} is under {MIN_TOTAL}")
        if self.total > limit - self.reserve:
            raise LimitError(
                f"--max-connections: {self.total} leaves fewer than {self.reserve} of the "
                f"file limit (RLIMIT_NOFILE {limit}) for the store, the governor and the logs: "
                f"use at most {limit - self.reserve}, or raise the limit (ulimit -n)"
            )
        return self.total

    def check(self) -> None:
        """Raises :class:`LimitError` naming the flag and the value when a limit is out of
        range."""
        if self.per_peer < 1:
            raise LimitError(f"--max-connections-per-user: {self.per_peer} must be at least 1")
        if self.reserve < 0:
            raise LimitError(f"--connection-reserve: {self.reserve} must not be negative")
        for flag, value in (
            ("--request-timeout", self.request_timeout_s),
            ("--idle-timeout", self.idle_timeout_s),
        ):
            if not value > 0 or value != value or value == float("inf"):
                raise LimitError(f"{flag}: {value!r} must be a positive number of seconds")
        self.resolved_total()


class ThrottledLog:
    """A warning that is logged at most once per ``interval_s``, with the count of the
    occurrences that were not.

    Args:
        what: the sentence's subject, e.g. ``"refused connections"``.
        interval_s: the least time between two lines.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        what: str,
        interval_s: float = LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self._skipped = 0
        self.lines = 0
        """Lines logged so far."""

    def note(self, detail: str) -> None:
        """One occurrence; logs it (with the count skipped since the last line) when the
        interval has passed."""
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            self._skipped += 1
            return
        more = f" ({self._skipped} more since the last report)" if self._skipped else ""
        log.warning("%s: %s%s", self.what, detail, more)
        self._last = now
        self._skipped = 0
        self.lines += 1


Peer = tuple[str, int | str]
"""Who a connection counts against: ``("uid", 1001)`` or ``("address", "192.0.2.7")``."""


def peer_of(uid: int | None, peername: object) -> Peer:
    """The key a connection is counted under: ``uid`` when one is known (the Unix socket's
    peer credentials, or the owner of a local TCP client's socket), else the remote host of
    a TCP peer name (``(host, port, ...)``), else ``("address", "?")``.

    A local TCP client whose socket's owner cannot be found (it closed before the server
    looked, or the kernel does not say) falls back to its address, ``127.0.0.1`` or ``::1``,
    which it then shares with every other local client in the same case."""
    if uid is not None:
        return ("uid", uid)
    if isinstance(peername, tuple) and peername:
        return ("address", str(peername[0]))
    return ("address", "?")


def describe(peer: Peer) -> str:
    """``uid 1001`` or ``address 192.0.2.7``."""
    return f"{peer[0]} {peer[1]}"


class ConnectionGuard:
    """Counts open connections per peer and in all, and says which to refuse.

    Used from the event loop's thread; a lock makes the counts safe from others too.

    Args:
        limits: the limits (:meth:`ConnectionLimits.check` them first).
        nofile: the file limit to size the total from (default :func:`file_limit`).
    """

    def __init__(
        self,
        limits: ConnectionLimits,
        nofile: int | None = None,
        workload_fds: Callable[[], int] | None = None,
    ) -> None:
        self.limits = limits
        self.total = limits.resolved_total(nofile)
        self.workload_fds = workload_fds
        """Descriptors the running workloads hold in the service now (pidfds, freezer
        files: :data:`fgpu.server.fdbudget.FDS_PER_WORKLOAD` each); the total cap is lowered
        by them (to no less than :data:`MIN_TOTAL`), so that connections and workloads
        together stay under the file limit with the reserve kept."""
        self._open: dict[Peer, int] = {}
        self._count = 0
        self._lock = threading.Lock()
        self.refused = 0
        """Connections refused so far."""
        self.timed_out = 0
        """Connections cut off for an incomplete request so far."""
        self.lingering = 0
        """Refused connections being closed lingering now (:mod:`fgpu.server.peerconn`)."""
        self.refusals = ThrottledLog("refused connections")
        self.cutoffs = ThrottledLog("closed connections with an incomplete request")

    @property
    def open_connections(self) -> int:
        """Connections admitted and not yet released."""
        return self._count

    def open_for(self, peer: Peer) -> int:
        """Connections of ``peer`` admitted and not yet released."""
        return self._open.get(peer, 0)

    def cap(self) -> int:
        """The total cap now: :attr:`total` less :attr:`workload_fds`, at least
        :data:`MIN_TOTAL`."""
        if self.workload_fds is None:
            return self.total
        return max(MIN_TOTAL, self.total - self.workload_fds())

    def admit(self, peer: Peer) -> tuple[int, str] | None:
        """Count one more connection of ``peer``; or, over a cap, count nothing and return
        ``(HTTP status, reason)`` to refuse it with (429 per peer, 503 in total)."""
        with self._lock:
            have = self._open.get(peer, 0)
            if have >= self.limits.per_peer:
                refusal = (
                    429,
                    f"too many open connections from {describe(peer)}: {have} open, limit "
                    f"{self.limits.per_peer} (--max-connections-per-user); close some first",
                )
            elif self._count >= (cap := self.cap()):
                held = "" if cap == self.total else ", less what its workloads hold"
                refusal = (
                    503,
                    f"the server has {self._count} open connections, its limit "
                    f"(--max-connections {self.total}{held}: {cap}); try again shortly",
                )
            else:
                self._open[peer] = have + 1
                self._count += 1
                return None
            self.refused += 1
        self.refusals.note(refusal[1])
        return refusal

    def release(self, peer: Peer) -> None:
        """One connection of ``peer`` (admitted before) closed."""
        with self._lock:
            have = self._open.get(peer, 0)
            if have <= 1:
                self._open.pop(peer, None)
            else:
                self._open[peer] = have - 1
            if have > 0:
                self._count -= 1

    def note_timeout(self, peer: Peer) -> None:
        """A connection of ``peer`` was cut off for an incomplete request."""
        self.timed_out += 1
        self.cutoffs.note(
            f"{describe(peer)} sent no complete request within "
            f"{self.limits.request_timeout_s:g} s (--request-timeout)"
        )


_REASONS = {408: "Request Timeout", 429: "Too Many Requests", 503: "Service Unavailable"}


def closing_response(status: int, field: str, reason: str) -> bytes:
    """A whole HTTP/1.1 answer that ends the connection, with the API's error body
    (``{"detail": {"field": ..., "reason": ...}}``)."""
    body = json.dumps({"detail": {"field": field, "reason": reason}}).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n" + ("retry-after: 1\r\n" if status in (429, 503) else "") + "\r\n"
    )
    return head.encode("ascii") + body


__all__ = [
    "ConnectionGuard",
    "ConnectionLimits",
    "LimitError",
    "Peer",
    "ThrottledLog",
    "closing_response",
    "file_limit",
    "peer_of",
]
