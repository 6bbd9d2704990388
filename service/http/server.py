"""The HTTP front end as the server runs it: uvicorn in the gRPC server's own event loop.

``HttpFrontEnd.start`` binds the socket (a taken port fails the start-up, as
gRPC's does) and runs ``uvicorn.Server.serve`` as a task on the running loop:
one process, one loop, one engine, no proxy. Requests before the model is
loaded, while draining or after an engine failure are answered 503 by the
intake's one ``unavailable`` check; ``stop`` closes the listener and gives
open connections ``graceful_close_s`` (the server's drain has already let
in-flight requests finish).

Every connection goes through ``GuardedH11Protocol`` (``service.http.protocol``): the connection
cap, the request head and body deadlines, the head size limit (``HttpConfig.connections``, the
``--http-*`` connection flags); failed ``accept()`` calls and malformed requests are logged at
most once per ten seconds (``service.http.log_limits``).

TLS uses the gRPC port's files (``--tls-cert``/``--tls-key``, client
certificates required with ``--tls-client-ca``), reloaded on change
(``service.security.tls.RotatingSSLContext``). With mTLS a client certificate
is required, but HTTP callers name their tenant with a bearer token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from service.api.intake import Intake
from service.http.app import HttpApi, make_app
from service.http.batches import BatchJobs, BatchRoutes
from service.http.config import HttpConfig
from service.http.connections import ConnectionGuard
from service.http.files import FileStore, SqliteFileStore
from service.http.log_limits import limit_accept_errors, limit_invalid_requests
from service.http.prompt_render import RenderRoutes
from service.http.protocol import GuardedH11Protocol
from service.http.tokens import TokenRoutes
from service.security.tenancy import Tenancy
from service.security.tls import RotatingSSLContext

log = logging.getLogger("service.http")

LISTEN_BACKLOG = 2048  # connections the kernel queues for accept()
# NOTE: asyncio accepts up to the server's ``backlog`` connections per wake-up of the loop, in one
# go, and sets up each (transport, protocol, connection_made) before anything else queued runs. A
# flood of 2,000 half-sent heads arriving at once then held every other connection's callbacks (a
# health check on a kept-alive connection: 597 ms at load 5.5, issue #35) for the whole burst. The
# loop is given this smaller number, so other connections are served between batches, and the
# kernel's queue is set back to LISTEN_BACKLOG once asyncio has listened (``_Server.startup``).
ACCEPT_BATCH = 64


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: SIGTERM belongs to the service's drain."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's, then the kernel's accept queue back to ``LISTEN_BACKLOG`` (asyncio listened with
        ``ACCEPT_BATCH``, its accept batch)."""
        await super().startup(sockets)
        for sock in sockets or ():
            sock.listen(LISTEN_BACKLOG)


class HttpFrontEnd:
    """The HTTP API of one server (see the module docstring)."""

    def __init__(self, config: HttpConfig, intake: Intake, tenancy: Tenancy, jobs: BatchJobs | None = None) -> None:
        self.config = config
        self.api = HttpApi(config, intake, tenancy)
        self.files = open_files(config)  # a bad SQLite path fails here; a PostgreSQL store connects later
        self.routes = self.api.routes() + TokenRoutes(self.api).routes() + RenderRoutes(self.api).routes()
        if jobs is not None:
            self.routes += BatchRoutes(self.api, jobs, self.files).routes()
        self.tls = RotatingSSLContext(config.tls_cert, config.tls_key, config.tls_client_ca or None) \
            if config.tls_cert else None
        self.guard = ConnectionGuard(config.connections.max_connections)
        self.server: _Server | None = None
        self.task: asyncio.Task[None] | None = None
        self.port = 0

    def _uvicorn_config(self) -> uvicorn.Config:
        tls: Any = None
        if self.tls is not None:
            context = self.tls.context
            tls = lambda _config, _default: context  # noqa: E731
        return uvicorn.Config(
            make_app(self.routes), lifespan="off", log_config=None, access_log=False, server_header=False,
            timeout_graceful_shutdown=int(self.config.graceful_close_s), ssl_context_factory=tls,
            # NOTE: a bare h11 protocol; keep-alive connections stay open across requests
            http=GuardedH11Protocol.bind(self.guard, self.config.connections), ws="none",
            timeout_keep_alive=self.config.connections.keep_alive_s,  # type: ignore[arg-type]  # seconds, int in uvicorn
            h11_max_incomplete_event_size=self.config.connections.max_header_bytes,
            backlog=ACCEPT_BATCH,
        )

    async def start(self) -> int:
        """Bind and serve; returns the bound port (OSError if it is taken)."""
        sock = socket.create_server((self.config.host, self.config.port), family=_family(self.config.host),
                                    backlog=LISTEN_BACKLOG, reuse_port=False)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        limit_accept_errors(asyncio.get_running_loop(), log)
        limit_invalid_requests()
        self.server = _Server(self._uvicorn_config())
        self.task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[sock]))
        scheme = "https" if self.tls is not None else "http"
        log.info("HTTP API (OpenAI-compatible) on %s://%s:%d/v1", scheme, self.config.host, self.port)
        return self.port

    def attach(self, metrics: Any) -> None:
        """The engine runs: ``/metrics`` serves ``metrics`` (a prometheus_client registry)."""
        self.api.metrics = metrics

    async def stop(self) -> None:
        if self.server is not None and self.task is not None:
            self.server.should_exit = True
            await asyncio.gather(self.task, return_exceptions=True)
        self.files.close()


def open_files(config: HttpConfig) -> FileStore:
    """The uploaded files' store: in the shared PostgreSQL database of the batch store, else in SQLite."""
    if config.files_store == "postgres":
        from service.http.files_pg import PgFileStore  # psycopg only when used

        return PgFileStore(config.files_db, config.files_retention_s)
    return SqliteFileStore(config.files_db, config.files_retention_s)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
