"""Pages of the workload listing (``GET /v1/workloads?limit=N&cursor=C``; issue 27): a page
ends at a workload, and the cursor of the next page names it as ``<submitted_at>~<id>``
(workloads are listed in submission order, ties by id)."""

from __future__ import annotations

import math

from fgpu.rules.errors import BadRequest

MAX_PAGE = 10_000
"""Most workloads one page of a listing holds."""

DEFAULT_PAGE = 1_000
"""Workloads one page holds when the request names no ``limit``."""


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


__all__ = ["DEFAULT_PAGE", "MAX_PAGE", "format_cursor", "parse_cursor"]
