"""A plain HTTP endpoint for scrapers: ``/metrics`` of one registry on HOST:PORT
(prometheus-client's threaded server), for ``--metrics-listen`` of ``fgpu serve``,
``fgpu k8s scheduler`` and ``fgpu k8s node-agent``."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[::1]:PORT`` or ``:PORT`` (every address) -> (host, port).

    Raises:
        ValueError: a message naming what is wrong (no port, not a number, out of range).
    """
    host, sep, port_text = text.strip().rpartition(":")
    if not sep:
        raise ValueError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9400 or :9400")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{text!r}: port {port_text!r} is not a number") from None
    if not 0 < port <= 65535:
        raise ValueError(f"{text!r}: port must be between 1 and 65535")
    return host or "0.0.0.0", port


def serve_metrics(
    registry: CollectorRegistry, address: tuple[str, int]
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` at ``http://HOST:PORT/metrics`` in a daemon thread until the
    returned server's ``shutdown()``.

    Raises:
        OSError: the address cannot be bound.
    """
    server, thread = start_http_server(address[1], addr=address[0], registry=registry)
    return server, thread
