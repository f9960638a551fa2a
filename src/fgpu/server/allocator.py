"""The server's memory allocator settings (issue 27: a heavy listing must not leave the
server holding its peak).

Workload commands are up to 1 MiB, each argument up to 128 KiB: a listing decodes and
encodes many such blocks. glibc serves blocks above its mmap threshold (128 KiB at start)
with ``mmap`` and gives them back on ``free``, but raises the threshold to the size of each
such block freed (up to 32 MiB), after which the same blocks come from the heap and, freed in
a fragmented heap, stay in the process; and each thread of the API's pool gets its own arena
(up to 8 per core), each keeping its own freed memory. So :func:`tune_allocator` fixes the
threshold at 64 KiB (which also turns its raising off) and caps the arenas at 2
(``mallopt(3)``, ``M_MMAP_THRESHOLD`` and ``M_ARENA_MAX``). ``bench/heavy_listing.py``
measured the effect (40 workloads of 256 KiB commands, four listings at once, idle 150 MB):
peak RSS 254 MB without, 192 MB with, and RSS back to within 4 MB of idle after each.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("fgpu.server")

M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter number of the mmap threshold (glibc ``malloc.h``)."""
M_ARENA_MAX = -8
"""``mallopt`` parameter number of the most arenas (glibc ``malloc.h``)."""

MMAP_THRESHOLD = 64 * 1024
"""Blocks from this size up are mapped and unmapped on their own, bytes."""
ARENAS = 2
"""Most malloc arenas of the server process."""

_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES")


def tune_allocator() -> bool:
    """Set :data:`MMAP_THRESHOLD` and :data:`ARENAS` with glibc's ``mallopt``, unless the
    environment sets the allocator itself (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_ARENA_MAX``,
    ``GLIBC_TUNABLES``: the operator's choice wins). Call it early, before the server's
    threads start. True when both were set; False elsewhere (another C library, or the
    environment's settings), which changes nothing but the memory figures."""
    if any(os.environ.get(name) for name in _ENVIRONMENT):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done: bool = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    done = bool(mallopt(M_ARENA_MAX, ARENAS) == 1) and done
    if not done:
        log.debug("mallopt refused the allocator settings; memory figures may differ")
    return done


__all__ = ["ARENAS", "MMAP_THRESHOLD", "tune_allocator"]
