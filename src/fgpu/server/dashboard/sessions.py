"""The dashboard's sessions on the TCP listener and the limit on its login attempts.

A session cookie is ``EEEEEEEEEEEE`` + ``MAC``: its expiry (Unix seconds, 12 hex digits)
and an HMAC-SHA256 of a fixed label and that expiry under the server's bearer token (64 hex
digits). It proves the token was typed, cannot be used as the bearer token, and is refused
after its expiry (:data:`SESSION_LIFETIME_S` after the login; the browser is told the same
with ``Max-Age``). A new token ends every session.

Wrong tokens typed at the login are limited with the API's (:mod:`fgpu.server.guesses`):
per account and client key (a local client's uid, else its address), with a server-wide
slow-down; a client over the limit gets HTTP 429 with ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SESSION_LIFETIME_S = 12 * 3600
"""Seconds a dashboard session lasts from its login."""

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


__all__ = [
    "SESSION_LIFETIME_S",
    "new_session",
    "session_valid",
    "session_value",
]
