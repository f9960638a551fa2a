"""Users inside a queue share it fairly, and each user has a default queue (issue 25, point 5),
end to end: the real ``fgpu serve`` as root and three real local users (alice, bob, carol)
driving it through the ``fgpu`` command line as themselves (``setpriv --reuid``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.localusers import ALICE, BOB, CAROL, TEAM, as_user, ensure_users
from tests.serverproc import ServerProcess, started_server

SLEEP = ("/bin/sleep", "300")
GRACE = ("--grace", "1")


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    ensure_users()
    with started_server("fgpu-fair-", "1xA100-40GB", for_local_users=True) as proc:
        yield proc


def submit(server: ServerProcess, user: str, *options: str) -> str:
    out = server.cli("submit", *options, *GRACE, "--json", "--", *SLEEP, user=as_user(user)).stdout
    return str(json.loads(out)["id"])


def running(server: ServerProcess) -> set[str]:
    return {i for i, w in server.workloads().items() if w["phase"] == "running"}


def test_the_user_with_less_allocated_goes_first(server: ServerProcess) -> None:
    server.cli("queue", "create", "lab", "--quota", "1", "--member", "*")
    # alice fills the GPU with two halves and queues two more; then bob, then carol
    a = [submit(server, ALICE, "-q", "lab", "-g", "0.5") for _ in range(4)]
    server.wait_phase(a[0], "running")
    server.wait_phase(a[1], "running")
    b = submit(server, BOB, "-q", "lab", "-g", "0.5")
    c = submit(server, CAROL, "-q", "lab", "-g", "0.5")
    assert {server.phase(w) for w in (a[2], a[3], b, c)} == {"pending"}

    # half a GPU frees: alice still holds 0.5, bob and carol nothing; bob submitted before
    # carol, so bob (strict submission order would have started alice's third)
    server.cli("cancel", a[0])
    server.wait_phase(b, "running")
    assert running(server) == {a[1], b}
    # alice's second ends: alice and carol hold nothing, bob 0.5; alice's waiting work is
    # older than carol's
    server.cli("cancel", a[1])
    server.wait_phase(a[2], "running")
    assert running(server) == {b, a[2]}
    # bob's ends: carol holds nothing, alice 0.5 -> carol, though alice's fourth is older
    server.cli("cancel", b)
    server.wait_phase(c, "running")
    assert running(server) == {a[2], c}
    assert server.phase(a[3]) == "pending"


def test_default_queue_per_user_and_group(server: ServerProcess) -> None:
    server.cli("queue", "create", "lab", "--member", "*", "--default-for", f"@{TEAM}")
    server.cli("queue", "create", "solo", "--member", "*", "--default-for", BOB)
    queues = {q["name"]: q for q in server.json("queue", "ls")}
    assert queues["lab"]["default_for"] == [f"@{TEAM}"]
    assert queues["solo"]["default_for"] == [BOB]
    assert queues["default"]["default_for"] == []

    def lands(user: str) -> tuple[str, str]:
        result = server.cli("submit", "-g", "0.1", *GRACE, "--", *SLEEP, user=as_user(user))
        workload = result.stdout.strip()
        return server.describe(workload)["queue"], result.stderr

    # alice through her group, bob by name, carol (neither) to default; submit says where
    queue, said = lands(ALICE)
    assert queue == "lab"
    assert " to queue lab (your default; -q to choose): " in said, said
    assert lands(BOB)[0] == "solo"
    assert lands(CAROL)[0] == "default"
    # -q still chooses
    explicit = server.cli("submit", "-q", "default", "-g", "0.1", "--", "true", user=as_user(ALICE))
    assert " to queue default: " in explicit.stderr, explicit.stderr

    # one default queue each: refused naming the user or group and both queues
    refused = server.cli("queue", "set", "solo", "--default-for", f"{BOB},@{TEAM}", check=False)
    assert refused.returncode == 2, refused.stderr
    assert f"@{TEAM} already has queue lab as default" in refused.stderr, refused.stderr
    assert "queue solo" in refused.stderr, refused.stderr
    assert server.json("queue", "ls")[2]["default_for"] == [BOB]  # nothing written
    # a name beats a group: alice named on solo goes there though her group says lab
    server.cli("queue", "set", "solo", "--default-for", f"{BOB},{ALICE}")
    assert lands(ALICE)[0] == "solo"
    # '*' is not a default, and an unknown name is refused naming the flag
    star = server.cli("queue", "set", "lab", "--default-for", "*", check=False)
    assert star.returncode == 2, star.stderr
    assert star.stderr.startswith("error: --default-for: '*' cannot be a default"), star.stderr
    nobody = server.cli("queue", "set", "lab", "--default-for", "nobody-here-x", check=False)
    assert nobody.returncode == 2, nobody.stderr
    assert nobody.stderr.startswith("error: --default-for"), nobody.stderr
    assert "no user or group nobody-here-x on this machine" in nobody.stderr, nobody.stderr
    server.cli("queue", "set", "solo", "--no-default-for")
    assert lands(BOB)[0] == "default"
    # a default queue for someone it does not admit is refused (all their submissions
    # without -q would be), naming the flag and who
    closed = server.cli(
        "queue", "create", "closed", "--member", BOB, "--default-for", CAROL, check=False
    )
    assert closed.returncode == 2, closed.stderr
    assert closed.stderr.startswith("error: --default-for"), closed.stderr
    assert f"{CAROL} may not submit to queue closed (members: {BOB})" in closed.stderr
    assert "closed" not in {q["name"] for q in server.json("queue", "ls")}  # nothing written
    # a member by group may have it as default
    server.cli("queue", "create", "teamq", "--member", f"@{TEAM}", "--default-for", ALICE)
