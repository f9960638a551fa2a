"""``fgpu sim fill`` as a user runs it: a real process on a tiny trace written here."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
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
    # Own trace files: the paper's values belong to another trace, so no comparison.
    assert "published @100" not in done.stdout
    assert "within tolerance" not in done.stdout
    assert "4.77" not in done.stdout
    assert "no published values to compare" in " ".join(done.stdout.split())
    assert summary["inputs"] == {"nodes": str(nodes.resolve()), "pods": str(pods.resolve())}
    assert "Warning" not in done.stderr  # e.g. numpy's overflow in the FGD score
    assert "Traceback" not in done.stderr


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


def run_fill_cli(
    tmp_path: Path, *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fgpu", "sim", "fill", *map(str, args)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def one_line(text: str) -> str:
    """Rich wraps long messages; tests compare them with the line breaks undone."""
    return " ".join(text.split())


def assert_refused(done: subprocess.CompletedProcess[str], message: str) -> None:
    """Exit 2 with the message, before any run started, with no traceback and no table."""
    assert done.returncode == 2, done.stderr
    assert message in one_line(done.stderr)
    assert "Traceback" not in done.stderr
    assert "fill:" not in done.stderr  # nothing was run
    assert done.stdout == ""


def test_papers_file_names_compare_with_the_published_values(tmp_path: Path) -> None:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES)
    (tmp_path / "openb_pod_list_default.csv").write_text(PODS)
    done = run_fill_cli(
        tmp_path,
        "--nodes",
        "openb_node_list_gpu_node.csv",
        "--pods",
        "openb_pod_list_default.csv",
        "--policy",
        "FGD",  # names match case-insensitively
        "--seeds",
        "1",
        "--workers",
        "1",
        "--out",
        "out",
    )
    assert done.returncode == 0, done.stderr
    assert "4.77" in done.stdout  # the published FGD value is shown beside fgpu's
    assert "within tolerance" in one_line(done.stdout)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert list(summary) == ["seeds", "tune", "policies", "elapsed_s", "inputs"]
    assert summary["inputs"] == {
        "nodes": str(tmp_path / "openb_node_list_gpu_node.csv"),
        "pods": str(tmp_path / "openb_pod_list_default.csv"),
    }
    assert list(summary["policies"]) == ["fgd"]


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("", "error: --out: empty folder name; give a folder, e.g. --out fill-results"),
        ("  ", "error: --out: empty folder name"),
        ("afile/sub", "error: --out: cannot create afile/sub: afile exists and is not a folder"),
        ("afile", "error: --out: afile exists and is not a folder"),
        ("/proc/fgpu-x", "error: --out: cannot create /proc/fgpu-x: /proc does not allow new"),
        ("/sys/kernel/fgpu-x", "error: --out: cannot create /sys/kernel/fgpu-x:"),
    ],
    ids=["empty", "blank", "below-a-file", "a-file", "proc", "sys"],
)
def test_bad_out_is_refused_before_any_run(
    tiny: tuple[Path, Path], tmp_path: Path, out: str, message: str
) -> None:
    if out.startswith(("/proc", "/sys")) and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux /proc and /sys")
    nodes, pods = tiny
    (tmp_path / "afile").write_text("keep me")
    done = run_fill_cli(tmp_path, "--nodes", nodes, "--pods", pods, "--out", out)
    assert_refused(done, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "nodes.csv", "pods.csv"]
    assert (tmp_path / "afile").read_text() == "keep me"


BAD_VALUES = [
    (
        "node-cpu",
        "nodes",
        f"n-a,{10**27},131072,4,G2\n",
        "nodes.csv:2: column 'cpu_milli': 1000000000000000000000000000 is above the largest "
        "supported value 1000000000",
    ),
    (
        "node-gpus",
        "nodes",
        "n-a,32000,131072,100000000000,G2\n",
        "nodes.csv:2: column 'gpu': 100000000000 is above the largest supported value 64",
    ),
    (
        "node-memory",
        "nodes",
        f"n-a,32000,{2**40 + 1},4,G2\n",
        f"nodes.csv:2: column 'memory_mib': {2**40 + 1} is above the largest supported value "
        f"{2**40}",
    ),
    (
        "pod-num-gpu",
        "pods",
        "p00,4000,8192,99999999999999999999,1000,,LS\n",
        "pods.csv:2: column 'num_gpu': 99999999999999999999 is above the largest supported "
        "value 64",
    ),
    (
        "pod-cpu",
        "pods",
        f"p00,{10**27},8192,1,500,,LS\n",
        "pods.csv:2: column 'cpu_milli': 1000000000000000000000000000 is above the largest "
        "supported value 1000000000",
    ),
]


@pytest.mark.parametrize(
    ("case", "which", "row", "message"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES]
)
def test_absurd_numbers_are_refused_with_file_line_and_bound(
    tiny: tuple[Path, Path], tmp_path: Path, case: str, which: str, row: str, message: str
) -> None:
    nodes, pods = tiny
    path, text = (nodes, NODES) if which == "nodes" else (pods, PODS)
    lines = text.splitlines(keepends=True)
    path.write_text(lines[0] + row + "".join(lines[2:]))
    out = tmp_path / "out"
    done = run_fill_cli(tmp_path, "--nodes", nodes, "--pods", pods, "--seeds", "1", "--out", out)
    assert done.returncode == 2
    assert f"error: {path}" in one_line(done.stderr)
    assert message in one_line(done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert not out.exists()


def test_missing_file_has_no_line_number(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    _, pods = tiny
    missing = tmp_path / "nope.csv"
    done = run_fill_cli(tmp_path, "--nodes", missing, "--pods", pods, "--out", tmp_path / "o")
    assert done.returncode == 2
    assert f"error: {missing}: file not found" in one_line(done.stderr)
    assert ":0:" not in done.stderr
    assert not (tmp_path / "o").exists()


def test_nodes_without_gpus_are_refused(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = tiny
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nc1,32000,131072,0,\nc2,8000,1024,0,\n")
    out = tmp_path / "out"
    done = run_fill_cli(tmp_path, "--nodes", nodes, "--pods", pods, "--out", out)
    assert done.returncode == 2
    assert f"error: --nodes: the cluster has no GPUs ({nodes}: 2 node(s), all with gpu 0)" in (
        one_line(done.stderr)
    )
    assert done.stdout == ""
    assert not out.exists()


def test_pods_that_never_fit_and_low_tune_are_warned_about(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    nodes, pods = tiny
    pods.write_text(PODS + "q1,1000,1024,1,500,A100-80GB,LS\nq2,1000,1024,16,1000,,LS\n")
    done = run_fill_cli(
        tmp_path,
        "--nodes",
        nodes,
        "--pods",
        pods,
        "--policy",
        "best-fit",
        "--seeds",
        "1",
        "--tune",
        "0.8",
        "--workers",
        "1",
        "--out",
        "out",
    )
    assert done.returncode == 0, done.stderr
    stderr = one_line(done.stderr)
    assert (
        "warning: 2 of 12 pods can never fit on any node (1 ask for GPU models no node has, "
        "1 ask for more GPUs than any allowed node has (largest node: 8)); they count as "
        "arrived and always fail"
    ) in stderr
    assert (
        "warning: --tune 0.8: pods stop arriving at 80 % of GPU capacity, so buckets above "
        "80 % (the comparison at 100 % included) stay empty"
    ) in stderr
    assert stderr.index("warning:") < stderr.index("fill:")  # before the runs start


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tune", "0"], "error: --tune: 0.0 is outside (0, 10]"),
        (["--tune", "nan"], "error: --tune: nan is outside (0, 10]"),
        (["--workers", "0"], "error: --workers: 0 must be at least 1"),
        (["--seeds", "x"], "error: --seeds: 'x' is not a seed or a range"),
        (["--policy", "fdg"], "error: --policy: unknown policy 'fdg'; did you mean 'fgd'? valid:"),
        (["--out", ""], "error: --out: empty folder name"),
    ],
    ids=["tune", "tune-nan", "workers", "seeds", "policy", "out"],
)
def test_options_are_checked_before_the_csvs_are_read(
    tmp_path: Path, args: list[str], message: str
) -> None:
    # Neither CSV exists: the option's error must come first.
    done = run_fill_cli(tmp_path, "--nodes", "none.csv", "--pods", "none.csv", *args)
    assert_refused(done, message)
    assert "none.csv" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_workers_above_the_cpu_count_are_capped_with_a_note(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    nodes, pods = tiny
    done = run_fill_cli(
        tmp_path,
        "--nodes",
        nodes,
        "--pods",
        pods,
        "--policy",
        "random",
        "--seeds",
        "1",
        "--workers",
        "4096",
        "--out",
        "out",
    )
    assert done.returncode == 0, done.stderr
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert f"note: --workers 4096 is more than the {cpus} CPUs here; using {cpus}" in (
        one_line(done.stderr)
    )


def test_env_trace_dir_without_the_csvs_names_the_variable(tmp_path: Path) -> None:
    env = {**os.environ, "FGPU_TRACE_DIR": str(tmp_path)}
    done = run_fill_cli(tmp_path, "--seeds", "1", env=env)
    assert_refused(
        done,
        f"error: --nodes: no file given and FGPU_TRACE_DIR={tmp_path} has no "
        "openb_node_list_gpu_node.csv; FGPU_TRACE_DIR must point to the trace's csv folder",
    )
    assert list(tmp_path.iterdir()) == []


def test_help_shows_every_option_in_full(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    done = run_fill_cli(tmp_path, "--help", env=env)
    assert done.returncode == 0
    assert "…" not in done.stdout
    text = one_line(done.stdout.replace("│", " "))
    assert "Pod CSV: name, cpu_milli, memory_mib, num_gpu, gpu_milli[, gpu_spec]." in text
    assert "Node CSV: sn, cpu_milli, memory_mib, gpu, model." in text


def test_report_that_cannot_be_written_exits_2_and_leaves_nothing(
    tiny: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from fgpu import cli
    from fgpu.sim import report

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "write_report", disk_full)
    nodes, pods = tiny
    out = tmp_path / "new" / "out"
    result = CliRunner().invoke(
        cli.app,
        [
            *("sim", "fill", "--nodes", str(nodes), "--pods", str(pods), "--policy", "random"),
            *("--seeds", "1", "--workers", "1", "--out", str(out)),
        ],
    )
    assert result.exit_code == 2
    assert f"error: --out: cannot write the report into {out}: No space left on device" in one_line(
        result.output
    )
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "new").exists()  # the folders it made are gone again


def slow_trace(tmp_path: Path) -> tuple[Path, Path]:
    """A trace whose fgd runs take seconds each: many distinct pod shapes."""
    nodes = tmp_path / "slow-nodes.csv"
    pods = tmp_path / "slow-pods.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"n{i:03d},96000,393216,8,G2\n" for i in range(60))
    )
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(f"p{i:04d},{1000 + i},1024,1,{1 + (i * 37) % 999}\n" for i in range(600))
    )
    return nodes, pods


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="needs POSIX process groups")
def test_ctrl_c_stops_every_worker_at_once(tmp_path: Path) -> None:
    nodes, pods = slow_trace(tmp_path)
    out = tmp_path / "out"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "fgpu", "sim", "fill", "--nodes", str(nodes)),
            *("--pods", str(pods), "--policy", "fgd", "--seeds", "1-20", "--workers", "2"),
            *("--out", str(out)),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a shell job
    )
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
        assert first.startswith("fill:"), first
        time.sleep(1.5)  # the workers are inside their first runs (seconds each)
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        started = time.monotonic()
        stdout, stderr = process.communicate(timeout=30)
        stopped_after = time.monotonic() - started
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, stderr
    assert stopped_after < 5, stopped_after
    assert "interrupted: no report written" in stderr
    assert "Traceback" not in stderr
    assert "KeyboardInterrupt" not in stderr
    assert stdout == ""
    assert not out.exists()
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):  # no worker is left in the group
        os.killpg(process.pid, 0)
