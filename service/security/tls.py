"""Server TLS and mTLS with certificate rotation (grpcio's own credentials, no proxy).

``server_credentials(cert, key, client_ca)`` builds
``grpc.dynamic_ssl_server_credentials``: gRPC asks ``CertificateFiles.fetch``
for the configuration before each new handshake; it re-reads the files when
their mtimes change, so a rotated certificate is served to new connections
without a restart (open connections keep the one they were set up with).
With ``client_ca``, client certificates are required and verified against it.

``RotatingSSLContext`` does the same for the HTTP front end (``ssl`` module):
its context's SNI callback, run on every ClientHello, swaps in a context
loaded from the files when their mtimes changed.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger("service.tls")


class CertificateFiles:
    """The certificate, key and optional client CA files, re-read when they change on disk."""

    def __init__(self, cert: str | Path, key: str | Path, client_ca: str | Path | None = None) -> None:
        self.paths = [Path(cert), Path(key)] + ([Path(client_ca)] if client_ca else [])
        self.require_client_auth = client_ca is not None
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        self.initial = self._config()  # unreadable files fail the start-up
        self.rotations = 0

    def _mtimes(self) -> tuple[int, ...]:
        return tuple(os.stat(p).st_mtime_ns for p in self.paths)

    def _config(self) -> Any:
        """gRPC's configuration of the files; raises OSError (ssl.SSLError) unless the key fits the cert.

        NOTE: gRPC would accept any bytes here and fail every handshake later; loading
        the pair with ``ssl`` first catches a wrong, unreadable or half-rotated pair.
        """
        check = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        check.load_cert_chain(self.paths[0], self.paths[1])
        if self.require_client_auth:
            check.load_verify_locations(self.paths[2])
        cert, key = self.paths[0].read_bytes(), self.paths[1].read_bytes()
        ca = self.paths[2].read_bytes() if self.require_client_auth else None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> Any:
        """gRPC's fetcher: a new configuration if the files changed, else None (keep the current one)."""
        with self._lock:
            try:
                stamp = self._mtimes()
                if stamp == self._stamp:
                    return None
                config = self._config()
            except (OSError, ValueError) as exc:  # half-written files: keep serving the old certificate
                log.warning("TLS files not reloaded (keeping the current ones): %s", exc)
                return None
            self._stamp = stamp
            self.rotations += 1
        log.info("TLS certificate files changed on disk: new connections use the new certificate")
        return config


def server_credentials(
    cert: str | Path, key: str | Path, client_ca: str | Path | None = None
) -> tuple[grpc.ServerCredentials, CertificateFiles]:
    """Dynamic TLS credentials for ``add_secure_port`` and the file watcher behind them."""
    files = CertificateFiles(cert, key, client_ca)
    creds = grpc.dynamic_ssl_server_credentials(
        files.initial, files.fetch, require_client_authentication=files.require_client_auth
    )
    return creds, files


class RotatingSSLContext:
    """An ``ssl.SSLContext`` for an asyncio server over the same files, reloaded when they change.

    ``context`` is what the server listens with; a failed reload (half-written
    files) keeps the previous certificate, as ``CertificateFiles.fetch`` does.
    """

    def __init__(self, cert: str | Path, key: str | Path, client_ca: str | Path | None = None) -> None:
        self.paths = [Path(cert), Path(key)] + ([Path(client_ca)] if client_ca else [])
        self.require_client_auth = client_ca is not None
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        self._current = self._load()  # unreadable files fail the start-up
        self.context = self._load()
        self.context.sni_callback = self._pick
        self.rotations = 0

    def _mtimes(self) -> tuple[int, ...]:
        return tuple(os.stat(p).st_mtime_ns for p in self.paths)

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.paths[0], self.paths[1])
        if self.require_client_auth:
            ctx.load_verify_locations(self.paths[2])
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def _pick(self, sslobj: ssl.SSLObject, _server_name: str | None, _ctx: ssl.SSLContext) -> None:
        """SNI callback (every handshake): serve the newest loadable files."""
        with self._lock:
            try:
                stamp = self._mtimes()
                if stamp != self._stamp:
                    self._current, self._stamp = self._load(), stamp
                    self.rotations += 1
                    log.info("TLS certificate files changed on disk: new HTTP connections use the new certificate")
            except (OSError, ValueError) as exc:
                log.warning("TLS files not reloaded for HTTP (keeping the current ones): %s", exc)
            sslobj.context = self._current
