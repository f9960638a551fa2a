"""Benchmark: how long the ``fgpu`` command takes to start and answer.

Runs, interleaved, ``python -c pass`` (the interpreter alone), ``fgpu --help``, and ``fgpu
ls``, ``submit``, ``describe``, ``logs``, ``top`` and ``cancel`` against a real ``fgpu
serve`` on a Unix socket (one simulated A100, a few workloads), each as a fresh process
``--runs`` times (each run's ``cancel`` cancels what that run's ``submit`` submitted), and
prints one JSON object: the wall times (median, min, max in seconds) and CPU times (user +
system) of each, each command's median over the interpreter's, and the targets with
measured / target and whether each was met:

- ``fgpu --help`` and ``fgpu ls``: under 0.3 s wall (issue 17);
- ``submit``, ``describe``, ``top``, ``logs``, ``cancel``: at most 0.2 s of CPU each
  (issue 25, point 8; CPU rather than wall, which grows with the machine's load).

``--baseline SRC`` runs every command a second time in each round with ``PYTHONPATH=SRC``
(another checkout's ``src`` folder: the same interpreter and libraries, that fgpu's code),
against the same server, and adds ``baseline`` (its figures) and ``over_baseline`` (this
code's median CPU and wall over the baseline's, per command): a side-by-side comparison
that holds on a busy machine, where absolute times drift.

The wall times include the interpreter's own start (what a user waits for); on a busy
machine they grow with the load (``load_average``), the CPU times much less.

Usage: ``python bench/cli_start.py [--runs N] [--baseline SRC] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_S = 0.3
"""``fgpu --help`` and ``fgpu ls``: wall seconds (issue 17)."""
CPU_TARGET_S = 0.2
"""``submit``, ``describe``, ``top``, ``logs``, ``cancel``: CPU seconds (issue 25)."""
CPU_TARGETS = ("fgpu submit", "fgpu describe", "fgpu top", "fgpu logs", "fgpu cancel")
BIN = Path(sys.executable).parent


def start_server(folder: Path) -> tuple[subprocess.Popen[bytes], Path]:
    socket = folder / "fgpu.sock"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "fgpu", "serve", "--socket", str(socket)),
            *("--state-dir", str(folder), "--simulate-gpus", "1xA100-40GB"),
            *("--log-level", "warning"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not socket.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("fgpu serve did not start")
        time.sleep(0.05)
    return proc, socket


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system) and stdout of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, check=True, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu, done.stdout


def summary(times: list[float], cpu: list[float]) -> dict[str, float]:
    return {
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
        "cpu_median_s": round(statistics.median(cpu), 4),
    }


class Round:
    """One version's commands (``env`` picks the code), run once per round."""

    def __init__(self, fgpu: str, env: dict[str, str], first: str) -> None:
        self.fgpu = fgpu
        self.env = env
        self.first = first  # a running workload: describe, logs
        self.times: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def timed(self, name: str, argv: list[str], keep: bool = True) -> str:
        elapsed, used, stdout = run(argv, self.env)
        if keep:
            self.times.setdefault(name, []).append(elapsed)
            self.cpu.setdefault(name, []).append(used)
        return stdout

    def once(self, keep: bool = True) -> str:
        """Every command once; returns the id of the workload it submitted (and cancelled)."""
        fgpu = self.fgpu
        self.timed("python -c pass", [sys.executable, "-c", "pass"], keep)
        self.timed("fgpu --help", [fgpu, "--help"], keep)
        self.timed("fgpu ls", [fgpu, "ls"], keep)
        job = ("-g", "0.01", "--grace", "0", "--", "sleep", "600")
        submitted = self.timed("fgpu submit", [fgpu, "submit", *job], keep).strip()
        self.timed("fgpu describe", [fgpu, "describe", self.first], keep)
        self.timed("fgpu logs", [fgpu, "logs", self.first], keep)
        self.timed("fgpu top", [fgpu, "top"], keep)
        self.timed("fgpu cancel", [fgpu, "cancel", submitted], keep)
        return submitted

    def figures(self) -> dict[str, dict[str, float]]:
        return {name: summary(t, self.cpu[name]) for name, t in self.times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--baseline", type=Path, help="another checkout's src folder")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    fgpu = str(BIN / "fgpu")
    with tempfile.TemporaryDirectory(prefix="fgpu-cli-start-") as tmp:
        proc, socket = start_server(Path(tmp))
        env = {**os.environ, "FGPU_SOCKET": str(socket)}
        env.pop("PYTHONPATH", None)
        ids: list[str] = []
        try:
            for i in range(3):  # something to list
                job = ("--name", f"job-{i}", "-g", "0.3", "--grace", "0", "--", "sleep", "600")
                ids.append(run([fgpu, "submit", *job], env)[2].strip())
            this = Round(fgpu, env, ids[0])
            rounds = [this]
            base: Round | None = None
            if args.baseline is not None:
                base_env = {**env, "PYTHONPATH": str(args.baseline.resolve())}
                base = Round(fgpu, base_env, ids[0])
                rounds.append(base)
            for r in rounds:  # warm the page cache and the bytecode
                ids.append(r.once(keep=False))
            for _ in range(args.runs):
                for r in rounds:
                    ids.append(r.once())
        finally:
            # the workloads outlive a stopped server (it re-adopts them): cancel them first
            subprocess.run([fgpu, "cancel", *ids], capture_output=True, env=env)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                listed = subprocess.run([fgpu, "ls"], capture_output=True, text=True, env=env)
                if not any(i in listed.stdout for i in ids):
                    break
                time.sleep(0.2)
            proc.terminate()
            proc.wait(timeout=60)
    figures = this.figures()
    python = statistics.median(this.times["python -c pass"])
    targets: dict[str, dict[str, Any]] = {
        name: {
            "target_s": TARGET_S,
            "of": "wall",
            "measured_over_target": round(figures[name]["median_s"] / TARGET_S, 2),
            "cpu_over_target": round(figures[name]["cpu_median_s"] / TARGET_S, 2),
            "met": figures[name]["median_s"] < TARGET_S,
        }
        for name in ("fgpu --help", "fgpu ls")
    }
    for name in CPU_TARGETS:
        targets[name] = {
            "target_s": CPU_TARGET_S,
            "of": "cpu",
            "measured_over_target": round(figures[name]["cpu_median_s"] / CPU_TARGET_S, 2),
            "met": figures[name]["cpu_median_s"] <= CPU_TARGET_S,
        }
    result: dict[str, Any] = {
        "benchmark": "cli_start",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "runs": args.runs,
        "commands": figures,
        "over_python": {
            name: round(statistics.median(t) / python, 2)
            for name, t in this.times.items()
            if name != "python -c pass"
        },
        "target": targets,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if base is not None:
        before = base.figures()
        result["baseline"] = {"src": str(args.baseline), "commands": before}
        result["over_baseline"] = {
            name: {
                "cpu": round(figures[name]["cpu_median_s"] / before[name]["cpu_median_s"], 2),
                "wall": round(figures[name]["median_s"] / before[name]["median_s"], 2),
            }
            for name in figures
            if name != "python -c pass"
        }
        result["baseline_target_met"] = {
            name: before[name]["cpu_median_s"] <= CPU_TARGET_S for name in CPU_TARGETS
        }
    text = json.dumps(result, indent=2)
    print(text)
    for name, t in result["target"].items():
        print(f"target {name}: {'met' if t['met'] else 'NOT met'}", file=sys.stderr)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
