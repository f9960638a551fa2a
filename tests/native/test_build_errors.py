"""``native/build.py`` without a C compiler says why it failed (issue 25, point 9): before,
it exited 1 printing nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parents[2] / "native" / "build.py"


def run_build(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BUILD), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k != "CC"}, **env},
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"CC": "/nonexistent/bin/cc"}, "'/nonexistent/bin/cc'"),
        ({"CC": "no-such-compiler-fgpu -O2"}, "'no-such-compiler-fgpu'"),
        ({"PATH": "/nonexistent"}, "'cc'"),  # CC unset and no cc on PATH
    ],
    ids=["cc-missing-path", "cc-missing-name", "no-cc-on-path"],
)
def test_a_missing_compiler_is_named_on_stderr(
    tmp_path: Path, env: dict[str, str], named: str
) -> None:
    result = run_build(tmp_path, **env)
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert f"native build failed: C compiler {named} not found" in result.stderr, result.stderr
    assert "set CC, or install gcc or clang" in result.stderr
    assert not any((tmp_path / "out").rglob("*.so*"))  # nothing half-built
