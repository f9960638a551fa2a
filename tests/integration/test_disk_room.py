"""One user's output cannot take the state disk from everyone (issue 27: an attacker's
workloads wrote output until the state disk was full, and then nobody could cancel).

A real ``fgpu serve`` as root on a small tmpfs state folder (mounted for the test), with two
real local users: alice's workloads write far more output than the disk holds; the wrappers
stop appending at the disk's reserve (``--log-disk-reserve``) and say so in the logs. bob's
``fgpu ls`` and cancel, and alice's own cancels, still work; every framed log is whole.
Then a file of root's takes the rest of the disk: cancels and ends are still recorded (the
ballast, ``--disk-ballast``), submissions get 507 saying why, and once the disk has room
again the ballast is back and so are submissions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fgpu.client.transport import unix_exchange
from fgpu.disk_room import free_bytes
from fgpu.wire_logs import FrameReader
from tests.integration.test_disk_full import fill
from tests.localusers import ALICE, BOB, as_user, ensure_users
from tests.serverproc import FGPU, ServerProcess, wait_for

DISK = "32m"
RESERVE = 6 * 2**20
WRITERS = 3
WRITE_MIB = 12  # each writer: 3 x 12 MiB of output, twice stored, on a 32 MiB disk
DEADLINE_S = 120.0


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    """``fgpu serve`` on a 32 MiB tmpfs state folder, reachable by the local test users."""
    ensure_users()
    root = Path(tempfile.mkdtemp(prefix="fgpu-diskroom-", dir="/tmp"))
    root.chmod(0o755)
    state = root / "state"
    state.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0700", "tmpfs", str(state)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    marks = root / "marks"
    marks.mkdir()
    marks.chmod(0o1777)  # the workloads (alice) say there that they wrote everything
    extra = ["--log-disk-reserve", "6MiB", "--disk-ballast", "1MiB"]
    proc = ServerProcess(root, "1xA100-40GB", extra)
    try:
        proc.start()
        yield proc
    finally:
        try:
            (state / "filler").unlink(missing_ok=True)
            proc.cleanup()
        finally:
            subprocess.run(["umount", "-l", str(state)], check=False)
            shutil.rmtree(root, ignore_errors=True)


def writer(mark: Path) -> list[str]:
    """A workload that writes ``WRITE_MIB`` MiB to stdout (lines of 1 KiB) and a line to
    stderr, marks that it has, and waits to be cancelled."""
    script = (
        f"yes \"$(head -c 1023 /dev/zero | tr '\\0' x)\" | head -c {WRITE_MIB * 2**20}; "
        f"echo to stderr >&2; touch {mark}; exec sleep 3600"
    )
    return ["/bin/sh", "-c", script]


def submit(server: ServerProcess, user: str, command: list[str]) -> str:
    options = ("-g", "0.1", "--grace", "1", "--json")
    out = server.cli("submit", *options, "--", *command, user=as_user(user))
    return str(json.loads(out.stdout)["id"])


def whole_records(path: Path) -> None:
    """The framed log parses to its end: no half record, no broken header."""
    reader = FrameReader()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            reader.feed(block)
    assert reader.pending == 0, f"{path}: {reader.pending} bytes of a half record at the end"


def test_one_users_output_stops_at_the_reserve_and_everyone_can_still_cancel(
    server: ServerProcess,
) -> None:
    sleeper = submit(server, BOB, ["/bin/sleep", "3600"])
    server.wait_phase(sleeper, "running")
    marks = server.root / "marks"
    floods = [submit(server, ALICE, writer(marks / f"w{i}")) for i in range(WRITERS)]
    for flood in floods:
        server.wait_phase(flood, "running")
    wait_for(
        lambda: all((marks / f"w{i}").exists() for i in range(WRITERS)),
        "alice's workloads to write all their output",
        DEADLINE_S,
    )

    # output stopped at the reserve: the disk keeps it (less at most a chunk per log)
    free = free_bytes(server.state_dir)
    assert free is not None
    assert free > RESERVE - 2**20, f"{free} bytes free; the reserve is {RESERVE}"
    logs = server.state_dir / "logs"
    said = b"output dropped from here"
    cut = [f for f in floods if said in (logs / f / "output.log").read_bytes()]
    assert cut, "no workload's log says that its output was dropped"
    shown = server.cli("logs", cut[0], user=as_user(ALICE)).stdout
    assert "output dropped from here: the disk of" in shown
    assert "fgpu serve --log-disk-reserve: 6 MiB" in shown
    for flood in floods:
        whole_records(logs / flood / "output.log")

    # bob lists and cancels his own; alice cancels hers; each ends cancelled
    listed = json.loads(server.cli("ls", "--json", user=as_user(BOB)).stdout)
    assert sleeper in {w["id"] for w in listed}
    server.cli("cancel", sleeper, user=as_user(BOB))
    server.wait_phase(sleeper, "cancelled", timeout_s=DEADLINE_S)
    for flood in floods:
        server.cli("cancel", flood, user=as_user(ALICE))
    for flood in floods:
        server.wait_phase(flood, "cancelled", timeout_s=DEADLINE_S)
        whole_records(logs / flood / "output.log")
    # the cut's end is said with what was dropped
    ended = server.cli("logs", cut[0], user=as_user(ALICE)).stdout
    assert "bytes of stdout and" in ended
    assert "dropped up to the end" in ended


def test_on_a_disk_filled_by_others_cancels_and_ends_use_the_ballast(
    server: ServerProcess,
) -> None:
    ballast = server.state_dir / "disk-ballast"
    assert ballast.stat().st_size == 2**20
    mine = submit(server, BOB, ["/bin/sleep", "3600"])
    theirs = submit(server, ALICE, ["/bin/sleep", "3600"])
    for workload in (mine, theirs):
        server.wait_phase(workload, "running")
    from tests.integration.test_disk_full import empty_wal

    empty_wal(server.state_dir / "fgpu.db")
    filler = fill(server.state_dir)

    server.cli("cancel", mine, user=as_user(BOB))  # the store's write takes the ballast
    server.wait_phase(mine, "cancelled", timeout_s=DEADLINE_S)
    assert not ballast.exists()
    server.cli("cancel", theirs, user=as_user(ALICE))
    server.wait_phase(theirs, "cancelled", timeout_s=DEADLINE_S)

    refused = unix_exchange(
        str(server.socket), 30, "POST", "/v1/workloads", {}, {"command": ["true"], "gpu": "0.1"}
    )
    assert refused.status_code == 507, refused.text
    reason = refused.json()["detail"]["reason"]
    assert "ran full" in reason, reason
    assert "disk-ballast" in reason, reason
    health = unix_exchange(str(server.socket), 30, "GET", "/v1/healthz", {}, None)
    assert health.status_code == 503, health.text

    filler.unlink()  # room again: the ballast comes back, and with it submissions
    wait_for(
        lambda: (
            unix_exchange(str(server.socket), 30, "GET", "/v1/healthz", {}, None).status_code == 200
        ),
        "health back",
        DEADLINE_S,
    )
    assert ballast.stat().st_size == 2**20
    again = server.submit("-g", "0.1", command=["true"])
    server.wait_phase(again, "succeeded", timeout_s=DEADLINE_S)
    assert os.path.exists(ballast)


# bob, through the socket, submits ~240 KiB commands (under --max-submission-bytes) that wait
# behind his own job until one is refused; prints what he got as JSON
STUFFER = """
import json, sys
from fgpu.client.transport import unix_exchange
socket, arg = sys.argv[1], "x" * 60000
accepted = 0
for _ in range(1000):
    body = {"command": ["/bin/true", arg, arg, arg, arg], "gpu": "1"}
    got = unix_exchange(socket, 60, "POST", "/v1/workloads", {}, body)
    if got.status_code >= 300:
        print(json.dumps({"accepted": accepted, "status": got.status_code, "body": got.json()}))
        break
    accepted += 1
"""


def test_one_users_stored_commands_stop_at_the_reserve_and_others_can_still_submit(
    server: ServerProcess,
) -> None:
    holder = server.cli("submit", "-g", "1", "--json", "--", "sleep", "3600", user=as_user(BOB))
    held = str(json.loads(holder.stdout)["id"])  # he holds the GPU: the rest waits
    server.wait_phase(held, "running")
    run = subprocess.run(
        [*as_user(BOB), sys.executable, "-c", STUFFER, str(server.socket)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 5,
        env=server.env,
        cwd="/",
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["accepted"] > 0, got
    assert got["status"] == 507, got
    reason = got["body"]["detail"]["reason"]
    assert got["body"]["detail"]["field"] == "store", got
    assert "bytes of command, env and cwd" in reason, reason
    assert "kept free for everyone's cancels" in reason, reason
    assert "--log-disk-reserve: 6 MiB" in reason, reason
    free = free_bytes(server.state_dir)
    assert free is not None
    sizes = {p.name: p.stat().st_size for p in server.state_dir.iterdir() if p.is_file()}
    assert free >= RESERVE, f"{free} bytes free; the reserve is {RESERVE}; {got} {sizes}"

    # alice still submits (a small command) and cancels; bob cancels his own
    theirs = submit(server, ALICE, ["/bin/sleep", "3600"])
    assert server.describe(theirs)["phase"] == "pending"
    server.cli("cancel", theirs, user=as_user(ALICE))
    server.wait_phase(theirs, "cancelled", timeout_s=DEADLINE_S)
    done = server.cli("cancel", "--all", user=as_user(BOB))
    assert done.returncode == 0, done.stderr
    server.wait_phase(held, "cancelled", timeout_s=DEADLINE_S)


def test_cancel_all_goes_through_on_a_full_disk(server: ServerProcess) -> None:
    bobs = [submit(server, BOB, ["/bin/sleep", "3600"]) for _ in range(2)]
    alices = [submit(server, ALICE, ["/bin/sleep", "3600"]) for _ in range(2)]
    for workload in bobs + alices:
        server.wait_phase(workload, "running")
    from tests.integration.test_disk_full import empty_wal

    empty_wal(server.state_dir / "fgpu.db")
    fill(server.state_dir)
    health = unix_exchange(str(server.socket), 30, "GET", "/v1/healthz", {}, None)
    assert health.status_code == 503, health.text  # what made cancel --all give up before

    own = server.cli("cancel", "--all", user=as_user(BOB), check=False)
    assert own.returncode == 0, own.stderr
    for workload in bobs:
        assert workload in own.stdout, own.stdout
        server.wait_phase(workload, "cancelled", timeout_s=DEADLINE_S)
    admin = server.cli("cancel", "--all", "--user", ALICE, check=False)
    assert admin.returncode == 0, admin.stderr
    for workload in alices:
        assert workload in admin.stdout, admin.stdout
        server.wait_phase(workload, "cancelled", timeout_s=DEADLINE_S)


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--log-disk-reserve", "lots", "--log-disk-reserve: 'lots': not a size"),
        ("--log-disk-reserve", "75%", "--log-disk-reserve: '75%' must be between 0% and 50%"),
        ("--log-disk-reserve", "1GiB,2GiB", "--log-disk-reserve: '1GiB,2GiB' gives two sizes"),
        ("--disk-ballast", "big", "--disk-ballast: 'big'"),
        ("--disk-ballast", "1000", "--disk-ballast: '1000' is 1000 bytes; give 0 (none) or at"),
    ],
    ids=["reserve-word", "reserve-share", "reserve-two-sizes", "ballast-word", "ballast-small"],
)
def test_bad_disk_flags_are_refused_at_start(
    flag: str, value: str, says: str, tmp_path: Path
) -> None:
    run = subprocess.run(
        [
            *FGPU,
            "serve",
            "--socket",
            str(tmp_path / "s.sock"),
            "--state-dir",
            str(tmp_path / "state"),
            "--simulate-gpus",
            "1xA100-40GB",
            flag,
            value,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert says in run.stderr, run.stderr
    assert not (tmp_path / "state").exists()  # nothing made before the flags were checked
