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
    """A real Unix socket server at ``path`` calling ``handle`` on each connection until the
    block ends; yields an event set when it ends (a handler may wait on it)."""
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
