"""Where a client finds the fgpu server: the Unix socket's default place and the
environment variables of the socket, the TCP URL and its token. Standard library only, so
that the command line can name them in its options without loading the API models."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SOCKET_ENV = "FGPU_SOCKET"
"""Environment variable naming the server's Unix socket (client and server)."""

URL_ENV = "FGPU_URL"
"""Environment variable with ``http://HOST:PORT`` of a server's TCP listener (client)."""

TOKEN_ENV = "FGPU_TOKEN"
"""Environment variable with the bearer token for ``URL_ENV`` (client)."""

SYSTEM_SOCKET = Path("/run/fgpu/fgpu.sock")
"""The socket of a server started by root; clients fall back to it."""


def default_socket_path(env: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """Where the server listens and the client connects when no socket is given.

    ``/run/fgpu/fgpu.sock`` as root (a root server is the machine's shared service, and root's
    own ``$XDG_RUNTIME_DIR`` is closed to other users), else ``$XDG_RUNTIME_DIR/fgpu/fgpu.sock``
    when that variable is set, else ``/tmp/fgpu-$UID/fgpu.sock``. ``$FGPU_SOCKET`` is not read
    here: the command line reads it as the ``--socket`` option's environment variable.

    Args:
        env: the environment to read (default: ``os.environ``).
        uid: the user (default: the effective uid of this process).
    """
    env = os.environ if env is None else env
    uid = os.geteuid() if uid is None else uid
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if uid == 0:
        return SYSTEM_SOCKET
    if runtime:
        return Path(runtime) / "fgpu" / "fgpu.sock"
    return Path(f"/tmp/fgpu-{uid}/fgpu.sock")


__all__ = ["SOCKET_ENV", "SYSTEM_SOCKET", "TOKEN_ENV", "URL_ENV", "default_socket_path"]
