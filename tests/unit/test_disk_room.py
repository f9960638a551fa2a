"""The state disk's reserve for workloads' output and the gate that keeps it
(:mod:`fgpu.disk_room`), and the service's ballast (:class:`fgpu.server.storage.Ballast`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fgpu.disk_room import STOP_FILE, DiskReserve, OutputGate, parse_reserve, write_stop
from fgpu.server.storage import Ballast


@pytest.mark.parametrize(
    ("text", "reserve"),
    [
        ("256MiB,5%", DiskReserve(256 * 2**20, 5.0)),
        ("5%,1GiB", DiskReserve(2**30, 5.0)),
        ("1GiB", DiskReserve(2**30, 0.0)),
        ("10%", DiskReserve(0, 10.0)),
        ("0", DiskReserve(0, 0.0)),
        ("0,0%", DiskReserve(0, 0.0)),
        (" 4096 , 2.5% ", DiskReserve(4096, 2.5)),
    ],
    ids=["both", "either-order", "size", "percent", "none", "none-both", "spaces"],
)
def test_reserves_parse(text: str, reserve: DiskReserve) -> None:
    assert parse_reserve(text) == reserve


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "--log-disk-reserve: '' is not a reserve"),
        ("lots", "--log-disk-reserve: 'lots': not a size"),
        ("1GiB,2GiB", "--log-disk-reserve: '1GiB,2GiB' gives two sizes"),
        ("5%,6%", "--log-disk-reserve: '5%,6%' gives two percentages"),
        ("60%", "--log-disk-reserve: '60%' must be between 0% and 50% of the disk"),
        ("-1%", "--log-disk-reserve: '-1%' must be between 0% and 50% of the disk"),
        ("x%", "--log-disk-reserve: 'x%' is not a percentage"),
        ("nan%", "--log-disk-reserve: 'nan%' must be between 0% and 50%"),
        ("1GiB,", "--log-disk-reserve: '1GiB,' is not a reserve"),
        ("-5MiB", "--log-disk-reserve: '-5MiB'"),
    ],
    ids=[
        "empty",
        "word",
        "two-sizes",
        "two-percents",
        "over-50",
        "negative-percent",
        "bad-percent",
        "nan",
        "trailing-comma",
        "negative-size",
    ],
)
def test_bad_reserves_are_refused_naming_the_flag(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_reserve(text)


def test_the_reserve_is_the_larger_of_its_size_and_its_share(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    disk = st.f_blocks * st.f_frsize
    assert DiskReserve(1, 10.0).needed(tmp_path) >= disk // 10
    assert DiskReserve(disk // 8, 1.0).needed(tmp_path) == disk // 8
    assert DiskReserve(1, 0.0).words() == "1 bytes, at most 25% of the disk"
    assert DiskReserve(256 * 2**20, 5.0).words() == (
        "the larger of 256 MiB and 5% of the disk, at most 25% of the disk"
    )


def test_the_reserve_is_at_most_a_quarter_of_the_disk(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    disk = st.f_blocks * st.f_frsize
    assert DiskReserve(disk, 1.0).needed(tmp_path) == disk // 4
    assert DiskReserve(2 * disk, 50.0).needed(tmp_path) == disk // 4
    assert DiskReserve(0, 50.0).needed(tmp_path) == disk // 4


def test_the_gate_drops_below_the_reserve_and_says_so(tmp_path: Path) -> None:
    gate = OutputGate(tmp_path, DiskReserve(0, 50.0))
    gate.needed = 2**62  # more than any disk has free
    began, ended = gate.check()
    assert ended is None
    assert began is not None
    assert "output dropped from here: the disk of" in began
    assert "fgpu serve --log-disk-reserve: 50% of the disk" in began
    assert gate.dropping is not None
    assert gate.check() == (None, None)  # still dropping, said once
    gate.dropped["stdout"] += 100
    gate.needed = 1  # room again
    began, ended = gate.check()
    assert began is None
    assert ended is not None
    assert "100 bytes of stdout and 0 bytes of stderr dropped up to here" in ended
    assert gate.dropping is None
    assert gate.closing() is None


def test_the_stop_file_drops_for_good_naming_why(tmp_path: Path) -> None:
    gate = OutputGate(tmp_path, None)
    assert gate.check() == (None, None)
    assert write_stop(tmp_path, "over your limit (--max-output-bytes 1 MiB)")
    began, _ = gate.check()
    assert began is not None
    assert "output dropped from here: over your limit (--max-output-bytes 1 MiB)" in began
    (tmp_path / STOP_FILE).unlink()
    assert gate.check() == (None, None)
    assert gate.dropping is not None  # for good
    gate.dropped["stderr"] += 7
    closing = gate.closing()
    assert closing is not None
    assert "0 bytes of stdout and 7 bytes of stderr dropped up to the end" in closing


def test_a_stop_file_cannot_be_written_into_a_missing_folder(tmp_path: Path) -> None:
    assert not write_stop(tmp_path / "gone", "why")


def test_the_ballast_is_allocated_released_once_and_allocated_again(tmp_path: Path) -> None:
    ballast = Ballast(tmp_path, 1 << 20)
    assert ballast.problem() is None
    assert ballast.allocate()
    assert ballast.path.stat().st_size == 1 << 20
    assert os.stat(ballast.path).st_blocks * 512 >= 1 << 20  # blocks held, not a sparse file
    assert ballast.release("database or disk is full")
    assert not ballast.path.exists()
    assert not ballast.release("again")  # nothing left to give
    again = Ballast(tmp_path, 1 << 20)
    again.released_because = "database or disk is full"
    # (with no room it says why: tests/integration/test_disk_room.py, on a full tmpfs)
    assert again.problem() is None  # room: allocated again
    assert again.path.stat().st_size == 1 << 20


def test_no_ballast_gives_nothing(tmp_path: Path) -> None:
    ballast = Ballast(tmp_path, 0)
    assert ballast.allocate()
    assert not ballast.path.exists()
    assert not ballast.release("full")


def test_a_ballast_with_no_room_says_why_and_leaves_no_file(tmp_path: Path) -> None:
    ballast = Ballast(tmp_path, 1 << 60)  # more than this disk holds
    assert not ballast.allocate()
    assert not ballast.path.exists()
    assert list(tmp_path.iterdir()) == []  # no partial file left
    ballast.released_because = "no room for it when the service started"
    said = ballast.problem()
    assert said is not None
    assert f"the disk of {tmp_path} has no room for fgpu's reserve (disk-ballast" in said
    assert "fgpu serve --disk-ballast; no room for it when the service started" in said
