"""Per-user submission limits on a real ``fgpu serve`` with real local users (issue 27,
point 2): bob at ``--max-active-per-user`` is refused (429) naming the limit while alice
still submits; a command and environment over ``--max-submission-bytes`` are refused (422)
echoing the size, and nothing is stored; bad limit flags are refused at start."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.localusers import ALICE, BOB, as_user, ensure_users
from tests.serverproc import FGPU, ServerProcess, started_server


@pytest.fixture
def limited() -> Iterator[ServerProcess]:
    ensure_users()
    extra = ["--max-active-per-user", "2", "--max-submission-bytes", "65536"]
    with started_server("fgpu-quota-", "1xA100-40GB", for_local_users=True, extra=extra) as s:
        yield s


def submit(
    server: ServerProcess, user: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return server.cli(
        "submit",
        "--gpu",
        "0.1",
        *args,
        "--",
        "sleep",
        "600",
        user=as_user(user),
        check=False,
        env_extra=env,
    )


def mine(server: ServerProcess, user: str) -> list[str]:
    listed = server.cli("ls", "--json", user=as_user(user))
    return [w["id"] for w in json.loads(listed.stdout)]


def test_a_user_at_his_active_limit_is_refused_and_others_are_not(
    limited: ServerProcess,
) -> None:
    server = limited
    for _ in range(2):
        assert submit(server, BOB).returncode == 0
    third = submit(server, BOB)
    assert third.returncode != 0
    assert "429" in third.stderr or "limit" in third.stderr, third.stderr
    assert "--max-active-per-user 2" in third.stderr, third.stderr
    assert "2 active workloads" in third.stderr, third.stderr
    assert len(mine(server, BOB)) == 2  # nothing stored
    # alice is not held by bob's limit
    assert submit(server, ALICE).returncode == 0
    # bob may submit again once one of his ends
    server.cli("cancel", mine(server, BOB)[0], user=as_user(BOB))
    assert submit(server, BOB).returncode == 0


def test_a_command_and_env_over_the_byte_limit_are_refused_echoing_the_size(
    limited: ServerProcess,
) -> None:
    server = limited
    big = submit(server, ALICE, env={"FGPU_TEST_BIG": "x" * 70_000})
    assert big.returncode != 0
    assert "--max-submission-bytes" in big.stderr, big.stderr
    assert "over the limit of 65536 bytes" in big.stderr, big.stderr
    size = int(big.stderr.split("command, env and cwd take ")[1].split()[0])
    assert size > 70_000
    assert mine(server, ALICE) == []  # nothing half-written
    # a given name another active workload of hers has: refused with its id (409)
    first = submit(server, ALICE, "--name", "train", "--json")
    assert first.returncode == 0, first.stderr
    wid = json.loads(first.stdout)["id"]
    again = submit(server, ALICE, "--name", "train")
    assert again.returncode != 0
    assert wid in again.stderr, again.stderr
    assert "train" in again.stderr, again.stderr


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--max-active-per-user", "0", "--max-active-per-user: 0 must be at least 1"),
        ("--max-submission-bytes", "10", "--max-submission-bytes: 10 must be at least 1024"),
        ("--max-connections-per-user", "0", "--max-connections-per-user: 0 must be at least 1"),
        ("--request-timeout", "-1", "--request-timeout: -1.0 must be a positive number"),
    ],
)
def test_bad_limit_flags_are_refused_at_start(
    flag: str, value: str, says: str, tmp_path: Path
) -> None:
    run = subprocess.run(
        [
            *FGPU,
            "serve",
            "--socket",
            str(tmp_path / "s.sock"),
            "--state-dir",
            str(tmp_path),
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


def test_a_long_working_directory_is_refused_and_counts_as_stored(
    limited: ServerProcess,
) -> None:
    """cwd is bounded (PATH_MAX) and counts toward the bytes a user stores (an attacker's
    trial stored 78 MB through cwd past both limits)."""
    server = limited
    body = {"command": ["true"], "gpu": "0.1", "cwd": "/" + "a" * 3000}
    transport = httpx.HTTPTransport(uds=str(server.socket))
    with httpx.Client(transport=transport, base_url="http://fgpu", timeout=60) as client:
        too_long = client.post("/v1/workloads", json={**body, "cwd": "/" + "a" * 4095})
        assert too_long.status_code == 422, too_long.text
        assert too_long.json()["detail"]["field"] == "cwd"
        server.cli("queue", "set", "default", "--max-stored-bytes", "4KiB")
        answers = [client.post("/v1/workloads", json=body) for _ in range(2)]
    assert answers[0].status_code == 201, answers[0].text
    assert answers[1].status_code == 429, answers[1].text  # 2 x 3 KB of cwd > 4 KiB
    assert "max_stored_bytes" in answers[1].text, answers[1].text
