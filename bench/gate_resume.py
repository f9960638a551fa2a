"""Benchmark: how soon a workload held at the launch gate resumes after the service dies
(issue 27, point 5: "within 2 s").

Each run starts a real ``fgpu serve --fake-driver`` (one simulated A100-80GB) in a fresh
temporary folder, submits a low-priority CUDA program (``fgpu-cudemo spin``, 1 ms kernels)
and a latency-critical service that stays busy, so the governor holds the low program at
its launch gate; then the service is killed with SIGKILL. Nothing opens the gate: the
interposer counts it open once the agent's heartbeat is older than ``FGPU_SEG_STALE_NS``.

Measured per run, from the instant just before the SIGKILL (``CLOCK_MONOTONIC``):

- ``resume_s``: until the low program's segment counts a new launch (polled every 0.5 ms);
- ``first_launch_s``: until the segment's ``last_launch_ns`` stamp of that launch (the
  interposer's coarse clock, at most a tick behind).

Prints one JSON object and writes it to ``--out`` (default
``bench/results/gate-resume-cpu.json``): the runs, min / median / max, the staleness
threshold, ``target_held`` (every run's ``resume_s`` within 2 s) and the figure measured
before the threshold was lowered (``before``).

Usage: ``python bench/gate_resume.py [--runs 5] [--out FILE]``. Linux; run as root or as a
plain user (the segment folder follows :func:`default_segment_root`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fgpu.agent.interposer.preload import default_segment_root
from fgpu.agent.interposer.segment import STALE_NS, Segment, SegmentError, SegmentStats
from fgpu.native import ensure_built, lib_dir

TARGET_S = 2.0
BEFORE = (
    "2.00-2.08 s with FGPU_SEG_STALE_NS = 2 s (issue 27's measurement; the threshold is "
    "compiled into libfgpu, so the old value cannot run beside the new one)"
)
DEADLINE_S = 60.0
FGPU = [sys.executable, "-m", "fgpu"]


def _wait(check: Any, what: str, timeout_s: float = DEADLINE_S, step_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(step_s)


class Run:
    """One server in its own folder."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fgpu-bench-gate-", dir="/tmp"))
        self.socket = self.root / "s.sock"
        self.state = self.root / "state"
        self.env = {**os.environ, "FGPU_SOCKET": str(self.socket)}
        command = [*FGPU, "serve", "--socket", str(self.socket), "--state-dir", str(self.state)]
        command += ["--simulate-gpus", "1xA100-80GB", "--fake-driver"]
        self.log = (self.root / "serve.log").open("wb")
        self.server = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        _wait(self._healthy, "fgpu serve to answer")

    def _healthy(self) -> bool:
        if self.server.poll() is not None:
            raise RuntimeError(f"fgpu serve exited {self.server.returncode}")
        result = subprocess.run(
            [*FGPU, "ls", "--json"], env=self.env, capture_output=True, timeout=60
        )
        return result.returncode == 0

    def submit(self, *args: str) -> str:
        out = subprocess.run(
            [*FGPU, "submit", *args], env=self.env, capture_output=True, text=True, check=True
        ).stdout
        return str(json.loads(out)["id"])

    def stats(self, workload_id: str) -> SegmentStats | None:
        """The workload's segment now; None before the service made it."""
        try:
            segment = Segment.open(default_segment_root(self.state) / f"{workload_id}.seg")
        except SegmentError:
            return None
        try:
            return segment.stats()
        finally:
            segment.close()

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.server.kill()
        self.server.wait()
        for path in (self.state / "logs").glob("*/handle.json"):
            with contextlib.suppress(OSError, ValueError, ProcessLookupError, KeyError):
                os.killpg(int(json.loads(path.read_text())["pgid"]), signal.SIGKILL)
            with contextlib.suppress(OSError, ValueError, ProcessLookupError, KeyError):
                os.kill(int(json.loads(path.read_text())["pid"]), signal.SIGKILL)
        self.log.close()
        shutil.rmtree(default_segment_root(self.state), ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)


def one_run() -> dict[str, float]:
    run = Run()
    try:
        spin = [str(lib_dir() / "bin" / "fgpu-cudemo"), "spin", "1000000", "100000000"]
        low = run.submit("-p", "low", "-g", "0.25", "--grace", "1", "--json", "--", *spin)
        _wait(lambda: (s := run.stats(low)) is not None and s.launches > 0, "low launching")
        busy = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"  # no hint: busy
        run.submit("-p", "critical", "-g", "0.5", "--json", "--", sys.executable, "-c", busy)
        _wait(
            lambda: (s := run.stats(low)) is not None and s.gate_closed and s.waiting > 0,
            "the low workload held at its gate",
        )
        segment = Segment.open(default_segment_root(run.state) / f"{low}.seg")
        try:
            held = segment.stats().launches
            killed = time.monotonic_ns()
            run.server.send_signal(signal.SIGKILL)
            deadline = killed + int(DEADLINE_S * 1e9)
            while True:
                s = segment.stats()
                if s.launches > held:
                    seen = time.monotonic_ns()
                    break
                if time.monotonic_ns() > deadline:
                    raise RuntimeError("the held workload never resumed")
                time.sleep(0.0005)
        finally:
            segment.close()
        return {
            "resume_s": round((seen - killed) / 1e9, 4),
            "first_launch_s": round((s.last_launch_ns - killed) / 1e9, 4),
        }
    finally:
        run.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "gate-resume-cpu.json"
    )
    args = parser.parse_args()
    ensure_built()
    runs = [one_run() for _ in range(args.runs)]
    resume = [r["resume_s"] for r in runs]
    result = {
        "benchmark": "gate_resume",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "stale_threshold_s": STALE_NS / 1e9,
        "runs": runs,
        "resume_s": {
            "min": min(resume),
            "median": statistics.median(resume),
            "max": max(resume),
        },
        "target_s": TARGET_S,
        "before": BEFORE,
        "worst_over_target": round(max(resume) / TARGET_S, 3),
        "target_held": all(r <= TARGET_S for r in resume),
    }
    text = json.dumps(result, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
