"""BatchService assembly: store, worker, servicer and metrics, for ``service.server``.

``--batch-db`` opens (or creates) the SQLite store when the server is built,
so a bad path fails before listening; the worker starts once the engine is
ready and stops before it.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from typing import Any

import grpc
from inference.v1 import batch_pb2 as bpb

from service.api.intake import Intake
from service.api.tolerant_decoding import add_servicer
from service.batch.items import StoreThread
from service.batch.jobs import BatchJobs
from service.batch.servicer import BatchServicer
from service.batch.sqlite_store import SqliteJobStore
from service.batch.worker import BatchWorker

log = logging.getLogger("service.batch")
DESCRIPTOR = bpb.DESCRIPTOR.services_by_name["BatchService"]
BATCH_SERVICE_NAME = DESCRIPTOR.full_name


@dataclass(frozen=True)
class BatchConfig:
    """The batch service's settings (``--batch-db``, ``--batch-retention-hours``, ``--batch-max-running``)."""

    db: str
    retention_s: float
    max_running: int  # batch items in the engine at once


class BatchService:
    """Owns the batch store, the worker and the servicer of one server."""

    def __init__(self, config: BatchConfig, intake: Intake, telemetry: Any = None) -> None:
        try:
            store = SqliteJobStore(config.db, retention_s=config.retention_s)
            # NOTE: before the server listens: a CreateBatch must never race the removal of broken uploads
            requeued = store.recover()
        except sqlite3.Error as exc:
            raise OSError(f"--batch-db {config.db}: {exc}") from exc
        if requeued:
            log.info("batch: %d items that were running at the last stop are queued again", requeued)
        self.db = StoreThread(store)
        provider = getattr(telemetry, "tracer_provider", None)
        tracer = provider.get_tracer("service.batch") if provider is not None else None
        self.worker = BatchWorker(self.db, intake, config.max_running, tracer=tracer)
        self.servicer = BatchServicer(self.db, self.worker, intake)
        self.jobs = BatchJobs(self.db, self.worker, intake)  # the same operations for the HTTP API
        meters = getattr(telemetry, "meter_provider", None)
        if meters is not None:
            observe_batches(meters.get_meter("service.batch"), store, self.worker)

    def register(self, server: grpc.aio.Server) -> None:
        add_servicer(server, self.servicer, DESCRIPTOR)

    async def start(self) -> None:
        await self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()
        self.db.close()


def observe_batches(meter: Any, store: Any, worker: BatchWorker) -> None:
    """OTel gauges: jobs by state, queued/running items (backlog), items finished per second."""
    from opentelemetry.metrics import CallbackOptions, Observation

    items = ("queued_items", "running_items")

    def jobs(_options: CallbackOptions) -> list[Observation]:
        counts = store.state_counts()
        return [Observation(n, {"state": state}) for state, n in counts.items() if state not in items]

    def backlog(_options: CallbackOptions) -> list[Observation]:
        counts = store.state_counts()
        return [Observation(counts[k], {"item_state": k.removesuffix("_items")}) for k in items]

    meter.create_observable_gauge("inference.batch.jobs", [jobs], description="batch jobs by state")
    meter.create_observable_gauge("inference.batch.items", [backlog], description="items of open batch jobs by state")
    meter.create_observable_gauge(
        "inference.batch.items_per_second",
        [lambda _o: [Observation(worker.rate())]],
        unit="1/s",
        description="batch items finished per second (last 10 s)",
    )
