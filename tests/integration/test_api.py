"""The REST API served for real: uvicorn on a temporary Unix socket (and a TCP port with a
token), the real service on one simulated A100-40GB, HTTP through httpx and the typed client.

Covers identity from peer credentials, the token on TCP, the error body of every refusal
(``{"detail": {"field", "reason"}}``), the OpenAPI spec, log offsets, and the socket's
life: modes, stale files, a second server, removal on stop.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fgpu.client import Client, ClientError, ServerUnavailable
from fgpu.server.app import PEER_UID, create_app
from fgpu.server.peerconn import peer_uid
from fgpu.server.service import Service
from fgpu.server.uds import ApiServer, SocketInUse, parse_listen
from fgpu.wire import LOG_OFFSET_HEADER, SubmitRequest
from fgpu.wire_logs import FrameReader

TOKEN = "s3cret-token-for-tests"
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
TIMEOUT_S = 15.0


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class Running:
    socket: Path
    tcp: str
    root: Path
    server: ApiServer

    def unix(self) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://fgpu"
        )


@pytest.fixture(scope="module")
def short_dir() -> Iterator[Path]:
    """A short, world-traversable folder (socket paths are limited to 108 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="fgpu-api-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def running(short_dir: Path) -> Iterator[Running]:
    """The real service and API in a thread, on ``short_dir/run/fgpu.sock`` and TCP."""
    path = short_dir / "run" / "fgpu.sock"
    service = Service.create(
        db=str(short_dir / "fgpu.db"),
        simulate_gpus="1xA100-40GB",
        state_dir=short_dir / "state",
    )
    server = ApiServer(path, ("127.0.0.1", 0), log_level="warning")
    server.bind()
    tcp = server.tcp_address
    assert tcp is not None
    thread = threading.Thread(target=server.run, args=(create_app(service, token=TOKEN),))
    thread.start()
    assert server.started.wait(TIMEOUT_S), "the server did not start"
    yield Running(path, f"http://{tcp[0]}:{tcp[1]}", short_dir, server)
    with Client(path) as client:
        for view in client.list_workloads():
            client.cancel(view.id)
    server.stop()
    thread.join(TIMEOUT_S)
    assert not thread.is_alive()


# ------------------------------------------------------------------------- identity
def test_the_caller_is_identified_by_peer_credentials(running: Running) -> None:
    with running.unix() as http:
        answer = http.get("/v1/healthz")
    assert answer.status_code == 200
    assert answer.json()["caller_uid"] == os.getuid()
    assert answer.json()["server_uid"] == os.geteuid()


def test_a_submission_is_owned_by_the_peer(running: Running) -> None:
    with Client(running.socket) as client:
        view = client.submit(SubmitRequest(command=["true"], gpu="0.1", cwd="/"))
    assert view.owner_uid == os.getuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_users_uid_comes_through_the_socket(running: Running) -> None:
    script = (
        "from fgpu.client import Client; import sys; "
        f"print(Client({str(running.socket)!r}).health().caller_uid)"
    )
    result = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={**os.environ, "HOME": "/"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "65534"


def test_peer_uid_is_none_for_tcp_sockets() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        assert peer_uid(sock) is None
    assert peer_uid(None) is None


# ---------------------------------------------------------------------------- TCP
@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "a bearer token is required"),
        ({"authorization": "Bearer wrong"}, "wrong token"),
        ({"authorization": f"Basic {TOKEN}"}, "a bearer token is required"),
        ({"authorization": f"Bearer {TOKEN}x"}, "wrong token"),
    ],
    ids=["none", "wrong", "not-bearer", "longer"],
)
def test_tcp_without_the_right_token_is_401(
    running: Running, headers: dict[str, str], reason: str
) -> None:
    answer = httpx.get(f"{running.tcp}/v1/workloads", headers=headers)
    assert answer.status_code == 401
    assert answer.json() == {"detail": {"field": "authorization", "reason": reason}}
    assert answer.headers["www-authenticate"] == "Bearer"


def test_tcp_with_the_token_acts_as_the_server_user(running: Running) -> None:
    answer = httpx.get(f"{running.tcp}/v1/workloads", headers={"authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200
    with Client(base_url=running.tcp, token=TOKEN) as client:
        view = client.submit(SubmitRequest(command=["true"], gpu="0.1", cwd="/"))
        assert view.owner_uid == os.geteuid()
        assert client.health().caller_uid is None


class BrokenService:
    """Only what the two tests below reach: no peer credentials, and a bug in nodes()."""

    admins: frozenset[int] = frozenset()

    def nodes(self) -> list[object]:
        raise RuntimeError("a bug")

    def list_queues(self) -> list[object]:
        return []


def call_in_process(
    path: str,
    token: str | None,
    headers: dict[str, str],
    *,
    peer_uid: int | None = None,
    server_uid: int | None = None,
) -> httpx.Response:
    app = create_app(BrokenService(), token=token, server_uid=server_uid)  # type: ignore[arg-type]

    async def with_peer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if peer_uid is not None:
            scope = {**scope, PEER_UID: peer_uid}  # what the Unix socket protocol adds
        await app(scope, receive, send)

    transport = httpx.ASGITransport(app=with_peer, raise_app_exceptions=False)

    async def call() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
            return await http.get(path, headers=headers)

    return asyncio.run(call())


def test_a_server_without_a_token_refuses_callers_without_peer_credentials() -> None:
    answer = call_in_process("/v1/nodes", None, {"authorization": "Bearer anything"})
    assert answer.status_code == 401
    assert answer.json()["detail"]["reason"] == "this server answers only on its Unix socket"


@pytest.mark.parametrize(
    ("peer", "status"),
    [(1000, 200), (0, 200), (1001, 403), (65534, 403)],
    ids=["itself", "root", "another-user", "nobody"],
)
def test_a_server_not_run_by_root_serves_only_its_own_user(peer: int, status: int) -> None:
    """Its workloads run as its own user: serving others would run their commands as it."""
    answer = call_in_process("/v1/queues", None, {}, peer_uid=peer, server_uid=1000)
    assert answer.status_code == status
    if status == 403:
        assert answer.json()["detail"] == {
            "field": "caller",
            "reason": f"this server runs as uid 1000 and serves only that user (uid {peer} "
            "asked); run fgpu serve as root to share a machine",
        }


def test_a_root_server_serves_every_user() -> None:
    answer = call_in_process("/v1/queues", None, {}, peer_uid=1001, server_uid=0)
    assert answer.status_code == 200


def test_a_bug_is_a_500_with_the_same_shape() -> None:
    answer = call_in_process("/v1/nodes", "t", {"authorization": "Bearer t"})
    assert answer.status_code == 500
    assert answer.json() == {
        "detail": {"field": "", "reason": "internal error (RuntimeError); see the server log"}
    }


def test_only_healthz_answers_on_tcp_without_the_token(running: Running) -> None:
    assert httpx.get(f"{running.tcp}/v1/healthz").status_code == 200
    for path in ("/openapi.json", "/docs", "/v1/nodes", "/redoc"):
        answer = httpx.get(f"{running.tcp}{path}")
        assert answer.status_code in (401, 404), (path, answer.status_code)
        assert answer.status_code == 401 or path == "/redoc"
    bearer = {"authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{running.tcp}/docs", headers=bearer).status_code == 200
    with running.unix() as http:  # the Unix socket knows its caller: no token
        assert http.get("/openapi.json").status_code == 200
    spec = httpx.get(f"{running.tcp}/openapi.json", headers=bearer).json()
    assert spec["info"]["title"] == "fgpu"
    for path in (
        "/v1/workloads",
        "/v1/workloads/{workload_id}",
        "/v1/workloads/{workload_id}/cancel",
        "/v1/workloads/{workload_id}/logs",
        "/v1/queues",
        "/v1/queues/{name}",
        "/v1/nodes",
        "/v1/events",
        "/v1/healthz",
    ):
        assert path in spec["paths"], path
    refusal = spec["paths"]["/v1/workloads"]["post"]["responses"]["422"]
    assert refusal["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")


# ------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (b'{"command": ["true"', "body", "malformed JSON"),
        (b"not json", "body", "malformed JSON"),
        (b'{"command": "true"}', "command", "valid list"),
        (b'{"command": ["true"], "grace_s": "soon"}', "grace_s", "valid number"),
        (b'{"command": ["true"], "gpus": "0.5"}', "gpus", "Extra inputs are not permitted"),
        (b'{"command": [1]}', "command.0", "valid string"),
        (b"{}", "command", "Field required"),
        (b'{"command": ["true"], "gpu": "0"}', "gpu", ""),
        (b'{"command": ["true"], "queue": "nope"}', "queue", "unknown queue"),
        (b'{"command": []}', "command", "give a command"),
    ],
    ids=[
        "truncated-json",
        "not-json",
        "command-not-a-list",
        "grace-not-a-number",
        "unknown-field",
        "argument-not-a-string",
        "missing-command",
        "fraction-zero",
        "unknown-queue",
        "empty-command",
    ],
)
def test_bad_submissions_are_422_with_field_and_reason(
    running: Running, body: bytes, field: str, reason: str
) -> None:
    with running.unix() as http:
        before = http.get("/v1/workloads", params={"all": "true"}).json()
        answer = http.post(
            "/v1/workloads", content=body, headers={"content-type": "application/json"}
        )
        after = http.get("/v1/workloads", params={"all": "true"}).json()
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert set(detail) == {"field", "reason"}
    assert detail["field"] == field
    assert reason in detail["reason"]
    assert detail["reason"]
    assert len(after) == len(before), "a refused submission was stored"


@pytest.mark.parametrize(
    ("method", "path", "status", "field"),
    [
        ("GET", "/v1/workloads/nope", 404, "id"),
        ("POST", "/v1/workloads/nope/cancel", 404, "id"),
        ("GET", "/v1/workloads/nope/logs", 404, "id"),
        ("GET", "/v1/workloads/x/logs?stream=both", 422, "stream"),
        ("GET", "/v1/workloads/x/logs?offset=-1", 422, "offset"),
        ("GET", "/v1/events?after=abc", 422, "after"),
        ("DELETE", "/v1/queues/nope", 404, "name"),
        ("GET", "/v1/nothing-here", 404, "path"),
        ("DELETE", "/v1/nodes", 405, "method"),
    ],
    ids=[
        "unknown-workload",
        "cancel-unknown",
        "logs-unknown",
        "bad-stream",
        "negative-offset",
        "bad-after",
        "unknown-queue",
        "unknown-route",
        "wrong-method",
    ],
)
def test_refusals_have_the_same_shape(
    running: Running, method: str, path: str, status: int, field: str
) -> None:
    with running.unix() as http:
        answer = http.request(method, path)
    assert answer.status_code == status, answer.text
    assert answer.json()["detail"]["field"] == field
    assert answer.json()["detail"]["reason"]


def test_put_queue_with_another_name_in_the_body_is_422(running: Running) -> None:
    with running.unix() as http:
        answer = http.put("/v1/queues/default", json={"name": "other", "quota": 1})
    assert answer.status_code == 422
    assert answer.json()["detail"]["field"] == "name"


def test_client_raises_client_error_with_the_servers_field(running: Running) -> None:
    with Client(running.socket) as client, pytest.raises(ClientError) as caught:
        client.get_workload("nope")
    assert (caught.value.status, caught.value.field) == (404, "id")
    assert "nope" in caught.value.reason


def test_client_says_how_to_start_a_server_when_none_answers(short_dir: Path) -> None:
    missing = short_dir / "none" / "fgpu.sock"
    with Client(missing) as client, pytest.raises(ServerUnavailable) as caught:
        client.nodes()
    assert str(caught.value) == f"no fgpu server at {missing}; start one with `fgpu serve`"


# ----------------------------------------------------------------------------- logs
def test_logs_are_read_from_an_offset(running: Running) -> None:
    with Client(running.socket) as client:
        view = client.submit(
            SubmitRequest(
                command=["printf 'hello\\nworld\\n'; echo oops >&2"], shell=True, gpu="0.1"
            )
        )
        wait_for(lambda: client.get_workload(view.id).phase == "succeeded", "the job to end")
        both, end = client.logs(view.id, "all")
        assert [(c.stream, c.data) for c in FrameReader().feed(both)] == [
            ("stdout", b"hello\nworld\n"),
            ("stderr", b"oops\n"),
        ]
        assert client.logs(view.id, "all", offset=end) == (b"", end)
        # one stream is read back from that log: its offset is a cursor the answers give
        out, cursor = client.logs(view.id)
        assert out == b"hello\nworld\n"
        assert client.logs(view.id, offset=cursor) == (b"", cursor)
        assert client.logs(view.id, "stderr")[0] == b"oops\n"
    with running.unix() as http:
        pieces, cursor = [], 0
        while True:
            answer = http.get(
                f"/v1/workloads/{view.id}/logs", params={"offset": cursor, "limit": 5}
            )
            assert answer.headers["content-type"] == "application/octet-stream"
            if not answer.content:
                break
            pieces.append(answer.content)
            cursor = int(answer.headers[LOG_OFFSET_HEADER])
    assert pieces == [b"hello", b"\nworl", b"d\n"]


# --------------------------------------------------------------------------- socket
def test_the_socket_is_world_writable_as_root_else_private(running: Running) -> None:
    """A root server serves every local user; another user's server only that user."""
    expected = 0o666 if os.geteuid() == 0 else 0o600
    assert stat.S_IMODE(running.socket.stat().st_mode) == expected
    assert stat.S_ISSOCK(running.socket.stat().st_mode)
    assert stat.S_IMODE(running.socket.parent.stat().st_mode) == 0o755


def test_a_second_server_on_the_same_socket_is_refused(running: Running) -> None:
    with pytest.raises(SocketInUse, match="another fgpu server"):
        ApiServer(running.socket).bind()
    assert running.socket.exists(), "the refused server removed the running one's socket"


def test_a_socket_another_program_answers_on_is_not_taken(short_dir: Path) -> None:
    path = short_dir / "other" / "app.sock"
    path.parent.mkdir()
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(path))
        other.listen()
        with pytest.raises(SocketInUse, match="another server answers"):
            ApiServer(path).bind()
    assert not (path.parent / ".app.sock.lock").exists()


def test_a_stale_socket_is_replaced_and_removed_on_release(short_dir: Path) -> None:
    path = short_dir / "stale" / "fgpu.sock"
    path.parent.mkdir()
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(path))  # bound, never listening, closed: what a killed server leaves
    server = ApiServer(path)
    server.bind()
    assert stat.S_IMODE(path.stat().st_mode) == (0o666 if os.geteuid() == 0 else 0o600)
    server.release()
    assert not path.exists()
    assert list(path.parent.iterdir()) == []


def test_a_file_that_is_not_a_socket_is_not_replaced(short_dir: Path) -> None:
    path = short_dir / "file" / "fgpu.sock"
    path.parent.mkdir()
    path.write_text("keep me")
    with pytest.raises(SocketInUse, match="not a socket"):
        ApiServer(path).bind()
    assert path.read_text() == "keep me"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:8750", ("127.0.0.1", 8750)), ("[::1]:80", ("::1", 80)), ("h:0", ("h", 0))],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["8750", ":8750", "host:", "host:http", "host:70000"])
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=repr(text)):
        parse_listen(text)


# ----------------------------------------------------------------------- body size
def test_a_body_above_the_limit_is_413_before_it_is_read(running: Running) -> None:
    huge = b'{"command": ["true"], "env": {"X": "' + b"x" * (5 * 1024 * 1024) + b'"}}'
    expected = {
        "detail": {"field": "body", "reason": "the request body is larger than 4194304 bytes"}
    }
    with running.unix() as http:
        declared = http.post(
            "/v1/workloads", content=huge, headers={"content-type": "application/json"}
        )

        def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
            for start in range(0, len(huge), 65536):
                yield huge[start : start + 65536]

        streamed = http.post(
            "/v1/workloads", content=chunks(), headers={"content-type": "application/json"}
        )
        after = http.get("/v1/workloads")
    assert (declared.status_code, declared.json()) == (413, expected)
    assert (streamed.status_code, streamed.json()) == (413, expected)
    assert after.status_code == 200  # the server is fine
    assert all(w["command"] != ["true"] or "X" not in w.get("env", {}) for w in after.json())
