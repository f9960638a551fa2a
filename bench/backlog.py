"""Benchmark: one user's backlog must cost others nothing (issue 27, point 2).

A real root ``fgpu serve`` (one simulated A100) with two real local users, alice and bob
(created as the tests create them when missing; needs root and ``setpriv``). Measured, each
as the user, over the Unix socket:

- alice's ``fgpu ls`` (the whole command, as she types it; median of
  :data:`LS_RUNS`) and her submission latency (one client, :data:`ALICE_SUBMITS`
  submissions, p50/p99), first on an idle server, then with bob's :data:`BACKLOG` pending
  workloads;
- bob's submission rate while he queues his backlog (8 concurrent clients): with the name
  check and the per-user limits read from indexes it must not fall as his backlog grows
  (first and last 500 compared);
- ``fgpu ls --all-users`` with the backlog, for reference (what every listing cost before).

Targets: alice's ``fgpu ls`` and her submission p50 with bob's backlog within 1.5x of idle;
bob's last 500 submissions at least half as fast as his first 500.

Usage: ``sudo python bench/backlog.py [--out FILE] [--backlog N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BACKLOG = 5000
LS_RUNS = 7
ALICE_SUBMITS = 40
ALICE, BOB = "fgpu-test-alice", "fgpu-test-bob"
TARGETS = {"ls_ratio": 1.5, "submit_p50_ratio": 1.5, "bob_rate_ratio": 2.0}

_SUBMITTER = """
import json, sys, time, threading
from concurrent.futures import ThreadPoolExecutor
from fgpu.client.client import Client
from fgpu.wire import SubmitRequest
socket, count, clients = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
local = threading.local()
def one(i):
    c = getattr(local, "c", None)
    if c is None:
        c = local.c = Client(socket=socket)
    t = time.perf_counter()
    c.submit(SubmitRequest(command=["sleep", "600"], gpu="1", grace_s=0.0))
    return time.perf_counter(), (time.perf_counter() - t) * 1000
with ThreadPoolExecutor(clients) as pool:
    start = time.perf_counter()
    done = list(pool.map(one, range(count)))
print(json.dumps({"start": start, "ends": [d[0] for d in done], "ms": [d[1] for d in done]}))
"""


def ensure_users() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        raise SystemExit("bench/backlog.py runs as root with setpriv (it switches users)")
    for user in (ALICE, BOB):
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(
                ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", user], check=True
            )


def as_user(name: str) -> list[str]:
    gid = pwd.getpwnam(name).pw_gid
    return ["setpriv", f"--reuid={name}", f"--regid={gid}", "--init-groups"]


def run_as(user: str, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*as_user(user), *argv],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        env={**env, "HOME": "/"},
        timeout=3600,
    )


def start_server(folder: Path) -> tuple[subprocess.Popen[bytes], Path]:
    socket = folder / "fgpu.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fgpu", "serve", "--socket", str(socket), "--state-dir",
         str(folder / "state"), "--simulate-gpus", "1xA100-40GB", "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not socket.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("fgpu serve did not start")
        time.sleep(0.05)
    return proc, socket


def ls_seconds(user: str, env: dict[str, str], *extra: str) -> dict[str, Any]:
    """Median wall time of ``fgpu ls`` as ``user`` (the whole command) and the rows shown."""
    times = []
    rows = 0
    run_as(user, [sys.executable, "-m", "fgpu", "ls", "--json", *extra], env)  # warm caches
    for _ in range(LS_RUNS):
        t = time.perf_counter()
        done = run_as(user, [sys.executable, "-m", "fgpu", "ls", "--json", *extra], env)
        times.append(time.perf_counter() - t)
        rows = len(json.loads(done.stdout))
    return {"median_s": round(statistics.median(times), 3), "rows": rows}


def submissions(user: str, env: dict[str, str], socket: Path, count: int, clients: int) -> Any:
    done = run_as(
        user, [sys.executable, "-c", _SUBMITTER, str(socket), str(count), str(clients)], env
    )
    return json.loads(done.stdout)


def latency(result: Any) -> dict[str, float]:
    ms = sorted(result["ms"])
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
    }


def rate(ends: list[float], start: float) -> float:
    return round(len(ends) / max(1e-9, max(ends) - start), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--backlog", type=int, default=BACKLOG)
    args = parser.parse_args()
    ensure_users()
    folder = Path(tempfile.mkdtemp(prefix="fgpu-backlog-", dir="/tmp"))
    folder.chmod(0o755)
    env = {**os.environ, "FGPU_SOCKET": str(folder / "fgpu.sock")}
    env.pop("FGPU_URL", None)
    proc, socket = start_server(folder)
    try:
        idle_ls = ls_seconds(ALICE, env)
        idle_submit = latency(submissions(ALICE, env, socket, ALICE_SUBMITS, 1))
        bob = submissions(BOB, env, socket, args.backlog, 8)
        ends = sorted(bob["ends"])
        first = ends[:500]
        last = ends[-500:]
        bob_first_rate = rate(first, bob["start"])
        bob_last_rate = rate(last, ends[-501])
        loaded_ls = ls_seconds(ALICE, env)
        loaded_submit = latency(submissions(ALICE, env, socket, ALICE_SUBMITS, 1))
        everyone = ls_seconds(ALICE, env, "--all-users")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(folder, ignore_errors=True)
    measured = {
        "ls_ratio": round(loaded_ls["median_s"] / idle_ls["median_s"], 3),
        "submit_p50_ratio": round(loaded_submit["p50_ms"] / idle_submit["p50_ms"], 3),
        "bob_rate_ratio": round(bob_first_rate / max(bob_last_rate, 1e-9), 3),
    }
    result = {
        "benchmark": "backlog",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "backlog": args.backlog,
        "alice_ls": {"idle": idle_ls, "with_backlog": loaded_ls},
        "alice_submit": {"idle": idle_submit, "with_backlog": loaded_submit},
        "bob_submissions": {
            "count": args.backlog,
            "clients": 8,
            "per_s_all": rate(ends, bob["start"]),
            "per_s_first_500": bob_first_rate,
            "per_s_last_500": bob_last_rate,
        },
        "ls_all_users_with_backlog": everyone,
        "targets": {
            name: {"target": TARGETS[name], "measured": value, "met": value <= TARGETS[name]}
            for name, value in measured.items()
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    for name, t in result["targets"].items():
        print(f"target {name}: {'met' if t['met'] else 'NOT met'}", file=sys.stderr)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
