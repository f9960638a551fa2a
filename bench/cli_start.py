"""Benchmark: how long the ``fgpu`` command takes to start and answer.

Runs, interleaved, ``python -c pass`` (the interpreter alone), ``fgpu --help`` and
``fgpu ls`` against a real ``fgpu serve`` on a Unix socket (one simulated A100, a few
workloads), each as a fresh process ``--runs`` times, and prints one JSON object: the wall
times (median, min, max in seconds) and CPU times (user + system) of each, each command's
median over the interpreter's, and the issue's target (under 0.3 s for ``fgpu --help`` and
``fgpu ls``) with measured / target (wall, and CPU).
The wall times include the interpreter's own start (what a user waits for); on a busy
machine they grow with the load (``load_average``), the CPU times much less.

Usage: ``python bench/cli_start.py [--runs N] [--out FILE]``.
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


def wall(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def summary(times: list[float]) -> dict[str, float]:
    return {
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "max_s": round(max(times), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    fgpu = str(BIN / "fgpu")
    with tempfile.TemporaryDirectory(prefix="fgpu-cli-start-") as tmp:
        proc, socket = start_server(Path(tmp))
        ids: list[str] = []
        try:
            env = {**os.environ, "FGPU_SOCKET": str(socket)}
            for i in range(3):  # something to list
                job = ("--name", f"job-{i}", "-g", "0.3", "--grace", "0", "--", "sleep", "600")
                submitted = subprocess.run(
                    [fgpu, "submit", *job],
                    check=True,
                    capture_output=True,
                    text=True,
                    env=env,
                )
                ids.append(submitted.stdout.strip())
            commands = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "fgpu --help": [fgpu, "--help"],
                "fgpu ls": [fgpu, "ls"],
            }
            for argv in commands.values():  # warm the page cache and the bytecode
                wall(argv, env)
            times: dict[str, list[float]] = {name: [] for name in commands}
            cpu: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(args.runs):
                for name, argv in commands.items():
                    elapsed, used = wall(argv, env)
                    times[name].append(elapsed)
                    cpu[name].append(used)
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
    base = statistics.median(times["python -c pass"])
    result: dict[str, Any] = {
        "benchmark": "cli_start",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "runs": args.runs,
        "commands": {
            name: {**summary(t), "cpu_median_s": round(statistics.median(cpu[name]), 4)}
            for name, t in times.items()
        },
        "over_python": {
            name: round(statistics.median(t) / base, 2)
            for name, t in times.items()
            if name != "python -c pass"
        },
        "target": {
            name: {
                "target_s": TARGET_S,
                "measured_over_target": round(statistics.median(times[name]) / TARGET_S, 2),
                "cpu_over_target": round(statistics.median(cpu[name]) / TARGET_S, 2),
                "met": statistics.median(times[name]) < TARGET_S,
            }
            for name in ("fgpu --help", "fgpu ls")
        },
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    text = json.dumps(result, indent=2)
    print(text)
    for name, t in result["target"].items():
        print(f"target {name}: {'met' if t['met'] else 'NOT met'}", file=sys.stderr)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
