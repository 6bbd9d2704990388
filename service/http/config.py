"""The HTTP front end's settings (built from the server flags by ``service.assembly``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from service.api.generate_stream import StreamLimits
from service.api.input_limits import InputLimits


@dataclass(frozen=True)
class ConnectionLimits:
    """What one HTTP connection may hold (the ``--http-*`` connection flags; docs/security.md)."""

    max_connections: int = 1000  # open at once; past it the oldest waiting for a request head is closed
    header_timeout_s: float = 10.0  # a request head complete within this (from the connection, or its first byte)
    body_timeout_s: float = 30.0  # a request body: this long, plus a second per ``body_min_rate`` bytes received
    body_min_rate: int = 16384
    max_header_bytes: int = 16384  # request line and headers; larger: 431
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this


@dataclass(frozen=True)
class HttpConfig:
    """``port`` 0 binds a free port (the flag's 0, "off", is decided by the assembly)."""

    host: str
    port: int
    model_name: str  # the id of /v1/models and the model a request must name
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    stream: StreamLimits = field(default_factory=StreamLimits)
    limits: InputLimits = field(default_factory=InputLimits)  # messages, tools, stop strings, logit_bias
    max_body_bytes: int = 8 << 20  # a chat or completion request
    max_file_bytes: int = 256 << 20  # an uploaded batch input file
    # uploaded files: files_store "sqlite" (files_db a path; ":memory:" = not durable) or "postgres" (files_db
    # the shared database's URL: not in the repr, it may hold a password)
    files_store: Literal["sqlite", "postgres"] = "sqlite"
    files_db: str = field(default=":memory:", repr=False)
    files_retention_s: float = 7 * 24 * 3600.0
    graceful_close_s: float = 5.0  # after the server's drain, time left to open connections
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
