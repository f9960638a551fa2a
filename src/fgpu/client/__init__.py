"""The typed HTTP client of the fgpu API (:class:`Client`), used by the command line
(:mod:`fgpu.cli`) and by scripts.

It depends only on the wire models (:mod:`fgpu.wire`, pydantic, loaded by the first method
that returns one), the standard library's HTTP (the Unix socket) and httpx (TCP and TLS).
:mod:`fgpu.client.plain` reads the workload listing without pydantic (``fgpu ls``).
"""

from fgpu.client.client import Client, ClientError, ServerUnavailable, resolve_socket

__all__ = ["Client", "ClientError", "ServerUnavailable", "resolve_socket"]
