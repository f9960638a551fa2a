"""Listings are shared fairly between users (issue 27, attacker trial: bob's 64 threads
looping ``GET /v1/workloads?all=true&limit=10000&brief=true`` made every other user's
``fgpu ls``, ``fgpu ls -w`` and ``fgpu cancel --all`` answer 503 "too many listings at once").

A real server with ``--listings-at-once 2`` and heavy finished rows (so a page takes time);
bob (a real local user) floods it with many concurrent listings from his own process, and
while the flood goes on alice's ``fgpu ls``, raw listings and ``fgpu cancel --all`` (which
lists first) succeed every time, while bob's
extra listings get 503 with ``Retry-After`` naming the per-user rule.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import IO

import pytest

from tests.localusers import ALICE, BOB, as_user, ensure_users
from tests.serverproc import ServerProcess, started_server, wait_for

ARG = 100_000  # two arguments: ~200 KB of command per workload
COUNT = 12
FLOOD_THREADS = 48
ALICE_TRIES = 6
DEADLINE_S = 120.0

# Run as bob (and alice) in a process of their own, so that the server sees their uid on
# the socket. Standard library only. argv: socket, threads, rounds (0: until stdin closes).
# Prints one JSON line per answer: {"status": N, "retry_after": ..., "reason": ...}.
LISTER = r"""
import json, socket, sys, threading
path, threads, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
stop = threading.Event()
out = threading.Lock()
REQUEST = (b"GET /v1/workloads?all=true&limit=10000&brief=true HTTP/1.1\r\n"
           b"Host: fgpu\r\nConnection: close\r\n\r\n")

def once():
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(120)
        conn.connect(path)
        conn.sendall(REQUEST)
        data = b""
        while True:
            piece = conn.recv(1 << 20)
            if not piece:
                break
            data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(l.split(": ", 1) for l in lines[1:] if ": " in l)
    retry = {k.lower(): v for k, v in headers.items()}.get("retry-after")
    reason = ""
    if status != 200:
        try:
            reason = json.loads(body)["detail"]["reason"]
        except Exception:
            reason = body[:500].decode("latin-1")
    with out:
        print(json.dumps({"status": status, "retry_after": retry, "reason": reason}), flush=True)

def loop():
    done = 0
    while not stop.is_set() and (rounds == 0 or done < rounds):
        once()
        done += 1

def watch_stdin():
    sys.stdin.read()
    stop.set()

if rounds == 0:
    threading.Thread(target=watch_stdin, daemon=True).start()
workers = [threading.Thread(target=loop) for _ in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
"""


def lister(server: ServerProcess, user: str, threads: int, rounds: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*as_user(user), sys.executable, "-c", LISTER, str(server.socket), str(threads),
         str(rounds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    ensure_users()
    extra = ["--listings-at-once", "2", "--listing-max-bytes", "1MiB"]
    extra += ["--max-active-per-user", "100"]
    with started_server("fgpu-fair-", "1xA100-40GB", for_local_users=True, extra=extra) as srv:
        ids = [
            srv.submit(
                "--gpu", "0.5", "--gpu-model", "A100-40GB",
                command=["true", "a" * ARG, "b" * ARG],
            )
            for _ in range(COUNT)
        ]  # fmt: skip
        for workload_id in ids:  # finished: an --all listing reads them from the store
            srv.cli("cancel", workload_id, check=False)
        srv.wait_listing(
            lambda seen: all(seen[i]["phase"] in ("cancelled", "succeeded") for i in ids),
            "the heavy workloads to end",
        )
        yield srv


class Answers:
    """The JSON lines of a lister's stdout, read by a thread as they come."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[dict[str, object]] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                self.seen.append(json.loads(line))

    def snapshot(self) -> list[dict[str, object]]:
        with self._lock:
            return list(self.seen)

    def join(self) -> None:
        self._thread.join(DEADLINE_S)


def test_one_users_flood_of_listings_leaves_turns_to_others(server: ServerProcess) -> None:
    flood = lister(server, BOB, FLOOD_THREADS, 0)
    assert flood.stdout is not None
    assert flood.stdin is not None
    bob = Answers(flood.stdout)
    try:
        wait_for(
            lambda: (
                any(a["status"] == 503 for a in bob.snapshot())
                and any(a["status"] == 200 for a in bob.snapshot())
            ),
            "bob's flood to be served and refused",
            DEADLINE_S,
        )
        for _ in range(ALICE_TRIES):  # during the flood, every one of alice's listings goes
            table = server.cli("ls", "--all", user=as_user(ALICE), check=False)
            assert table.returncode == 0, f"alice's fgpu ls: {table.stdout}\n{table.stderr}"
            raw = lister(server, ALICE, 1, 1)
            out, err = raw.communicate(timeout=DEADLINE_S)
            answer = json.loads(out)
            assert answer["status"] == 200, (answer, err)
            assert flood.poll() is None, "the flood went on"
        cancel = server.cli("cancel", "--all", user=as_user(ALICE), check=False)  # lists first
        assert cancel.returncode == 0, (
            f"alice's fgpu cancel --all: {cancel.stdout}\n{cancel.stderr}"
        )
        before = len(bob.snapshot())
        wait_for(lambda: len(bob.snapshot()) > before, "bob's flood to go on", DEADLINE_S)
    finally:
        flood.stdin.close()
        flood.wait(DEADLINE_S)
        bob.join()
    answers = bob.snapshot()
    refused = [a for a in answers if a["status"] == 503]
    assert refused
    assert all(a["retry_after"] == "1" for a in refused)
    assert all("too many listings of one user at once" in str(a["reason"]) for a in refused), {
        str(a["reason"]) for a in refused
    }
    assert all("each user gets at most 1 made at once and 2 waiting" in str(a["reason"])
               for a in refused)  # fmt: skip
    assert {a["status"] for a in answers} == {200, 503}
