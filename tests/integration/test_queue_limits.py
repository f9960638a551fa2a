"""Per-queue per-user limits, listings that leave others' backlog out, and events of one's own
work, on a real root ``fgpu serve`` with real local users alice and bob (issue 27, points 2
and 5).

- a queue's ``--max-active-per-user`` and ``--max-stored-bytes`` refuse bob (429) naming the
  limit, the queue and the value, while alice still submits, and the machine's limits stay
  the fallback over all queues;
- each bad value of those flags gets its own error, naming the flag and echoing the value;
- ``fgpu ls`` shows alice her work and others' running work, not bob's pending backlog
  (``--all-users`` shows it);
- ``GET /v1/events`` gives alice her workloads' events and those of no workload, unless she
  asks for everyone's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.localusers import ALICE, BOB, as_user, ensure_users, uid_of
from tests.serverproc import CLI_TIMEOUT_S, ServerProcess, started_server


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    ensure_users()
    extra = ["--max-active-per-user", "3", "--max-stored-bytes", "1MiB"]
    with started_server("fgpu-qlim-", "1xA100-40GB", for_local_users=True, extra=extra) as s:
        yield s


def submit(
    server: ServerProcess,
    user: str,
    *options: str,
    env: dict[str, str] | None = None,
    gpu: str = "0.05",
) -> subprocess.CompletedProcess[str]:
    return server.cli(
        "submit",
        "--gpu",
        gpu,
        "--json",
        *options,
        "--",
        "sleep",
        "600",
        user=as_user(user),
        check=False,
        env_extra=env,
    )


def listed(server: ServerProcess, user: str, *args: str) -> list[dict[str, object]]:
    answer = server.cli("ls", "--json", *args, user=as_user(user))
    return list(json.loads(answer.stdout))


def test_a_queues_per_user_active_limit_refuses_naming_it_and_the_machines_is_the_fallback(
    server: ServerProcess,
) -> None:
    created = server.json("queue", "create", "team", "--member", "*", "--max-active-per-user", "2")
    assert created["max_active_per_user"] == 2
    for _ in range(2):
        assert submit(server, BOB, "-q", "team").returncode == 0
    third = submit(server, BOB, "-q", "team")
    assert third.returncode != 0
    assert "2 active workloads in queue team" in third.stderr, third.stderr
    assert "max_active_per_user 2" in third.stderr, third.stderr
    # alice is not held by bob's count
    assert submit(server, ALICE, "-q", "team").returncode == 0
    # the default queue sets nothing: the machine's limit (3, all queues) applies
    assert submit(server, BOB).returncode == 0
    fourth = submit(server, BOB)
    assert fourth.returncode != 0
    assert "--max-active-per-user 3" in fourth.stderr, fourth.stderr
    assert "3 active workloads" in fourth.stderr, fourth.stderr
    bob_uid = uid_of(BOB)
    assert sum(1 for w in listed(server, BOB) if w["owner_uid"] == bob_uid) == 3  # no more
    # an admin lifts the queue's limit: the machine's is left
    server.cli("queue", "set", "team", "--max-active-per-user", "none")
    (team,) = [q for q in server.json("queue", "ls") if q["name"] == "team"]
    assert team["max_active_per_user"] is None


def test_a_queues_stored_bytes_limit_counts_commands_and_environments(
    server: ServerProcess,
) -> None:
    server.cli("queue", "create", "tiny", "--member", "*", "--max-stored-bytes", "12KiB")
    big = {"FGPU_TEST_PAYLOAD": "x" * 7000}
    assert submit(server, BOB, "-q", "tiny", env=big).returncode == 0
    second = submit(server, BOB, "-q", "tiny", env=big)
    assert second.returncode != 0
    assert "queue tiny" in second.stderr, second.stderr
    assert "max_stored_bytes 12 KiB (12288 bytes)" in second.stderr, second.stderr
    # the machine's limit (1 MiB) is not reached, and alice has her own count
    assert submit(server, ALICE, "-q", "tiny", env=big).returncode == 0
    assert submit(server, BOB, env=big).returncode == 0


def test_the_machines_stored_bytes_limit_covers_every_queue_and_finished_work(
    server: ServerProcess,
) -> None:
    # 240,000 bytes, under --max-submission-bytes (256 KiB); one variable at most 128 KiB
    payload = {"FGPU_TEST_PAYLOAD_A": "y" * 120_000, "FGPU_TEST_PAYLOAD_B": "z" * 120_000}
    for i in range(3):
        server.cli("queue", "create", f"q{i}", "--member", "*")
    outcomes = []
    for i in range(5):  # each cancelled at once: the active limit (3) is never the cause
        result = submit(server, BOB, "-q", f"q{i % 3}", env=payload)
        outcomes.append(result)
        if result.returncode == 0:
            server.cli("cancel", json.loads(result.stdout)["id"], user=as_user(BOB))
    assert [r.returncode == 0 for r in outcomes] == [True, True, True, True, False], [
        r.stderr for r in outcomes
    ]
    refusal = outcomes[-1].stderr
    assert "--max-stored-bytes 1 MiB (1048576 bytes)" in refusal, refusal
    assert "finished workloads count until they are pruned" in refusal, refusal
    # alice is not held by bob's bytes
    assert submit(server, ALICE, env=payload).returncode == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ("--max-active-per-user", "0"),
            "--max-active-per-user '0': give a whole number >= 1, or none",
        ),
        (
            ("--max-active-per-user", "many"),
            "--max-active-per-user 'many': give a whole number >= 1, or none",
        ),
        (("--max-stored-bytes", "12parsecs"), "unknown unit 'parsecs'"),
        (("--max-stored-bytes", "-5"), "--max-stored-bytes '-5'"),
        (("--max-stored-bytes", "100"), "--max-stored-bytes"),
    ],
    ids=["active-zero", "active-word", "bytes-unit", "bytes-negative", "bytes-too-small"],
)
def test_bad_per_user_limits_of_a_queue_are_refused_naming_the_flag(
    server: ServerProcess, args: tuple[str, str], says: str
) -> None:
    result = server.cli("queue", "create", "bad", "--member", "*", *args, check=False)
    assert result.returncode != 0
    assert says in result.stderr, result.stderr
    assert all(q["name"] != "bad" for q in server.json("queue", "ls"))  # nothing created


def test_the_api_refuses_a_stored_bytes_limit_below_its_floor(server: ServerProcess) -> None:
    body = json.dumps({"name": "bad", "members": ["*"], "max_stored_bytes": 100})
    answer = api_as(server, "root", "POST", "/v1/queues", body)
    assert answer["status"] == 422, answer
    assert answer["body"]["detail"]["field"] == "max_stored_bytes", answer
    assert "100" in answer["body"]["detail"]["reason"], answer


def test_only_admins_set_a_queues_limits(server: ServerProcess) -> None:
    server.cli("queue", "create", "team", "--member", "*")
    refused = server.cli(
        "queue", "set", "team", "--max-active-per-user", "500", user=as_user(BOB), check=False
    )
    assert refused.returncode != 0
    assert "admin" in refused.stderr.lower(), refused.stderr


def test_ls_shows_a_user_her_work_and_running_work_not_others_backlog(
    server: ServerProcess,
) -> None:
    running = json.loads(submit(server, BOB, gpu="0.6").stdout)["id"]
    server.wait_phase(running, "running")
    backlog = [json.loads(submit(server, BOB, gpu="0.6").stdout)["id"] for _ in range(2)]
    own = json.loads(submit(server, ALICE, gpu="0.2").stdout)["id"]
    alice_sees = {w["id"] for w in listed(server, ALICE)}
    assert running in alice_sees
    assert own in alice_sees
    assert not alice_sees & set(backlog), alice_sees
    everyone = {w["id"] for w in listed(server, ALICE, "--all-users")}
    assert set(backlog) <= everyone
    assert set(backlog) <= {w["id"] for w in listed(server, BOB)}  # bob sees his own
    # the table says what it leaves out when nothing is left
    server.cli("cancel", own, user=as_user(ALICE))
    table = server.cli("ls", user=as_user(ALICE))
    assert running in table.stdout
    # picking a user lists that user's work whatever its phase
    picked = {w["id"] for w in listed(server, ALICE, "--user", BOB)}
    assert set(backlog) <= picked


def api_as(
    server: ServerProcess, user: str, method: str, path: str, body: str | None = None
) -> dict[str, object]:
    """One request on the socket as ``user`` (root: no prefix); status and JSON body."""
    payload = None if body is None else json.loads(body)
    script = (
        "import json, sys\n"
        "from fgpu.client.transport import unix_exchange\n"
        f"answer = unix_exchange({str(server.socket)!r}, 30, {method!r}, {path!r}, "
        f"{{'Host': 'localhost'}}, json.loads({json.dumps(payload)!r}))\n"
        "print(json.dumps({'status': answer.status_code, 'body': answer.json(), "
        "'headers': dict(answer.headers)}))\n"
    )
    prefix = [] if user == "root" else list(as_user(user))
    done = subprocess.run(
        [*prefix, sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd="/",
        env={**server.env, "HOME": "/"},
        check=True,
    )
    return dict(json.loads(done.stdout))


def test_events_of_others_workloads_are_left_out_unless_asked_for(
    server: ServerProcess,
) -> None:
    bob = json.loads(submit(server, BOB).stdout)["id"]
    alice = json.loads(submit(server, ALICE).stdout)["id"]
    mine = api_as(server, ALICE, "GET", "/v1/events?limit=1000")
    assert mine["status"] == 200, mine
    seen = {e["workload_id"] for e in mine["body"]}  # type: ignore[union-attr]
    assert alice in seen, seen
    assert bob not in seen, seen
    every = api_as(server, ALICE, "GET", "/v1/events?limit=1000&all_users=true")
    assert bob in {e["workload_id"] for e in every["body"]}  # type: ignore[union-attr]
    # root is an admin: everyone's by default
    admin = api_as(server, "root", "GET", "/v1/events?limit=1000")
    assert bob in {e["workload_id"] for e in admin["body"]}  # type: ignore[union-attr]


def test_the_listing_pages_with_limit_and_cursor(server: ServerProcess) -> None:
    ids = [json.loads(submit(server, ALICE).stdout)["id"] for _ in range(3)]
    first = api_as(server, ALICE, "GET", "/v1/workloads?limit=2")
    assert [w["id"] for w in first["body"]] == ids[:2]  # type: ignore[union-attr]
    cursor = first["headers"]["x-fgpu-next-cursor"]  # type: ignore[index]
    rest = api_as(server, ALICE, "GET", f"/v1/workloads?limit=2&cursor={cursor}")
    assert [w["id"] for w in rest["body"]] == ids[2:]  # type: ignore[union-attr]
    assert "x-fgpu-next-cursor" not in rest["headers"]  # type: ignore[operator]
    bad = api_as(server, ALICE, "GET", "/v1/workloads?cursor=yesterday")
    assert bad["status"] == 400 or bad["status"] == 422, bad
    assert bad["body"]["detail"]["field"] == "cursor", bad  # type: ignore[index]
    assert "'yesterday' is not a cursor" in bad["body"]["detail"]["reason"], bad  # type: ignore[index]
    too_many = api_as(server, ALICE, "GET", "/v1/workloads?limit=0")
    assert too_many["status"] == 422
    assert too_many["body"]["detail"]["field"] == "limit"


def test_the_dashboard_lists_the_oldest_pending_work_and_counts_the_rest() -> None:
    import httpx

    from fgpu.client import Client
    from fgpu.server.dashboard import PENDING_SHOWN
    from fgpu.wire import SubmitRequest

    token = "dashboard-token-0123456789abcdef"
    with started_server("fgpu-dashcap-", "1xA100-40GB", token=token, token_user="nobody") as server:
        with Client(server.socket) as client:
            ids = [
                client.submit(SubmitRequest(command=["sleep", "600"], gpu="1")).id
                for _ in range(PENDING_SHOWN + 11)
            ]
        server.wait_phase(ids[0], "running")
        answer = httpx.get(
            f"http://127.0.0.1:{server.tcp_port}/ui/fragment/overview",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text[:300]
        pending = answer.text.split('<section id="pending">', 1)[1].split("</section>", 1)[0]
        shown = re.findall(r'data-workload="([0-9a-f]+)"', pending)
        assert shown == ids[1 : PENDING_SHOWN + 1]  # the oldest first
        assert f"and {10} more" in pending, pending[-400:]


def test_a_listing_without_a_limit_answers_one_page() -> None:
    """No answer holds every workload of a large backlog (an attacker's 60 parallel full
    listings took the server from 279 MB to 2.5 GB): without ``limit`` a page of
    DEFAULT_PAGE, with the cursor of the next."""
    import httpx

    from fgpu.server.listing import DEFAULT_PAGE

    with started_server("fgpu-page-", "1xA100-40GB") as server:
        transport = httpx.HTTPTransport(uds=str(server.socket))
        with httpx.Client(transport=transport, base_url="http://fgpu", timeout=60) as client:
            for _ in range(DEFAULT_PAGE + 1):
                made = client.post("/v1/workloads", json={"command": ["true"], "gpu": "1"})
                assert made.status_code == 201, made.text
            page = client.get("/v1/workloads", params={"all": "true"})  # finished ones too
            assert page.status_code == 200
            assert len(page.json()) == DEFAULT_PAGE
            cursor = page.headers["x-fgpu-next-cursor"]
            rest = client.get("/v1/workloads", params={"all": "true", "cursor": cursor})
            assert len(rest.json()) >= 1
        assert len(server.workloads(all_=True)) == DEFAULT_PAGE + 1  # the CLI follows pages
