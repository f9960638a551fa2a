"""Idempotent submissions (issue 27, point 5): a submission whose answer was lost, retried
with the same ``Idempotency-Key``, creates one workload; keys are per user.

A real ``fgpu serve`` (root) on its Unix socket. The clients are real: raw HTTP from the
system Python (as root, and as the test users alice and bob), and the ``fgpu`` command line
through a proxy socket that forwards the first submission to the server, reads the server's
whole answer (so the workload surely exists) and then closes the client's connection without
passing the answer on: the command line must retry with the same key and print the workload
the first try created.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.localusers import ALICE, BOB, as_user, ensure_users, uid_of
from tests.serverproc import ServerProcess, started_server

RAW_POST = r"""
import http.client, json, socket, sys
path, key, body, mode = sys.argv[1:5]
class Conn(http.client.HTTPConnection):
    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        self.sock = s
c = Conn("fgpu", timeout=60)
data = body.encode()
c.putrequest("POST", "/v1/workloads")
c.putheader("content-type", "application/json")
c.putheader("content-length", str(len(data)))
for one in key.split("|") if key else []:  # "a|b": the header twice
    c.putheader("Idempotency-Key", one)
c.endheaders(data)
if mode == "drop":  # the answer is lost: the connection closes before it is read
    c.sock.close()
    print(json.dumps({"status": 0}))
else:
    r = c.getresponse()
    print(json.dumps({"status": r.status, "body": json.loads(r.read())}))
"""
"""POST a submission with the standard library only (other users cannot reach this venv)."""

SLEEP = ["/bin/sleep", "300"]


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    with started_server("fgpu-idem-", "1xA100-40GB", for_local_users=True) as proc:
        yield proc


def post(
    server: ServerProcess, key: str, body: dict[str, Any], *, user: str | None = None,
    mode: str = "read",
) -> dict[str, Any]:  # fmt: skip
    prefix = list(as_user(user)) if user is not None else []
    result = subprocess.run(
        [*prefix, "/usr/bin/python3", "-c", RAW_POST, str(server.socket), key,
         json.dumps(body), mode],
        capture_output=True, text=True, timeout=90, cwd="/", check=True,
    )  # fmt: skip
    return dict(json.loads(result.stdout))


def named(server: ServerProcess, name: str) -> list[dict[str, Any]]:
    return [w for w in server.workloads().values() if w["name"] == name]


def test_a_retry_after_a_lost_answer_gets_the_first_workload(server: ServerProcess) -> None:
    body = {"command": SLEEP, "gpu": "0.25", "name": "once", "grace_s": 1}
    first = post(server, "key-1", body)  # answered, but say the client never saw it
    assert first["status"] == 201
    again = post(server, "key-1", body)
    assert again["status"] == 201
    assert again["body"]["id"] == first["body"]["id"]
    assert [w["id"] for w in named(server, "once")] == [first["body"]["id"]]

    # the connection closed before the answer was read: stored once, whatever the timing
    dropped = {**body, "name": "dropped"}
    post(server, "key-2", dropped, mode="drop")
    retry = post(server, "key-2", dropped)
    assert retry["status"] == 201
    assert [w["id"] for w in named(server, "dropped")] == [retry["body"]["id"]]


def test_the_same_key_with_another_body_is_refused_naming_the_header(
    server: ServerProcess,
) -> None:
    body = {"command": SLEEP, "gpu": "0.25", "name": "first", "grace_s": 1}
    assert post(server, "key-x", body)["status"] == 201
    other = post(server, "key-x", {**body, "gpu": "0.5"})
    assert other["status"] == 422
    assert other["body"]["detail"]["field"] == "Idempotency-Key"
    assert "key-x" in other["body"]["detail"]["reason"]
    assert len(named(server, "first")) == 1

    twice = post(server, "key-a|key-b", {**body, "name": "twice"})
    assert twice["status"] == 422  # which one would a retry send?
    assert twice["body"]["detail"]["field"] == "Idempotency-Key"
    assert "given 2 times ('key-a', 'key-b')" in twice["body"]["detail"]["reason"]
    assert named(server, "twice") == []

    bad = post(server, "not a key", {**body, "name": "spaced"})
    assert bad["status"] == 422
    assert bad["body"]["detail"]["field"] == "Idempotency-Key"
    assert "'not a key'" in bad["body"]["detail"]["reason"]
    assert named(server, "spaced") == []


def test_two_users_with_the_same_key_each_get_their_own_workload(
    server: ServerProcess,
) -> None:
    ensure_users()
    body = {"command": SLEEP, "gpu": "0.25", "name": "shared-key", "grace_s": 1}
    alice = post(server, "the-same-key", body, user=ALICE)
    bob = post(server, "the-same-key", body, user=BOB)
    assert (alice["status"], bob["status"]) == (201, 201)
    assert alice["body"]["id"] != bob["body"]["id"]
    owners = {w["id"]: w["owner_uid"] for w in named(server, "shared-key")}
    assert owners == {alice["body"]["id"]: uid_of(ALICE), bob["body"]["id"]: uid_of(BOB)}
    # and each one's retry finds their own
    assert post(server, "the-same-key", body, user=BOB)["body"]["id"] == bob["body"]["id"]


class DroppingProxy:
    """A Unix socket that forwards each HTTP request to ``target`` and relays the answer,
    except the first answer: that one it reads whole from the server and then closes the
    client's connection without sending it."""

    def __init__(self, path: Path, target: Path) -> None:
        self.path = path
        self.target = target
        self.requests: list[bytes] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with client:
                request = read_message(client)
                self.requests.append(request)
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
                    upstream.connect(str(self.target))
                    upstream.sendall(request)
                    answer = read_message(upstream)
                if len(self.requests) > 1:
                    client.sendall(answer)

    def close(self) -> None:
        self.listener.close()
        self.thread.join(10)


def read_message(sock: socket.socket) -> bytes:
    """One HTTP/1.1 message (head and a Content-Length body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_the_command_line_retries_a_lost_answer_with_the_same_key(
    server: ServerProcess,
) -> None:
    proxy = DroppingProxy(server.root / "proxy.sock", server.socket)
    try:
        result = server.cli(
            "submit", "-g", "0.25", "--name", "via-proxy", "--grace", "1", "--json", "--",
            *SLEEP, env_extra={"FGPU_SOCKET": str(proxy.path)},
        )  # fmt: skip
    finally:
        proxy.close()
    shown = json.loads(result.stdout)
    assert [w["id"] for w in named(server, "via-proxy")] == [shown["id"]]
    keys = [
        line.split(b":", 1)[1].strip()
        for request in proxy.requests
        for line in request.split(b"\r\n")
        if line.lower().startswith(b"idempotency-key:")
    ]
    assert len(proxy.requests) == 2
    assert len(keys) == 2
    assert keys[0] == keys[1]  # one UUID, sent twice
    assert len(keys[0]) == 36


def test_a_submission_without_a_key_is_stored_each_time(server: ServerProcess) -> None:
    body = {"command": SLEEP, "gpu": "0.25", "grace_s": 1}
    ids = {post(server, "", body)["body"]["id"] for _ in range(2)}
    assert len(ids) == 2


@pytest.mark.parametrize("name", ["once", None])
def test_the_same_key_twice_at_once_stores_one_workload(tmp_path: Path, name: str | None) -> None:
    """Two submissions with one key, both under way before either is stored (a barrier
    holds each at the start until the other arrives): the second is refused (its name taken
    by the first's workload; or, with names of their own, the store refusing its claim of
    the key, nothing written) and answered with the first's workload; one is stored."""
    from fgpu.server.service import Caller, Service
    from fgpu.wire import SubmitRequest

    svc = Service.create(simulate_gpus="1xA100-40GB", state_dir=tmp_path, db=str(tmp_path / "f.db"))
    try:
        me = Caller(0, admin=True)
        both_started = threading.Barrier(2, timeout=60)
        store_it = svc._submit_new

        def start_then_wait(*args: Any) -> Any:
            both_started.wait()
            return store_it(*args)

        svc._submit_new = start_then_wait  # type: ignore[method-assign]
        body = SubmitRequest(command=SLEEP, gpu="0.5", name=name)
        answers: list[str] = []
        errors: list[BaseException] = []

        def submit() -> None:
            try:
                answers.append(svc.submit(me, body, idempotency_key="k-twice").id)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=submit) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        assert len(answers) == 2, answers
        assert answers[0] == answers[1], answers
        stored = svc.list_workloads(include_done=True)
        assert [w.id for w in stored] == [answers[0]]
    finally:
        svc.store.close()


def test_a_retry_is_answered_with_its_workload_where_a_new_submission_is_refused(
    tmp_path: Path,
) -> None:
    """The key is looked up only when a submission is refused: a retry whose first attempt
    took the caller's last active slot (or its name) still gets that workload back, and
    the same key with another body is refused for the key, not for the limit."""
    from fgpu.rules.errors import BadRequest
    from fgpu.server.quotas import LimitReached, SubmissionLimits
    from fgpu.server.service import Caller, Service
    from fgpu.wire import SubmitRequest

    svc = Service.create(simulate_gpus="1xA100-40GB", state_dir=tmp_path, db=str(tmp_path / "f.db"))
    try:
        svc.submission_limits = SubmissionLimits(max_active=1)
        me = Caller(os.getuid(), admin=False)
        named = SubmitRequest(command=SLEEP, gpu="0.5", name="only")
        first = svc.submit(me, named, idempotency_key="k-1").id
        assert svc.submit(me, named, idempotency_key="k-1").id == first  # name and limit
        with pytest.raises(LimitReached):
            svc.submit(me, SubmitRequest(command=SLEEP, gpu="0.5"), idempotency_key="k-2")
        with pytest.raises(BadRequest) as caught:
            svc.submit(me, SubmitRequest(command=SLEEP, gpu="0.25"), idempotency_key="k-1")
        assert caught.value.field == "Idempotency-Key"
        assert first in caught.value.reason
        assert [w.id for w in svc.list_workloads(include_done=True)] == [first]
    finally:
        svc.store.close()
