"""The fgpu API client (:class:`Client`) and the client commands of the ``fgpu`` CLI.

The client depends only on the wire models (:mod:`fgpu.wire`), httpx, Typer and Rich.
"""

from fgpu.client.client import Client, ClientError, ServerUnavailable, resolve_socket

__all__ = ["Client", "ClientError", "ServerUnavailable", "resolve_socket"]
