"""The dashboard's tail of the framed output log (both streams in order;
:mod:`fgpu.server.dashboard.logtail`): found from the middle of a record, in order, cut to
the size asked, and not fooled by header-shaped output."""

from __future__ import annotations

from pathlib import Path

from fgpu.server.dashboard.logtail import SLACK_BYTES, tail_chunks
from fgpu.wire_logs import frame


def write(path: Path, records: list[tuple[str, bytes]]) -> None:
    path.write_bytes(b"".join(frame(s, 1_000 + i, d) for i, (s, d) in enumerate(records)))


def test_a_short_log_whole_and_in_order(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    write(log, [("stdout", b"epoch 1\n"), ("stderr", b"Traceback\n"), ("stdout", b"done\n")])
    chunks = tail_chunks(log, 4096)
    assert [(c.stream, c.data) for c in chunks] == [
        ("stdout", b"epoch 1\n"),
        ("stderr", b"Traceback\n"),
        ("stdout", b"done\n"),
    ]


def test_a_long_log_is_cut_to_its_tail_from_inside_a_record(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    # output that looks like headers must not be taken for one
    noise = b"o 5 3\nxyz e 12 4\n" * 50
    records = [("stdout", noise + b"line %d\n" % i) for i in range(400)]
    records.append(("stderr", b"ValueError: boom\n"))
    write(log, records)
    assert log.stat().st_size > 4096 + SLACK_BYTES
    chunks = tail_chunks(log, 4096)
    assert sum(len(c.data) for c in chunks) == 4096
    assert chunks[-1].stream == "stderr"
    assert chunks[-1].data == b"ValueError: boom\n"
    assert chunks[-2].data.endswith(b"line 399\n")
    assert [c.time_ns for c in chunks] == sorted(c.time_ns for c in chunks)


def test_missing_and_empty(tmp_path: Path) -> None:
    assert tail_chunks(tmp_path / "none.log", 4096) == []
    (tmp_path / "empty.log").write_bytes(b"")
    assert tail_chunks(tmp_path / "empty.log", 4096) == []
