"""The tail of a workload's framed output log (both streams in the order written,
:mod:`fgpu.wire_logs`) for the dashboard's workload page.

The log is a chain of records from its first byte; a tail read from the middle starts
inside some record. :func:`tail_chunks` finds where the first whole record of the tail
begins: the earliest header-shaped line from which the records chain without error to the
end of what was read (a header-shaped run of bytes inside a record's data would have to
chain exactly to the end as well to be taken, which output does not do by chance).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fgpu.wire_logs import Chunk, FrameError, FrameReader

_HEADER = re.compile(rb"[oe] [0-9]{1,20} [0-9]{1,20}\n")
SLACK_BYTES = 4096
"""Read this much before the tail asked for, so that the record holding the tail's first
byte can be found from its header."""


def tail_chunks(path: Path, max_bytes: int) -> list[Chunk]:
    """The last records of the framed log at ``path``, their data cut to ``max_bytes`` in
    all (the first record kept may lose its head); [] for a missing or empty file.

    Args:
        path: ``output.log`` of a workload.
        max_bytes: most bytes of output to return (> 0).

    Raises:
        OSError: the file exists but cannot be read.
    """
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = max(0, size - max_bytes - SLACK_BYTES)
            handle.seek(start)
            data = handle.read(size - start)
    except FileNotFoundError:
        return []
    chunks = _chain(data, 0) if start == 0 else None
    if chunks is None:
        for found in _HEADER.finditer(data):
            chunks = _chain(data, found.start())
            if chunks is not None:
                break
    if not chunks:
        return []
    kept: list[Chunk] = []
    room = max_bytes
    for chunk in reversed(chunks):
        if room <= 0:
            break
        data_kept = chunk.data[-room:]
        kept.append(Chunk(chunk.stream, chunk.time_ns, data_kept))
        room -= len(data_kept)
    kept.reverse()
    return kept


def _chain(data: bytes, at: int) -> list[Chunk] | None:
    """The records from ``at`` when they chain to the end of ``data`` (a last record still
    being written may be incomplete), else None."""
    reader = FrameReader()
    try:
        chunks = reader.feed(data[at:])
    except FrameError:
        return None
    if not chunks:
        return None
    return chunks


__all__ = ["SLACK_BYTES", "tail_chunks"]
