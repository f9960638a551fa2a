"""``fgpu mig``: the commands in process (CliRunner), plus the root check as another user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fgpu.cli import app
from tests.serverproc import AS_NOBODY


def fgpu(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["mig", *args])
    return result.exit_code, result.stdout, result.stderr


def test_profiles_table_and_json() -> None:
    code, out, _ = fgpu("profiles", "A100-80GB")
    assert code == 0
    assert "3g.40gb" in out
    assert "0,4" in out
    code, out, _ = fgpu("profiles", "a30", "--json")
    data = json.loads(out)
    assert data["model"] == "A30"
    assert [p["profile"] for p in data["profiles"]] == [
        "1g.6gb",
        "1g.6gb+me",
        "2g.12gb",
        "2g.12gb+me",
        "4g.24gb",
    ]


def test_profiles_of_a_gpu_without_mig() -> None:
    code, _, err = fgpu("profiles", "T4")
    assert code == 2
    assert "MODEL: T4 has no MIG profiles" in err


def test_layouts() -> None:
    code, out, err = fgpu("layouts", "H100-80GB", "--json")
    assert code == 0
    assert len(json.loads(out)["layouts"]) == 78
    code, out, err = fgpu("layouts", "H100-80GB")
    assert "4g.40gb@0 + 3g.40gb@4" in out
    assert "78 maximal layouts on H100-80GB" in err


def test_plan_json_has_gpus_and_unserved() -> None:
    code, out, _ = fgpu(
        "plan", "--gpus", "2xA100-80GB", "--demand", "3x1g.10gb,2x3g.40gb", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["unserved"] == []
    assert [g["index"] for g in data["gpus"]] == [0, 1]
    assert sum(len(g["create"]) for g in data["gpus"]) == 5
    code, out, err = fgpu("plan", "--gpus", "A100-80GB", "--demand", "2x7g.80gb", "--json")
    assert code == 0
    assert [(u["request"], u["count"]) for u in json.loads(out)["unserved"]] == [("7g.80gb", 1)]
    assert "not served: 1 x 7g.80gb" in err


def test_plan_as_mig_parted(tmp_path: Path) -> None:
    target = tmp_path / "config.yaml"
    code, _, _ = fgpu(
        "plan",
        "--gpus",
        "2xA100-80GB",
        "--demand",
        "3x1g.10gb,2x3g.40gb",
        "--format",
        "mig-parted",
        "--config-name",
        "lab",
        "--out",
        str(target),
    )
    assert code == 0
    data = yaml.safe_load(target.read_text())
    assert data["version"] == "v1"
    counts = [e["mig-devices"] for e in data["mig-configs"]["lab"]]
    assert sorted(n for c in counts for n in c.values()) == [1, 1, 3]


def test_plan_from_an_inventory_file(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "gpus:\n"
        "  - {index: 0, model: A100-80GB,\n"
        "     instances: [{profile: 1g.10gb, start: 0, in_use: true}]}\n"
        "  - {index: 1, model: A100-80GB}\n"
    )
    code, out, _ = fgpu("plan", "--inventory", str(inventory), "--demand", "2x3g.40gb", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["changed_gpus"] == 1
    assert data["gpus"][0]["changed"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--gpus", "A100-80GB", "--demand", "1g.5gb"],
            "--demand: '1g.5gb' is not a MIG profile of A100-80GB; valid: A100-80GB: 1g.10gb",
        ),
        (["--gpus", "2xA30", "--demand", "30GiB"], "--demand: '30GiB' can never fit"),
        (["--gpus", "A100-80GB", "--demand", "x"], "--demand: 'x'"),
        (["--demand", "1g.10gb"], "--gpus or --inventory: give exactly one"),
        (["--gpus", "A100-80GB", "--demand", "1g.10gb", "--format", "xml"], "--format: expected"),
    ],
)
def test_plan_bad_input(args: list[str], message: str) -> None:
    code, out, err = fgpu("plan", *args)
    assert code == 2
    assert message in " ".join(err.split())
    assert out == ""


def test_overlapping_inventory_file_is_refused(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.json"
    inventory.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "model": "A100-80GB",
                        "instances": [
                            {"profile": "4g.40gb", "start": 0},
                            {"profile": "3g.40gb", "start": 0},
                        ],
                    }
                ]
            }
        )
    )
    code, _, err = fgpu("plan", "--inventory", str(inventory), "--demand", "1g.10gb")
    assert code == 2
    assert "inventory.gpus[0].instances: GPU 0: 3g.40gb@0 and 4g.40gb@0 overlap" in " ".join(
        err.split()
    )


def _plan_file(tmp_path: Path) -> Path:
    target = tmp_path / "plan.json"
    code, _, _ = fgpu(
        "plan",
        "--gpus",
        "2xA100-80GB",
        "--demand",
        "3x1g.10gb,2x3g.40gb",
        "--json",
        "--out",
        str(target),
    )
    assert code == 0
    return target


def test_apply_is_a_dry_run_by_default(tmp_path: Path) -> None:
    code, out, err = fgpu("apply", str(_plan_file(tmp_path)), "--simulate-gpus", "2xA100-80GB")
    assert code == 0
    assert "dry run, would: GPU 1: create 3g.40gb@4" in out
    assert "nothing changed" in err


def test_apply_on_simulated_gpus(tmp_path: Path) -> None:
    code, out, _ = fgpu(
        "apply", str(_plan_file(tmp_path)), "--simulate-gpus", "2xA100-80GB", "--yes", "--json"
    )
    assert code == 0
    report = json.loads(out)
    assert report["dry_run"] is False
    assert report["error"] is None
    assert len(report["steps"]) == 5
    assert all(s["uuid"].startswith("MIG-") for s in report["steps"])


def test_apply_refuses_an_overlapping_plan(tmp_path: Path) -> None:
    path = _plan_file(tmp_path)
    data = json.loads(path.read_text())
    data["gpus"][0]["create"].append({"profile": "4g.40gb", "start": 0})
    data["gpus"][0]["create"].append({"profile": "3g.40gb", "start": 0})
    path.write_text(json.dumps(data))
    code, out, err = fgpu("apply", str(path), "--simulate-gpus", "2xA100-80GB", "--yes")
    assert code == 2
    assert "plan.gpus[0].create: GPU 0:" in err
    assert "overlap" in err
    assert "nothing was applied" in " ".join(err.split())
    assert "done:" not in out


def test_apply_a_mig_parted_config(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nmig-configs:\n  half:\n    - devices: all\n      mig-enabled: true\n"
        "      mig-devices: {3g.40gb: 1, 2g.20gb: 2}\n"
    )
    code, out, _ = fgpu("apply", str(config), "--simulate-gpus", "2xA100-80GB", "--yes", "--json")
    assert code == 0
    steps = json.loads(out)["steps"]
    assert sorted((s["gpu"], s["profile"]) for s in steps) == [
        (0, "2g.20gb"),
        (0, "2g.20gb"),
        (0, "3g.40gb"),
        (1, "2g.20gb"),
        (1, "2g.20gb"),
        (1, "3g.40gb"),
    ]


def test_apply_a_file_that_is_neither(tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("hello: world\n")
    code, _, err = fgpu("apply", str(other), "--simulate-gpus", "A30")
    assert code == 2
    assert "neither an fgpu MIG plan" in err


def test_apply_a_binary_file(tmp_path: Path) -> None:
    binary = tmp_path / "random.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    code, _, err = fgpu("apply", str(binary), "--simulate-gpus", "A30")
    assert code == 2
    assert "is not text (UTF-8); give a plan JSON or a mig-parted YAML" in err
    assert "Traceback" not in err


def test_plan_refuses_more_gpus_than_a_plan_takes() -> None:
    code, _, err = fgpu("plan", "--gpus", "1000000000xA100-80GB", "--demand", "1x1g.10gb")
    assert code == 2
    assert "--gpus: more than 1024 GPUs" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a command as another user")
def test_apply_yes_needs_root(tmp_path: Path) -> None:
    path = _plan_file(tmp_path)  # nobody cannot even read it: the root check comes first
    done = subprocess.run(
        [*AS_NOBODY, sys.executable, "-m", "fgpu", "mig", "apply", str(path), "--yes"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={**os.environ, "HOME": "/"},
    )
    assert done.returncode == 2
    assert "needs root" in done.stderr
