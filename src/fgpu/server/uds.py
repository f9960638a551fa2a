"""Serving the API on a Unix socket, with the caller's uid from peer credentials.

uvicorn serves the app; :class:`fgpu.server.peerconn.PeerCredProtocol` (its HTTP protocol,
one instance per connection) tags every request with the peer's uid and client key and
applies the connection limits.

:class:`ApiServer` owns the listening sockets: it creates the socket's folder (0755), takes a
lock beside the socket so that two servers never share it, refuses to start when another
server answers on the socket, replaces a stale socket file left by a dead server, makes the
socket 0666 (every local user may call; the API decides what each may do), and removes the
socket and its lock on shutdown. SIGINT and SIGTERM stop it cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import socket
import ssl
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from fgpu.server.connlimit import ConnectionGuard, ConnectionLimits
from fgpu.server.peerconn import PeerCredProtocol

log = logging.getLogger("fgpu.server")

SOCKET_MODE = 0o666
"""Mode of a root server's socket: every local user may call it (identity is the peer uid)."""
PRIVATE_SOCKET_MODE = 0o600
"""Mode of another user's server socket: it serves only that user."""
FOLDER_MODE = 0o755
BACKLOG = 2048


class SocketInUse(Exception):
    """Another server holds or answers on the socket, or the path is not ours to take."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) -> (host, port).

    Raises:
        ValueError: with a message that names what is wrong.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:8750")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{text!r}: port must be between 0 and 65535")
    return host, port


class _Uvicorn(uvicorn.Server):
    """uvicorn's server with our own signal handling (stop cleanly, do not re-raise)."""

    on_started: Callable[[], None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def stop(signum: int, frame: FrameType | None) -> None:
            if self.should_exit and signum == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    handshake_timeout_s: float = 10.0
    """Seconds a TLS handshake may take (a connection counts against the limits only once
    its handshake is done)."""

    tls: ssl.SSLContext | None = None
    """TLS for the TCP listeners (uvicorn would put its one ``ssl`` on every socket, the Unix
    socket too; this server serves the Unix socket in clear and TCP with this)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        plain = [s for s in sockets or () if self.tls is None or s.family == socket.AF_UNIX]
        secured = [s for s in sockets or () if s not in plain]
        await super().startup(plain)
        if self.started and secured:
            loop = asyncio.get_running_loop()
            config = self.config

            def protocol() -> asyncio.Protocol:
                # what uvicorn's startup builds per connection (uvicorn.Server.startup)
                return config.http_protocol_class(  # type: ignore[call-arg]
                    config=config,
                    server_state=self.server_state,
                    app_state=self.lifespan.state,
                    _loop=loop,
                )

            for sock in secured:
                server = await loop.create_server(
                    protocol,
                    sock=sock,
                    ssl=self.tls,
                    backlog=config.backlog,
                    ssl_handshake_timeout=self.handshake_timeout_s,
                )
                self.servers.append(server)
        if self.started and self.on_started is not None:
            self.on_started()


class ApiServer:
    """The API on a Unix socket and, optionally, a TCP address.

    Args:
        socket_path: the Unix socket to create.
        listen: optional (host, port) for TCP; port 0 picks a free port.
        log_level: uvicorn's log level name.
        tls: TLS for the TCP listener (the Unix socket is always plain); None: plain HTTP.
        limits: the connection limits (:mod:`fgpu.server.connlimit`); None: the defaults.

    Use :meth:`bind` (raises :class:`SocketInUse` or ``OSError``) before building anything
    expensive, then :meth:`run` with the app (blocks until SIGINT/SIGTERM or :meth:`stop`);
    :meth:`run` releases the sockets when it returns.
    """

    def __init__(
        self,
        socket_path: Path,
        listen: tuple[str, int] | None = None,
        log_level: str = "info",
        tls: ssl.SSLContext | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.limits = limits if limits is not None else ConnectionLimits()
        self.guard: ConnectionGuard | None = None
        self.workload_fds: Callable[[], int] | None = None
        """Descriptors the workloads hold (:attr:`ConnectionGuard.workload_fds`); set
        before :meth:`run`."""
        """The connection counts, once :meth:`run` has started."""
        self.listen = listen
        self.log_level = log_level
        self.tls = tls
        self._server: _Uvicorn | None = None
        self._stop_requested = False
        self._sockets: list[socket.socket] = []
        self._lock_fd: int | None = None
        self._lock_path = socket_path.with_name(f".{socket_path.name}.lock")
        self._socket_ino: int | None = None
        self.started = threading.Event()

    @property
    def tcp_address(self) -> tuple[str, int] | None:
        """The bound TCP (host, port), after :meth:`bind`."""
        for sock in self._sockets:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                host, port = sock.getsockname()[:2]
                return str(host), int(port)
        return None

    def bind(self) -> None:
        """Claim the socket path and open the listeners.

        Raises:
            SocketInUse: another server runs there, or the path is not a socket we may replace.
            OSError: the folder or the TCP address cannot be used.
        """
        try:
            self._prepare_folder()
            self._take_lock()
            self._clear_stale_socket()
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sockets.append(unix)
            unix.bind(str(self.socket_path))
            os.chmod(self.socket_path, SOCKET_MODE if os.geteuid() == 0 else PRIVATE_SOCKET_MODE)
            self._socket_ino = self.socket_path.stat().st_ino
            unix.listen(BACKLOG)
            unix.setblocking(False)
            if self.listen is not None:
                host, port = self.listen
                infos = socket.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
                )
                family, kind, proto, _, address = infos[0]
                tcp = socket.socket(family, kind, proto)
                self._sockets.append(tcp)
                tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                tcp.bind(address)
                tcp.listen(BACKLOG)
                tcp.setblocking(False)
        except BaseException:
            self.release()
            raise

    def run(self, app: ASGIApp) -> None:
        """Serve ``app`` until stopped; then close and remove the socket and the lock.

        The app's lifespan startup runs before the first request is taken; when it fails,
        the server logs why and exits with status 3 (uvicorn's ``SystemExit``).
        """
        guard = ConnectionGuard(self.limits, workload_fds=self.workload_fds)
        self.guard = guard

        class GuardedProtocol(PeerCredProtocol):
            pass

        GuardedProtocol.guard = guard
        log.info(
            "connection limits: %d per user or address, %d in all; a request must arrive "
            "within %g s, idle connections close after %g s",
            self.limits.per_peer,
            guard.total,
            self.limits.request_timeout_s,
            self.limits.idle_timeout_s,
        )
        config = uvicorn.Config(
            app,
            http=GuardedProtocol,
            timeout_keep_alive=self.limits.idle_timeout_s,  # type: ignore[arg-type]  # a float works
            ws="none",
            lifespan="on",
            log_config=None,
            log_level=self.log_level,
            access_log=self.log_level in ("debug", "trace"),
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=5,
        )
        server = _Uvicorn(config)
        server.tls = self.tls
        server.handshake_timeout_s = self.limits.request_timeout_s
        server.on_started = self._announce
        server.should_exit = self._stop_requested
        self._server = server
        try:
            server.run(sockets=self._sockets)
        finally:
            self.release()

    def stop(self) -> None:
        """Ask the server to stop (thread-safe; also before :meth:`run` started)."""
        self._stop_requested = True
        if self._server is not None:
            self._server.should_exit = True

    def release(self) -> None:
        """Close the listeners and remove the socket file (when still ours) and the lock."""
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self._sockets.clear()
        if self._socket_ino is not None:
            with contextlib.suppress(OSError):
                if self.socket_path.stat().st_ino == self._socket_ino:
                    self.socket_path.unlink()
            self._socket_ino = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                self._lock_path.unlink()
            os.close(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ internals
    def _announce(self) -> None:
        where = f"unix socket {self.socket_path}"
        tcp = self.tcp_address
        if tcp is not None:
            host, port = tcp
            scheme = "https" if self.tls is not None else "http"
            where += f" and {scheme}://{f'[{host}]' if ':' in host else host}:{port} (token)"
        log.info("fgpu server ready on %s", where)
        self.started.set()

    def _prepare_folder(self) -> None:
        folder = self.socket_path.parent
        if not folder.exists():
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, FOLDER_MODE)
        info = folder.stat()
        if not stat.S_ISDIR(info.st_mode):
            raise SocketInUse(f"{folder} is not a folder")
        if info.st_uid not in (os.geteuid(), 0):
            raise SocketInUse(
                f"{folder} belongs to uid {info.st_uid}; choose another --socket folder"
            )

    def _take_lock(self) -> None:
        while True:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    who = f" (pid {holder})" if holder else ""
                    raise SocketInUse(
                        f"another fgpu server{who} is serving {self.socket_path}"
                    ) from None
                raise
            # The holder before us may have removed the file after we opened it: the lock
            # is ours only if the path still names the file we locked.
            try:
                same = os.stat(self._lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                self._lock_fd = fd
                return
            os.close(fd)

    def _clear_stale_socket(self) -> None:
        path = self.socket_path
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise SocketInUse(f"{path} exists and is not a socket; not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            log.info("replacing stale socket %s (its server is gone)", path)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        except OSError as exc:
            raise SocketInUse(f"cannot check {path}: {exc.strerror or exc}") from None
        finally:
            probe.close()
        raise SocketInUse(f"another server answers on {path}")
