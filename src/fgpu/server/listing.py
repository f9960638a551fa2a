"""Pages of the workload listing (``GET /v1/workloads?limit=N&cursor=C``; issue 27): a page
ends at a workload, and the cursor of the next page names it as ``<submitted_at>~<id>``
(workloads are listed in submission order, ties by id).

A page is bounded twice: by ``limit`` workloads and by :data:`DEFAULT_MAX_BYTES` of JSON (a
page stops before the workload that would cross it; its cursor goes on from there), so a user
with huge commands makes more pages, not bigger ones. At most :data:`DEFAULT_CONCURRENT`
pages are made at once (:class:`ListingGate`); up to :data:`DEFAULT_QUEUED` more wait their
turn, and one beyond that gets 503 with ``Retry-After``. Peak memory of listings is so about
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
"""Listing requests that may wait for a turn; one more gets 503."""

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
    """At most ``concurrent`` listings at once; ``queued`` more wait (each at most
    ``wait_s``); any other gets :class:`Unavailable` (503, ``Retry-After: 1``) naming the
    limit. Thread-safe (the routes run in a thread pool).

    Args:
        concurrent: listings made at once (>= 1).
        queued: listings that may wait (>= 0).
        wait_s: longest wait, seconds.
        clock: monotonic seconds (tests pass theirs).
    """

    def __init__(
        self,
        concurrent: int = DEFAULT_CONCURRENT,
        queued: int = DEFAULT_QUEUED,
        wait_s: float = WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if concurrent < 1 or queued < 0:
            raise ValueError(f"concurrent {concurrent} must be >= 1 and queued {queued} >= 0")
        self.concurrent = concurrent
        self.queued = queued
        self.wait_s = wait_s
        self._clock = clock
        self._turn = threading.Condition()
        self.running = 0
        self.waiting = 0

    def _busy(self, why: str) -> Unavailable:
        return Unavailable(
            "listing",
            f"{why}: at most {self.concurrent} listings are made at once and {self.queued} "
            "wait; try again in a second",
        )

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Hold a turn for the block.

        Raises:
            Unavailable: every turn is taken and the queue is full, or the wait ran out.
        """
        with self._turn:
            if self.running >= self.concurrent:
                if self.waiting >= self.queued:
                    raise self._busy("too many listings at once")
                self.waiting += 1
                try:
                    end = self._clock() + self.wait_s
                    while self.running >= self.concurrent:
                        left = end - self._clock()
                        if left <= 0:
                            raise self._busy(f"no turn within {self.wait_s:g} s")
                        self._turn.wait(left)
                finally:
                    self.waiting -= 1
            self.running += 1
        try:
            yield
        finally:
            with self._turn:
                self.running -= 1
                self._turn.notify()


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
