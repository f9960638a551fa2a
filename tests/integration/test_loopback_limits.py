"""Local users on the TCP listener are told apart (issue 27, points 1 and 5), with real
local users on a real ``fgpu serve --listen 127.0.0.1:PORT``: every local client comes from
``127.0.0.1``, yet the connection cap and the limit on wrong tokens count per uid (the owner
of the client's socket), so bob at his connection cap, or locked out after his wrong
tokens (API and dashboard login together), leaves alice's connections, API calls and login
working; a client past the limit of wrong tokens gets 429 naming it, even for the right
token, and one log line is written however many.

Each user's requests are made by a small Python program run as that user (``setpriv``), on
a connection of its own. No assertion is about timing; waits have generous deadlines.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from fgpu.server.guesses import GUESS_FAILURES, GUESS_WINDOW_S
from tests.localusers import ALICE, BOB, as_user, ensure_users, uid_of
from tests.serverproc import ServerProcess, started_server

TOKEN = "loopback-limits-token-0123456789abcdef"
DEADLINE_S = 60.0

REQUESTS = r"""
import json, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
answers = []
for text in json.loads(sys.argv[3]):
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(text.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    answers.append(data.decode("latin-1"))
print(json.dumps(answers), flush=True)
"""

HOLDER = r"""
import json, socket, sys
host, port, count, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
held = []
for _ in range(count):
    s = socket.create_connection((host, port))
    s.sendall(b"GET /v1/healthz HTTP/1.1\r\nhost: fgpu\r\n")  # a head never finished
    held.append(s)
answers = []
for _ in range(extra):
    s = socket.create_connection((host, port), timeout=30)
    answer = b""
    try:
        while chunk := s.recv(65536):
            answer += chunk
    except OSError as exc:
        answers.append(f"<no answer within 30 s: {exc}>")
        break  # not refused: the server holds it like the others
    s.close()
    answers.append(answer.decode(errors="replace"))
print(json.dumps(answers), flush=True)
sys.stdin.read()  # hold the connections until the test closes our stdin
"""


def api(token: str) -> str:
    return (
        "GET /v1/workloads HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Authorization: Bearer {token}\r\n\r\n"
    )


def login(token: str) -> str:
    body = f"token={token}"
    return (
        "POST /ui/login HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    )


def requests_as(user: str, server: ServerProcess, *texts: str) -> list[tuple[int, str]]:
    """Each request on its own TCP connection from a program run as ``user``: the status
    and the whole answer of each."""
    run = subprocess.run(
        [
            *as_user(user),
            sys.executable,
            "-c",
            REQUESTS,
            "127.0.0.1",
            str(server.tcp_port),
            json.dumps(texts),
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        cwd="/",
    )
    assert run.returncode == 0, run.stderr
    return [(int(a.split(" ", 2)[1]), a) for a in json.loads(run.stdout)]


def retry_after(answer: str) -> int:
    found = re.search(r"(?im)^retry-after: (\d+)", answer)
    assert found is not None, answer[:400]
    return int(found.group(1))


@pytest.fixture(scope="module")
def users() -> None:
    ensure_users()


@pytest.fixture
def capped(users: None) -> Iterator[ServerProcess]:
    extra = ["--max-connections-per-user", "4", "--request-timeout", "600"]
    with started_server(
        "fgpu-lbcap-", "1xA100-40GB", for_local_users=True, token=TOKEN, token_user="65534",
        extra=extra,
    ) as s:  # fmt: skip
        yield s


@pytest.fixture
def served(users: None) -> Iterator[ServerProcess]:
    with started_server(
        "fgpu-lbtok-", "1xA100-40GB", for_local_users=True, token=TOKEN, token_user="65534"
    ) as s:
        yield s


def test_bob_at_his_cap_on_loopback_leaves_alice_her_connections(
    capped: ServerProcess,
) -> None:
    server = capped
    bob = uid_of(BOB)
    holder = subprocess.Popen(
        [
            *as_user(BOB),
            sys.executable,
            "-c",
            HOLDER,
            "127.0.0.1",
            str(server.tcp_port),
            "4",
            "3",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line, f"bob's holder ended: {holder.communicate(timeout=DEADLINE_S)}"
        answers = json.loads(line)
        # past his 4, each is refused at once, counted against his uid, not 127.0.0.1
        assert len(answers) == 3
        for answer in answers:
            assert answer.startswith("HTTP/1.1 429 "), answer
            assert f"too many open connections from uid {bob}: 4 open, limit 4" in answer
        # alice, from the same 127.0.0.1, is not touched
        for status, answer in requests_as(ALICE, server, *[api(TOKEN)] * 3):
            assert status == 200, answer[:400]
        # bob's connections on the socket count with his TCP ones: the same uid
        refused = server.cli("ls", user=as_user(BOB), check=False)
        assert refused.returncode != 0
        assert f"too many open connections from uid {bob}" in refused.stderr, refused.stderr
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(DEADLINE_S)
    assert holder.returncode == 0, holder.stderr.read() if holder.stderr else ""
    assert server.cli("ls", user=as_user(BOB)).returncode == 0


def test_wrong_bearer_tokens_are_limited_per_local_user(served: ServerProcess) -> None:
    server = served
    started = time.monotonic()
    bob = uid_of(BOB)
    answers = requests_as(BOB, server, *[api("not-the-token")] * GUESS_FAILURES)
    assert [status for status, _ in answers] == [401] * GUESS_FAILURES
    # past the limit: 429 naming it, the token not looked at (the right one too)
    for status, answer in requests_as(BOB, server, api("still-not-it"), api(TOKEN)):
        assert status == 429, answer[:400]
        assert 0 < retry_after(answer) <= GUESS_WINDOW_S
        assert (
            f"{GUESS_FAILURES} wrong tokens from uid {bob} within {GUESS_WINDOW_S:g} s "
            f"(the limit: {GUESS_FAILURES} per client)"
        ) in answer, answer
    # alice and root, from the same 127.0.0.1, are not slowed: every call succeeds
    for user in (ALICE, "root"):
        for status, answer in requests_as(user, server, *[api(TOKEN)] * 10):
            assert status == 200, answer[:400]
    # seven wrong or refused tokens, one log line: the next comes a minute after it at the
    # earliest (with the count since), which only a test slowed past a minute would see
    lines = [ln for ln in server.server_log().splitlines() if "wrong or refused tokens" in ln]
    assert 1 <= len(lines) <= 1 + (time.monotonic() - started) // 60, lines
    assert f"a wrong token from uid {bob}" in lines[0]


def test_bob_hammering_the_login_leaves_alice_able_to_log_in(served: ServerProcess) -> None:
    server = served
    bob = uid_of(BOB)
    # bob's wrong tokens, at the login and the API, count together against his uid
    wrong = [login("guess-1"), api("guess-2"), login("guess-3"), api("guess-4"), login("x")]
    assert [s for s, _ in requests_as(BOB, server, *wrong)] == [401] * GUESS_FAILURES
    status, answer = requests_as(BOB, server, login(TOKEN))[0]
    assert status == 429, answer[:400]
    assert f"{GUESS_FAILURES} wrong tokens from uid {bob}" in answer
    assert retry_after(answer) > 0
    assert "set-cookie" not in answer.lower()
    # alice logs in meanwhile, from the same 127.0.0.1
    status, answer = requests_as(ALICE, server, login(TOKEN))[0]
    assert status == 303, answer[:400]
    assert re.search(r"(?im)^set-cookie: fgpu_session=", answer), answer[:400]
    # and a typo of hers is hers alone: she may still log in after one
    statuses = [s for s, _ in requests_as(ALICE, server, login("typo"), login(TOKEN))]
    assert statuses == [401, 303]
