"""BatchService assembly: store, worker, servicer, change feed and metrics, for ``service.server``.

``--batch-db`` names the store (``service.batch.open_store``):

* a SQLite path: opened (or created) and recovered when the server is built,
  so a bad path fails before listening;
* a PostgreSQL URL (shared by replicas): opened in the background once the
  server starts, retried with backoff while the database does not answer.
  Meanwhile, and whenever the database is lost later, BatchService answers
  UNAVAILABLE (its gRPC health NOT_SERVING, ``on_health``) while Generate
  keeps serving. The store is recovered (this replica's own running items
  requeued) before any call reaches it.

The worker starts once the engine is ready and stops before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from inference.v1 import batch_pb2 as bpb

from service.api.intake import Intake
from service.api.tolerant_decoding import add_servicer
from service.batch.feed import ChangeFeed
from service.batch.jobs import BatchJobs
from service.batch.metrics import observe_batches
from service.batch.open_store import open_store, parse_batch_db
from service.batch.servicer import BatchServicer
from service.batch.shared_store import SharedJobStore
from service.batch.store import JobStore, StoreUnavailable
from service.batch.store_thread import StoreThread
from service.batch.worker import BatchWorker

log = logging.getLogger("service.batch")
DESCRIPTOR = bpb.DESCRIPTOR.services_by_name["BatchService"]
BATCH_SERVICE_NAME = DESCRIPTOR.full_name
OPEN_BACKOFF_S = (0.5, 10.0)

__all__ = ["BATCH_SERVICE_NAME", "BatchConfig", "BatchService", "observe_batches"]


@dataclass(frozen=True)
class BatchConfig:
    """The batch service's settings (``--batch-db``, ``--batch-retention-hours``, ``--batch-max-running``,
    ``--replica-id``, ``--batch-lease-s``)."""

    db: str
    retention_s: float
    max_running: int  # batch items in the engine at once
    replica_id: str = "local"  # this replica in a shared store (leases, recovery)
    lease_s: float = 60.0  # a shared store's claim lease


class BatchService:
    """Owns the batch store, the worker and the servicer of one server."""

    def __init__(self, config: BatchConfig, intake: Intake, telemetry: Any = None) -> None:
        self.config = config
        self.shared = parse_batch_db(config.db).kind == "postgres"
        self.on_health: Callable[[bool], None] | None = None  # the server's: BatchService health
        self.db = StoreThread(None if self.shared else self._open_local(), self._health_changed, lanes=self.shared)
        self.feed = ChangeFeed()
        provider = getattr(telemetry, "tracer_provider", None)
        tracer = provider.get_tracer("service.batch") if provider is not None else None
        lease_s = config.lease_s if self.shared else None
        self.worker = BatchWorker(self.db, intake, config.max_running, tracer=tracer, lease_s=lease_s)
        self.worker.idle_s = lambda: self.feed.poll_s(1.0)
        self.feed.on_work = lambda: self.worker.notify(stopping=True)
        self.servicer = BatchServicer(self.db, self.worker, intake, self.feed)
        self.jobs = BatchJobs(self.db, self.worker, intake)  # the same operations for the HTTP API
        self._opener: asyncio.Task[None] | None = None
        meters = getattr(telemetry, "meter_provider", None)
        if meters is not None:
            observe_batches(meters.get_meter("service.batch"), self.db, self.worker, self.worker.leases)

    @property
    def available(self) -> bool:
        """True while the store answers (BatchService health SERVING)."""
        return self.db.up

    def _open_local(self) -> JobStore:
        """The SQLite store, recovered; OSError (start-up fails) for a bad path."""
        try:
            store = open_store(self.config.db, retention_s=self.config.retention_s, replica_id=self.config.replica_id)
            # NOTE: before the server listens: a CreateBatch must never race the removal of broken uploads
            requeued = store.recover()
        except sqlite3.Error as exc:
            raise OSError(f"--batch-db {self.config.db}: {exc}") from exc
        if requeued:
            log.info("batch: %d items that were running at the last stop are queued again", requeued)
        return store

    async def _open_shared(self) -> None:
        """Open and recover the shared store, retrying with backoff until the database answers."""
        target, delay = parse_batch_db(self.config.db), OPEN_BACKOFF_S[0]
        while True:
            try:
                store, requeued = await self.db.run(self._connect)
                break
            except StoreUnavailable as exc:
                self.db.last_error = str(exc)
                log.warning("batch store %s not reachable (%s); retrying in %.1f s", target, exc, delay)
            except Exception as exc:  # NOTE: e.g. no right to create the tables: logged, retried, never fatal
                self.db.last_error = repr(exc)
                log.exception("opening the batch store %s failed; retrying in %.1f s", target, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, OPEN_BACKOFF_S[1])
        log.info("batch store %s open (replica %s, lease %.0f s); %d of this replica's items queued again",
                 target, self.config.replica_id, self.config.lease_s, requeued)
        # NOTE: on the store thread: the first subscription waits (briefly) for LISTEN to be in place
        await self.db.run(self.feed.attach, store, asyncio.get_running_loop())
        self.db.attach(store)
        self.worker.notify(stopping=True)

    def _connect(self) -> tuple[SharedJobStore, int]:
        """(Store thread) Open, migrate and recover the shared store: (store, items requeued)."""
        store = open_store(self.config.db, retention_s=self.config.retention_s, replica_id=self.config.replica_id,
                           lease_s=self.config.lease_s)
        assert isinstance(store, SharedJobStore)
        try:
            return store, store.recover()
        except BaseException:
            store.close()
            raise

    def _health_changed(self, up: bool) -> None:
        if self.on_health is not None:
            self.on_health(up)

    def register(self, server: grpc.aio.Server) -> None:
        add_servicer(server, self.servicer, DESCRIPTOR)

    async def start(self) -> None:
        """Start the worker (and, for a shared store, its opening: the worker waits for it)."""
        if self.shared and self._opener is None:
            self._opener = asyncio.get_running_loop().create_task(self._open_shared())
        await self.worker.start()

    async def stop(self) -> None:
        if self._opener is not None:
            self._opener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._opener
        await self.worker.stop()
        self.db.close()
