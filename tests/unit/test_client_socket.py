"""The client on a Unix socket (the standard library's HTTP, not httpx): against small real
socket servers, what it sends, and that each answer and each failure gives what the httpx
path gives (the same exception, status, field and reason)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from fgpu.client import Client, ClientError
from fgpu.client.transport import json_text
from fgpu.wire import LOG_OFFSET_HEADER, QueueBody
from tests.builders import workload_view
from tests.serverproc import AS_NOBODY

Handler = Callable[[socket.socket], None]


def read_request(conn: socket.socket) -> tuple[bytes, bytes]:
    """The head and the body of one HTTP request read from ``conn``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head, body


def answer(status: str, body: bytes, headers: tuple[str, ...] = ()) -> Handler:
    """A handler that reads the request and answers ``status`` with ``body``."""

    def handle(conn: socket.socket) -> None:
        read_request(conn)
        lines = [f"HTTP/1.1 {status}", f"content-length: {len(body)}", *headers]
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    return handle


@contextmanager
def serving(path: Path, handle: Handler) -> Iterator[threading.Event]:
    """A real Unix socket server at ``path`` calling ``handle`` on each connection (each in
    a thread of its own) until the block ends; yields an event set when it ends (a handler
    may wait on it)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    def serve_one(conn: socket.socket) -> None:
        with conn:
            handle(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        done.set()
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=30)


def outcome(call: Callable[[Client], object], client: Client) -> tuple[object, ...]:
    """What a call gives: ("ok", result) or the error's kind, status, field and reason."""
    with client:
        try:
            return ("ok", call(client))
        except ClientError as exc:
            return (type(exc).__name__, exc.status, exc.field, exc.reason)


def both(path: Path, call: Callable[[Client], object], timeout: float = 30.0) -> list[object]:
    """The outcome on the standard library path and on httpx's, same socket and server."""
    return [
        outcome(call, Client(path, timeout=timeout)),
        outcome(call, Client(path, timeout=timeout, transport=httpx.HTTPTransport(uds=str(path)))),
    ]


def test_a_request_is_sent_as_httpx_sends_it(tmp_path: Path) -> None:
    seen: list[tuple[bytes, bytes]] = []

    def record(conn: socket.socket) -> None:
        seen.append(read_request(conn))
        body = json.dumps({"name": "team-a", "parent": None, "quota_milli": 2000}).encode()
        head = b"HTTP/1.1 422 Unprocessable\r\ncontent-length: %d\r\n\r\n" % len(body)
        conn.sendall(head + body)

    path = tmp_path / "s.sock"
    with serving(path, record):
        for client in (Client(path), Client(path, transport=httpx.HTTPTransport(uds=str(path)))):
            with client:
                with pytest.raises(ClientError):
                    client.create_queue(QueueBody(name="tëam", quota=2))
                with pytest.raises(ClientError):
                    client.events(after=7, limit=5)
    heads = [head.decode().split("\r\n") for head, _ in seen]
    # the standard library's request (0, 1) and httpx's (2, 3): same line, agent and body
    assert heads[0][0] == heads[2][0] == "POST /v1/queues HTTP/1.1"
    assert heads[1][0] == heads[3][0] == "GET /v1/events?limit=5&after=7 HTTP/1.1"
    for head in heads:
        fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
        assert fields["user-agent"] == "fgpu-client"
        assert fields["host"] == "fgpu"
    assert seen[0][1] == seen[2][1]
    assert json.loads(seen[0][1])["name"] == "tëam"
    assert seen[0][1] == json_text(json.loads(seen[0][1])).encode()  # compact UTF-8


def test_answers_become_the_same_models_and_refusals(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    queue = {
        "name": "a",
        "parent": None,
        "quota_milli": 1000,
        "limit_milli": None,
        "over_quota_weight": 1.0,
        "priority": 0,
        "allocated_milli": 0,
        "fair_share_milli": 0,
        "pending": 0,
        "running": 0,
    }
    cases: list[tuple[Handler, tuple[object, ...]]] = [
        (answer("200 OK", json.dumps([queue]).encode()), ("ok",)),
        (
            answer("422 Unprocessable Entity", b'{"detail": {"field": "quota", "reason": "no"}}'),
            ("ClientError", 422, "quota", "no"),
        ),
        (
            answer("404 Not Found", b'{"detail": "Not Found"}'),
            ("ClientError", 404, "", "Not Found"),
        ),
        (answer("502 Bad Gateway", b""), ("ClientError", 502, "", "HTTP 502: Bad Gateway")),
        (answer("200 OK", b"{not json"), ("ClientError", 200)),
    ]
    for handle, expected in cases:
        with serving(path, handle):
            results = both(path, lambda c: c.list_queues())
        path.unlink()
        assert results[0] == results[1]
        assert results[0][: len(expected)] == expected
    with serving(path, answer("200 OK", b"abc", (f"{LOG_OFFSET_HEADER}: 10",))):
        assert both(path, lambda c: c.logs("w", offset=7)) == [("ok", (b"abc", 10))] * 2


def test_no_server_says_how_to_start_one(tmp_path: Path) -> None:
    missing = tmp_path / "none.sock"
    results = both(missing, lambda c: c.list_workloads())
    assert results[0] == results[1]
    assert results[0] == (
        "ServerUnavailable",
        0,
        "",
        f"no fgpu server at {missing}; start one with `fgpu serve`",
    )
    not_a_socket = tmp_path / "file.sock"
    not_a_socket.write_text("")
    results = both(not_a_socket, lambda c: c.list_workloads())
    assert results[0] == results[1]
    assert str(results[0][3]).startswith(f"no fgpu server at {not_a_socket}")


def test_a_server_that_hangs_up_or_never_answers(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with serving(path, read_request):  # reads the request, then closes without an answer
        results = both(path, lambda c: c.nodes())
    assert results[0] == results[1]
    assert results[0] == (
        "ServerUnavailable",
        0,
        "",
        f"no fgpu server at {path}; start one with `fgpu serve` "
        "(Server disconnected without sending a response.)",
    )
    path.unlink()
    done = threading.Event()
    with serving(path, lambda conn: done.wait(60)):  # never answers while the test runs
        try:
            results = both(path, lambda c: c.nodes(), timeout=0.5)
        finally:
            done.set()
    assert results[0] == results[1]
    assert results[0] == ("ClientError", 0, "", f"the fgpu server at {path} did not answer in time")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may use any socket")
def test_a_socket_of_another_user_says_no_permission(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with serving(path, answer("200 OK", b"[]")):
        path.chmod(0)  # the socket is there, but this user may not use it
        results = both(path, lambda c: c.nodes())
    assert results[0] == results[1]
    assert "no permission to use the fgpu socket" in str(results[0][3])


def test_the_plain_listing_is_the_typed_one(tmp_path: Path) -> None:
    views = [workload_view(), workload_view(id="b", phase="pending", gpus=[])]
    body = json.dumps([v.model_dump(mode="json") for v in views]).encode()
    path = tmp_path / "s.sock"
    with serving(path, answer("200 OK", body)), Client(path) as client:
        typed = client.list_workloads()
        plain = client.list_workloads_plain()
    assert typed == views
    assert [dataclasses.asdict(p) for p in plain] == [v.model_dump() for v in typed]
    bad = path.with_name("b.sock")
    with (
        serving(bad, answer("200 OK", b'[{"id": 1}]')),
        Client(bad) as client,
        pytest.raises(ClientError) as caught,
    ):
        client.list_workloads_plain()
    assert caught.value.reason.startswith("unexpected answer from the server: ")


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_a_socket_another_user_may_not_use_says_no_permission() -> None:
    root = Path(tempfile.mkdtemp(prefix="fgpu-perm-", dir="/tmp"))
    try:
        root.chmod(0o755)
        path = root / "s.sock"
        with serving(path, answer("200 OK", b"[]")):
            path.chmod(0o600)  # root's socket: nobody may not connect
            code = (
                "import json, sys\n"
                "import httpx\n"
                "from fgpu.client import Client, ClientError\n"
                "out = []\n"
                "for t in (None, httpx.HTTPTransport(uds=sys.argv[1])):\n"
                "    try:\n"
                "        Client(sys.argv[1], transport=t).nodes()\n"
                "    except ClientError as exc:\n"
                "        out.append([type(exc).__name__, exc.status, exc.reason])\n"
                "print(json.dumps(out))\n"
            )
            done = subprocess.run(
                [*AS_NOBODY, sys.executable, "-c", code, str(path)],
                capture_output=True,
                text=True,
                timeout=60,
                cwd="/",
                env={**os.environ, "HOME": "/"},
            )
        assert done.returncode == 0, done.stderr
        ours, httpxs = json.loads(done.stdout)
        assert ours == httpxs
        assert ours == ["ServerUnavailable", 0, f"no permission to use the fgpu socket {path}"]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def keeping(status: str, body: bytes, seen: list[int], headers: tuple[str, ...] = ()) -> Handler:
    """A handler that answers every request of its connection (keep-alive) until the client
    closes it, adding to ``seen`` the number of requests each connection carried."""

    def handle(conn: socket.socket) -> None:
        seen.append(0)
        while True:
            head, _ = read_request(conn)
            if not head:
                return
            seen[-1] += 1
            lines = [f"HTTP/1.1 {status}", f"content-length: {len(body)}", *headers]
            conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    return handle


def test_a_client_keeps_its_connection_between_requests(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    seen: list[int] = []
    with serving(path, keeping("200 OK", b"[]", seen)), Client(path, timeout=30) as client:
        for _ in range(3):
            assert client.nodes() == []
    assert seen == [3]  # one connection carried the three requests


def test_a_kept_connection_the_server_closed_is_replaced_before_the_request(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sock"
    with serving(path, answer("200 OK", b"[]")), Client(path, timeout=30) as client:
        # the server closes each connection after one answer (an idle keep-alive timeout):
        # the next request finds it closed and goes on a new one, nothing is lost
        assert [client.nodes() for _ in range(3)] == [[], [], []]


def test_a_connection_the_server_says_it_closes_is_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    seen: list[int] = []
    handler = keeping("200 OK", b"[]", seen, ("connection: close",))
    with serving(path, handler), Client(path, timeout=30) as client:
        assert [client.nodes() for _ in range(2)] == [[], []]
    assert seen == [1, 1]


def test_two_threads_on_one_client_each_get_their_answer(tmp_path: Path) -> None:
    """A request made while another thread's is on the kept connection goes on its own."""
    path = tmp_path / "s.sock"
    seen: list[int] = []
    answers: list[object] = []
    with serving(path, keeping("200 OK", b"[]", seen)), Client(path, timeout=30) as client:

        def many() -> None:
            answers.extend(client.nodes() for _ in range(20))

        threads = [threading.Thread(target=many) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert answers == [[]] * 40
    assert sum(seen) == 40


def test_a_read_lost_to_a_keep_alive_close_is_sent_again_once(tmp_path: Path) -> None:
    """The server closing the kept connection as a request goes (its keep-alive timeout)
    never read it: a read is sent again on a new connection; a cancel (a POST without an
    Idempotency-Key) is not, and says its answer may be lost."""
    path = tmp_path / "s.sock"
    connections: list[int] = []
    body = json.dumps(workload_view().model_dump(mode="json")).encode()

    def first_answers_once(conn: socket.socket) -> None:
        connections.append(len(connections))
        head, _ = read_request(conn)
        reply = b"[]" if head.startswith(b"GET") else body
        lines = ["HTTP/1.1 200 OK", f"content-length: {len(reply)}"]
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + reply)
        if len(connections) % 2 == 1:
            read_request(conn)  # the next request on this connection: closed unanswered
            return
        while read_request(conn)[0]:  # a new connection answers what comes
            conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + reply)

    with serving(path, first_answers_once), Client(path, timeout=30) as client:
        assert client.nodes() == []
        assert client.nodes() == []  # lost on the kept connection, sent again on a new one
    assert len(connections) == 2
    connections.clear()
    path.unlink()
    with serving(path, first_answers_once), Client(path, timeout=30) as client:
        client.cancel("w1")
        with pytest.raises(ClientError) as lost:
            client.cancel("w1")
    assert lost.value.answer_lost
    assert len(connections) == 1


def test_a_connection_is_not_reused_past_the_servers_keep_alive_timeout(tmp_path: Path) -> None:
    """An answer saying ``Keep-Alive: timeout=1`` leaves nothing to reuse (a request must
    reach the server a margin before its idle close): each request opens a connection."""
    path = tmp_path / "s.sock"
    seen: list[int] = []
    handler = keeping("200 OK", b"[]", seen, ("keep-alive: timeout=1",))
    with serving(path, handler), Client(path, timeout=30) as client:
        assert [client.nodes() for _ in range(3)] == [[], [], []]
    assert seen == [1, 1, 1]
    seen.clear()
    path.unlink()
    handler = keeping("200 OK", b"[]", seen, ("keep-alive: timeout=600",))
    with serving(path, handler), Client(path, timeout=30) as client:
        assert [client.nodes() for _ in range(3)] == [[], [], []]
    assert seen == [3]
