"""A TLS server certificate read again from its files when they change, so the webhook
follows cert-manager's renewals without a restart.

cert-manager writes a renewed certificate into the Secret; the kubelet updates a mounted
Secret's files in place (an atomic swap of the volume's ``..data`` link), eventually, within
its sync period. :class:`CertReloader` looks at the files every ``interval_s`` and, when
their content changed, loads them into the server's :class:`ssl.SSLContext`
(``load_cert_chain`` on the live context: handshakes after it present the new certificate;
connections already open keep theirs). A half-written pair (a key that does not match the
certificate) is tried on a scratch context first, refused there, and the old pair stays in
use until the next look.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import threading
from pathlib import Path

log = logging.getLogger("fgpu.k8s.tlsreload")


class CertReloader:
    """Keeps ``context`` serving the certificate and key in ``cert_file`` and ``key_file``.

    Args:
        context: the server's SSL context (already loaded with the pair).
        cert_file: the PEM certificate (chain) path.
        key_file: the PEM private key path.
        interval_s: seconds between looks in :meth:`start`'s thread.
    """

    def __init__(
        self, context: ssl.SSLContext, cert_file: str, key_file: str, interval_s: float = 30.0
    ) -> None:
        self.context = context
        self.cert_file = cert_file
        self.key_file = key_file
        self.interval_s = interval_s
        self._digest = self._read()
        self._stop = threading.Event()
        self.reloads = 0

    def _read(self) -> bytes | None:
        try:
            data = Path(self.cert_file).read_bytes() + b"\0" + Path(self.key_file).read_bytes()
        except OSError as exc:
            log.warning("TLS files not readable: %s", exc)
            return None
        return hashlib.sha256(data).digest()

    def check(self) -> bool:
        """Load the pair again if its files changed; True when the new pair is in use."""
        digest = self._read()
        if digest is None or digest == self._digest:
            return False
        try:
            # tried on a scratch context first: a failed load_cert_chain can leave a context
            # with the new certificate and the old key, which no handshake survives
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert_file, self.key_file)
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as exc:
            log.warning("new TLS certificate not loaded (keeping the old one): %s", exc)
            return False
        self._digest = digest
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.cert_file)
        return True

    def start(self) -> None:
        """Look every ``interval_s`` in a daemon thread until :meth:`stop`."""

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                self.check()

        threading.Thread(target=loop, name="tls-reload", daemon=True).start()

    def stop(self) -> None:
        """End the thread."""
        self._stop.set()
