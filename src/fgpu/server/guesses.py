"""A limit on guessing the bearer token of the TCP listener (``fgpu serve --listen``): wrong
tokens given to the API (``Authorization: Bearer``) and typed into the dashboard's login
(``/ui/login``) are counted together, since both guess the same secret.

Failures are counted per *(account, client key)*. The account is the one a token logs in
as (today one per server: the ``--token-user``); the client key is what the connection
limits count under (:func:`fgpu.server.connlimit.peer_of`): the uid on the Unix socket and
for a TCP client on this machine (the owner of its socket, so local users, who all come
from ``127.0.0.1`` or ``::1``, are told apart), else the remote address. The rule:

1. **Per client:** a client key with :data:`GUESS_FAILURES` wrong tokens for an account
   within :data:`GUESS_WINDOW_S` waits until the oldest of them leaves the window.
2. **Server-wide slow-down:** while all clients together gave :data:`GLOBAL_FAILURES`
   wrong tokens within the window, a client key with any wrong token of its own in the
   window waits too (until its own failures, or enough of all, leave the window): many
   clients get one guess each instead of :data:`GUESS_FAILURES`.
3. A client key that gave no wrong token in the window is never made to wait, and a right
   token forgets its key's failures (not the server-wide count).

So one user cannot lock another out: bob's wrong tokens, whichever account they try, count
against his uid (his cap is reached after five; the server-wide count he alone reaches is
five per window), and alice, from her own uid, logs in meanwhile. A waiting client gets
HTTP 429 with ``Retry-After`` and a reason naming the limit, its token not looked at.
Wrong tokens and refusals are logged through :class:`~fgpu.server.connlimit.ThrottledLog`
(at most a line a minute).

What it does not stop: a remote attacker with very many addresses (an IPv6 prefix) gets
one guess per address while the slow-down holds; the token's length (at least 16
characters, ``--token-file``) is what makes guessing hopeless.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from fgpu.server.connlimit import ThrottledLog

GUESS_FAILURES = 5
"""Wrong tokens per (account, client key) within :data:`GUESS_WINDOW_S` before it waits."""
GUESS_WINDOW_S = 300.0
"""Seconds over which wrong tokens are counted."""
GLOBAL_FAILURES = 100
"""Wrong tokens from all clients within :data:`GUESS_WINDOW_S` from which any client that
failed in the window waits."""
MAX_KEYS = 10_000
"""(account, client key) pairs whose failures are remembered at most (the oldest are
forgotten first)."""


@dataclass(frozen=True, slots=True)
class Wait:
    """A refused attempt: ``seconds`` to wait (``Retry-After``) and the ``reason`` to show
    (names the limit and the client key)."""

    seconds: int
    reason: str


class GuessThrottle:
    """Wrong tokens per (account, client key) and in all, and who must wait (see the
    module docstring for the rule).

    Args:
        failures: wrong tokens per key within ``window_s`` after which the key waits.
        window_s: the window, seconds.
        global_failures: wrong tokens from all keys within ``window_s`` from which every
            key with a failure in the window waits.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        failures: int = GUESS_FAILURES,
        window_s: float = GUESS_WINDOW_S,
        global_failures: int = GLOBAL_FAILURES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures = failures
        self.window_s = window_s
        self.global_failures = global_failures
        self._clock = clock
        self._failed: dict[tuple[str, str], deque[float]] = {}
        self._all: deque[float] = deque(maxlen=global_failures)
        self._lock = threading.Lock()
        self.log = ThrottledLog("wrong or refused tokens")

    def check(self, account: str, client: str) -> Wait | None:
        """None when ``client`` may try a token for ``account`` now; else how long it must
        wait and why (also logged, throttled)."""
        now = self._clock()
        with self._lock:
            wait = self._wait(now, (account, client), client)
        if wait is not None:
            self.log.note(f"refused a token from {client} for {wait.seconds} s: {wait.reason}")
        return wait

    def failed(self, account: str, client: str) -> None:
        """``client`` gave a wrong token for ``account`` (logged, throttled)."""
        now = self._clock()
        key = (account, client)
        with self._lock:
            times = self._failed.pop(key, None) or deque(maxlen=self.failures)
            times.append(now)
            self._failed[key] = times  # re-inserted: the dict is oldest first
            while len(self._failed) > MAX_KEYS:
                del self._failed[next(iter(self._failed))]
            self._all.append(now)
        self.log.note(f"a wrong token from {client}")

    def succeeded(self, account: str, client: str) -> None:
        """``client`` gave the right token for ``account``: its failures are forgotten."""
        with self._lock:
            self._failed.pop((account, client), None)

    def _wait(self, now: float, key: tuple[str, str], client: str) -> Wait | None:
        times = self._failed.get(key)
        if times is None:
            return None
        while times and now - times[0] >= self.window_s:
            times.popleft()
        if not times:
            del self._failed[key]
            return None
        waits: list[Wait] = []
        if len(times) >= self.failures:
            seconds = max(1, math.ceil(times[0] + self.window_s - now))
            waits.append(
                Wait(
                    seconds,
                    f"{len(times)} wrong tokens from {client} within {self.window_s:g} s "
                    f"(the limit: {self.failures} per client); try again in {seconds} s",
                )
            )
        everyone = self._all
        if len(everyone) >= self.global_failures and now - everyone[0] < self.window_s:
            until = min(times[-1], everyone[0]) + self.window_s
            seconds = max(1, math.ceil(until - now))
            waits.append(
                Wait(
                    seconds,
                    f"{self.global_failures} wrong tokens from all clients within "
                    f"{self.window_s:g} s (the server-wide limit: while it holds, a client "
                    f"with a wrong token of its own, as {client} has, waits); try again in "
                    f"{seconds} s",
                )
            )
        return max(waits, key=lambda w: w.seconds) if waits else None


__all__ = [
    "GLOBAL_FAILURES",
    "GUESS_FAILURES",
    "GUESS_WINDOW_S",
    "GuessThrottle",
    "Wait",
]
