"""The owner of a loopback connection's client socket (issue 27, point 1), with real local
users: alice and bob each connect to a listener of the test over ``127.0.0.1``, ``::1`` and
``::`` taking IPv4 (``::ffff:127.0.0.1``);
sock_diag and the socket tables (``/proc/net/tcp*``) both name each one's uid, and a client
that already closed its socket is nobody (not root, as the kernel's uid 0 for a socket
no process holds would say)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fgpu import loopback_peer
from fgpu.loopback_peer import OwnerLookup
from tests.localusers import ALICE, BOB, as_user, ensure_users, uid_of

pytestmark = pytest.mark.skipif(not loopback_peer.supported(), reason="no /proc/net/tcp")

DEADLINE_S = 30.0

CLIENT = r"""
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
s = socket.socket(family)
s.connect((host, port))
print(s.getsockname()[1], flush=True)
sys.stdin.read()  # held until the test closes our stdin
"""


@pytest.fixture(scope="module")
def users() -> None:
    ensure_users()


@pytest.fixture(params=["127.0.0.1", "::1", "::"])
def listener(request: pytest.FixtureRequest) -> Iterator[socket.socket]:
    """A listening socket on ``127.0.0.1``, ``::1``, or ``::`` taking IPv4 too (its
    clients connect to ``127.0.0.1`` and are seen as ``::ffff:127.0.0.1``)."""
    host = request.param
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as server:
        try:
            if host == "::":
                server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            server.bind((host, 0))
        except OSError:
            pytest.skip(f"no {host} here")
        server.listen(8)
        server.settimeout(DEADLINE_S)
        yield server


def connect_as(user: str, server: socket.socket) -> subprocess.Popen[str]:
    host, port = server.getsockname()[:2]
    host = "127.0.0.1" if host == "::" else host
    return subprocess.Popen(
        [*as_user(user), sys.executable, "-c", CLIENT, host, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )


def test_alice_and_bob_are_told_apart_on_loopback(users: None, listener: socket.socket) -> None:
    clients = {user: connect_as(user, listener) for user in (ALICE, BOB)}
    accepted: list[socket.socket] = []
    try:
        ports = {}
        for user, process in clients.items():
            assert process.stdout is not None
            ports[int(process.stdout.readline())] = user
        found: dict[str, tuple[int | None, int | None, set[int]]] = {}
        for _ in clients:
            conn, peer = listener.accept()
            accepted.append(conn)
            local = conn.getsockname()[:2]
            user = ports[peer[1]]
            tables = OwnerLookup()
            tables.sock_diag = False  # as where the kernel has no sock_diag for TCP
            found[user] = (
                OwnerLookup().owner_uid(peer[:2], local),
                tables.owner_uid(peer[:2], local),
                loopback_peer.peer_uids(peer[:2], local),
            )
        assert found == {
            ALICE: (uid_of(ALICE), uid_of(ALICE), {uid_of(ALICE)}),
            BOB: (uid_of(BOB), uid_of(BOB), {uid_of(BOB)}),
        }
    finally:
        for process in clients.values():
            assert process.stdin is not None
            process.stdin.close()
            process.wait(DEADLINE_S)
        for conn in accepted:
            conn.close()


def test_a_client_that_closed_its_socket_is_nobody(users: None, listener: socket.socket) -> None:
    process = connect_as(BOB, listener)
    assert process.stdout is not None
    assert process.stdin is not None
    process.stdout.readline()
    conn, peer = listener.accept()
    with conn:
        local = conn.getsockname()[:2]
        assert OwnerLookup().owner_uid(peer[:2], local) == uid_of(BOB)
        process.stdin.close()
        assert process.wait(DEADLINE_S) == 0
        # bob's socket is closed (the kernel may keep it, no longer held, with uid 0)
        assert conn.recv(1) == b""
        tables = OwnerLookup()
        tables.sock_diag = False
        assert OwnerLookup().owner_uid(peer[:2], local) is None
        assert tables.owner_uid(peer[:2], local) is None
        assert loopback_peer.peer_uids(peer[:2], local) == set()
        # our own end is still ours
        assert OwnerLookup().owner_uid(local, peer[:2]) == os.geteuid()
