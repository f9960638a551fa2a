"""One user cannot take the API from others (issue 27, point 1), with real local users on a
real ``fgpu serve``: bob holds half-open connections up to his cap and one more is refused
with 429 at once (one log line however many), while alice's commands succeed and the
governor goes on time-slicing her workload; a silent connection and a slowloris (a request
head sent one line at a time) are cut off with 408 after ``--request-timeout``.

bob's connections are made by a small Python program run as bob (``setpriv``), so the
server sees his uid in the socket's peer credentials. No assertion is about timing; waits
have generous deadlines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.integration.test_service_governor import stopped
from tests.localusers import ALICE, BOB, as_user, ensure_users, uid_of
from tests.serverproc import ServerProcess, started_server, wait_for

LONG_S = 60.0
TOKEN = "connection-limits-token-0123456789"

HOLDER = r"""
import json, socket, sys
path, count, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b"GET /v1/healthz HTTP/1.1\r\nhost: fgpu\r\n")  # a head never finished
    held.append(s)
answers = []
for _ in range(extra):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(path)
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

SLOW = r"""
import json, select, socket, sys, time
target = sys.argv[1]


def connect():
    if target.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX)
        s.connect(target[5:])
        return s
    host, port = target[4:].rsplit(":", 1)
    return socket.create_connection((host, int(port)))


# seconds between header lines: silent sends nothing, slow a line each half second (a
# slowloris); late too, and then, when its answer has come, 10 lines more at once (a client
# still sending when the server answers), before it reads on
every = {"silent": None, "slow": 0.5, "late": 0.5, "body": None}
conns = {name: connect() for name in every}
for name in ("slow", "late"):
    conns[name].sendall(b"GET /v1/healthz HTTP/1.1\r\n")
# body: a whole head, then 6 of the 100 bytes it announced, then nothing
conns["body"].sendall(
    b"POST /v1/workloads HTTP/1.1\r\nhost: fgpu\r\ncontent-type: application/json\r\n"
    b"content-length: 100\r\n\r\n{\"comm"
)
answers = {name: b"" for name in every}
ends = {}
lines = {name: 0 for name in every}
late_sent = []
due = {name: time.monotonic() for name in every}
open_ = dict(conns)
deadline = time.monotonic() + 40
while open_ and time.monotonic() < deadline:
    ready, _, _ = select.select(list(open_.values()), [], [], 0.5)
    for name, s in list(open_.items()):
        if s in ready:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:  # the end, after what was read so far
                ends[name] = "reset"
                del open_[name]
                continue
            answers[name] += chunk
            if not chunk:
                ends[name] = "eof"
                del open_[name]
            elif name == "late" and not late_sent:
                for n in range(10):
                    try:
                        s.sendall(b"x-late-%d: 1\r\n" % n)
                        late_sent.append("sent")
                    except OSError as exc:
                        late_sent.append(type(exc).__name__)
        elif every[name] is not None and not answers[name] and time.monotonic() >= due[name]:
            try:
                s.sendall(b"x-line-%d: 1\r\n" % lines[name])  # one more line, never the end
                lines[name] += 1
            except OSError:
                pass
            due[name] = time.monotonic() + every[name]
print(json.dumps({
    "answers": {name: a.decode(errors="replace") for name, a in answers.items()},
    "ends": ends,
    "still_open": sorted(open_),
    "lines": lines,
    "late_sent": late_sent,
}), flush=True)
"""


@pytest.fixture(scope="module")
def users() -> None:
    ensure_users()


@pytest.fixture
def capped(users: None) -> Iterator[ServerProcess]:
    extra = ["--max-connections-per-user", "4", "--request-timeout", "600"]
    extra += ["--compute-mode", "strict"]
    with started_server("fgpu-conn-", "1xA100-40GB", for_local_users=True, extra=extra) as s:
        yield s


def test_bob_at_his_connection_cap_leaves_alice_and_the_governor_working(
    capped: ServerProcess,
) -> None:
    server = capped
    # alice's workload, time-sliced (strict: 30% of the GPU's time even alone); /bin/sleep:
    # the test's interpreter may lie where alice's workloads cannot run it
    result = server.cli(
        "submit", "--gpu", "0.3", "--json", "--", "sleep", "600", user=as_user(ALICE)
    )
    wid = str(json.loads(result.stdout)["id"])
    server.wait_phase(wid, "running", timeout_s=LONG_S)
    wait_for(lambda: (server.state_dir / "logs" / wid / "handle.json").is_file(), "its handle")
    pgid = int(server.handle(wid)["pgid"])

    holder = subprocess.Popen(
        [*as_user(BOB), sys.executable, "-c", HOLDER, str(server.socket), "4", "20"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line, f"bob's holder ended: {holder.communicate(timeout=LONG_S)}"
        answers = json.loads(line)
        # every connection past his 4 is answered at once with 429 naming the limit
        assert len(answers) == 20
        for answer in answers:
            assert answer.startswith("HTTP/1.1 429 "), answer
            assert f"uid {uid_of(BOB)}" in answer, answer
            assert "limit 4" in answer, answer
            assert "--max-connections-per-user" in answer, answer

        # while bob holds his 4 half-open connections: alice's commands work ...
        listed = server.cli("ls", "--json", user=as_user(ALICE))
        assert wid in {w["id"] for w in json.loads(listed.stdout)}
        assert server.cli("describe", wid, "--json", user=as_user(ALICE)).returncode == 0
        # ... and the governor goes on freezing and thawing her workload
        seen: set[bool] = set()

        def both() -> bool:
            seen.add(stopped(pgid))
            return seen == {True, False}

        wait_for(both, "alice's workload frozen and thawed by the governor", LONG_S)
        # 20 refusals, one log line (the next would come a minute later at the earliest)
        refusals = [ln for ln in server.server_log().splitlines() if "refused connections" in ln]
        assert len(refusals) == 1, refusals
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(LONG_S)
    assert holder.returncode == 0, holder.stderr.read() if holder.stderr else ""
    # his connections closed, bob may connect again
    assert server.cli("ls", user=as_user(BOB)).returncode == 0


@pytest.fixture
def hurried(users: None) -> Iterator[ServerProcess]:
    extra = ["--request-timeout", "2"]
    with started_server(
        "fgpu-slow-", "1xA100-40GB", for_local_users=True, token=TOKEN, token_user="65534",
        extra=extra,
    ) as s:  # fmt: skip
        yield s


@pytest.mark.parametrize("over", ["unix", "tcp"])
def test_a_silent_connection_and_a_slowloris_are_cut_off_with_408(
    hurried: ServerProcess, over: str
) -> None:
    server = hurried
    target = f"unix:{server.socket}" if over == "unix" else f"tcp:127.0.0.1:{server.tcp_port}"
    run = subprocess.run(
        [*as_user(BOB), sys.executable, "-c", SLOW, target],
        capture_output=True,
        text=True,
        timeout=LONG_S + 30,
        cwd="/",
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["still_open"] == [], seen  # all closed by the server within the 40 s
    for name in ("silent", "slow", "late", "body"):  # body: a trial found it cut, unanswered
        assert seen["answers"][name].startswith("HTTP/1.1 408 "), seen
        assert "--request-timeout" in seen["answers"][name], seen
        # the whole answer, then the end of the connection: the server shut its side after
        # the answer and read (and dropped) what the client still sent, so the client's
        # sends go through and the server's close cannot reset the connection
        assert seen["ends"][name] == "eof", seen
    assert seen["late_sent"] == ["sent"] * 10, seen
    # the slowloris kept sending (a line each half second) and was cut all the same
    assert seen["lines"]["slow"] >= 1, seen
    # and the server still answers, and the submission cut short left no error behind
    assert server.cli("ls", user=as_user(BOB)).returncode == 0
    assert "Traceback" not in server.server_log()


def test_every_answer_says_how_long_an_idle_connection_stays_open(
    hurried: ServerProcess,
) -> None:
    """``Keep-Alive: timeout=N`` (``--idle-timeout``, 5 s here): the client reuses a kept
    connection only within it, so the server's idle close never meets a request."""
    import socket

    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(LONG_S)
        conn.connect(str(hurried.socket))
        answers = []
        for _ in range(2):  # the second answer on the same connection says it too
            conn.sendall(b"GET /v1/healthz HTTP/1.1\r\nhost: fgpu\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head = data.split(b"\r\n\r\n", 1)[0].decode().lower()
            answers.append(head)
    for head in answers:
        assert head.startswith("http/1.1 200"), head
        assert "\r\nkeep-alive: timeout=5" in head, head
