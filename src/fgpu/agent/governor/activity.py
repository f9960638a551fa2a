"""The agent end of :mod:`fgpu.sdk`: a Unix datagram socket that receives hints.

:class:`HintListener` binds the socket named by ``FGPU_AGENT_SOCKET``, with ``SO_PASSCRED``
so that the kernel attaches each sender's pid, uid and gid (``unix(7)``, "Ancillary
messages", ``SCM_CREDENTIALS``; an unprivileged sender cannot forge them). The governor
believes a datagram's workload id only when that pid belongs to the workload. The listener
never blocks: :meth:`HintListener.receive` drains what is queued; the governor selects on
:meth:`HintListener.fileno`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from fgpu.sdk.wire import MAX_DATAGRAM, Message, decode

log = logging.getLogger(__name__)

_CREDS = struct.Struct("iII")  # struct ucred: pid_t pid; uid_t uid; gid_t gid
RECEIVE_BUFFER = 1 << 20


@dataclass(frozen=True, slots=True)
class Hint:
    """A datagram and who sent it (kernel-reported).

    Attributes:
        message: the decoded message.
        pid: sender's pid (in the agent's pid namespace), 0 when the kernel attached none.
        uid: sender's uid.
    """

    message: Message
    pid: int
    uid: int


class HintListener:
    """The agent's activity-hint socket.

    Args:
        path: where to bind. A stale socket file there is replaced; any other file is an
            error. The parent directory must exist.
        mode: permissions of the socket file (default ``0o666``: workloads run as their
            owners' users and must be able to send; senders are authenticated by pid).

    Raises:
        OSError: the path is taken by something that is not a socket, or binding fails.
    """

    def __init__(self, path: str | Path, mode: int = 0o666) -> None:
        self.path = Path(path)
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(self.path.lstat().st_mode):
                raise FileExistsError(f"{self.path} exists and is not a socket")
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            sock.bind(str(self.path))
            os.chmod(self.path, mode)
            sock.setblocking(False)
            bound = self.path.lstat()
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._file = (bound.st_dev, bound.st_ino)
        self.dropped = 0
        """Datagrams that were not valid messages or came without credentials."""

    def fileno(self) -> int:
        """The socket's descriptor (readable when datagrams are queued)."""
        return self._sock.fileno()

    def receive(self, limit: int = 1000) -> list[Hint]:
        """Every queued datagram (at most ``limit``), decoded; invalid ones are counted in
        :attr:`dropped` and skipped. Never blocks."""
        hints: list[Hint] = []
        space = socket.CMSG_SPACE(_CREDS.size)
        while len(hints) < limit:
            try:
                data, ancillary, _flags, _addr = self._sock.recvmsg(MAX_DATAGRAM + 1, space)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                log.debug("hint socket: %s", exc)
                break
            pid = uid = 0
            for level, kind, payload in ancillary:
                if (
                    level == socket.SOL_SOCKET
                    and kind == socket.SCM_CREDENTIALS
                    and len(payload) >= _CREDS.size
                ):
                    pid, uid, _gid = _CREDS.unpack_from(payload)
            message = decode(data)
            if message is None or pid <= 0:
                self.dropped += 1
                continue
            hints.append(Hint(message, pid, uid))
        return hints

    def close(self) -> None:
        """Close the socket and remove its file, unless another listener (a new agent that
        started before this one stopped) has bound that path since; idempotent."""
        if self._sock.fileno() < 0:
            return
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            now = self.path.lstat()
            if (now.st_dev, now.st_ino) == self._file:
                self.path.unlink()


__all__ = ["Hint", "HintListener"]
