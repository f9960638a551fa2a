"""Shared fixtures: where the Alibaba trace lives (beside the project, never copied in)."""

from __future__ import annotations

from pathlib import Path

import pytest

TRACE_DIR = Path(__file__).resolve().parents[2] / "shared" / "traces" / "alibaba-gpu-v2023" / "csv"


@pytest.fixture
def trace_dir() -> Path:
    if not (TRACE_DIR / "openb_node_list_gpu_node.csv").is_file():
        pytest.skip(f"Alibaba trace not found at {TRACE_DIR}")
    return TRACE_DIR
