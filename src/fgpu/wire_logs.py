"""The framed output log: a workload's stdout and stderr in one file, in the order written.

The launch wrapper (:mod:`fgpu.agent.runner`, option ``--output-log``) appends one record
per read of either output pipe to ``<log_dir>/<workload_id>/output.log``; the API serves it
as ``GET /v1/workloads/{id}/logs?stream=all`` (bytes from an offset, like the two plain
logs), and the command line parses it with :class:`FrameReader`. A record is a header line
of ASCII, then the bytes::

    <o|e> <unix time in ns> <length in bytes>\\n<length bytes>

``o`` is stdout, ``e`` stderr; the time is the wall-clock time the wrapper read the bytes.
``c`` (:data:`CUT`) is no output of the workload: the server's notice, in a capped log,
that bytes were dropped there (:mod:`fgpu.log_files`), its text saying how many.
Standard library only (the wrapper and the command line load it without pydantic).
"""

from __future__ import annotations

from dataclasses import dataclass

CUT = "cut"
"""The kind of a record that says where a capped log dropped bytes (not workload output)."""
STREAM_MARKS = {"stdout": b"o", "stderr": b"e", CUT: b"c"}
_STREAMS = {mark: stream for stream, mark in STREAM_MARKS.items()}
_HEADER_MAX = 64
"""Longest header line a well-formed record has (mark, 20-digit time, 20-digit length)."""


class FrameError(ValueError):
    """The bytes are not a framed output log."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One record of the output log.

    Attributes:
        stream: ``"stdout"``, ``"stderr"``, or :data:`CUT` for the notice of a cut.
        time_ns: when the wrapper read it, nanoseconds since the Unix epoch.
        data: the bytes as written.
    """

    stream: str
    time_ns: int
    data: bytes


def frame(stream: str, time_ns: int, data: bytes) -> bytes:
    """One record (header line and bytes) for ``data`` read from ``stream`` at ``time_ns``.

    Raises:
        KeyError: ``stream`` is not stdout or stderr.
    """
    return b"%s %d %d\n" % (STREAM_MARKS[stream], time_ns, len(data)) + data


class FrameReader:
    """Parses records from bytes fed in pieces (the API answers a log in chunks that need
    not end at a record's end): :meth:`feed` returns the records completed so far and keeps
    the rest for the next piece."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Chunk]:
        """The records that ``data`` (after what was fed before) completes.

        Raises:
            FrameError: a header is malformed.
        """
        self._buffer += data
        chunks: list[Chunk] = []
        while True:
            end = self._buffer.find(b"\n", 0, _HEADER_MAX + 1)
            if end < 0:
                if len(self._buffer) > _HEADER_MAX:
                    raise FrameError(f"no record header in {bytes(self._buffer[:40])!r}")
                return chunks
            parts = bytes(self._buffer[:end]).split(b" ")
            if len(parts) != 3 or parts[0] not in _STREAMS:
                raise FrameError(f"malformed record header {bytes(self._buffer[:end])!r}")
            try:
                time_ns, length = int(parts[1]), int(parts[2])
            except ValueError:
                raise FrameError(f"malformed record header {bytes(self._buffer[:end])!r}") from None
            if length < 0:
                raise FrameError(f"negative record length in {bytes(self._buffer[:end])!r}")
            if len(self._buffer) < end + 1 + length:
                return chunks
            data = bytes(self._buffer[end + 1 : end + 1 + length])
            del self._buffer[: end + 1 + length]
            chunks.append(Chunk(_STREAMS[parts[0]], time_ns, data))

    @property
    def pending(self) -> int:
        """Bytes kept for a record not complete yet."""
        return len(self._buffer)


__all__ = ["CUT", "STREAM_MARKS", "Chunk", "FrameError", "FrameReader", "frame"]
