"""The dashboard's sessions on the TCP listener and the limit on its login attempts.

A session cookie is ``EEEEEEEEEEEE`` + ``MAC``: its expiry (Unix seconds, 12 hex digits)
and an HMAC-SHA256 of a fixed label and that expiry under the server's bearer token (64 hex
digits). It proves the token was typed, cannot be used as the bearer token, and is refused
after its expiry (:data:`SESSION_LIFETIME_S` after the login; the browser is told the same
with ``Max-Age``). A new token ends every session.

:class:`LoginThrottle` refuses a login from an address that failed :data:`LOGIN_FAILURES`
times within :data:`LOGIN_WINDOW_S`, until the oldest of those failures leaves the window
(HTTP 429 with ``Retry-After``): the token cannot be guessed at the speed of the server.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import threading
import time
from collections import deque
from collections.abc import Callable

SESSION_LIFETIME_S = 12 * 3600
"""Seconds a dashboard session lasts from its login."""
LOGIN_FAILURES = 5
"""Failed logins from one address within :data:`LOGIN_WINDOW_S` before it must wait."""
LOGIN_WINDOW_S = 300.0
"""Seconds over which failed logins are counted."""
MAX_ADDRESSES = 10_000
"""Addresses whose failures are remembered at most (the oldest are forgotten first)."""

_LABEL = b"fgpu dashboard session"
_EXPIRY_DIGITS = 12


def session_value(token: bytes, expires: int) -> str:
    """The session cookie's value for ``token``, valid until ``expires`` (Unix seconds)."""
    stamp = f"{expires:0{_EXPIRY_DIGITS}x}"
    mac = hmac.new(token, _LABEL + b" " + stamp.encode(), hashlib.sha256).hexdigest()
    return stamp + mac


def new_session(token: bytes, now: float | None = None) -> str:
    """A session cookie value for a login now, lasting :data:`SESSION_LIFETIME_S`."""
    start = time.time() if now is None else now
    return session_value(token, int(start) + SESSION_LIFETIME_S)


def session_valid(value: str, token: bytes, now: float | None = None) -> bool:
    """Whether ``value`` is a session cookie made with ``token`` that has not expired."""
    stamp = value[:_EXPIRY_DIGITS]
    try:
        expires = int(stamp, 16)
    except ValueError:
        return False
    expected = session_value(token, expires)
    if not hmac.compare_digest(value.encode(), expected.encode()):
        return False
    return (time.time() if now is None else now) < expires


class LoginThrottle:
    """Failed dashboard logins per address, and whether one may try again.

    Args:
        failures: failures within ``window_s`` after which an address must wait.
        window_s: the window, seconds.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        failures: int = LOGIN_FAILURES,
        window_s: float = LOGIN_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.window_s = window_s
        self._clock = clock
        self._failed: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def wait_s(self, address: str) -> int:
        """Seconds ``address`` must wait before its next login (0: it may try now)."""
        now = self._clock()
        with self._lock:
            times = self._failed.get(address)
            if times is None:
                return 0
            while times and now - times[0] >= self.window_s:
                times.popleft()
            if not times:
                del self._failed[address]
                return 0
            if len(times) < self.failures:
                return 0
            return max(1, math.ceil(times[0] + self.window_s - now))

    def failed(self, address: str) -> None:
        """``address`` typed a wrong token."""
        now = self._clock()
        with self._lock:
            times = self._failed.pop(address, None) or deque(maxlen=self.failures)
            times.append(now)
            self._failed[address] = times  # re-inserted: the dict is oldest first
            while len(self._failed) > MAX_ADDRESSES:
                del self._failed[next(iter(self._failed))]

    def succeeded(self, address: str) -> None:
        """``address`` typed the right token: its failures are forgotten."""
        with self._lock:
            self._failed.pop(address, None)


__all__ = [
    "LOGIN_FAILURES",
    "LOGIN_WINDOW_S",
    "SESSION_LIFETIME_S",
    "LoginThrottle",
    "new_session",
    "session_valid",
    "session_value",
]
