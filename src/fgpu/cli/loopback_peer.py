"""Who is on the other end of a loopback TCP connection (Linux): the uid owning the
client's socket, read from ``/proc/net/tcp`` and ``/proc/net/tcp6`` as ``ss -tnpe`` does.

Each line of those tables is one socket: ``local_address`` and ``rem_address`` are
``HEX_IP:HEX_PORT`` (the address in the kernel's byte order: each 32-bit word little-endian
on the usual hosts; the port big-endian), and the 8th column is the owning uid (see
``proc(5)``, "/proc/net/tcp"). The client's socket of a connection that a server accepted on
``server`` from ``client`` is the line whose local end is ``client`` and remote end
``server``.
"""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(text: str) -> tuple[Address, int]:
    """``HEX_IP:HEX_PORT`` of a ``/proc/net/tcp*`` line as (address, port); an IPv4-mapped
    IPv6 address is given as its IPv4 address."""
    hex_ip, _, hex_port = text.partition(":")
    raw = bytes.fromhex(hex_ip)
    # each 32-bit word is in host byte order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if sys.byteorder == "big":
        words = raw
    address: Address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address, int(hex_port, 16)


def _normal(host: str) -> Address:
    address = ipaddress.ip_address(host.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def supported() -> bool:
    """Whether this system exposes the socket tables (Linux with ``/proc``)."""
    return TABLES[0].exists()


def peer_uids(client: tuple[str, int], server: tuple[str, int]) -> set[int]:
    """The uids owning a socket whose local end is ``client`` and remote end ``server``
    (``(host, port)`` as the server saw them); empty when none is found (the client already
    closed, or no ``/proc``). More than one uid means the answer cannot be trusted."""
    want_local = (_normal(client[0]), client[1])
    want_remote = (_normal(server[0]), server[1])
    found: set[int] = set()
    for table in TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 8:
                continue
            try:
                local, remote = _address(fields[1]), _address(fields[2])
                uid = int(fields[7])
            except ValueError:
                continue
            if local == want_local and remote == want_remote:
                found.add(uid)
    return found
