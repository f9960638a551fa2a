"""Pages of the workload listing (``GET /v1/workloads?limit=N&cursor=C``; issue 27): a page
ends at a workload, and the cursor of the next page names it as ``<submitted_at>~<id>``
(workloads are listed in submission order, ties by id).

A page is bounded twice: by ``limit`` workloads and by :data:`DEFAULT_MAX_BYTES` of JSON (a
page stops before the workload that would cross it; its cursor goes on from there), so a user
with huge commands makes more pages, not bigger ones. At most :data:`DEFAULT_CONCURRENT`
pages are made at once (:class:`ListingGate`), at most :data:`DEFAULT_PER_USER` of them one
user's; up to :data:`DEFAULT_QUEUED` more wait their turn (at most
:data:`DEFAULT_PER_USER_QUEUED` of one user), and one beyond that gets 503 with
``Retry-After`` naming the rule, so one user's flood of listings leaves the other turns to
other users. Peak memory of listings is so about
``concurrent x 3 x max_bytes`` (the page's records, views and JSON) whatever the backlog.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from fgpu.rules.errors import BadRequest, Unavailable

MAX_PAGE = 10_000
"""Most workloads one page of a listing holds."""

DEFAULT_PAGE = 1_000
"""Workloads one page holds when the request names no ``limit``."""


DEFAULT_MAX_BYTES = 8 * 2**20
"""Most bytes of JSON one listing answer holds (a page stops early before crossing it; one
workload alone may exceed it, since a page holds at least one)."""

BRIEF_COMMAND_CHARS = 200
"""With ``brief=true`` each workload's ``command`` holds at most this many characters in all
(the last argument kept cut short, ending in ``...``): what ``fgpu ls``'s table needs."""

DEFAULT_CONCURRENT = 2
"""Listing answers made at once (reading, rendering and encoding a page)."""

DEFAULT_QUEUED = 16
"""Listing requests that may wait for a turn, all users together; one more gets 503."""

DEFAULT_PER_USER = 1
"""Listing answers one user (uid) has made at once; the other turns stay for other users."""

DEFAULT_PER_USER_QUEUED = 2
"""Listing requests one user may have waiting; one more of theirs gets 503."""

SKIPPED_IDS_SHOWN = 100
"""Most ids of skipped damaged rows one answer names (its count is always whole)."""

WAIT_S = 30.0
"""Longest a listing request waits for its turn before it gets 503."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ListingAnswer:
    """One answer of ``GET /v1/workloads``.

    Attributes:
        body: the page as a JSON array of workload views, in pieces (one a workload).
        cursor: the next page's cursor (``X-Fgpu-Next-Cursor``); None on the last page.
        skipped: ids of damaged rows left out (``X-Fgpu-Skipped-Rows``; :mod:`fgpu.store.rows`).
    """

    body: deque[bytes]
    cursor: str | None
    skipped: list[str] = field(default_factory=list)
    size: int = 0
    """Bytes of ``body`` in all (its ``Content-Length``)."""

    def drain(self) -> Iterator[bytes]:
        """The body's pieces in order, each let go once given (so a page is held once, and
        less as it is sent)."""
        while self.body:
            yield self.body.popleft()


class ListingGate:
    """At most ``concurrent`` listings at once, and at most ``per_user`` of them for one
    user; ``queued`` more wait in all (each at most ``wait_s``), at most ``per_user_queued``
    of them one user's. A request beyond its user's share, or beyond the queue, gets
    :class:`Unavailable` (503, ``Retry-After: 1``) naming the rule it broke. Thread-safe
    (the routes run in a thread pool).

    Fairness (issue 27, trial finding: one user's 64 looping listings made everyone else's
    ``fgpu ls`` 503): since one user makes at most ``per_user`` pages at once and waits with
    at most ``per_user_queued`` more, the other slots and the rest of the queue stay for
    other users; a freed slot goes to the waiter whose user was served longest ago (round
    robin over users; first come first served within one user).

    Args:
        concurrent: listings made at once (>= 1).
        queued: listings that may wait, all users together (>= 0).
        wait_s: longest wait, seconds.
        clock: monotonic seconds (tests pass theirs).
        per_user: listings one user makes at once (>= 1).
        per_user_queued: listings one user may have waiting (>= 0).
    """

    def __init__(
        self,
        concurrent: int = DEFAULT_CONCURRENT,
        queued: int = DEFAULT_QUEUED,
        wait_s: float = WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        *,
        per_user: int = DEFAULT_PER_USER,
        per_user_queued: int = DEFAULT_PER_USER_QUEUED,
    ) -> None:
        if concurrent < 1 or queued < 0:
            raise ValueError(f"concurrent {concurrent} must be >= 1 and queued {queued} >= 0")
        if per_user < 1 or per_user_queued < 0:
            raise ValueError(
                f"per_user {per_user} must be >= 1 and per_user_queued {per_user_queued} >= 0"
            )
        self.concurrent = concurrent
        self.queued = queued
        self.wait_s = wait_s
        self.per_user = per_user
        self.per_user_queued = per_user_queued
        self._clock = clock
        self._turn = threading.Condition()
        self.running = 0
        self.waiting = 0
        self._running_of: dict[int | None, int] = {}
        self._waiting_of: dict[int | None, int] = {}
        self._queue: list[tuple[int, int | None]] = []  # (ticket, user), in arrival order
        self._served: dict[int | None, int] = {}  # user -> ticket of their last turn
        self._tickets = 0

    def running_of(self, user: int | None) -> int:
        """Listings ``user`` has being made now."""
        with self._turn:
            return self._running_of.get(user, 0)

    def waiting_of(self, user: int | None) -> int:
        """Listings ``user`` has waiting now."""
        with self._turn:
            return self._waiting_of.get(user, 0)

    def _busy(self, why: str) -> Unavailable:
        return Unavailable(
            "listing",
            f"{why}: at most {self.concurrent} listings are made at once and {self.queued} "
            "wait; try again in a second",
        )

    def _over_share(self, user: int | None) -> Unavailable:
        who = "this caller" if user is None else f"uid {user}"
        return Unavailable(
            "listing",
            f"too many listings of one user at once: {who} already has "
            f"{self._running_of.get(user, 0)} being made and {self._waiting_of.get(user, 0)} "
            f"waiting; each user gets at most {self.per_user} made at once and "
            f"{self.per_user_queued} waiting (the rest stay for other users); try again in a "
            "second",
        )

    def _may_start(self, user: int | None) -> bool:
        return self.running < self.concurrent and self._running_of.get(user, 0) < self.per_user

    def _next(self) -> int | None:
        """The ticket whose turn it is: among waiters that may start, the one whose user was
        served longest ago (then the oldest); None when no waiter may start."""
        best: tuple[int, int] | None = None
        for ticket, user in self._queue:
            if self._may_start(user):
                key = (self._served.get(user, -1), ticket)
                if best is None or key < best:
                    best = key
        return None if best is None else best[1]

    def _count(self, table: dict[int | None, int], user: int | None, step: int) -> None:
        value = table.get(user, 0) + step
        if value:
            table[user] = value
        else:
            del table[user]

    @contextmanager
    def turn(self, user: int | None = None) -> Iterator[None]:
        """Hold a turn for the block, as ``user`` (the caller's uid).

        Raises:
            Unavailable: ``user`` already has their share being made and waiting, or every
                turn is taken and the queue is full, or the wait ran out.
        """
        with self._turn:
            self._tickets += 1
            ticket = self._tickets
            if not self._may_start(user) or self._next() is not None:  # else: go at once
                if self._waiting_of.get(user, 0) >= self.per_user_queued:
                    raise self._over_share(user)
                if self.waiting >= self.queued:
                    raise self._busy("too many listings at once")
                self.waiting += 1
                self._count(self._waiting_of, user, 1)
                self._queue.append((ticket, user))
                try:
                    end = self._clock() + self.wait_s
                    while self._next() != ticket:
                        left = end - self._clock()
                        if left <= 0:
                            raise self._busy(f"no turn within {self.wait_s:g} s")
                        self._turn.wait(left)
                finally:
                    self.waiting -= 1
                    self._count(self._waiting_of, user, -1)
                    self._queue.remove((ticket, user))
                    self._turn.notify_all()  # the next waiter may go now
            self.running += 1
            self._count(self._running_of, user, 1)
            self._served[user] = ticket
        try:
            yield
        finally:
            with self._turn:
                self.running -= 1
                self._count(self._running_of, user, -1)
                self._turn.notify_all()


def brief_command(argv: Iterable[str], limit: int = BRIEF_COMMAND_CHARS) -> list[str]:
    """``argv`` cut to at most ``limit`` characters in all: whole arguments while they fit,
    then the next one cut short ending in ``...`` (and no more)."""
    kept: list[str] = []
    left = limit
    for arg in argv:
        if len(arg) <= left:
            kept.append(arg)
            left -= len(arg)
            continue
        kept.append(arg[: max(left - 3, 0)] + "...")
        break
    return kept


class PageEncoder(Generic[T]):
    """A JSON array of items built one at a time, each encoded by ``encode``, refusing the
    first item that would make the array longer than ``max_bytes`` (the first item is
    always taken). The items themselves are not kept (only :attr:`last`)."""

    def __init__(self, encode: Callable[[T], bytes], max_bytes: int) -> None:
        self._encode = encode
        self._max_bytes = max_bytes
        self._parts: list[bytes] = [b"["]
        self.size = 2
        """Bytes of the array so far, brackets included."""
        self.count = 0
        """Items taken."""
        self.last: T | None = None
        """The last item taken."""

    def add(self, item: T) -> bool:
        """Take ``item``; False (not taken) when it would cross the budget."""
        part = self._encode(item)
        if self.count and self.size + len(part) + 1 > self._max_bytes:
            return False
        if self.count:
            self._parts.append(b",")
            self.size += 1
        self._parts.append(part)
        self.size += len(part)
        self.count += 1
        self.last = item
        return True

    def pieces(self) -> deque[bytes]:
        """The array in pieces (no copy of the page; the encoder is empty afterwards)."""
        self._parts.append(b"]")
        parts, self._parts = deque(self._parts), [b"["]
        return parts

    def answer(self, cursor: str | None, skipped: list[str]) -> ListingAnswer:
        """The page as a :class:`ListingAnswer`."""
        size = self.size
        return ListingAnswer(self.pieces(), cursor, skipped, size)

    def body(self) -> bytes:
        """The array as one bytes object (a copy of the pieces)."""
        return b"".join(self.pieces())


def encode_page(
    items: Iterable[T], encode: Callable[[T], bytes], max_bytes: int
) -> tuple[bytes, int]:
    """A JSON array of ``items``, each encoded by ``encode``, stopping before the first
    that would make the array longer than ``max_bytes`` (the first always goes in).

    Returns:
        The array's bytes and how many items it holds.
    """
    page = PageEncoder(encode, max_bytes)
    for item in items:
        if not page.add(item):
            break
    return page.body(), page.count


def format_cursor(cursor: tuple[float, str] | None) -> str | None:
    """A page's end as text for the API: ``<submitted_at>~<id>`` (None stays None)."""
    return None if cursor is None else f"{cursor[0]!r}~{cursor[1]}"


def parse_cursor(text: str | None) -> tuple[float, str] | None:
    """The page end :func:`format_cursor` wrote.

    Raises:
        BadRequest: field ``cursor``, echoing the text, when it is not one.
    """
    if text is None:
        return None
    time_text, sep, workload_id = text.partition("~")
    try:
        submitted = float(time_text)
    except ValueError:
        submitted = float("nan")
    if not sep or not workload_id or not math.isfinite(submitted):
        shown = text if len(text) <= 80 else f"{text[:80]}..."
        raise BadRequest(
            "cursor", f"{shown!r} is not a cursor: pass the X-Fgpu-Next-Cursor of a page as it is"
        )
    return submitted, workload_id


__all__ = [
    "BRIEF_COMMAND_CHARS",
    "DEFAULT_CONCURRENT",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_PAGE",
    "DEFAULT_PER_USER",
    "DEFAULT_PER_USER_QUEUED",
    "DEFAULT_QUEUED",
    "MAX_PAGE",
    "SKIPPED_IDS_SHOWN",
    "ListingAnswer",
    "ListingGate",
    "brief_command",
    "encode_page",
    "format_cursor",
    "parse_cursor",
]
