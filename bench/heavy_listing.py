"""Benchmark: peak server memory of a heavy listing (issue 27, trial finding: a page of 1,000
workloads with 256 KiB commands was ~256 MB per answer).

Two real ``fgpu serve`` processes, side by side in one run, each on its own SQLite store with
the same workloads: the baseline (the source tree given with ``--baseline-src``, main at
ef01fae) and this tree. Each gets :data:`COUNT` finished workloads whose commands take
:data:`COMMAND_BYTES` bytes, is restarted (a clean memory baseline), and then, with its peak
RSS reset before each (``/proc/PID/clear_refs`` 5) and read after (``VmHWM``):

- ``api``: every page of ``GET /v1/workloads?all=true`` (following the cursor, no timeout
  to speak of, so that a slow server is measured);
- ``api_concurrent_4``: four such listings at once;
- ``cli_ls_json`` / ``cli_ls_table``: ``fgpu ls --all --all-users [--json]`` as a user types
  it (the client's 30 s timeout applies: a failure is recorded with its message).

Target: the server's peak RSS stays under :data:`TARGET_MB` MB during each listing (this
tree), and every listing still shows every workload.

Usage: ``python bench/heavy_listing.py --baseline-src DIR [--out FILE] [--count N]``
(``DIR``: a ``src`` folder of the baseline, with its ``fgpu/_native`` libraries).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

COUNT = 1000
COMMAND_BYTES = 256 * 1024
TARGET_MB = 200.0
HERE = Path(__file__).resolve().parent.parent / "src"


def command() -> list[str]:
    """``true`` and two arguments of about 128 KiB (Linux's longest argument): 256 KiB."""
    half = (COMMAND_BYTES - 8) // 2
    return ["true", "a" * half, "b" * half]


def start(src: Path, folder: Path) -> tuple[subprocess.Popen[bytes], Path]:
    socket = folder / "fgpu.sock"
    limits = ["--max-submission-bytes", str(COMMAND_BYTES + 4096), "--max-stored-bytes", "2GiB"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fgpu", "serve", "--socket", str(socket), "--state-dir",
         str(folder / "state"), "--simulate-gpus", "1xA100-40GB", "--log-level", "warning",
         *limits],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "serve.log").open("ab"),
        env={**os.environ, "PYTHONPATH": str(src)},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"fgpu serve ({src}) did not start: {folder / 'serve.log'}")
        if socket.exists():
            try:
                with http(socket) as client:
                    if client.get("/v1/healthz").status_code == 200:
                        return proc, socket
            except httpx.HTTPError:
                pass
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(60)


def http(socket: Path) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=str(socket))
    return httpx.Client(transport=transport, base_url="http://fgpu", timeout=600)


def populate(socket: Path, count: int) -> None:
    """``count`` finished workloads with heavy commands: a blocker holds the GPU, the rest
    wait, then all are cancelled."""
    with http(socket) as client:
        blocker = client.post("/v1/workloads", json={"command": ["sleep", "600"], "gpu": "1"})
        blocker.raise_for_status()
        ids = []
        for _ in range(count):
            answer = client.post("/v1/workloads", json={"command": command(), "gpu": "1"})
            answer.raise_for_status()
            ids.append(answer.json()["id"])
        for workload_id in [*ids, blocker.json()["id"]]:
            client.post(f"/v1/workloads/{workload_id}/cancel").raise_for_status()


def rss_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


def cli_listing(src: Path, socket: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fgpu", "ls", "--all", "--all-users", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src), "FGPU_SOCKET": str(socket)},
    )


def api_listing(socket: Path) -> dict[str, Any]:
    """Every page of ``GET /v1/workloads?all=true`` (following the cursor; a long timeout,
    so that a slow server is measured rather than given up on)."""
    rows = pages = size = 0
    biggest = 0
    params = {"all": "true", "limit": "1000"}
    with http(socket) as client:
        while True:
            answer = client.get("/v1/workloads", params=params)
            answer.raise_for_status()
            rows += len(answer.json())
            pages += 1
            size += len(answer.content)
            biggest = max(biggest, len(answer.content))
            following = answer.headers.get("x-fgpu-next-cursor")
            if not following:
                return {"rows": rows, "pages": pages, "bytes": size, "largest_page": biggest}
            params["cursor"] = following


def peak(pid: int, run: Any) -> dict[str, Any]:
    """Peak RSS of the server (VmHWM, reset first) while ``run()`` runs."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = rss_mb(pid, "VmRSS")
    started = time.perf_counter()
    result: dict[str, Any] = {"rss_before_mb": round(before, 1)}
    result.update(run())
    result["seconds"] = round(time.perf_counter() - started, 2)
    result["peak_rss_mb"] = round(rss_mb(pid, "VmHWM"), 1)
    return result


def cli(src: Path, socket: Path, *extra: str) -> dict[str, Any]:
    proc = cli_listing(src, socket, *extra)
    out, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        return {"ok": False, "error": err.strip()[-300:]}
    rows = len(json.loads(out)) if "--json" in extra else out.count("\n") - 1
    return {"ok": True, "rows": rows}


def concurrent(socket: Path, runs: int) -> dict[str, Any]:
    with ThreadPoolExecutor(runs) as pool:
        done = list(pool.map(lambda _: api_listing(socket), range(runs)))
    return {"rows_each": [d["rows"] for d in done], "pages_each": [d["pages"] for d in done]}


def side(name: str, src: Path, count: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix=f"fgpu-heavy-{name}-"))
    proc, socket = start(src, folder)
    t = time.perf_counter()
    try:
        populate(socket, count)
    finally:
        stop(proc)
    setup_s = time.perf_counter() - t
    proc, socket = start(src, folder)  # a clean memory baseline
    try:
        result: dict[str, Any] = {"src": str(src), "setup_s": round(setup_s, 1)}
        result["idle_rss_mb"] = round(rss_mb(proc.pid, "VmRSS"), 1)
        result["api"] = peak(proc.pid, lambda: api_listing(socket))
        result["api_concurrent_4"] = peak(proc.pid, lambda: concurrent(socket, 4))
        result["cli_ls_json"] = peak(proc.pid, lambda: cli(src, socket, "--json"))
        result["cli_ls_table"] = peak(proc.pid, lambda: cli(src, socket))
        return result
    finally:
        stop(proc)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-src", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--count", type=int, default=COUNT)
    args = parser.parse_args()
    base = side("baseline", args.baseline_src.resolve(), args.count)
    this = side("this", HERE, args.count)
    kinds = ("api", "api_concurrent_4", "cli_ls_json", "cli_ls_table")
    peaks = {k: this[k]["peak_rss_mb"] for k in kinds}
    report = {
        "bench": "heavy_listing",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "workloads": args.count,
        "command_bytes": COMMAND_BYTES,
        "baseline": base,
        "this": this,
        "peak_ratio_this_over_baseline": {
            k: round(this[k]["peak_rss_mb"] / base[k]["peak_rss_mb"], 3) for k in kinds
        },
        "target_peak_rss_mb": TARGET_MB,
        "target_held": all(v < TARGET_MB for v in peaks.values()),
        "all_rows_listed": this["api"]["rows"] >= args.count
        and all(r >= args.count for r in this["api_concurrent_4"]["rows_each"])
        and bool(this["cli_ls_json"].get("ok"))
        and this["cli_ls_json"]["rows"] >= args.count,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
