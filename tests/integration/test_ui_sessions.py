"""The dashboard's login on the TCP listener (issue 27, point 7), against a real
``fgpu serve``: wrong tokens from one client are limited (429 with Retry-After once
:data:`GUESS_FAILURES` failed, even for the right token, until the window has passed; the
client is the uid owning a local client's socket, :mod:`tests.integration.test_loopback_limits`
tells local users apart); the
session cookie says its lifetime (Max-Age) and carries its expiry, so an expired one (made
with the real token) is refused like no cookie."""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterator

import pytest

from fgpu.server.dashboard.sessions import (
    SESSION_LIFETIME_S,
    session_valid,
    session_value,
)
from fgpu.server.guesses import GUESS_FAILURES
from tests.serverproc import ServerProcess, started_server

TOKEN = "ui-sessions-token-0123456789abcdef"
DEADLINE_S = 30.0


def exchange(port: int, request: bytes) -> tuple[int, str]:
    """Send ``request`` byte for byte; the status and the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    text = data.decode("latin-1")
    return int(text.split(" ", 2)[1]), text


def login(port: int, token: str) -> tuple[int, str]:
    body = f"token={token}".encode()
    return exchange(
        port,
        b"POST /ui/login HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body,
    )


def overview(port: int, cookie: str) -> int:
    return exchange(
        port,
        f"GET /ui HTTP/1.1\r\nHost: x\r\nConnection: close\r\nCookie: {cookie}\r\n\r\n".encode(),
    )[0]


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    with started_server("fgpu-uisess-", "1xA100-40GB", token=TOKEN, token_user="65534") as s:
        yield s


def test_wrong_tokens_are_limited_per_client_then_even_the_right_one_waits(
    server: ServerProcess,
) -> None:
    port = server.tcp_port
    for _ in range(GUESS_FAILURES):
        assert login(port, "not-the-token")[0] == 401
    status, answer = login(port, TOKEN)
    assert status == 429, answer[:300]
    wait = int(re.search(r"(?im)^retry-after: (\d+)", answer).group(1))  # type: ignore[union-attr]
    assert wait > 0
    # this test runs as root: its connections are root's (the owner of its sockets)
    assert f"{GUESS_FAILURES} wrong tokens from uid {os.geteuid()}" in answer
    assert "set-cookie" not in answer.lower()


def test_a_session_says_its_lifetime_and_an_expired_one_is_refused(
    server: ServerProcess,
) -> None:
    port = server.tcp_port
    status, answer = login(port, TOKEN)
    assert status == 303, answer[:300]
    header = re.search(r"(?im)^set-cookie: (.*)$", answer).group(1)  # type: ignore[union-attr]
    assert f"Max-Age={SESSION_LIFETIME_S}" in header, header
    cookie = header.split(";")[0]
    assert overview(port, cookie) == 200
    value = cookie.split("=", 1)[1]
    assert session_valid(value, TOKEN.encode())
    # the same token, an expiry one second ago: refused as if there were no cookie
    expired = session_value(TOKEN.encode(), int(time.time()) - 1)
    assert overview(port, f"fgpu_session={expired}") == overview(port, "other=1") != 200
    # a cookie whose expiry was moved on by hand is refused too (the MAC covers it)
    forged = f"{int(time.time()) + 10**6:012x}" + value[12:]
    assert not session_valid(forged, TOKEN.encode())
    assert overview(port, f"fgpu_session={forged}") != 200
