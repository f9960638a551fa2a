"""Who is on the other end of a TCP connection made on this machine (Linux): the uid owning
the client's socket.

Two sources, the same answer:

- **sock_diag** (``NETLINK_SOCK_DIAG``, ``SOCK_DIAG_BY_FAMILY`` with an exact
  ``inet_diag_req_v2``; Linux ``sock_diag(7)``, ``linux/inet_diag.h``): the kernel looks the
  one socket up by its address pair in its connection hash, about 15 µs whatever the number
  of sockets. This is what :meth:`OwnerLookup.owner_uid` asks first.
- **the socket tables** ``/proc/net/tcp`` and ``/proc/net/tcp6`` (``proc(5)``, as ``ss``
  without netlink reads them): one line per socket, ``local_address`` and ``rem_address``
  written ``HEX_IP:HEX_PORT`` (the address as the kernel stores it, each 32-bit word printed
  as a host-order integer, so ``127.0.0.1`` is ``0100007F`` on a little-endian host; the port
  printed as a number, so big-endian digits), the 8th column the owning uid, the 10th the
  inode (0 once no process holds the socket). Reading them costs time in proportion to all
  the sockets of the machine (``bench/loopback_owner.py``: 216 ms a lookup with 16,000
  loopback sockets open, against 13 µs by sock_diag, on 2 busy cores), so
  :meth:`OwnerLookup.owner_uid` reads them only where the kernel has no sock_diag for TCP.

The client's socket of a connection that a server accepted on ``server`` from ``client`` is
the one whose local end is ``client`` and remote end ``server``. Only a socket that a
process still holds open counts (inode not 0): a client that closed at once leaves a
``TIME_WAIT`` or orphaned socket that the kernel reports as uid 0, which must not be taken
for root.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import sys
from pathlib import Path

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

NETLINK_SOCK_DIAG = 4
"""``linux/netlink.h``."""
SOCK_DIAG_BY_FAMILY = 20
"""``linux/sock_diag.h``: the request type of an ``inet_diag_req_v2``."""
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 1
_NO_COOKIE = 0xFFFFFFFF
"""``INET_DIAG_NOCOOKIE``: look the socket up by its addresses alone."""
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQ = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_SOCKID_PORTS = struct.Struct("!HH")  # sport, dport: network order
_SOCKID_TAIL = struct.Struct("=III")  # interface, cookie[2]
_MSG_UID = struct.Struct("=II")  # inet_diag_msg: uid, inode at offset 64
_MSG_UID_AT = 64


def _address(text: str) -> tuple[Address, int]:
    """``HEX_IP:HEX_PORT`` of a ``/proc/net/tcp*`` line as (address, port); an IPv4-mapped
    IPv6 address is given as its IPv4 address."""
    hex_ip, _, hex_port = text.partition(":")
    raw = bytes.fromhex(hex_ip)
    # each 32-bit word is printed as a host-order integer
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


def is_local_peer(client_host: str, server_host: str) -> bool:
    """Whether a connection from ``client_host`` to ``server_host`` (as the server saw
    them) comes from this machine: a loopback client address, or the server's own address
    (a local client connecting to one of this host's addresses gets it as its source).
    False for text that is not an IP address."""
    try:
        client, server = _normal(client_host), _normal(server_host)
    except ValueError:
        return False
    return client.is_loopback or client == server


def peer_uids(client: tuple[str, int], server: tuple[str, int]) -> set[int]:
    """From the socket tables: the uids owning an open socket whose local end is ``client``
    and remote end ``server`` (``(host, port)`` as the server saw them); empty when none is
    found (the client already closed, or no ``/proc``). More than one uid means the answer
    cannot be trusted."""
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
            if len(fields) < 10:
                continue
            try:
                local, remote = _address(fields[1]), _address(fields[2])
                uid, inode = int(fields[7]), int(fields[9])
            except ValueError:
                continue
            if local == want_local and remote == want_remote and inode != 0:
                found.add(uid)
    return found


def _diag_request(client: Address, cport: int, server: Address, sport: int, ifindex: int) -> bytes:
    family = socket.AF_INET if client.version == 4 else socket.AF_INET6
    body = (
        _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF)
        + _SOCKID_PORTS.pack(cport, sport)
        + client.packed.ljust(16, b"\0")
        + server.packed.ljust(16, b"\0")
        + _SOCKID_TAIL.pack(ifindex, _NO_COOKIE, _NO_COOKIE)
    )
    return (
        _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + body
    )


class _NoSockDiag(Exception):
    """The kernel gives no sock_diag answers for TCP here."""


def _diag_uid(client: tuple[str, int], server: tuple[str, int], ifindex: int = 0) -> int | None:
    """sock_diag's owner of the open socket ``client`` -> ``server``; None when there is
    none. Raises :class:`_NoSockDiag` when netlink cannot be asked."""
    caddr, saddr = _normal(client[0]), _normal(server[0])
    if caddr.version != saddr.version:
        return None
    request = _diag_request(caddr, client[1], saddr, server[1], ifindex)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as link:
            link.settimeout(1.0)
            link.send(request)
            answer = link.recv(8192)
    except OSError as exc:
        raise _NoSockDiag(str(exc)) from None
    if len(answer) < _NLMSGHDR.size + 4:
        raise _NoSockDiag(f"a short netlink answer ({len(answer)} bytes)")
    kind = _NLMSGHDR.unpack_from(answer)[1]
    if kind == _NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", answer, _NLMSGHDR.size)
        if -code == errno.ENOENT:
            return None
        raise _NoSockDiag(f"netlink error {-code} ({errno.errorcode.get(-code, '?')})")
    if kind != SOCK_DIAG_BY_FAMILY or len(answer) < _NLMSGHDR.size + _MSG_UID_AT + 8:
        raise _NoSockDiag(f"an unexpected netlink answer (type {kind})")
    uid, inode = _MSG_UID.unpack_from(answer, _NLMSGHDR.size + _MSG_UID_AT)
    return uid if inode != 0 else None


class OwnerLookup:
    """Finds the uid owning the client end of a local TCP connection (see the module
    docstring); one per process, it remembers whether sock_diag answers here.

    sock_diag answers "no such socket" (``ENOENT``) the same way whether the socket is gone
    or the kernel lacks TCP's diag module; so until a lookup has found a socket, a miss is
    checked once against the server's own end of the connection (which exists for sure):
    when sock_diag cannot see that either, the tables are read from then on.
    """

    def __init__(self) -> None:
        self.sock_diag: bool | None = None
        """True once sock_diag found a socket; False when it cannot be used here."""

    def owner_uid(
        self, client: tuple[str, int], server: tuple[str, int], ifindex: int = 0
    ) -> int | None:
        """The uid owning the open socket whose local end is ``client`` and remote end
        ``server`` (``(host, port)`` as the server saw them; ``ifindex`` the IPv6 scope);
        None when there is none, or the tables name more than one uid, or the addresses are
        not IP addresses."""
        try:
            _normal(client[0]), _normal(server[0])
        except ValueError:
            return None
        if self.sock_diag is not False:
            try:
                uid = _diag_uid(client, server, ifindex)
                if uid is not None:
                    self.sock_diag = True
                elif self.sock_diag is None:  # never found one: can it see our own end?
                    self.sock_diag = _diag_uid(server, client, ifindex) is not None
                if self.sock_diag:
                    return uid
            except _NoSockDiag:
                self.sock_diag = False
        uids = peer_uids(client, server)
        return next(iter(uids)) if len(uids) == 1 else None


__all__ = ["OwnerLookup", "is_local_peer", "peer_uids", "supported"]
