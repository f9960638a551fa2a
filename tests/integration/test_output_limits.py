"""A per-user limit on stored output (issue 27: each log had its own cap, so one user's many
workloads could still store without bound): ``fgpu serve --max-output-bytes`` and a queue's
``--max-output-bytes``. A real ``fgpu serve`` as root with two real local users: alice's
workloads pass her limit; their output is cut, and ``fgpu logs`` says so naming the limit;
a workload she starts afterwards is cut from its start; bob's output is untouched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from fgpu.server.output_limits import folder_bytes
from tests.localusers import ALICE, BOB, as_user, ensure_users
from tests.serverproc import ServerProcess, started_server, wait_for

DEADLINE_S = 120.0
CHUNKS = 200  # a writer: 200 chunks of 64 KiB (12.5 MiB), paced, then it waits


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    ensure_users()
    extra = ["--max-output-bytes", "2MiB", "--max-log-bytes", "0"]
    with started_server("fgpu-output-", "1xA100-40GB", for_local_users=True, extra=extra) as proc:
        yield proc


def writer(chunks: int = CHUNKS) -> list[str]:
    """Writes ``chunks`` lines of 64 KiB, a few per second's tenth, then waits."""
    script = (
        "line=$(head -c 65535 /dev/zero | tr '\\0' y); i=0; "
        f'while [ $i -lt {chunks} ]; do echo "$line"; i=$((i+1)); sleep 0.02; done; '
        "echo finished-writing; exec sleep 3600"
    )
    return ["/bin/sh", "-c", script]


def submit(server: ServerProcess, user: str, command: list[str], *options: str) -> str:
    flags = ("-g", "0.1", "--grace", "1", "--json", *options)
    out = server.cli("submit", *flags, "--", *command, user=as_user(user))
    return str(json.loads(out.stdout)["id"])


def events(server: ServerProcess, workload: str) -> list[dict[str, str]]:
    return list(server.describe(workload)["events"])


def test_a_users_output_past_the_limit_is_cut_naming_it(server: ServerProcess) -> None:
    small = submit(server, BOB, writer(8))
    flood = submit(server, ALICE, writer())
    wait_for(
        lambda: any(e["kind"] == "output-cut" for e in events(server, flood)),
        "alice's output to be cut",
        DEADLINE_S,
    )
    cut = next(e for e in events(server, flood) if e["kind"] == "output-cut")
    assert "--max-output-bytes 2 MiB" in cut["message"]
    logs = server.state_dir / "logs"
    wait_for(
        lambda: b"output dropped from here" in (logs / flood / "output.log").read_bytes(),
        "the wrapper to see the stop",
        DEADLINE_S,
    )
    shown = server.cli("logs", flood, user=as_user(ALICE)).stdout
    assert "output dropped from here: your workloads store" in shown
    assert "the limit per user on this machine (--max-output-bytes 2 MiB" in shown
    assert "finished-writing" not in shown  # what came after the cut is not kept
    kept = folder_bytes(logs / flood)
    assert kept < 12 * 2**20, kept  # far less than the 2 x 12.5 MiB it wrote

    # her next workload is cut from its start; bob's output is whole
    later = submit(server, ALICE, ["/bin/sh", "-c", "echo hello; exec sleep 3600"])
    server.wait_phase(later, "running")
    wait_for(
        lambda: b"output dropped from here" in (logs / later / "output.log").read_bytes(),
        "the later workload's cut",
        DEADLINE_S,
    )
    assert "hello" not in server.cli("logs", later, user=as_user(ALICE)).stdout
    wait_for(
        lambda: b"finished-writing" in (logs / small / "output.log").read_bytes(),
        "bob's writer to finish",
        DEADLINE_S,
    )
    bobs = server.cli("logs", small, user=as_user(BOB)).stdout
    assert "dropped" not in bobs
    assert bobs.count("y" * 65535) == 8


def test_a_queue_sets_its_own_output_limit(server: ServerProcess) -> None:
    server.cli("queue", "create", "tight", "--member", "*", "--max-output-bytes", "1MiB")
    shown = server.json("queue", "ls")
    tight = next(q for q in shown if q["name"] == "tight")
    assert tight["max_output_bytes"] == 2**20
    flood = submit(server, ALICE, writer(), "-q", "tight")
    wait_for(
        lambda: any(e["kind"] == "output-cut" for e in events(server, flood)),
        "alice's output in queue tight to be cut",
        DEADLINE_S,
    )
    cut = next(e for e in events(server, flood) if e["kind"] == "output-cut")
    assert "queue tight" in cut["message"]
    assert "max_output_bytes 1 MiB" in cut["message"]
    assert "fgpu queue set tight --max-output-bytes SIZE" in cut["message"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("lots", "--max-output-bytes 'lots'"),
        ("1KiB", "--max-output-bytes: 1024 is out of range: give 1048576 to"),
    ],
    ids=["word", "too-small"],
)
def test_bad_queue_output_limits_are_refused(server: ServerProcess, value: str, says: str) -> None:
    refused = server.cli("queue", "create", "q", "--max-output-bytes", value, check=False)
    assert refused.returncode != 0
    assert says in refused.stdout + refused.stderr, refused.stdout + refused.stderr
