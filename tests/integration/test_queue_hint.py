"""``fgpu queue create`` says how to narrow ``default`` while it still holds every GPU for
everyone (issue 25, point 9): the real ``fgpu serve`` on two simulated GPUs, the command line
as root (the admin), and the hint followed as written."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.serverproc import ServerProcess, started_server


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    with started_server("fgpu-queue-hint-", "2xA100-40GB") as proc:
        yield proc


def hints(stderr: str) -> list[str]:
    text = " ".join(stderr.split())  # one line: the terminal folds long messages
    return re.findall(r"hint: (.*?)(?= hint: |$)", text)


def test_creating_a_team_queue_says_how_to_narrow_default(server: ServerProcess) -> None:
    created = server.cli("queue", "create", "team-a", "--quota", "1")
    (hint,) = hints(created.stderr)
    assert hint.startswith(
        "queue default still has every GPU of this machine as its quota (2.0 of 2.0) for "
        "everyone (member *)"
    ), hint
    command = re.search(r"'(fgpu queue set default --quota [0-9.]+)'", hint)
    assert command, hint
    assert command.group(1) == "fgpu queue set default --quota 1.0"  # what team-a leaves
    assert "'fgpu queue set default --member NAME' (repeat)" in hint
    as_json = json.loads(server.cli("queue", "create", "team-j", "--json").stdout)
    assert as_json["hints"] == [hint]  # the same words in --json (team-j has no quota)

    server.cli(*command.group(1).split()[1:])  # the hint, followed as written
    (default,) = [q for q in server.json("queue", "ls") if q["name"] == "default"]
    assert default["quota_milli"] == 1000
    quiet = server.cli("queue", "create", "team-b", "--quota", "1")
    assert hints(quiet.stderr) == [], quiet.stderr


def test_a_first_queue_without_quota_is_not_told_a_quota_that_changes_nothing(
    server: ServerProcess,
) -> None:
    """With no other queue holding a quota, 'default --quota 2.0' would change nothing: the
    hint says to give the team queue a quota first, then narrow default to the rest."""
    created = server.cli("queue", "create", "team-z")
    (hint,) = hints(created.stderr)
    assert "--quota 2.0" not in hint, hint
    assert "'fgpu queue set team-z --quota N'" in hint, hint
    assert "'fgpu queue set default --quota REST'" in hint, hint
