"""fgpu.cli.loopback_peer: the owner of a real loopback connection's client socket, read
from /proc/net/tcp and tcp6 (Linux)."""

from __future__ import annotations

import os
import socket

import pytest

from fgpu import loopback_peer

pytestmark = pytest.mark.skipif(not loopback_peer.supported(), reason="no /proc/net/tcp")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_client_socket_of_a_connection_is_ours(host: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as server:
        try:
            server.bind((host, 0))
        except OSError:
            pytest.skip(f"no {host} here")
        server.listen(1)
        with socket.socket(family) as client:
            client.connect(server.getsockname()[:2])
            accepted, peer = server.accept()
            with accepted:
                local = accepted.getsockname()[:2]
                assert loopback_peer.peer_uids(peer[:2], local) == {os.geteuid()}
                # a pair no socket has matches nothing
                assert loopback_peer.peer_uids((host, 1), local) == set()


def test_the_table_addresses_decode() -> None:
    # /proc/net/tcp writes 127.0.0.1:8750 as 0100007F:222E (little-endian word, port big)
    assert loopback_peer._address("0100007F:222E") == (loopback_peer._normal("127.0.0.1"), 8750)
    mapped = "0000000000000000FFFF00000100007F:0050"
    assert loopback_peer._address(mapped) == (loopback_peer._normal("127.0.0.1"), 80)
    one = "00000000000000000000000001000000:0016"
    assert loopback_peer._address(one) == (loopback_peer._normal("::1"), 22)
