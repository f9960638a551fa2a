"""``fgpu sim fill`` as a user runs it: a real process on a tiny trace written here."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

NODES = """sn,cpu_milli,memory_mib,gpu,model
n-a,32000,131072,4,G2
n-b,32000,131072,2,T4
n-c,16000,65536,1,V100M16
n-d,64000,262144,8,G3
"""

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos
p00,4000,8192,1,500,,LS
p01,2000,4096,1,250,,BE
p02,8000,16384,2,1000,,LS
p03,1000,2048,0,0,,BE
p04,4000,8192,1,1000,T4,LS
p05,4000,8192,1,810,,LS
p06,3000,4096,1,470,G2|G3,BE
p07,6000,8192,4,1000,,LS
p08,2000,4096,1,320,,BE
p09,2000,4096,1,650,,LS
"""


def fgpu(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fgpu", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def test_fill_writes_the_report(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = tiny
    out = tmp_path / "out"
    done = fgpu(
        "sim",
        "fill",
        "--nodes",
        nodes,
        "--pods",
        pods,
        "--policy",
        "fgd",
        "--policy",
        "best-fit",
        "--seeds",
        "1-2",
        "--workers",
        "2",
        "--out",
        out,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "curves.csv",
        "fragmentation.png",
        "summary.json",
        "unallocated.png",
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [1, 2]
    assert summary["tune"] == 1.3
    assert list(summary["policies"]) == ["fgd", "best-fit"]
    fgd = summary["policies"]["fgd"]
    assert list(fgd["unallocated_gpu_pct"]) == [str(b) for b in range(131)]
    assert set(fgd) == {
        "unallocated_gpu_pct",
        "fragmentation_rate_pct",
        "fragment_gpu_pct",
        "failed_pods",
        "elapsed_s",
    }
    with (out / "curves.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 131
    assert {r["policy"] for r in rows} == {"fgd", "best-fit"}
    for png in ("unallocated.png", "fragmentation.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "fgd" in done.stdout
    assert "best-fit" in done.stdout
    assert "4.77" in done.stdout  # the published FGD value is shown beside fgpu's


def test_same_seed_same_summary(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = tiny
    results = []
    for name in ("a", "b"):
        done = fgpu(
            "sim",
            "fill",
            "--nodes",
            nodes,
            "--pods",
            pods,
            "--policy",
            "random",
            "--seeds",
            "5",
            "--workers",
            "1",
            "--out",
            tmp_path / name,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        results.append(summary["policies"]["random"]["unallocated_gpu_pct"])
    assert results[0] == results[1]


BAD_PODS = [
    ("negative", "p00,-4000,8192,1,500,,LS\n", "pods.csv:2:", "negative"),
    ("above-1000", "p00,4000,8192,1,1500,,LS\n", "pods.csv:2:", "1000"),
    ("fraction-multi", "p00,4000,8192,2,500,,LS\n", "pods.csv:2:", "num_gpu"),
    ("missing-field", "p00,4000,8192,1\n", "pods.csv:2:", "field"),
]


@pytest.mark.parametrize(("case", "row", "where", "why"), BAD_PODS, ids=[b[0] for b in BAD_PODS])
def test_malformed_pod_row_stops_with_file_line_reason_and_no_output(
    tiny: tuple[Path, Path], tmp_path: Path, case: str, row: str, where: str, why: str
) -> None:
    nodes, pods = tiny
    pods.write_text(PODS.splitlines(keepends=True)[0] + row + "".join(PODS.splitlines(True)[2:]))
    out = tmp_path / "out"
    done = fgpu(
        "sim", "fill", "--nodes", nodes, "--pods", pods, "--seeds", "1", "--out", out, cwd=tmp_path
    )
    assert done.returncode == 2
    assert where in done.stderr
    assert why in done.stderr
    assert not out.exists()


def test_missing_column_and_wrong_layout(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = tiny
    pods.write_text("name,cpu_milli,memory_mib,num_gpu\np0,1,1,0\n")
    done = fgpu(
        "sim", "fill", "--nodes", nodes, "--pods", pods, "--out", tmp_path / "o", cwd=tmp_path
    )
    assert done.returncode == 2
    assert "pods.csv:1:" in done.stderr
    assert "gpu_milli" in done.stderr
    # a node list given where the pod list belongs
    done = fgpu(
        "sim", "fill", "--nodes", nodes, "--pods", nodes, "--out", tmp_path / "o", cwd=tmp_path
    )
    assert done.returncode == 2
    assert "nodes.csv:1:" in done.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "tetris"], "--policy: unknown policy 'tetris'; valid: random, dotprod,"),
        (["--seeds", "51-42"], "--seeds: range '51-42' ends before it starts; write 42-51"),
        (["--seeds", "forty"], "--seeds: 'forty' is not a seed or a range"),
        (["--seeds", ""], "--seeds: empty"),
        (["--seeds", "-3"], "--seeds: '-3': seeds must not be negative"),
        (["--tune", "0"], "--tune: 0.0 is outside (0, 10]"),
        (["--workers", "0"], "--workers: 0 must be at least 1"),
    ],
    ids=[
        "policy",
        "seeds-reversed",
        "seeds-word",
        "seeds-empty",
        "seeds-negative",
        "tune",
        "workers",
    ],
)
def test_bad_options_are_explained(
    tiny: tuple[Path, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    nodes, pods = tiny
    out = tmp_path / "out"
    done = fgpu("sim", "fill", "--nodes", nodes, "--pods", pods, "--out", out, *args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in " ".join(done.stderr.split())
    assert not out.exists()


def test_unknown_policy_lists_every_valid_name(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = tiny
    done = fgpu(
        "sim",
        "fill",
        "--nodes",
        nodes,
        "--pods",
        pods,
        "--policy",
        "nope",
        "--out",
        tmp_path / "o",
        cwd=tmp_path,
    )
    text = " ".join(done.stderr.split())
    for name in (
        "random",
        "dotprod",
        "gpu-clustering",
        "gpu-packing",
        "best-fit",
        "fgd",
        "binpack",
        "spread",
        "fgd-exact",
        "all",
        "published",
    ):
        assert name in text


def test_out_that_is_a_file_is_refused(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = tiny
    target = tmp_path / "file.txt"
    target.write_text("keep me")
    done = fgpu("sim", "fill", "--nodes", nodes, "--pods", pods, "--out", target, cwd=tmp_path)
    assert done.returncode == 2
    assert "--out:" in done.stderr
    assert target.read_text() == "keep me"
