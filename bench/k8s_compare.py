"""Benchmark: ``bench/k8s.py`` on several commits side by side, in one run, under one load.

Each source tree is taken with ``git archive REV src`` into a temporary folder (the working
tree as it is for ``worktree``) and put first on ``PYTHONPATH`` of a ``bench/k8s.py --out -``
run: this checkout's bench script, and one API stand-in for every tree (``--standin REV``,
default ``HEAD``, run from its own archived tree), so only the scheduler's code differs.
The runs alternate between the trees (the order rotated each repeat), so other work on
the machine weighs on each alike; ``load_average_1m_end`` of every run is kept.

Prints one JSON object and writes it to ``--out`` (a new file: a stored result is never
written over; default ``bench/results/k8s-compare-<UTC time>.json``):

- ``trees``: label -> commit (``worktree``: uncommitted changes included);
- ``runs``: every run's ``bench/k8s.py`` object, with its tree's label;
- ``summary``: per tree the median over its runs of bind pods/s and decision p50/p99/max,
  and ``p99_ratio``: its decision p99 over the first tree's;
- ``targets``: per tree whether each ``bench/k8s.py`` target was met (on the median).

Usage: ``python bench/k8s_compare.py --tree old=3f7ab17 --tree main=main --tree new=worktree
[--repeat 2] [--out FILE|-] [-- k8s.py arguments, e.g. --nodes 1000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


def source_tree(rev: str, into: Path) -> tuple[Path, str]:
    """The ``src`` folder of ``rev`` (``worktree``: this checkout's) and its commit."""
    if rev == "worktree":
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        return REPO / "src", head + (" + uncommitted changes" if dirty else "")
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", commit, "src"], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src", commit


def run_once(src: Path, standin: Path, extra: list[str]) -> dict[str, Any]:
    """One ``bench/k8s.py`` run with ``src`` first on the path (the stand-in's process with
    ``standin``); its JSON object.

    Raises:
        RuntimeError: the run failed (its stderr's end in the message).
    """
    env = {**os.environ, "PYTHONPATH": str(src), "FGPU_BENCH_STANDIN_PATH": str(standin)}
    done = subprocess.run(
        [sys.executable, str(BENCH / "k8s.py"), "--out", "-", *extra],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench/k8s.py on {src} failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="LABEL=REV|worktree")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--standin", default="HEAD", help="the API stand-in's commit")
    parser.add_argument("--out", default=None, help="a new file ('-': print only)")
    parser.add_argument("extra", nargs="*", help="arguments for bench/k8s.py (after --)")
    args = parser.parse_args()
    if args.out == "-":
        out = None
    elif args.out is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        out = BENCH / "results" / f"k8s-compare-{stamp}.json"
    else:
        out = Path(args.out)
        if out.exists():
            raise SystemExit(f"--out {args.out}: the file exists; give a new path")
    with tempfile.TemporaryDirectory(prefix="fgpu-k8s-compare-") as tmp:
        trees: dict[str, tuple[Path, str]] = {}
        for spec in args.tree:
            label, sep, rev = spec.partition("=")
            if not sep or not label or not rev:
                raise SystemExit(f"--tree {spec!r}: expected LABEL=REV or LABEL=worktree")
            trees[label] = source_tree(rev, Path(tmp) / label)
        labels = list(trees)
        standin_src, standin_commit = source_tree(args.standin, Path(tmp) / "-standin")
        runs: list[dict[str, Any]] = []
        for r in range(args.repeat):
            order = labels[r % len(labels) :] + labels[: r % len(labels)]
            for label in order:
                print(f"run {r + 1}/{args.repeat}: {label}", file=sys.stderr, flush=True)
                runs.append({"tree": label, **run_once(trees[label][0], standin_src, args.extra)})
    summary: dict[str, dict[str, Any]] = {}
    for label in labels:
        mine = [x for x in runs if x["tree"] == label]
        summary[label] = {
            "runs": len(mine),
            "bind_pods_per_s": statistics.median(x["bind"]["pods_per_s"] or 0 for x in mine),
            "decision_p50_ms": statistics.median(x["decision"]["p50_ms"] for x in mine),
            "decision_p99_ms": statistics.median(x["decision"]["p99_ms"] for x in mine),
            "decision_max_ms": statistics.median(x["decision"]["max_ms"] for x in mine),
            "load_average_1m_end": [x["machine"]["load_average_1m_end"] for x in mine],
        }
    first = summary[labels[0]]["decision_p99_ms"]
    for label in labels:
        p99 = summary[label]["decision_p99_ms"]
        summary[label]["p99_ratio"] = round(p99 / first, 2) if first else None
    targets = {
        label: {
            "bind_pods_per_s_min_100": summary[label]["bind_pods_per_s"] >= 100,
            "decision_p99_ms_below_50": summary[label]["decision_p99_ms"] < 50,
        }
        for label in labels
    }
    result = {
        "benchmark": "k8s-compare",
        "trees": {label: trees[label][1] for label in labels},
        "standin": standin_commit,
        "k8s_args": args.extra,
        "summary": summary,
        "targets": targets,
        "runs": runs,
    }
    text = json.dumps(result, indent=2)
    print(text)
    for label, held in targets.items():
        for name, ok in held.items():
            print(f"{label}: target {name}: {'met' if ok else 'NOT met'}", file=sys.stderr)
    if out is not None:
        with out.open("x") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
