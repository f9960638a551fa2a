"""``fgpu serve --suspend-host-memory``: what each value means and what bad ones get."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fgpu.server.suspending import suspend_budget_mib

RAM = 64 * 1024  # MiB


@pytest.mark.parametrize(
    ("given", "mib"),
    [("25%", RAM // 4), ("0", 0), ("0%", 0), ("100%", RAM), ("2GiB", 2048), ("4096", 4096)],
)
def test_sizes_percentages_and_zero(given: str, mib: int) -> None:
    assert suspend_budget_mib(given, RAM) == mib


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("150%", "not a percentage of the RAM in 0..100%"),
        ("-5%", "not a percentage of the RAM in 0..100%"),
        ("abc%", "not a percentage of the RAM in 0..100%"),
        ("lots", "is not a size (e.g. 64GiB)"),
        ("-1GiB", "is not a size (e.g. 64GiB)"),
        ("2TiB", f"more than this machine's {RAM} MiB of RAM"),
    ],
)
def test_bad_values_name_the_flag_the_value_and_why(given: str, why: str) -> None:
    with pytest.raises(ValueError, match="--suspend-host-memory") as err:
        suspend_budget_mib(given, RAM)
    assert repr(given) in str(err.value)
    assert why in str(err.value)


def test_serve_refuses_a_bad_value_before_starting(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "fgpu", "serve", "--socket", str(tmp_path / "s.sock")]
    command += ["--state-dir", str(tmp_path / "state"), "--simulate-gpus", "1xA100-80GB"]
    done = subprocess.run(
        [*command, "--suspend-host-memory", "half"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "fgpu serve: error: --suspend-host-memory: 'half' is not a size" in done.stderr
    assert not (tmp_path / "s.sock").exists()
