"""gRPC servicer of inference.v1.BatchService: a thin translator onto the JobStore and the worker.

Every job belongs to the tenant of the call that created it
(``service.security.auth.current_tenant()``); another tenant's job is NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc

from service.api.intake import Intake, Need
from service.api.tolerant_decoding import MALFORMED
from service.batch.convert import job_proto, result_proto
from service.batch.items import StoreThread
from service.batch.store import TERMINAL, Job
from service.batch.upload import Upload
from service.batch.worker import BatchWorker
from service.request.errors import BadRequest
from service.security.auth import current_tenant

log = logging.getLogger("service.batch")
DEFAULT_PAGE, MAX_PAGE = 20, 100


class BatchServicer(bpb_grpc.BatchServiceServicer):
    """Implements inference.v1.BatchService; ``intake`` validates items and says whether work is taken."""

    def __init__(self, db: StoreThread, worker: BatchWorker, intake: Intake) -> None:
        self.db, self.worker, self.intake = db, worker, intake

    async def _job(self, batch_id: str, context: grpc.aio.ServicerContext) -> Job:
        await self.intake.require(context, Need.STORE)
        job: Job | None = await self.db("get_job", current_tenant(), batch_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no batch {batch_id!r}")
        assert job is not None
        return job

    # -- CreateBatch --------------------------------------------------------------------------
    async def CreateBatch(
        self, request_iterator: AsyncIterator[bpb.CreateBatchRequest], context: grpc.aio.ServicerContext
    ) -> bpb.CreateBatchResponse:
        await self.intake.require(context, Need.WORK)
        upload = Upload(self.db, self.intake)
        try:
            async for msg in request_iterator:
                if msg is MALFORMED:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "message is not a valid CreateBatchRequest")
                existing = await upload.add(msg)
                if existing is not None:  # idempotency key seen before: the first job, nothing added
                    return bpb.CreateBatchResponse(batch=job_proto(existing))
            job = await upload.finish()
        except BadRequest as exc:
            await upload.discard()
            await context.abort(grpc.StatusCode[exc.status], str(exc))
            raise AssertionError("unreachable") from None  # pragma: no cover - abort raises
        except BaseException:  # the client went away or the server stopped: no job was promised
            await asyncio.shield(upload.discard())
            raise
        self.worker.notify()
        log.info("batch %s created: %d items, %d errors", job.id, job.counts.total, job.error_count)
        return bpb.CreateBatchResponse(batch=job_proto(job))

    # -- reads and cancel ---------------------------------------------------------------------
    async def GetBatch(self, request: bpb.GetBatchRequest, context: grpc.aio.ServicerContext) -> Any:
        return bpb.GetBatchResponse(batch=job_proto(await self._job(request.batch_id, context)))

    async def ListBatches(self, request: bpb.ListBatchesRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.intake.require(context, Need.STORE)
        size = min(request.page_size or DEFAULT_PAGE, MAX_PAGE)
        try:
            jobs, token = await self.db("list_jobs", current_tenant(), size, request.page_token)
        except ValueError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_token is not one this server gave")
        return bpb.ListBatchesResponse(batches=[job_proto(j) for j in jobs], next_page_token=token)

    async def CancelBatch(self, request: bpb.CancelBatchRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.intake.require(context, Need.STORE)
        job = await self.db("cancel_job", current_tenant(), request.batch_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no batch {request.batch_id!r}")
        self.worker.notify(stopping=True)
        return bpb.CancelBatchResponse(batch=job_proto(job))

    async def WatchBatch(
        self, request: bpb.WatchBatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bpb.WatchBatchResponse]:
        interval = (request.min_interval_ms or 500) / 1000
        last = None
        while True:
            job = await self._job(request.batch_id, context)
            batch = job_proto(job)
            if batch != last:
                yield bpb.WatchBatchResponse(batch=batch, items_per_second=self.worker.rate(job.id))
                last = batch
            if job.state in TERMINAL:
                return
            await asyncio.sleep(interval)

    async def GetBatchResults(
        self, request: bpb.GetBatchResultsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bpb.GetBatchResultsResponse]:
        await self._job(request.batch_id, context)
        by_completion = request.order == bpb.RESULT_ORDER_COMPLETION
        if by_completion and request.cursor and not request.cursor.isdigit():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "cursor is not one of a completion-order stream")
        cursor, left = request.cursor, request.limit or None
        while True:
            page = await self.db("results", current_tenant(), request.batch_id, by_completion, cursor, 256)
            for r in page[:left]:
                yield result_proto(r)
            if left is not None:
                left -= min(left, len(page))
            if len(page) < 256 or left == 0:
                return
            cursor = page[-1].cursor
