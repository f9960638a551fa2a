"""Shared fixtures: where the Alibaba trace lives (beside the project, never copied in).

The trace is found the way ``fgpu sim fill`` finds it (:func:`find_trace_dir`):
``$FGPU_TRACE_DIR`` (the trace's ``csv`` folder) when set, else ``shared/traces/...`` beside
the working folder or the source tree. Tests that need it are skipped when it is absent, with
a reason starting with :data:`TRACE_SKIP`; the run's summary then says once how many were
skipped, why, and where the trace comes from (:func:`pytest_terminal_summary`).
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from fgpu.sim.experiment import DEFAULT_NODES, DEFAULT_PODS, TRACE_ENV, find_trace_dir
from fgpu.sim.trace_source import TRACE_COMMIT, TRACE_FOLDER, TRACE_REPOSITORY

TRACE_SKIP = "Alibaba trace not found"
"""How every skip for want of the trace begins (the summary counts them by it)."""


@pytest.fixture
def trace_dir() -> Path:
    folder = find_trace_dir()
    if folder is None:
        pytest.skip(f"{TRACE_SKIP} (set {TRACE_ENV} to its csv folder)")
    for name in (DEFAULT_NODES, DEFAULT_PODS):
        if not (folder / name).is_file():
            pytest.skip(f"{TRACE_SKIP}: {folder / name} is missing")
    return folder


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside the terminal reporter's own
def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter,
) -> Generator[None, None, None]:
    """One line for the tests skipped because the Alibaba trace is absent, instead of one
    line each in the short summary (``-ra``); the final counts still include them."""
    skipped = list(terminalreporter.stats.get("skipped", []))
    reasons = [_skip_reason(r) for r in skipped]
    trace = [r for r, why in zip(skipped, reasons, strict=True) if why.startswith(TRACE_SKIP)]
    if trace:
        terminalreporter.stats["skipped"] = [r for r in skipped if r not in trace]
    try:
        return (yield)
    finally:
        if trace:
            terminalreporter.stats["skipped"] = skipped
            first = next(why for why in reasons if why.startswith(TRACE_SKIP))
            first = first.removeprefix(TRACE_SKIP).lstrip(" :")
            terminalreporter.write_line(
                f"SKIPPED {len(trace)} test(s) that need the Alibaba GPU trace, which was not "
                f"found ({first}). It is the folder {TRACE_FOLDER} of {TRACE_REPOSITORY} "
                f"(commit {TRACE_COMMIT}); set {TRACE_ENV} to it (README: The fill "
                "experiment).",
                yellow=True,
            )
