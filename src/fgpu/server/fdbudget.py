"""The service's file descriptors: its limit raised at start, and launches held while they
would run short (issue 27).

Each running workload keeps descriptors open in the service for its whole run
(:data:`FDS_PER_WORKLOAD`: the pidfd its end is watched through and the freezer's kept
cgroup files), and a launch needs a few more for a moment (:data:`LAUNCH_FDS`: the wrapper's
pipes, its logs). One user's array of hundreds of small workloads reached the default soft
limit of 1024; every later launch failed half-way. So:

- :func:`raise_file_limit` lifts the soft ``RLIMIT_NOFILE`` to the hard limit when the
  service starts (``getrlimit(2)``: an unprivileged process may raise its soft limit up to
  the hard one), and the log says the figures;
- :func:`launch_shortfall` says why a launch must wait while fewer than
  :data:`LAUNCH_FDS` + :data:`FLOOR_FDS` descriptors are free: the workload stays pending
  with that reason (``fgpu ls``) and starts when others end, rather than failing half-way.
"""

from __future__ import annotations

import logging
import os
import resource

log = logging.getLogger("fgpu.server")

FDS_PER_WORKLOAD = 4
"""Descriptors the service keeps open per running workload (pidfd, three freezer files)."""
LAUNCH_FDS = 16
"""Descriptors a launch needs for a moment (pipes to the wrapper, its logs, the pidfd and
the freezer's files)."""
FLOOR_FDS = 64
"""Descriptors never given to launches: the store, the logs, the API's accept and answers."""


def raise_file_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; returns ``(before, after)`` soft
    limits (equal when there was nothing to raise or raising failed; logged either way)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == soft:
        log.info("file limit (RLIMIT_NOFILE): %s", soft)
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:
        log.warning(
            "file limit (RLIMIT_NOFILE) stays %s: raising it to %s failed: %s", soft, hard, exc
        )
        return soft, soft
    log.info("file limit (RLIMIT_NOFILE) raised from %s to the hard limit %s", soft, hard)
    return soft, hard


def open_fds() -> int:
    """How many descriptors this process has open (``/proc/self/fd``)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir opened
    except OSError:
        return 0


def launch_shortfall() -> str | None:
    """Why a launch must wait for descriptors now, or None when enough are free."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    used = open_fds()
    free = soft - used
    if free >= LAUNCH_FDS + FLOOR_FDS:
        return None
    return (
        f"held: the service is short of file descriptors ({used} open of its limit {soft}, "
        f"RLIMIT_NOFILE; a launch needs {LAUNCH_FDS} with {FLOOR_FDS} kept free); it starts "
        "when running workloads end or the service's file limit is raised"
    )


__all__ = [
    "FDS_PER_WORKLOAD",
    "FLOOR_FDS",
    "LAUNCH_FDS",
    "launch_shortfall",
    "open_fds",
    "raise_file_limit",
]
