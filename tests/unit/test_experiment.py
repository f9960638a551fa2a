"""The fill experiment's inputs and runner: option checks, output folder, trace discovery,
warnings about unusable traces, and the process pool."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from fgpu.model.types import Node, Request
from fgpu.sim import experiment
from fgpu.sim.experiment import (
    ExperimentError,
    Trace,
    check_tune,
    default_trace_file,
    find_trace_dir,
    never_fit,
    prepare_out_dir,
    resolve_policies,
    resolve_workers,
    run_experiment,
    trace_warnings,
    uses_published_inputs,
)

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn-a,32000,131072,4,G2\nn-b,16000,65536,2,T4\n"
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
    "p0,4000,8192,1,500,\np1,2000,4096,1,250,\np2,8000,16384,2,1000,\np3,1000,2048,0,0,\n"
    "p4,4000,8192,1,1000,T4\np5,3000,4096,1,470,G2|T4\n"
)


def write_trace(tmp_path: Path, nodes: str = NODES, pods: str = PODS) -> tuple[Path, Path]:
    (tmp_path / "nodes.csv").write_text(nodes)
    (tmp_path / "pods.csv").write_text(pods)
    return tmp_path / "nodes.csv", tmp_path / "pods.csv"


# ----------------------------------------------------------------------------- policies
@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["FGD"], ["fgd"]),
        (["Best-Fit", "best-fit"], ["best-fit"]),
        (["ALL"], None),
        (["Published"], ["random", "dotprod", "gpu-clustering", "gpu-packing", "best-fit", "fgd"]),
        ([" fgd "], ["fgd"]),
        (
            ["published,FGD-Pattern"],
            [
                "random",
                "dotprod",
                "gpu-clustering",
                "gpu-packing",
                "best-fit",
                "fgd",
                "fgd-pattern",
            ],
        ),
        (["fgd, best-fit", "fgd"], ["fgd", "best-fit"]),
    ],
    ids=[
        "upper",
        "mixed-and-repeat",
        "all-upper",
        "published-capitalized",
        "padded",
        "comma-list",
        "comma-spaces-repeat",
    ],
)
def test_policy_names_match_case_insensitively(
    given: list[str], expected: list[str] | None
) -> None:
    got = resolve_policies(given)
    if expected is None:
        assert len(got) == 11
        assert {"fgd-exact", "fgd-pattern", "fgd-pattern-lookahead"} <= set(got)
    else:
        assert got == expected


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("fdg", "did you mean 'fgd'? "),
        ("fgd-exakt", "did you mean 'fgd-exact' or 'fgd-pattern'? "),
        ("best_fit", "did you mean 'best-fit'? "),
        ("bestfit", "did you mean 'best-fit'? "),
        ("publish", "did you mean 'published'? "),
        ("tetris", ""),
    ],
    ids=["swap", "typo", "underscore", "no-dash", "group", "nothing-close"],
)
def test_unknown_policy_suggests_the_closest_names(name: str, hint: str) -> None:
    with pytest.raises(ExperimentError) as caught:
        resolve_policies([name])
    assert str(caught.value) == (
        f"--policy: unknown policy {name!r}; {hint}valid: random, dotprod, gpu-clustering, "
        "gpu-packing, best-fit, fgd, binpack, fgd-exact, fgd-pattern, fgd-pattern-lookahead, "
        "spread, or all, published"
    )


# ----------------------------------------------------------------------------- tune, workers
@pytest.mark.parametrize("tune", [0.0, -1.0, 10.5, float("nan"), float("inf")])
def test_tune_outside_range_is_refused(tune: float) -> None:
    with pytest.raises(ExperimentError, match=r"^--tune: .* is outside \(0, 10\]$"):
        check_tune(tune)


@pytest.mark.parametrize("tune", [0.01, 1.0, 1.3, 10.0])
def test_tune_inside_range_is_accepted(tune: float) -> None:
    check_tune(tune)


def test_workers_are_capped_at_the_cpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(experiment, "usable_cpus", lambda: 4)
    assert [resolve_workers(w) for w in (None, 1, 3, 4, 5, 64)] == [4, 1, 3, 4, 4, 4]
    with pytest.raises(ExperimentError, match=r"^--workers: 0 must be at least 1$"):
        resolve_workers(0)
    with pytest.raises(ExperimentError, match=r"^--workers: -2 must be at least 1$"):
        resolve_workers(-2)


# ----------------------------------------------------------------------------- --out
def test_out_folder_is_created_probed_and_discarded(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out"
    folder = prepare_out_dir(str(target))
    assert folder.path == target
    assert folder.created == (target, target.parent, target.parent.parent)
    assert target.is_dir()
    assert os.listdir(target) == []  # the probe file is gone
    folder.discard()
    assert os.listdir(tmp_path) == []


def test_existing_out_folder_is_kept_by_discard(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("keep")
    folder = prepare_out_dir(str(tmp_path))
    assert folder.created == ()
    folder.discard()
    assert os.listdir(tmp_path) == ["old.txt"]


def test_discard_leaves_a_folder_that_is_no_longer_empty(tmp_path: Path) -> None:
    folder = prepare_out_dir(str(tmp_path / "out"))
    (tmp_path / "out" / "someone-else.txt").write_text("x")
    folder.discard()
    assert (tmp_path / "out" / "someone-else.txt").is_file()


@pytest.mark.parametrize("text", ["", "   "], ids=["empty", "blank"])
def test_empty_out_is_refused(text: str) -> None:
    with pytest.raises(ExperimentError) as caught:
        prepare_out_dir(text)
    assert str(caught.value) == ("--out: empty folder name; give a folder, e.g. --out fill-results")


def test_out_that_is_a_file_or_below_a_file_is_refused(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep")
    with pytest.raises(ExperimentError) as caught:
        prepare_out_dir(str(afile))
    assert str(caught.value) == f"--out: {afile} exists and is not a folder"
    with pytest.raises(ExperimentError) as caught:
        prepare_out_dir(str(afile / "sub" / "deeper"))
    assert str(caught.value) == (
        f"--out: cannot create {afile}/sub/deeper: {afile} exists and is not a folder"
    )
    assert os.listdir(tmp_path) == ["afile"]
    assert afile.read_text() == "keep"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_out_in_proc_is_refused() -> None:
    with pytest.raises(ExperimentError) as caught:
        prepare_out_dir("/proc/fgpu-test-out")
    assert str(caught.value).startswith(
        "--out: cannot create /proc/fgpu-test-out: /proc does not allow new folders"
    )


def test_out_that_cannot_be_written_is_refused_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Path, data: bytes) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_bytes", refuse)
    with pytest.raises(ExperimentError) as caught:
        prepare_out_dir(str(tmp_path / "new" / "out"))
    assert str(caught.value) == f"--out: cannot write in {tmp_path}/new/out: Permission denied"
    assert os.listdir(tmp_path) == []  # both folders it made are gone again


# ----------------------------------------------------------------------------- trace files
def test_trace_dir_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FGPU_TRACE_DIR", str(tmp_path))
    assert find_trace_dir() == tmp_path


def test_env_trace_dir_without_the_csvs_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FGPU_TRACE_DIR", str(tmp_path))
    with pytest.raises(ExperimentError) as caught:
        default_trace_file("openb_node_list_gpu_node.csv", "--nodes")
    assert str(caught.value) == (
        f"--nodes: no file given and FGPU_TRACE_DIR={tmp_path} has no "
        "openb_node_list_gpu_node.csv; FGPU_TRACE_DIR must point to the trace's csv folder "
        "(.../traces/alibaba-gpu-v2023/csv, the folder holding openb_node_list_gpu_node.csv "
        "and openb_pod_list_default.csv)"
    )


def test_env_trace_dir_with_the_published_csvs_is_used(
    trace_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FGPU_TRACE_DIR", str(trace_dir))
    for name in ("openb_pod_list_default.csv", "openb_node_list_gpu_node.csv"):
        assert default_trace_file(name, "--pods") == trace_dir / name


def test_a_default_trace_file_that_is_not_the_published_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "openb_pod_list_default.csv"
    path.write_text(PODS)
    found = hashlib.sha256(PODS.encode()).hexdigest()
    monkeypatch.setenv("FGPU_TRACE_DIR", str(tmp_path))
    with pytest.raises(ExperimentError) as caught:
        default_trace_file("openb_pod_list_default.csv", "--pods")
    assert str(caught.value) == (
        f"--pods: {path}: SHA-256 {found} is not that of the published "
        "openb_pod_list_default.csv "
        "(1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8, "
        "https://github.com/alibaba/clusterdata folder cluster-trace-gpu-v2023/csv at commit "
        "7a6c496e4f4b6ce6150be8f881cb051bf2abff42); fetch that file again, or pass your "
        "file explicitly to use it anyway (with --pods FILE)"
    )


def test_no_trace_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FGPU_TRACE_DIR", raising=False)
    monkeypatch.setattr(experiment, "find_trace_dir", lambda: None)
    with pytest.raises(ExperimentError, match=r"^--pods: no file given and the Alibaba trace"):
        default_trace_file("openb_pod_list_default.csv", "--pods")


@pytest.mark.parametrize(
    ("nodes", "pods", "published"),
    [
        ("x/openb_node_list_gpu_node.csv", "/y/openb_pod_list_default.csv", True),
        ("openb_node_list_all_node.csv", "openb_pod_list_default.csv", False),
        ("openb_node_list_gpu_node.csv", "openb_pod_list_gpuspec33.csv", False),
        ("nodes.csv", "pods.csv", False),
    ],
    ids=["default-files", "all-nodes", "other-pods", "own-files"],
)
def test_published_inputs_are_recognised_by_file_name(
    nodes: str, pods: str, published: bool
) -> None:
    assert uses_published_inputs(nodes, pods) is published


# ----------------------------------------------------------------------------- warnings
def test_a_cluster_without_gpus_is_refused(tmp_path: Path) -> None:
    nodes, pods = write_trace(tmp_path, nodes="sn,cpu_milli,memory_mib,gpu,model\nc1,1,1,0,\n")
    with pytest.raises(ExperimentError) as caught:
        Trace.load(nodes, pods)
    assert str(caught.value) == (
        f"--nodes: the cluster has no GPUs ({nodes}: 1 node(s), all with gpu 0)"
    )


def test_pods_that_never_fit_are_counted_by_reason(tmp_path: Path) -> None:
    pods = PODS + (
        "q0,1000,1024,1,500,A10\n"  # no A10 node
        "q1,1000,1024,1,500,A10|P100\n"  # none of these models either
        "q2,1000,1024,8,1000,\n"  # the largest node has 4 GPUs
        "q3,1000,1024,4,1000,T4\n"  # the T4 node has 2
        "q4,64000,1024,1,500,\n"  # more CPU than any node
        "q5,64000,1024,0,0,\n"  # CPU-only, too big too
    )
    trace = Trace.load(*write_trace(tmp_path, pods=pods))
    assert never_fit(trace) == {"gpu model": 2, "gpu count": 2, "size": 2}
    assert trace_warnings(trace, 1.3) == [
        "6 of 12 pods can never fit on any node (2 ask for GPU models no node has, 2 ask for "
        "more GPUs than any allowed node has (largest node: 4), 2 need more CPU, memory or GPU "
        "memory than any node has); they count as arrived and always fail"
    ]


def test_no_pod_fits_anywhere(tmp_path: Path) -> None:
    pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1,1,1,500,A10\n"
    trace = Trace.load(*write_trace(tmp_path, pods=pods))
    assert trace_warnings(trace, 1.3) == [
        "none of the 1 pods can ever fit on any node (1 ask for GPU models no node has); "
        "they count as arrived and always fail"
    ]


def test_usable_trace_gives_no_warning(tmp_path: Path) -> None:
    assert trace_warnings(Trace.load(*write_trace(tmp_path)), 1.3) == []


def test_cpu_only_pods_and_low_tune_are_warned_about(tmp_path: Path) -> None:
    pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,0,0\n"
    trace = Trace.load(*write_trace(tmp_path, pods=pods))
    assert trace_warnings(trace, 0.75) == [
        "no pod asks for a GPU: no GPU arrives, so every bucket stays empty",
        "--tune 0.75: pods stop arriving at 75 % of GPU capacity, so buckets above 75 % "
        "(the comparison at 100 % included) stay empty",
    ]


# ----------------------------------------------------------------------------- runner
def test_pool_gives_the_same_runs_in_the_same_order_as_one_process(tmp_path: Path) -> None:
    trace = Trace.load(*write_trace(tmp_path))
    policies, seeds = ["best-fit", "fgd", "random"], [3, 1, 2]
    serial = run_experiment(trace, policies, seeds, workers=1)
    seen: list[tuple[str, int]] = []
    pooled = run_experiment(
        trace, policies, seeds, workers=2, on_done=lambda c: seen.append((c.policy, c.seed))
    )
    order = [(p, s) for p in policies for s in seeds]
    assert [(c.policy, c.seed) for c in pooled] == order
    assert sorted(seen) == sorted(order)
    for a, b in zip(serial, pooled, strict=True):
        assert a.arrived_pct.tolist() == b.arrived_pct.tolist()
        assert a.allocated_pct.tolist() == b.allocated_pct.tolist()
        assert a.frag_pct.tolist() == b.frag_pct.tolist()
        assert a.failed_pods == b.failed_pods


def test_trace_requests_canonicalize_models(tmp_path: Path) -> None:
    trace = Trace.load(*write_trace(tmp_path))
    assert trace.requests[-1] == Request(3000, 4096, 1, 470, None, frozenset({"G2", "T4"}))
    assert trace.nodes[0] == Node("n-a", 32000, 131072, 4, "G2", 32 * 1024)


def test_a_run_without_the_trace_says_so_once_in_its_summary(tmp_path: Path) -> None:
    """The conftest's summary line: how many tests were skipped for want of the trace, why,
    and where the trace comes from (real pytest run in a subprocess)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    missing = tmp_path / "no-trace"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/unit/test_trace.py",
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "FGPU_TRACE_DIR": str(missing)},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "Alibaba" in line]
    assert len(lines) == 1, result.stdout
    (line,) = lines
    assert re.match(r"^SKIPPED \d+ test\(s\) that need the Alibaba GPU trace", line), line
    assert str(missing) in line  # why: the folder it looked at
    assert "cluster-trace-gpu-v2023/csv of https://github.com/alibaba/clusterdata" in line
    assert "7a6c496e4f4b6ce6150be8f881cb051bf2abff42" in line
    assert "FGPU_TRACE_DIR" in line
    skipped = int(re.search(r"(\d+) skipped", result.stdout).group(1))  # type: ignore[union-attr]
    assert line.startswith(f"SKIPPED {skipped} test(s)")  # all of them, in one line
