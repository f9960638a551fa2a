"""Removing the empty cgroups a killed service or agent left behind (shared by the governor's
freezer and the host-limits cgroups)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path


def remove_stale_neighbours(folder: Path, min_age_s: float) -> list[Path]:
    """Remove the empty folders beside ``folder`` (under the same parent) and the empty
    cgroups in them, each when unchanged for ``min_age_s`` seconds (mtime). A cgroup with
    processes is never removed (the kernel refuses ``rmdir``); errors are skipped.

    Returns:
        the folders removed, per-workload cgroups before the folder that held them.
    """
    removed: list[Path] = []
    now = time.time()

    def old(path: Path) -> bool:
        try:
            return now - path.stat().st_mtime >= min_age_s
        except OSError:
            return False

    try:
        others = [p for p in folder.parent.iterdir() if p.is_dir() and p != folder]
    except OSError:
        return removed
    for other in others:
        with contextlib.suppress(OSError):
            for group in [g for g in other.iterdir() if g.is_dir() and old(g)]:
                with contextlib.suppress(OSError):
                    group.rmdir()
                    removed.append(group)
        if old(other):
            with contextlib.suppress(OSError):
                other.rmdir()
                removed.append(other)
    return removed


__all__ = ["remove_stale_neighbours"]
