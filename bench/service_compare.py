"""Benchmark: ``bench/service.py`` side by side for two source trees, in one run.

Runs ``bench/service.py`` (this tree's script) alternately with ``PYTHONPATH`` set to an
earlier commit's ``src`` folder ("before") and with this checkout ("after"), ``--rounds``
times each, before first, so the machine's drift falls on both; prints one JSON object with
every run and, per figure, the median of each side and the after/before ratio. A figure
where lower is better (latencies, CPU, pass time) holds when its ratio is at most 1.10, a
rate when at least 0.90 (10 % for the noise of a shared machine).

Usage: ``python bench/service_compare.py --before-src /tmp/old/src [--rounds 2] [--out F]``
(``git worktree add /tmp/old COMMIT`` gives the tree; it needs no build of its own when
that commit has no native code, else build it with that tree's ``native/build.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIGURES = {  # name -> (path in the bench's JSON, higher is better)
    "sequential_per_s": (("submit", "sequential", "per_s"), True),
    "sequential_p50_ms": (("submit", "sequential", "p50_ms"), False),
    "concurrent_per_s": (("submit", "concurrent", "per_s"), True),
    "p99_ms_all": (("submit", "p99_ms_all"), False),
    "server_cpu_ms_per_submission": (("submit", "server_cpu_ms_per_submission"), False),
    "setup_in_process_per_s": (("scheduling_pass", "setup_per_s"), True),
    "scheduling_pass_best_s": (("scheduling_pass", "best_s"), False),
}


def run_once(src: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out.json"
        run = subprocess.run(
            [sys.executable, str(HERE / "service.py"), "--out", str(out)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if run.returncode != 0:
            side = src if src is not None else "this tree"
            raise SystemExit(f"bench/service.py failed for {side}:\n{run.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def pick(result: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = result
    for part in path:
        value = value[part]
    return float(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-src", type=Path, required=True)
    parser.add_argument("--before-label", default="before")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not (args.before_src / "fgpu").is_dir():
        raise SystemExit(f"--before-src {args.before_src}: no fgpu package in it")
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        runs["before"].append(run_once(args.before_src))
        runs["after"].append(run_once(None))
    side_by_side: dict[str, Any] = {}
    for name, (path, higher_better) in FIGURES.items():
        before = statistics.median(pick(r, path) for r in runs["before"])
        after = statistics.median(pick(r, path) for r in runs["after"])
        ratio = after / before if before else float("inf")
        held = ratio >= 0.90 if higher_better else ratio <= 1.10
        side_by_side[name] = {
            "before": round(before, 2),
            "after": round(after, 2),
            "ratio": round(ratio, 3),
            "held": held,
        }
    result = {
        "benchmark": "service, side by side",
        "before": args.before_label,
        "rounds": args.rounds,
        "load_before_after": os.getloadavg(),
        "side_by_side": side_by_side,
        "runs": runs,
    }
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    for name, figure in side_by_side.items():
        print(f"{name}: {'held' if figure['held'] else 'NOT held'}", file=sys.stderr)


if __name__ == "__main__":
    main()
