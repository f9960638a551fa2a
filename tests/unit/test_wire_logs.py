"""The framed output log (:mod:`fgpu.wire_logs`): records round-trip whatever the pieces
they arrive in, and malformed headers are refused."""

from __future__ import annotations

import pytest

from fgpu.wire_logs import Chunk, FrameError, FrameReader, frame


def test_records_round_trip_fed_one_byte_at_a_time() -> None:
    records = [
        Chunk("stdout", 1, b"line\n"),
        Chunk("stderr", 2, b""),
        Chunk("stderr", 3, b"two\nlines\n with \x00 bytes and 1 2 3\n"),
    ]
    data = b"".join(frame(c.stream, c.time_ns, c.data) for c in records)
    reader = FrameReader()
    got: list[Chunk] = []
    for index in range(len(data)):
        got.extend(reader.feed(data[index : index + 1]))
    assert got == records
    assert reader.pending == 0
    assert FrameReader().feed(data) == records


def test_a_partial_record_waits_for_the_rest() -> None:
    data = frame("stdout", 5, b"hello")
    reader = FrameReader()
    assert reader.feed(data[:-2]) == []
    assert reader.pending == len(data) - 2
    assert reader.feed(data[-2:]) == [Chunk("stdout", 5, b"hello")]


@pytest.mark.parametrize(
    "data",
    [b"x 1 2\nab", b"o one 2\nab", b"o 1\nab", b"o 1 -2\n", b"o" * 80],
    ids=["stream", "time", "fields", "negative", "no-newline"],
)
def test_malformed_headers_are_refused(data: bytes) -> None:
    with pytest.raises(FrameError):
        FrameReader().feed(data)


def test_an_unknown_stream_cannot_be_framed() -> None:
    with pytest.raises(KeyError):
        frame("stdin", 0, b"")
