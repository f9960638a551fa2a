"""The typed HTTP client of the fgpu API (:class:`Client`), used by the command line
(:mod:`fgpu.cli`) and by scripts.

It depends only on the wire models (:mod:`fgpu.wire`), httpx and pydantic.
"""

from fgpu.client.client import Client, ClientError, ServerUnavailable, resolve_socket

__all__ = ["Client", "ClientError", "ServerUnavailable", "resolve_socket"]
