"""Benchmark: what finding the owner of a loopback client's socket costs the server per
accepted TCP connection (issue 27, point 1), as the machine's number of sockets grows.

A local user can open tens of thousands of loopback connections among his own processes;
each connection the server accepts from this machine is looked up
(:class:`fgpu.loopback_peer.OwnerLookup`). Measured with ``N`` extra loopback connections
open (``2 N`` sockets) for N in :data:`SIZES`: the median time of one lookup by sock_diag
(the kernel's hash lookup) and by reading ``/proc/net/tcp*`` (the fallback where the kernel
has no sock_diag for TCP).

Target: a sock_diag lookup under 1 ms at every size and within 3x of its time with no extra
sockets (it must not grow with the machine's sockets, or a user could make every connection
cost the server's event loop that much).

Usage: ``python bench/loopback_owner.py [--out FILE]`` (Linux; raises the file limit
itself, so run as root for the largest size).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import time
from pathlib import Path
from typing import Any

from fgpu.loopback_peer import OwnerLookup

SIZES = (0, 1000, 8000)
RUNS = {"sock_diag": 2000, "tables": 20}


def timed(
    lookup: OwnerLookup, client: tuple[str, int], server: tuple[str, int], runs: int
) -> float:
    """Median seconds of one lookup; asserts each finds our own uid."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        uid = lookup.owner_uid(client, server)
        times.append(time.perf_counter() - start)
        assert uid == os.geteuid(), uid
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * max(SIZES) + 256
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    held: list[socket.socket] = []
    probe = socket.create_connection(listener.getsockname())
    accepted, peer = listener.accept()
    client, server = (peer[0], peer[1]), accepted.getsockname()[:2]
    rows: list[dict[str, Any]] = []
    for size in SIZES:
        while len(held) < 2 * size:
            c = socket.create_connection(listener.getsockname())
            a, _ = listener.accept()
            held += [c, a]
        diag = OwnerLookup()
        tables = OwnerLookup()
        tables.sock_diag = False
        row = {
            "extra_connections": size,
            "sock_diag_ms": round(timed(diag, client, server, RUNS["sock_diag"]) * 1e3, 4),
            "tables_ms": round(timed(tables, client, server, RUNS["tables"]) * 1e3, 3),
            "sock_diag_used": diag.sock_diag,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["sock_diag_ms"]
    worst = max(r["sock_diag_ms"] for r in rows)
    result = {
        "benchmark": "loopback_owner",
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_1min": os.getloadavg()[0],
        "rows": rows,
        "sock_diag_ratio_largest_to_none": round(rows[-1]["sock_diag_ms"] / base, 2),
        "tables_ratio_largest_to_none": round(rows[-1]["tables_ms"] / rows[0]["tables_ms"], 1),
        "targets": {
            "sock_diag_under_1ms": worst < 1.0,
            "sock_diag_within_3x_of_none": all(r["sock_diag_ms"] <= 3 * base for r in rows),
        },
    }
    for sock in [probe, accepted, listener, *held]:
        sock.close()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
