"""One vocabulary of states across every view (issue 25, point 6), on one scenario with the
real ``fgpu serve`` as root and three real local users:

- alice's ``train`` (``-p low -g 0.5``) runs; root's ``serve`` (``-p critical -g 0.5``, busy:
  no hint) joins it on the one GPU, so the governor pauses ``train`` by priority;
- carol's ``sweep`` (``-g 0.5``, normal) then preempts ``train`` (its memory does not fit
  beside the other two, so no squeeze): ``train`` is pending, ``preempted by sweep
  (restart 1)``, until it runs again.

At each step ``fgpu ls`` (table and ``--json``), ``fgpu describe``, ``fgpu top`` (table and
``--json``), the API over TCP, and the dashboard say the same word; priorities show by name;
events name GPUs and workloads as ``ls`` does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.localusers import ALICE, BOB, CAROL, as_user, ensure_users
from tests.serverproc import ServerProcess, started_server, wait_for

TOKEN = "vocabulary-token-0123456789abcdef"
SLEEP = ("/bin/sleep", "300")
WIDE = {"COLUMNS": "400"}  # one line per row


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    ensure_users()
    with started_server(
        "fgpu-words-", "1xA100-40GB", for_local_users=True, token=TOKEN, token_user=BOB
    ) as proc:
        yield proc


def submit(server: ServerProcess, user: str | None, name: str, *options: str) -> str:
    out = server.cli(
        "submit",
        "--name",
        name,
        "--grace",
        "1",
        *options,
        "--json",
        "--",
        *SLEEP,
        user=as_user(user) if user else (),
    ).stdout
    return str(json.loads(out)["id"])


def api(server: ServerProcess, path: str) -> Any:
    url = f"http://127.0.0.1:{server.tcp_port}{path}"
    answer = httpx.get(url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
    answer.raise_for_status()
    return answer.json()


def dashboard(server: ServerProcess, path: str) -> str:
    base = f"http://127.0.0.1:{server.tcp_port}"
    with httpx.Client(base_url=base, timeout=30) as client:
        login = client.post("/ui/login", data={"token": TOKEN})
        assert login.status_code == 303, login.text
        page = client.get(path)
        page.raise_for_status()
        return page.text


def ls_row(server: ServerProcess, workload: str) -> str:
    listed = server.cli("ls", "--all-users", env_extra=WIDE).stdout
    (row,) = [line for line in listed.splitlines() if workload in line]
    return row


def holders(server: ServerProcess) -> dict[str, dict[str, Any]]:
    (gpu,) = server.json("top")
    return {h["workload_id"]: h for h in gpu["holders"]}


def test_every_view_says_the_same_word(server: ServerProcess) -> None:
    (node,) = server.json("nodes")
    gpu_name = f"{node['name']}/0"
    uuid = node["gpus"][0]["uuid"]
    train = submit(server, ALICE, "train", "-p", "low", "-g", "0.5")
    server.wait_phase(train, "running")
    serve = submit(server, None, "serve", "-p", "critical", "-g", "0.5")
    server.wait_phase(serve, "running")

    # 1. paused by priority: the same word in ls --json, the API, top --json
    server.wait_listing(
        lambda ls: ls[train]["state"] == "paused-by-priority", "train paused by priority"
    )
    (listed,) = [w for w in api(server, "/v1/workloads") if w["id"] == train]
    assert (listed["state"], listed["gpu_state"]) == ("paused-by-priority",) * 2
    assert listed["state_text"] == "paused-by-priority"
    wait_for(lambda: holders(server)[train].get("state") == "paused-by-priority", "top says paused")
    # ... in the tables of ls (priority by name), describe and top
    row = ls_row(server, train)
    assert "paused-by-priority" in row.split(), row
    assert "low" in row.split(), row
    assert "paused-by-priority" in server.cli("describe", train, env_extra=WIDE).stdout
    top_table = server.cli("top", env_extra=WIDE).stdout
    assert f"{train} train: 0.5 (20GiB) fair, paused-by-priority" in top_table, top_table
    # ... and on the dashboard: the mark on the share, with its user
    overview = dashboard(server, "/ui")
    share = next(line for line in overview.splitlines() if f'data-workload="{train}"' in line)
    assert 'data-marks="paused-by-priority"' in share, share
    assert f'data-user="{ALICE}"' in share, share
    assert f"train {ALICE} 0.5" in share, share
    wait_for(
        lambda: any(e["kind"] == "paused" for e in server.describe(train)["events"]),
        "the governor's paused event",
    )
    for old in ("frozen-by-", "held-by-", "waits for its share"):
        assert old not in overview + top_table + row

    # 2. preempted by carol's sweep: pending, named with the preemptor and the restart
    sweep = submit(server, CAROL, "sweep", "-g", "0.5")
    server.wait_phase(sweep, "running")
    listing = server.wait_listing(
        lambda ls: ls[train]["phase"] == "pending" and ls[train]["state"] == "preempted",
        "train preempted",
    )
    words = "preempted by sweep (restart 1)"
    assert listing[train]["state_text"] == words
    assert listing[train]["preempted_by"] == sweep
    (listed,) = [w for w in api(server, "/v1/workloads") if w["id"] == train]
    assert (listed["state"], listed["state_text"]) == ("preempted", words)
    assert words in ls_row(server, train)
    detail = server.describe(train)
    assert detail["state_text"] == words
    assert words in server.cli("describe", train, env_extra=WIDE).stdout
    overview = dashboard(server, "/ui")
    pending_row = overview.split(f'<tr data-workload="{train}">', 1)[1].split("</tr>", 1)[0]
    assert words in pending_row, pending_row
    assert "<td>low</td>" in pending_row, pending_row  # priority by name
    assert ALICE in pending_row, pending_row
    page = dashboard(server, f"/ui/workloads/{train}")
    assert f'data-state="preempted">{words}<' in page, page

    # events name the GPU and the workloads as ls does, priorities by name
    messages = " | ".join(f"{e['reason']}: {e['message']}" for e in detail["events"])
    assert f"started on {gpu_name}: 0.5 (20GiB)" in messages, messages
    assert f"sweep ({sweep})" in messages, messages
    assert "priority normal" in messages, messages
    assert uuid not in messages, messages
    assert "priority 50" not in messages, messages
    paused = [e["message"] for e in detail["events"] if e["kind"] == "paused"]
    assert paused[0] == f"paused: serve ({serve}, priority critical) is busy on {gpu_name}"

    # 3. it runs again: the mark is gone everywhere
    server.cli("cancel", sweep)
    server.wait_phase(train, "running")
    listing = server.workloads()
    assert listing[train]["preempted_by"] is None
    assert listing[train]["state"] in (None, "paused-by-priority", "waiting-for-share")
    assert "preempted" not in ls_row(server, train)


def test_reclaimed_by_names_the_reclaimer_until_it_runs_again(server: ServerProcess) -> None:
    # alice's queue borrows the GPU while bob's, which holds the quota, is idle; bob's work
    # then takes it back across queues (reclaim)
    server.cli("queue", "set", "default", "--quota", "0")
    server.cli("queue", "create", "lab", "--quota", "0", "--member", "*")
    server.cli("queue", "create", "team", "--quota", "1", "--member", "*")
    borrowed = submit(server, ALICE, "borrowed", "-q", "lab", "-g", "1")
    server.wait_phase(borrowed, "running")
    owner = submit(server, BOB, "owner", "-q", "team", "-g", "1")
    server.wait_phase(owner, "running")
    listing = server.wait_listing(
        lambda ls: ls[borrowed]["state"] == "reclaimed", "borrowed reclaimed"
    )
    words = "reclaimed by owner (restart 1)"
    assert listing[borrowed]["state_text"] == words
    assert listing[borrowed]["preempted_by"] == owner
    assert words in ls_row(server, borrowed)
    (listed,) = [w for w in api(server, "/v1/workloads") if w["id"] == borrowed]
    assert (listed["state"], listed["state_text"]) == ("reclaimed", words)
    overview = dashboard(server, "/ui")
    assert words in overview.split(f'<tr data-workload="{borrowed}">', 1)[1].split("</tr>")[0]
    events = server.describe(borrowed)["events"]
    assert any(f"reclaim by owner ({owner})" in e["message"] for e in events), events
