"""The systemd unit in ``deploy/systemd/fgpu.service`` (issue 14, point 11): it keeps state
and runtime folders with the modes the service expects, restarts on failure, signals only
the server on stop (workloads are re-adopted by the next start), and its ``ExecStart`` uses
options ``fgpu serve`` has. ``systemd-analyze verify`` checks it where systemd is installed.
"""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fgpu.cli import app

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "fgpu.service"


def read_unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_the_unit_keeps_state_and_runtime_folders_and_restarts() -> None:
    service = read_unit()["Service"]
    assert service["User"] == "root"  # workloads run as their submitters
    assert (service["StateDirectory"], service["StateDirectoryMode"]) == ("fgpu", "0700")
    assert (service["RuntimeDirectory"], service["RuntimeDirectoryMode"]) == ("fgpu", "0755")
    assert service["RuntimeDirectoryPreserve"] == "yes"
    assert service["Restart"] == "on-failure"
    assert service["KillMode"] == "process"
    assert read_unit()["Install"]["WantedBy"] == "multi-user.target"


def test_exec_start_serves_the_system_socket_with_options_fgpu_serve_has() -> None:
    argv = shlex.split(read_unit()["Service"]["ExecStart"])
    assert argv[0].endswith("/fgpu")
    assert argv[1] == "serve"
    options = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert options == {"--socket": "/run/fgpu/fgpu.sock", "--state-dir": "/var/lib/fgpu"}
    help_text = CliRunner().invoke(app, ["serve", "--help"], terminal_width=200).output
    for option in options:
        assert option in help_text


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed here")
    fgpu = Path(sys.executable).with_name("fgpu")
    if not fgpu.exists():
        pytest.skip(f"no fgpu entry point beside {sys.executable}")
    unit = tmp_path / "fgpu.service"
    unit.write_text(UNIT.read_text().replace("/opt/fgpu/.venv/bin/fgpu", str(fgpu)))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "fgpu.service" not in result.stderr, result.stderr
