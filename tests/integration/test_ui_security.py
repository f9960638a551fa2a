"""The dashboard's doors at the HTTP level (a fresh-user trial of issue 15), against a real
``fgpu serve`` and a real ``fgpu ui``, with raw sockets where a client library would tidy the
path: no path walks out of ``/ui`` into the API (through ``fgpu ui`` or on the TCP
listener), the ``fgpu ui`` key works once and only for the user who ran it, and a long query
string is answered at once."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator

import pytest

from tests.localusers import ALICE, as_user, ensure_users
from tests.serverproc import FGPU, ServerProcess, sleeper, started_server

TOKEN = "ui-security-token-0123456789abcdef"
DEADLINE_S = 30.0
WALKS = [
    "/ui/../v1/workloads",
    "/ui/%2e%2e/v1/workloads",
    "/ui/%2E%2E/v1/workloads",
    "/ui/static/..%2f..%2fv1%2fworkloads",
    "/ui/workloads/..%2f..%2fv1%2fworkloads",
    "/ui/./../v1/workloads",
    "/ui/..\\v1\\workloads",
    "/ui/%5c..%5cv1/workloads",
    "/ui/../openapi.json",
    "/ui/../metrics",
    "/ui/%252e%252e/v1/workloads",
]


def raw_get(port: int, target: str, cookie: str | None = None) -> tuple[int, dict[str, str], str]:
    """``GET target`` sent byte for byte (no client-side path tidying); the status, headers
    (lower-case names) and body. Fails if no answer comes within :data:`DEADLINE_S`."""
    lines = [f"GET {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    if cookie:
        lines.append(f"Cookie: {cookie}")
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, text = line.partition(":")
        headers[name.strip().lower()] = text.strip()
    return int(status_line.split()[1]), headers, body.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ServerProcess, int]]:
    with started_server(
        "fgpu-uisec-",
        "1xA100-40GB",
        for_local_users=True,
        token=TOKEN,
        token_user="65534" if os.geteuid() == 0 else str(os.geteuid()),  # never root
    ) as proc:
        yield proc, proc.tcp_port


class Ui:
    """A running ``fgpu ui``: its port and the key its URL carries."""

    def __init__(self, proc: ServerProcess) -> None:
        self.process = subprocess.Popen(
            [*FGPU, "ui", "--socket", str(proc.socket)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=proc.env,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # blocks until it prints (or exits)
        found = re.search(r"http://127\.0\.0\.1:(\d+)(/ui\?key=\S+)", line)
        assert found, f"fgpu ui printed {line!r}"
        self.port, self.target = int(found.group(1)), found.group(2)

    def login(self) -> str:
        """Use the key; the session cookie (``name=value``) it is traded for."""
        status, headers, _ = raw_get(self.port, self.target)
        assert status == 303, status
        return headers["set-cookie"].split(";")[0]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


@pytest.fixture
def ui(server: tuple[ServerProcess, int]) -> Iterator[Ui]:
    started = Ui(server[0])
    try:
        yield started
    finally:
        started.stop()


def tcp_cookie(tcp: int) -> str:
    """Log in on the TCP listener with the token; the dashboard's session cookie."""
    with socket.create_connection(("127.0.0.1", tcp), timeout=DEADLINE_S) as conn:
        body = f"token={TOKEN}".encode()
        conn.sendall(
            b"POST /ui/login HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    found = re.search(rb"set-cookie: (fgpu_session=[0-9a-f]+)", data, re.IGNORECASE)
    assert found, data[:500]
    return found.group(1).decode()


def test_no_path_walks_out_of_the_dashboard(server: tuple[ServerProcess, int], ui: Ui) -> None:
    """Every walk is refused (400/404) by ``fgpu ui`` and by the TCP listener, and nothing
    of the API (a workload list, the OpenAPI schema, metrics, a log) comes back."""
    proc, tcp = server
    wid = proc.submit("-g", "0.25", "--name", "walked", command=sleeper(300))
    proc.wait_phase(wid, "running")
    cookie = ui.login()
    assert raw_get(ui.port, "/ui", cookie)[0] == 200  # the cookie works
    tcp_session = tcp_cookie(tcp)
    assert raw_get(tcp, "/ui", tcp_session)[0] == 200
    walks = [*WALKS, f"/ui/../v1/workloads/{wid}/logs", f"/ui/%2e%2e/v1/workloads/{wid}"]
    for port, jar in ((ui.port, cookie), (tcp, tcp_session)):
        for target in walks:
            status, _, body = raw_get(port, target, jar)
            assert status in (400, 404), (port, target, status, body[:200])
            # the refusal echoes the path; none of the API's content comes back
            for leaked in ("walked", '"openapi"', "# HELP", '"phase"'):
                assert leaked not in body, (target, leaked, body[:200])


def test_the_key_works_once_and_is_not_the_cookie(ui: Ui) -> None:
    cookie = ui.login()
    name, _, value = cookie.partition("=")
    assert value
    assert value not in ui.target
    assert raw_get(ui.port, "/ui", cookie)[0] == 200
    status, _, body = raw_get(ui.port, ui.target)  # the same URL again
    assert status == 403
    assert "already used" in body
    assert raw_get(ui.port, "/ui")[0] == 403  # neither key nor cookie
    assert raw_get(ui.port, "/ui", f"{name}=forged")[0] == 403


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as a second user")
def test_another_user_cannot_use_the_link(ui: Ui) -> None:
    """alice (not the user who ran ``fgpu ui``) gets 403 naming the reason, and her try does
    not spend the key: its owner still logs in with it."""
    ensure_users()
    script = (
        "import socket,sys\n"
        f"c=socket.create_connection(('127.0.0.1',{ui.port}),timeout={DEADLINE_S})\n"
        f"c.sendall(b'GET {ui.target} HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n')\n"
        "d=b''\n"
        "while (k:=c.recv(65536)): d+=k\n"
        "sys.stdout.write(d.decode('latin-1'))\n"
    )
    system_python = shutil.which("python3", path="/usr/bin:/bin")  # not root's own venv
    assert system_python, "no python3 in /usr/bin or /bin"
    answer = subprocess.run(
        [*as_user(ALICE), system_python, "-c", script],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=True,
        cwd="/",
    )
    assert answer.stdout.startswith("HTTP/1.1 403"), answer.stdout
    assert f"served to uid {os.geteuid()} only" in answer.stdout
    assert "set-cookie" not in answer.stdout.lower()
    assert ui.login()  # the owner's first use still works


def test_a_long_query_string_is_answered_at_once(server: tuple[ServerProcess, int], ui: Ui) -> None:
    """A 12 KB query string gets 414 on both doors, logged in or not (``raw_get`` fails on
    its socket timeout if no answer comes)."""
    proc, tcp = server
    wid = proc.submit("-g", "0.25", "--name", "long", command=sleeper(300))
    long = "x" * 12_000
    cookie = ui.login()
    session = tcp_cookie(tcp)
    targets = [f"/ui?x={long}", f"/ui/workloads/{wid}?x={long}"]
    targets += [f"/ui/fragment/overview?v={long}", f"/ui/fragment/workloads/{wid}?v={long}"]
    for port, jar in ((ui.port, cookie), (tcp, session), (tcp, None)):
        for target in targets:
            status, _, body = raw_get(port, target, jar)
            assert status == 414, (port, target[:40], status)
            assert "8192" in body
    assert raw_get(tcp, f"/ui?x={'x' * 100}", session)[0] == 200  # a short one is served


def test_a_workload_page_names_its_owner_and_an_unknown_id_gets_a_page(
    server: tuple[ServerProcess, int], ui: Ui
) -> None:
    """The owner is shown by user name; ``/ui/workloads/deadbeef`` is a 404 page of the
    dashboard, not the API's JSON."""
    proc, _ = server
    wid = proc.submit("-g", "0.25", "--name", "owned", command=sleeper(300))
    cookie = ui.login()
    status, _, body = raw_get(ui.port, f"/ui/workloads/{wid}", cookie)
    assert status == 200
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert f'<td class="owner">{me} (uid {os.geteuid()})</td>' in body
    status, headers, body = raw_get(ui.port, "/ui/workloads/deadbeef", cookie)
    assert status == 404
    assert headers["content-type"].startswith("text/html")
    assert 'id="missing"' in body
    assert "deadbeef" in body
    assert '"detail"' not in body
