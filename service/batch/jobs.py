"""The batch service's operations for front ends without a gRPC context (the HTTP API's batches).

Each call acts for the caller's tenant (``service.security.auth.current_tenant()``,
set by the front end's authentication) exactly as the gRPC ``BatchService``
does: another tenant's job is absent (None). Results and jobs are returned as
the ``inference.v1`` protos the gRPC service sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

from inference.v1 import batch_pb2 as bpb

from service.api.intake import Intake
from service.batch.convert import job_proto, result_proto
from service.batch.store import StoreUnavailable, job_cursor
from service.batch.store_thread import StoreThread
from service.batch.upload import Refused, Upload
from service.batch.worker import BatchWorker
from service.security.auth import current_tenant

PAGE = 256


class BatchJobs:
    """Create, read, cancel and read the results of the caller's jobs (see the module docstring)."""

    def __init__(self, db: StoreThread, worker: BatchWorker, intake: Intake) -> None:
        self.db, self.worker, self.intake = db, worker, intake

    async def create(self, options: bpb.BatchOptions, lines: Iterable[bpb.BatchItem | Refused]) -> bpb.Batch:
        """Upload a whole job at once; raises BadRequest for bad options (nothing is kept then)."""
        upload = Upload(self.db, self.intake, self.worker.uploads)
        try:
            existing = await upload.start(options)
            if existing is not None:
                return job_proto(existing)
            batch: list[bpb.BatchItem | Refused] = []
            for line in lines:
                batch.append(line)
                if len(batch) == PAGE:
                    await upload.add_items(batch)
                    batch = []
            await upload.add_items(batch)
            job = await upload.finish()
        except LookupError as exc:  # NOTE: the upload's lease lapsed and a replica deleted it as broken
            await upload.discard()
            raise StoreUnavailable("the upload was interrupted; retry") from exc
        except BaseException:  # a bad option, the client went away, the server stopped: no job was promised
            await asyncio.shield(upload.discard())
            raise
        self.worker.notify()
        return job_proto(job)

    async def get(self, batch_id: str) -> bpb.Batch | None:
        job = await self.db.rpc("get_job", current_tenant(), batch_id)
        return job_proto(job) if job is not None else None

    async def list(self, limit: int, after: str = "") -> tuple[list[bpb.Batch], bool]:
        """A page of the caller's jobs, newest first, after the job ``after`` (""; from the newest), and
        whether more follow; ``LookupError`` when ``after`` is not one of the caller's jobs."""
        tenant, token = current_tenant(), ""
        if after:
            job = await self.db.rpc("get_job", tenant, after)
            if job is None:
                raise LookupError(after)
            token = job_cursor(job)
        jobs, following = await self.db.rpc("list_jobs", tenant, limit, token)
        return [job_proto(j) for j in jobs], bool(following)

    async def cancel(self, batch_id: str) -> bpb.Batch | None:
        job = await self.db.rpc("cancel_job", current_tenant(), batch_id)
        if job is None:
            return None
        self.worker.notify(stopping=True)
        return job_proto(job)

    async def results(self, batch_id: str) -> AsyncIterator[bpb.GetBatchResultsResponse]:
        """Every finished item's result, in custom_id order."""
        cursor = ""
        while True:
            page = await self.db.rpc("results", current_tenant(), batch_id, False, cursor, PAGE)
            for r in page:
                yield result_proto(r)
            if len(page) < PAGE:
                return
            cursor = page[-1].cursor
