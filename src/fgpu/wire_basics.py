"""Constants of the REST API that need no models: its prefix, the log offset and
idempotency headers and the phases a workload never leaves. Standard library only, so that
the command line and the client use them without loading pydantic; :mod:`fgpu.wire`
re-exports them."""

from __future__ import annotations

API_PREFIX = "/v1"

LOG_OFFSET_HEADER = "X-Fgpu-Log-Offset"
"""``GET /v1/workloads/{id}/logs`` answers the log bytes from ``offset``; this header holds the
offset to ask for next (``offset`` + the bytes sent)."""

IDEMPOTENCY_HEADER = "Idempotency-Key"
"""Request header of ``POST /v1/workloads``: a key (1-255 visible ASCII characters) that makes
the submission idempotent per user: a retry with the same key and body gets the workload the
first one created (issue 27; :mod:`fgpu.store.idempotency`)."""
NEXT_CURSOR_HEADER = "X-Fgpu-Next-Cursor"
"""``GET /v1/workloads?limit=N`` answers one page; this header holds the ``cursor`` of the
next page (absent on the last)."""

SKIPPED_ROWS_HEADER = "X-Fgpu-Skipped-Rows"
"""``GET /v1/workloads`` leaves out stored rows that cannot be decoded (a damaged store);
this header names them as JSON, ``{"count": N, "ids": [...]}`` (absent when none)."""

TERMINAL_PHASES = frozenset({"succeeded", "failed", "cancelled"})
"""Phases a workload never leaves (DESIGN.md section 8)."""

__all__ = [
    "API_PREFIX",
    "IDEMPOTENCY_HEADER",
    "LOG_OFFSET_HEADER",
    "NEXT_CURSOR_HEADER",
    "SKIPPED_ROWS_HEADER",
    "TERMINAL_PHASES",
]
