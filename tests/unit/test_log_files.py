"""Capped logs (issue 27): the head and the latest tail are kept, the bytes between are
dropped, and a reader is told where and how many; framed records are never split."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fgpu.log_files import (
    MIN_LOG_BYTES,
    CappedLog,
    log_end,
    read_log,
    read_stream,
    segments,
    stream_bytes,
    stream_text,
)
from fgpu.wire_logs import Chunk, FrameReader, frame

CAP = 256 * 1024
NOTICE = re.compile(rb"\[fgpu: (\d+) bytes of (\w+) dropped here, from byte (\d+)")


def read_all(path: Path, offset: int = 0, limit: int = 10_000) -> list[tuple[int, bytes]]:
    """(offset, bytes) of every read from ``offset`` until the log's end."""
    reads = []
    while True:
        data, following = read_log(path, offset, limit)
        if not data:
            assert following == offset
            return reads
        reads.append((offset, data))
        offset = following


def test_a_plain_log_keeps_its_head_and_latest_tail_and_says_the_cut(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    log = CappedLog(path, CAP)
    written = b"".join(b"%08d\n" % i for i in range(200_000))  # 1.8 MB
    for start in range(0, len(written), 4096):
        log.write(written[start : start + 4096])
    log.close()
    assert path.stat().st_size == CAP // 2  # the head, exactly
    kept = segments(path)
    assert 1 <= len(kept) <= 2
    tail = sum(p.stat().st_size for _, p in kept)
    assert CAP // 4 <= tail <= CAP // 2
    assert log_end(path) == len(written)
    reads = read_all(path)
    text = b"".join(data for _, data in reads)
    found = NOTICE.search(text)
    assert found is not None
    dropped, stream, at = int(found[1]), found[2], int(found[3])
    assert stream == b"stdout"
    assert at == CAP // 2
    assert dropped == len(written) - CAP // 2 - tail
    head, _, rest = text.partition(b"\n[fgpu: ")
    assert head == written[: CAP // 2]
    assert rest.split(b"]\n", 1)[1] == written[-tail:]  # the latest bytes, whole


def test_framed_records_are_never_split_and_the_cut_is_a_record(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    log = CappedLog(path, CAP)
    sent = []
    for i in range(3000):
        stream = "stdout" if i % 3 else "stderr"
        data = b"line %d " % i + b"x" * 300
        sent.append(Chunk(stream, i, data))
        log.write(frame(stream, i, data), whole=True)
    log.close()
    reader = FrameReader()
    chunks = [c for _, data in read_all(path, limit=777) for c in reader.feed(data)]
    assert reader.pending == 0
    cuts = [c for c in chunks if c.stream == "cut"]
    assert len(cuts) == 1
    assert b"bytes of output dropped here" in cuts[0].data
    records = [c for c in chunks if c.stream != "cut"]
    index = chunks.index(cuts[0])
    assert records[:index] == sent[:index]  # the head, in order
    assert records[index:] == sent[-(len(records) - index) :]  # the latest, in order


def test_a_reader_on_dropped_bytes_jumps_to_the_next_kept_byte(tmp_path: Path) -> None:
    path = tmp_path / "stderr.log"
    log = CappedLog(path, CAP)
    log.write(b"h" * (CAP // 2))
    log.write(b"a" * (CAP // 4))  # the first segment
    follower_at = CAP // 2 + 100  # a follower in it
    for _ in range(3):  # three more: the first is deleted
        log.write(b"b" * (CAP // 4))
    log.close()
    data, following = read_log(path, follower_at, 4096)
    found = NOTICE.search(data)
    assert found is not None
    first_kept = segments(path)[0][0]
    assert following == first_kept
    assert int(found[1]) == first_kept - follower_at
    assert int(found[3]) == follower_at


def test_without_a_cap_everything_stays_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    log = CappedLog(path, 0)
    log.write(b"z" * (3 * MIN_LOG_BYTES))
    assert path.stat().st_size == 3 * MIN_LOG_BYTES
    assert segments(path) == []


def test_a_restarted_writer_goes_on_after_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    first = CappedLog(path, CAP)
    first.write(b"1" * CAP)
    first.close()
    again = CappedLog(path, CAP)
    assert again.end == CAP
    again.write(b"2" * 10)
    again.close()
    assert log_end(path) == CAP + 10


@pytest.mark.parametrize("cap", [1, 1000, MIN_LOG_BYTES - 1])
def test_a_cap_below_the_smallest_is_refused(tmp_path: Path, cap: int) -> None:
    with pytest.raises(
        ValueError, match=f"max log bytes: {cap} must be 0 \\(no cap\\) or at least"
    ):
        CappedLog(tmp_path / "stdout.log", cap)


def test_past_the_end_a_reader_gets_the_end(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    CappedLog(path, CAP).write(b"abc")
    assert read_log(path, 10, 100) == (b"", 3)
    assert read_log(tmp_path / "missing.log", 5, 100) == (b"", 5)


@pytest.mark.parametrize("cap", [0, MIN_LOG_BYTES])
def test_a_record_the_disk_cuts_short_is_not_left_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int
) -> None:
    """A full disk stops a write part way: the half record is cut back off, so the next
    record (once there is room) is read as one (a trial's reader failed on such a log)."""
    import errno
    import os

    from fgpu import log_files

    path = tmp_path / "output.log"
    log = CappedLog(path, cap)
    log.write(frame("stdout", 1, b"before\n"), whole=True)
    real = log_files.write_all

    def half_then_full(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(log_files, "write_all", half_then_full)
    log.write(frame("stderr", 2, b"lost in the full disk\n"), whole=True)
    monkeypatch.setattr(log_files, "write_all", real)
    log.write(frame("stdout", 3, b"after\n"), whole=True)
    chunks = FrameReader().feed(path.read_bytes())
    assert [(c.stream, c.data) for c in chunks] == [
        ("stdout", b"before\n"),
        ("stdout", b"after\n"),
    ]


def framed(path: Path, records: list[tuple[str, bytes]], cap: int = 0) -> None:
    log = CappedLog(path, cap)
    for stream, data in records:
        log.write(frame(stream, 1, data), whole=True)
    log.close()


@pytest.mark.parametrize("limit", [1, 3, 7, 1000, 1 << 20], ids=lambda n: f"limit-{n}")
def test_one_stream_reads_back_from_the_framed_log_in_any_pieces(
    tmp_path: Path, limit: int
) -> None:
    """What stdout.log held when each stream was written twice, from the one framed log;
    a cursor may stop inside a record."""
    path = tmp_path / "output.log"
    framed(path, [("stdout", b"one\n"), ("stderr", b"ERR\n"), ("stdout", b"two\nthree\n")])
    for stream, whole in (("stdout", b"one\ntwo\nthree\n"), ("stderr", b"ERR\n")):
        cursor, got = 0, b""
        while True:
            data, cursor = read_stream(path, stream, cursor, limit)
            assert len(data) <= limit
            if not data:
                break
            got += data
        assert got == whole
    assert stream_bytes(tmp_path / "stdout.log") == b"one\ntwo\nthree\n"
    assert stream_text(tmp_path / "stderr.log") == "ERR\n"


def test_a_stream_read_says_the_cuts_and_goes_on_after_them(tmp_path: Path) -> None:
    path = tmp_path / "output.log"
    line = b"x" * 1000 + b"\n"
    framed(path, [("stdout", line)] * 600 + [("stdout", b"LAST\n")], cap=CAP)
    framed(path, [("cut", b"[fgpu: output dropped from here: a reason]\n")], cap=CAP)
    text = stream_bytes(tmp_path / "stdout.log")
    assert text.startswith(line)
    found = NOTICE.search(text)
    assert found is not None
    assert found[2] == b"output"
    assert text.endswith(b"LAST\n[fgpu: output dropped from here: a reason]\n")


def test_a_plain_log_written_by_an_older_fgpu_is_read_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "stdout.log").write_bytes(b"old\n")
    framed(tmp_path / "output.log", [("stdout", b"new\n")])
    assert stream_bytes(tmp_path / "stdout.log") == b"old\n"
    assert stream_bytes(tmp_path / "missing.log") == b""
