"""A plain HTTP endpoint for scrapers: ``/metrics`` of one :class:`~fgpu.metrics.Exporter`
on HOST:PORT (the standard library's threaded HTTP server), for ``--metrics-listen`` of
``fgpu serve``, ``fgpu k8s scheduler`` and ``fgpu k8s node-agent``; the last two also answer
their kubelet probes there (``/healthz``, ``/readyz``: :data:`Probe`)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fgpu.metrics.collector import CONTENT_TYPE

log = logging.getLogger("fgpu.metrics")

Probe = Callable[[], tuple[bool, str]]
"""A health check for a kubelet probe: (passes, what it found in a few words)."""


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[::1]:PORT`` or ``:PORT`` (every address) -> (host, port).

    Raises:
        ValueError: a message naming what is wrong (no port, not a number, out of range).
    """
    if not text.strip():
        raise ValueError(f"{text!r}: empty; expected HOST:PORT, e.g. 127.0.0.1:9400 or :9400")
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


def _loopback(host: str) -> bool:
    """Whether every address ``host`` resolves to is a loopback one."""
    import ipaddress

    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(found) and all(
        ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in found
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True


def serve_metrics(
    render: Callable[[], bytes],
    address: tuple[str, int],
    probes: Mapping[str, Probe] | None = None,
) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Answer ``GET /metrics`` at ``http://HOST:PORT`` with ``render()`` in a daemon thread
    until the returned server's ``shutdown()``; other paths (``/`` too) get 404, a failing
    ``render`` 500 (logged). There is no authentication: the series name workloads and
    queues, so a HOST that is not loopback is logged as a warning.

    Args:
        render: the exposition (Prometheus text format).
        address: (host, port) as :func:`parse_address` gives it.
        probes: path (e.g. ``/healthz``) -> check; ``GET`` of a path answers 200
            ``ok: DETAIL`` when the check passes, else 503 ``failing: DETAIL`` (what
            kubelet ``httpGet`` probes read: any 2xx or 3xx passes). A check that raises
            fails (500, logged).

    Raises:
        OSError: the address cannot be bound or resolved.
    """
    checks = dict(probes or {})
    paths = ", ".join(["/metrics", *sorted(checks)])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in checks:
                self._probe(checks[path])
                return
            if path != "/metrics":
                self._answer(404, f"only {paths} here\n".encode(), "text/plain; charset=utf-8")
                return
            try:
                body = render()
            except Exception:
                log.exception("a scrape failed")
                self._answer(500, b"the scrape failed; see the log\n", "text/plain")
                return
            self._answer(200, body, CONTENT_TYPE)

        def _probe(self, check: Probe) -> None:
            try:
                ok, detail = check()
            except Exception:
                log.exception("a health check failed")
                self._answer(500, b"the check failed; see the log\n", "text/plain")
                return
            text = f"{'ok' if ok else 'failing'}: {detail}\n"
            self._answer(200 if ok else 503, text.encode(), "text/plain; charset=utf-8")

        def _answer(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape or probe every few seconds is not news

    host, port = address
    if not _loopback(host):
        log.warning(
            "--metrics-listen %s:%d is not a loopback address: anyone who reaches it reads "
            "the metrics (workload and queue names) without a token",
            host,
            port,
        )
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type("_MetricsServer", (_Server,), {"address_family": family})
    server = server_class((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="fgpu-metrics", daemon=True)
    thread.start()
    return server, thread
