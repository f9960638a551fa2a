"""Room on the state disk for what must be written: workloads' output never takes the last of
it (issue 27: one user's workloads filled the state disk with output, and then nobody could
cancel, since a cancel is a write to the store in the same folder).

Two guards, each a plain rule on the free space of the state folder's file system:

- :class:`DiskReserve` (``fgpu serve --log-disk-reserve``, default the larger of
  :data:`DEFAULT_RESERVE_BYTES` and :data:`DEFAULT_RESERVE_PERCENT` % of the disk): the launch
  wrapper (:mod:`fgpu.agent.runner`) appends a workload's output only while the disk has more
  free than the reserve (never more than :data:`MAX_RESERVE_SHARE` of the disk's size, so a
  small disk keeps most of its room for use). Below it the output is dropped, and the log
  says so where it was cut (:class:`OutputGate`); it resumes once the disk has an eighth of
  the reserve more again, and says how many bytes were dropped. A submission never takes the
  disk below the same reserve either (:meth:`fgpu.server.storage.StorageCheck.room_problem`).
  So output alone never fills the disk: what stays free is for the store, the exit records
  and the process handles.
- :class:`OutputGate` also honours a *stop file* (``output.stop`` in the workload's log
  folder) that the service writes when the workload's user has stored more output than their
  limit (:mod:`fgpu.server.output_limits`): from then on that workload's output is dropped, and
  the log says why, naming the limit.

Free space is what this process may use (``f_bfree`` for root, who may use the blocks ext4
reserves, else ``f_bavail``), times the fragment size, read with ``statvfs`` (no write) before
each chunk of output, with a look for the stop file: two system calls per read of the
wrapper's pipes (at most 64 KiB), none on the workload's own path. What the wrapper uses is
standard library only (:func:`parse_reserve`, for ``fgpu serve``, reads sizes with
:mod:`fgpu.model.units`).
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_RESERVE_BYTES = 256 * 2**20
"""At least this much of the state disk is never taken by workloads' output."""
DEFAULT_RESERVE_PERCENT = 5.0
"""...nor this share of the disk's size, when it is more."""
MAX_RESERVE_SHARE = 0.25
"""The reserve is never more than this share of the disk's size (a 256 MiB reserve on a
64 MiB disk would drop all output and refuse every submission)."""
STOP_FILE = "output.stop"
"""In a workload's log folder: its output is dropped from now on; the file holds why."""


def free_bytes(folder: Path | str) -> int | None:
    """Bytes of ``folder``'s file system this process may still use (see the module
    docstring); None when it cannot be read."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize


def size_words(size: int) -> str:
    """``268435456`` -> ``256 MiB``; below 1 KiB the bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} bytes"


@dataclass(frozen=True, slots=True)
class DiskReserve:
    """Free space that workloads' output (and submissions, :mod:`fgpu.server.storage`) leave
    on the state disk: the larger of ``size`` bytes and ``percent`` % of the disk's size, but
    at most :data:`MAX_RESERVE_SHARE` of the disk's size.

    Attributes:
        size: bytes (>= 0).
        percent: of the file system's size (0 to 50).
    """

    size: int = DEFAULT_RESERVE_BYTES
    percent: float = DEFAULT_RESERVE_PERCENT

    def check(self) -> None:
        """Raises ValueError naming ``--log-disk-reserve`` when out of range."""
        if self.size < 0:
            raise ValueError(f"--log-disk-reserve: {self.size} bytes must not be negative")
        if not 0 <= self.percent <= 50:
            raise ValueError(f"--log-disk-reserve: {self.percent:g}% must be between 0% and 50%")

    def needed(self, folder: Path | str) -> int:
        """The reserve in bytes for ``folder``'s file system (its size read with
        ``statvfs``; only ``size`` when that fails): the larger of ``size`` and ``percent``
        of the disk, capped at :data:`MAX_RESERVE_SHARE` of the disk."""
        try:
            st = os.statvfs(folder)
        except OSError:
            return self.size
        total = st.f_blocks * st.f_frsize
        wanted = max(self.size, math.ceil(total * self.percent / 100))
        return min(wanted, int(total * MAX_RESERVE_SHARE))

    def words(self) -> str:
        """How it is set, for messages: ``the larger of 256 MiB and 5% of the disk``."""
        cap = f", at most {MAX_RESERVE_SHARE:.0%} of the disk"
        if self.percent and self.size:
            return f"the larger of {size_words(self.size)} and {self.percent:g}% of the disk" + cap
        if self.percent:
            return f"{self.percent:g}% of the disk"
        return size_words(self.size) + cap

    def argv(self) -> list[str]:
        """The wrapper's options that carry it (``--disk-reserve SIZE,PERCENT``)."""
        return ["--disk-reserve", f"{self.size},{self.percent:g}"]


def parse_reserve(text: str, option: str = "--log-disk-reserve") -> DiskReserve:
    """``"256MiB,5%"`` (the larger of the two), ``"1GiB"``, ``"10%"`` or ``"0"`` (no reserve)
    -> :class:`DiskReserve`. Sizes take the units of :func:`fgpu.model.units.parse_bytes`;
    a plain number is bytes.

    Raises:
        ValueError: naming ``option``, echoing ``text`` and saying what is wrong.
    """
    size, percent = 0, 0.0
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or len(parts) > 2 or any(not part for part in parts):
        raise ValueError(
            f"{option}: {text!r} is not a reserve; give a size (256MiB), a share of the disk "
            "(5%), or both (256MiB,5%: the larger), or 0"
        )
    seen_size = seen_percent = False
    for part in parts:
        if part.endswith("%"):
            if seen_percent:
                raise ValueError(f"{option}: {text!r} gives two percentages; give one")
            seen_percent = True
            try:
                percent = float(part[:-1])
            except ValueError:
                raise ValueError(f"{option}: {part!r} is not a percentage (e.g. 5%)") from None
            if not math.isfinite(percent) or not 0 <= percent <= 50:
                raise ValueError(f"{option}: {part!r} must be between 0% and 50% of the disk")
            continue
        if seen_size:
            raise ValueError(f"{option}: {text!r} gives two sizes; give one")
        seen_size = True
        if part in ("0", "0B", "0b"):
            continue
        from fgpu.model.units import UnitError, parse_bytes

        try:
            size = parse_bytes(part, option)
        except UnitError as exc:
            raise ValueError(f"{option}: {part!r}: {exc.reason}") from None
    reserve = DiskReserve(size, percent)
    reserve.check()
    return reserve


def parse_wrapper_reserve(text: str) -> DiskReserve:
    """The wrapper's ``--disk-reserve SIZE,PERCENT`` (bytes and a number, as
    :meth:`DiskReserve.argv` writes them).

    Raises:
        ValueError: malformed.
    """
    size, _, percent = text.partition(",")
    reserve = DiskReserve(int(size), float(percent or 0))
    reserve.check()
    return reserve


class OutputGate:
    """Whether a workload's output may be appended now (see the module docstring).

    Args:
        folder: the workload's log folder (on the state disk; the stop file's folder).
        reserve: free space to leave; None: no reserve (the stop file still counts).
    """

    def __init__(self, folder: Path, reserve: DiskReserve | None) -> None:
        self.folder = folder
        self.reserve = reserve
        self.needed = reserve.needed(folder) if reserve is not None else 0
        self.dropping: str | None = None
        """Why output is dropped now (the notice said where it began), None while kept."""
        self.stopped = False
        """The stop file was found: dropping is for good."""
        self.dropped: dict[str, int] = {"stdout": 0, "stderr": 0}
        """Bytes of each stream dropped since :attr:`dropping` began."""

    def _stop_reason(self) -> str | None:
        try:
            text = (self.folder / STOP_FILE).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"output stopped by the service ({exc.strerror or exc})"
        return text.strip() or "output stopped by the service"

    def check(self) -> tuple[str | None, str | None]:
        """Before a chunk of output: ``(began, ended)``: the notice to write where dropping
        begins now, and the notice to write where it ends now (each None when nothing
        changes). While :attr:`dropping` is set after the call, the chunk is dropped."""
        if self.stopped:
            return None, None
        stop = self._stop_reason()
        if stop is not None:
            self.stopped = True
            ended = self._ended() if self.dropping is not None else None
            self.dropping = stop
            return f"\n[fgpu: output dropped from here: {stop}]\n", ended
        if self.reserve is None or not self.needed:
            return None, None
        free = free_bytes(self.folder)
        if free is None:
            return None, None
        if self.dropping is None:
            if free >= self.needed:
                return None, None
            self.dropping = (
                f"the disk of {self.folder.parent} has {size_words(free)} free, less than "
                f"the {size_words(self.needed)} kept free for fgpu's records (fgpu serve "
                f"--log-disk-reserve: {self.reserve.words()})"
            )
            return f"\n[fgpu: output dropped from here: {self.dropping}]\n", None
        if free >= self.needed + self.needed // 8:
            return None, self._ended()
        return None, None

    def _ended(self) -> str:
        counts = " and ".join(f"{n} bytes of {stream}" for stream, n in self.dropped.items())
        self.dropping = None
        self.dropped = {"stdout": 0, "stderr": 0}
        return f"\n[fgpu: {counts} dropped up to here: the state disk was low]\n"

    def closing(self) -> str | None:
        """At the workload's end: the notice of how much was dropped since the cut began,
        or None when nothing is being dropped."""
        if self.dropping is None:
            return None
        counts = " and ".join(f"{n} bytes of {stream}" for stream, n in self.dropped.items())
        return f"\n[fgpu: {counts} dropped up to the end: {self.dropping}]\n"


def write_stop(folder: Path, reason: str) -> bool:
    """Write the stop file in the workload's log folder ``folder`` (atomically: temporary
    file and rename); False when it could not be written (a missing folder, a full disk)."""
    tmp = folder / f".{STOP_FILE}.tmp"
    try:
        tmp.write_text(reason + "\n", encoding="utf-8")
        os.replace(tmp, folder / STOP_FILE)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


__all__ = [
    "DEFAULT_RESERVE_BYTES",
    "DEFAULT_RESERVE_PERCENT",
    "MAX_RESERVE_SHARE",
    "STOP_FILE",
    "DiskReserve",
    "OutputGate",
    "free_bytes",
    "parse_reserve",
    "parse_wrapper_reserve",
    "size_words",
    "write_stop",
]
