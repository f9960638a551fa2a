"""Shared fixtures: where the Alibaba trace lives (beside the project, never copied in).

The trace is found the way ``fgpu sim fill`` finds it (:func:`find_trace_dir`):
``$FGPU_TRACE_DIR`` (the trace's ``csv`` folder) when set, else ``shared/traces/...`` beside
the working folder or the source tree. Tests that need it are skipped when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fgpu.sim.experiment import DEFAULT_NODES, DEFAULT_PODS, find_trace_dir


@pytest.fixture
def trace_dir() -> Path:
    folder = find_trace_dir()
    if folder is None:
        pytest.skip("Alibaba trace not found (set FGPU_TRACE_DIR to its csv folder)")
    for name in (DEFAULT_NODES, DEFAULT_PODS):
        if not (folder / name).is_file():
            pytest.skip(f"Alibaba trace not found: {folder / name} is missing")
    return folder
