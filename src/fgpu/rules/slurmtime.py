"""Slurm's way of printing a time, for ``describe`` and ``queue ls`` (kept apart from
:mod:`fgpu.rules.slurm` so that the command line prints it without loading the store's
records)."""

from __future__ import annotations

import math


def format_time(seconds: float) -> str:
    """Seconds as Slurm prints a time: ``HH:MM:SS``, or ``D-HH:MM:SS`` from a day on
    (``90`` -> ``00:01:30``; fractions of a second are rounded up)."""
    total = math.ceil(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


__all__ = ["format_time"]
