"""bench/mig_probe.py: read-only JSON about a GPU's MIG, over the stand-in pynvml; without
NVML a JSON error and a non-zero exit."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.test_mig_nvml import FakeMigNvml

PROBE = Path(__file__).parent.parent.parent / "bench" / "mig_probe.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mig_probe", PROBE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_reports_mode_profiles_placements_and_catalog_differences(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeMigNvml()
    fake.by_enum[0] = replace(fake.by_enum[0], sm_count=15)
    before = len(fake.calls)
    assert _load().main([], nvml=fake) == 0
    report = json.loads(capsys.readouterr().out)
    [gpu] = report["gpus"]
    assert gpu["catalog_model"] == "A100-80GB"
    assert gpu["mig_mode"] == {"current": 1, "pending": 1, "enabled": True}
    by_name = {p["name"]: p for p in gpu["profiles"]}
    assert by_name["3g.40gb"]["starts"] == [0, 4]
    assert by_name["1g.10gb"]["memory_mib"] == 9728
    assert gpu["catalog_comparison"]["different"] == {
        "1g.10gb": {"sm_count": {"device": 15, "catalog": 14}}
    }
    assert gpu["instances"] == []
    assert len(fake.calls) == before  # read only: nothing created or destroyed
    assert not hasattr(fake, "nvmlDeviceSetMigMode")  # the probe could not have called it


def test_probe_with_mig_off_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeMigNvml()
    fake.mig = 0
    assert _load().main([], nvml=fake) == 0
    [gpu] = json.loads(capsys.readouterr().out)["gpus"]
    assert gpu["mig_mode"]["enabled"] is False
    assert "no MIG profiles" in gpu["profiles_error"]


def test_probe_without_nvml_prints_a_json_error() -> None:
    done = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=60)
    # whether NVML loads is asked of a fresh process, as the probe is: this one may hold an
    # NVML library another test loaded (pynvml keeps the first it loads)
    nvml = subprocess.run(
        [sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"], capture_output=True, timeout=60
    )
    if nvml.returncode != 0:  # no driver here: the expected case on CI
        assert done.returncode == 1
        assert "error" in json.loads(done.stdout)
    else:  # pragma: no cover - a machine with a GPU
        assert done.returncode == 0
