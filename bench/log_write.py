"""Benchmark: each byte of a workload's output is stored once (issue 27).

Before, the launch wrapper (:mod:`fgpu.agent.runner`) wrote each stream twice: to its
plain log (``stdout.log``, ``stderr.log``) and, framed, to ``output.log``; now the launcher
asks for the framed log only (``--only-output-log``) and the API reads one stream back from
it (:func:`fgpu.log_files.read_stream`). This runs the real wrapper both ways, side by side,
over the same workload (``seq`` writing about :data:`MIB` MiB to stdout and a line to
stderr; no cap, no disk reserve), and reports per mode the bytes stored in the workload's
folder, the ratio to the output's own size, and the wrapper's wall time (median of
:data:`RUNS`). It also times reading stdout back through :func:`fgpu.log_files.read_stream`
in 8 MiB answers (the API's largest) against reading the old plain file.

Target: the framed-only mode stores at most 1.1x the output (the old mode: about 2x).

Usage: ``python bench/log_write.py [--out FILE] [--mib N]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fgpu.log_files import read_log, read_stream

MIB = 64
RUNS = 3
CHUNK = 8 * 2**20


def run_once(folder: Path, only_framed: bool, mib: int) -> tuple[float, int, int]:
    """One wrapper run; (wall seconds, bytes stored, bytes the workload wrote)."""
    folder.mkdir()
    count = mib * 2**20 // 7  # `seq` lines of about 7 bytes
    script = f"seq 1 {count}; echo to-stderr >&2"
    argv = [
        sys.executable,
        "-m",
        "fgpu.agent.runner",
        "--exit-file",
        str(folder / "exit.json"),
        "--output-log",
        str(folder / "output.log"),
        *(["--only-output-log"] if only_framed else []),
        "--",
        "sh",
        "-c",
        script,
    ]
    out_path = folder / ("wrapper.log" if only_framed else "stdout.log")
    err_path = folder / ("wrapper.log" if only_framed else "stderr.log")
    with out_path.open("ab") as out, err_path.open("ab") as err:
        started = time.perf_counter()
        subprocess.run(argv, stdout=out, stderr=err, check=True)
        wall = time.perf_counter() - started
    stored = sum(p.stat().st_size for p in folder.iterdir() if p.name != "exit.json")
    written = len(subprocess.run(["sh", "-c", script], capture_output=True, check=True).stdout)
    return wall, stored, written + len(b"to-stderr\n")


def read_back(folder: Path, only_framed: bool) -> float:
    """Seconds to read all of stdout back in API-sized answers."""
    started = time.perf_counter()
    cursor = 0
    while True:
        if only_framed:
            data, cursor = read_stream(folder / "output.log", "stdout", cursor, CHUNK)
        else:
            data, cursor = read_log(folder / "stdout.log", cursor, CHUNK)
        if not data:
            return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--mib", type=int, default=MIB)
    args = parser.parse_args()
    modes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="fgpu-logwrite-") as tmp:
        for name, only in (("both_copies", False), ("framed_only", True)):
            walls, reads = [], []
            stored = written = 0
            for run in range(RUNS):
                folder = Path(tmp) / f"{name}-{run}"
                wall, stored, written = run_once(folder, only, args.mib)
                walls.append(wall)
                reads.append(read_back(folder, only))
            modes[name] = {
                "output_bytes": written,
                "stored_bytes": stored,
                "stored_over_output": round(stored / written, 3),
                "wrapper_wall_s_median": round(statistics.median(walls), 3),
                "read_stdout_s_median": round(statistics.median(reads), 3),
            }
    ratio = modes["framed_only"]["stored_bytes"] / modes["both_copies"]["stored_bytes"]
    result = {
        "benchmark": "log_write",
        "machine": platform.node(),
        "python": platform.python_version(),
        "output_mib": args.mib,
        "runs": RUNS,
        "modes": modes,
        "stored_framed_only_over_both": round(ratio, 3),
        "target": "framed_only stores at most 1.1x the output",
        "target_held": modes["framed_only"]["stored_over_output"] <= 1.1,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
