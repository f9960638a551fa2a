"""Capped workload logs: the head and the latest tail are kept, what is between is dropped and
said (issue 27: nothing limited a workload's logs; ``fgpu serve --max-log-bytes``).

Each of a workload's logs (``stdout.log``, ``stderr.log``, the framed ``output.log``) is
written by the launch wrapper (:mod:`fgpu.agent.runner`) through a :class:`CappedLog`:

- **head:** the file itself takes the first ``cap // 2`` bytes;
- **tail:** after that, bytes go to segment files ``<file>.tail.<offset>``, each of at most
  ``cap // 4`` bytes, named after the log offset of their first byte (bytes written to the
  log since its start). When a segment is full the next one starts and all but the newest two
  are deleted: the last ``cap // 4`` to ``cap // 2`` bytes are kept.

So a log holds at most about ``cap`` bytes (a record that does not fit where it is may pass
a segment's size by itself; records are at most 64 KiB). Offsets are log offsets: the head's
bytes are at their place in the file, a segment's at its name's offset plus their place in
it; the dropped bytes are those between the head's end (or a reader's offset) and the first
kept segment. :func:`read_log` serves them from an offset, as the API's ``GET .../logs``
does, and answers a read that falls where bytes were dropped with a notice of the cut (how
many bytes, where) and the offset after it: in the framed log a record of its own kind
(:data:`fgpu.wire_logs.CUT`), in the plain logs a line of text.

Records of the framed log are never split: the head ends and each segment starts at a
record's start, so a reader resumes on a record after a cut. Standard library only (the
wrapper and the command line load it without pydantic).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from fgpu.wire_logs import CUT, STREAM_MARKS, FrameReader, frame

DEFAULT_MAX_LOG_BYTES = 64 * 2**20
"""Each log of a workload keeps about this many bytes (``fgpu serve --max-log-bytes``)."""
MIN_LOG_BYTES = 64 * 1024
"""Smallest cap (a segment must hold a record of the wrapper's largest read, 64 KiB)."""
TAIL = ".tail."
"""Infix of a tail segment's name: ``stdout.log.tail.1048576``."""


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _append(fd: int, data: bytes, size: int) -> None:
    """Append ``data`` to the file ``fd`` of ``size`` bytes, all or nothing: a write that
    fails part way (a full disk) is cut back to ``size``, so a framed log never holds half a
    record that its reader would take the next header for.

    Raises:
        OSError: the write's error (after the cut).
    """
    try:
        write_all(fd, data)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise


def segments(path: Path) -> list[tuple[int, Path]]:
    """The tail segments of the log ``path``: (log offset of their first byte, file), oldest
    first."""
    found = []
    prefix = path.name + TAIL
    with contextlib.suppress(FileNotFoundError):
        for entry in path.parent.iterdir():
            if entry.name.startswith(prefix) and entry.name[len(prefix) :].isdigit():
                found.append((int(entry.name[len(prefix) :]), entry))
    return sorted(found)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class CappedLog:
    """Appends to the log ``path`` within a cap (see the module docstring).

    Args:
        path: the log file (its head).
        cap: bytes the log keeps, about (>= :data:`MIN_LOG_BYTES`); 0 keeps everything in
            the file.
        fd: an open descriptor of ``path`` to write the head through (the wrapper's stdout
            and stderr); None opens it.

    Write errors (a full disk) lose log bytes, never the workload: they are swallowed.
    """

    def __init__(self, path: Path, cap: int, fd: int | None = None) -> None:
        if cap and cap < MIN_LOG_BYTES:
            raise ValueError(f"max log bytes: {cap} must be 0 (no cap) or at least {MIN_LOG_BYTES}")
        self.path = path
        self.cap = cap
        self.head_cap = cap // 2
        self.segment_cap = cap // 4
        self._fd = fd if fd is not None else os.open(path, _FLAGS, 0o644)
        self.head = os.fstat(self._fd).st_size
        self._segment_fd: int | None = None
        self._segment_size = 0
        kept = segments(path)  # a restarted workload goes on after what it wrote before
        self.end = max([self.head] + [start + _size(p) for start, p in kept])

    def write(self, data: bytes, *, whole: bool = False) -> None:
        """Append ``data``; ``whole``: a record that goes to one file, never split."""
        if not data:
            return
        with contextlib.suppress(OSError):
            self._write(data, whole)

    def _write(self, data: bytes, whole: bool) -> None:
        if not self.cap or (self.head == self.end and self.head + len(data) <= self.head_cap):
            _append(self._fd, data, self.head)
            self.head += len(data)
            self.end += len(data)
            return
        if self.head == self.end and not whole and self.head < self.head_cap:
            room = self.head_cap - self.head
            self._write(data[:room], whole)
            data = data[room:]
        if self._segment_fd is None or (
            self._segment_size and self._segment_size + len(data) > self.segment_cap
        ):
            self._next_segment()
        assert self._segment_fd is not None
        _append(self._segment_fd, data, self._segment_size)
        self._segment_size += len(data)
        self.end += len(data)

    def _next_segment(self) -> None:
        if self._segment_fd is not None:
            os.close(self._segment_fd)
            self._segment_fd = None
        path = self.path.with_name(f"{self.path.name}{TAIL}{self.end}")
        self._segment_fd = os.open(path, _FLAGS, 0o644)
        self._segment_size = os.fstat(self._segment_fd).st_size
        for _, old in segments(self.path)[:-2]:  # the newest two stay
            with contextlib.suppress(FileNotFoundError):
                old.unlink()

    def close(self) -> None:
        """Close the segment being written (the head's descriptor is the caller's when it
        gave one)."""
        if self._segment_fd is not None:
            os.close(self._segment_fd)
            self._segment_fd = None


_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW


def cut_notice(path: Path, dropped: int, at: int, head: int) -> bytes:
    """What a reader gets where ``dropped`` bytes of the log ``path`` were cut at log offset
    ``at``: a :data:`fgpu.wire_logs.CUT` record in the framed log, a line in a plain one."""
    stream = {"output.log": "output"}.get(path.name, path.name.removesuffix(".log"))
    text = (
        f"[fgpu: {dropped} bytes of {stream} dropped here, from byte {at}: this log is "
        f"capped (fgpu serve --max-log-bytes); its first {head} bytes and its latest are "
        "kept]\n"
    ).encode()
    if path.name == "output.log":
        return frame("cut", time.time_ns(), text)
    return b"\n" + text


def read_log(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """At most ``limit`` bytes of the (capped) log ``path`` from log offset ``offset``, and
    the offset to read next.

    A missing file reads as empty. Where ``offset`` falls on dropped bytes, the answer is
    the cut's notice (:func:`cut_notice`) and the next offset is the first kept byte after
    it. Past the log's end (it was started again): nothing, and its end.
    """
    try:
        head = path.stat().st_size
    except FileNotFoundError:
        return b"", offset
    if offset < head:
        return _read(path, offset, min(limit, head - offset)), offset + min(limit, head - offset)
    kept = segments(path)
    for start, segment in kept:
        size = _size(segment)
        if offset < start:
            begin = max(offset, head)
            return cut_notice(path, start - begin, begin, head), start
        if offset < start + size:
            data = _read(segment, offset - start, min(limit, start + size - offset))
            return data, offset + len(data)
    end = max([head] + [start + _size(segment) for start, segment in kept])
    return b"", min(offset, end)


SKIP_BITS = 17
"""A stream cursor (:func:`read_stream`) is ``record_offset << SKIP_BITS | skip``: a record's
data is at most 64 KiB (the wrapper's reads) plus a notice's few hundred bytes, below
``2 ** SKIP_BITS``."""
_SKIP_MASK = (1 << SKIP_BITS) - 1
_RECORD_READ = 2 * 65536 + 4096
"""Bytes read at a time to find whole records (one record at most 64 KiB and a header)."""
PLAIN_LOGS = {"stdout.log": "stdout", "stderr.log": "stderr"}
"""The plain logs a stream read stands for (:func:`read_stream`)."""


def read_stream(output_log: Path, stream: str, cursor: int, limit: int) -> tuple[bytes, int]:
    """At most ``limit`` bytes of one stream (``stdout`` or ``stderr``) of the framed log
    ``output_log`` from ``cursor``, and the cursor to read next: what ``stdout.log`` or
    ``stderr.log`` held when the wrapper still wrote each stream twice (issue 27).

    A cursor is opaque (see :data:`SKIP_BITS`): 0 is the start, and each answer gives the
    next. Records of the other stream are passed over; a cut (a capped log's dropped bytes,
    or the notice of a cut the wrapper wrote) reads as its text (a capped log's notice comes
    whole, even past ``limit``). An answer may be shorter than ``limit`` (it ends at the last
    whole record read); it is empty only at the log's end.
    """
    start, skip = cursor >> SKIP_BITS, cursor & _SKIP_MASK
    out = bytearray()
    while len(out) < limit:
        data, following = read_log(output_log, start, _RECORD_READ)
        if not data:
            break
        if following != start + len(data):  # a capped log's cut: its notice
            for chunk in FrameReader().feed(data):
                out += chunk.data[skip:]
            start, skip = following, 0
            continue
        reader = FrameReader()
        at = start
        moved = False
        for chunk in reader.feed(data):
            size = _header_size(chunk.stream, chunk.time_ns, len(chunk.data)) + len(chunk.data)
            if chunk.stream in (stream, CUT):
                room = limit - len(out)
                piece = chunk.data[skip : skip + room]
                out += piece
                if skip + len(piece) < len(chunk.data):
                    return bytes(out), at << SKIP_BITS | (skip + len(piece))
            at += size
            skip = 0
            moved = True
            if len(out) >= limit:
                break
        if not moved:  # a record still being written: read on next time
            break
        start = at
    return bytes(out), start << SKIP_BITS | skip


def _header_size(stream: str, time_ns: int, length: int) -> int:
    """Bytes of a record's header (:func:`fgpu.wire_logs.frame`)."""
    return len(b"%s %d %d\n" % (STREAM_MARKS[stream], time_ns, length))


def stream_bytes(path: Path) -> bytes:
    """All of one stream's log as the API serves it: ``path`` is a workload's ``stdout.log``
    or ``stderr.log``; where the wrapper did not write it (it writes each stream once, into
    the framed ``output.log`` beside it) the stream is read from there (cut notices
    included). Empty when neither exists."""
    if path.exists() or path.name not in PLAIN_LOGS:
        return read_log(path, 0, 1 << 62)[0]
    out = bytearray()
    cursor = 0
    while True:
        data, cursor = read_stream(
            path.with_name("output.log"), PLAIN_LOGS[path.name], cursor, 1 << 24
        )
        if not data:
            return bytes(out)
        out += data


def stream_text(path: Path) -> str:
    """:func:`stream_bytes` as text (UTF-8, undecodable bytes replaced)."""
    return stream_bytes(path).decode("utf-8", "replace")


def log_end(path: Path) -> int:
    """The log offset after the last byte written to the log ``path`` (head and tail)."""
    head = _size(path)
    return max([head] + [start + _size(segment) for start, segment in segments(path)])


def _read(path: Path, offset: int, limit: int) -> bytes:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read(limit)
    except FileNotFoundError:  # a segment deleted meanwhile: the next read finds the cut
        return b""


__all__ = [
    "DEFAULT_MAX_LOG_BYTES",
    "MIN_LOG_BYTES",
    "PLAIN_LOGS",
    "SKIP_BITS",
    "CappedLog",
    "cut_notice",
    "log_end",
    "read_log",
    "read_stream",
    "segments",
    "stream_bytes",
    "stream_text",
    "write_all",
]
