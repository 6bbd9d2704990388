"""gRPC servicer of inference.v1.BatchService: a thin translator onto the JobStore and the worker.

Every job belongs to the tenant of the call that created it
(``service.security.auth.current_tenant()``); another tenant's job is NOT_FOUND.
With a store shared by replicas every call works on every replica: the store
is the only state (``WatchBatch`` wakes on the store's change feed).

A store that cannot be reached ends a call with UNAVAILABLE (``store_errors``);
so does an upload whose lease lapsed and that another replica deleted as
broken (the client's retry, with its idempotency key, makes the job anew).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc

from service.api.intake import Intake
from service.api.readiness import Need
from service.api.tolerant_decoding import MALFORMED
from service.batch.convert import job_proto, result_proto
from service.batch.feed import ChangeFeed
from service.batch.rpc_support import ProgressRate, abort_unavailable, store_errors
from service.batch.store import TERMINAL, Job
from service.batch.store_thread import StoreThread
from service.batch.upload import Upload
from service.batch.worker import BatchWorker
from service.request.errors import BadRequest
from service.security.auth import current_tenant

log = logging.getLogger("service.batch")
DEFAULT_PAGE, MAX_PAGE = 20, 100


class BatchServicer(bpb_grpc.BatchServiceServicer):
    """Implements inference.v1.BatchService; ``intake`` validates items and says whether work is taken."""

    def __init__(self, db: StoreThread, worker: BatchWorker, intake: Intake, feed: ChangeFeed | None = None) -> None:
        self.db, self.worker, self.intake = db, worker, intake
        self.feed = feed or ChangeFeed()

    async def _job(self, batch_id: str, context: grpc.aio.ServicerContext) -> Job:
        await self.intake.require(context, Need.STORE)
        job: Job | None = await self.db.rpc("get_job", current_tenant(), batch_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no batch {batch_id!r}")
        assert job is not None
        return job

    # -- CreateBatch --------------------------------------------------------------------------
    @store_errors
    async def CreateBatch(
        self, request_iterator: AsyncIterator[bpb.CreateBatchRequest], context: grpc.aio.ServicerContext
    ) -> bpb.CreateBatchResponse:
        await self.intake.require(context, Need.WORK)
        upload = Upload(self.db, self.intake, self.worker.uploads)
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
        except LookupError as exc:  # NOTE: the upload's lease lapsed and a replica deleted it as broken
            await upload.discard()
            await abort_unavailable(context, exc, "the upload was interrupted; retry with the same idempotency_key")
            raise AssertionError("unreachable") from None  # pragma: no cover - abort raises
        except BaseException:  # the client went away, the server stopped or the store is down: no job
            await asyncio.shield(upload.discard())
            raise
        self.worker.notify()
        log.info("batch %s created: %d items, %d errors", job.id, job.counts.total, job.error_count)
        return bpb.CreateBatchResponse(batch=job_proto(job))

    # -- reads and cancel ---------------------------------------------------------------------
    @store_errors
    async def GetBatch(self, request: bpb.GetBatchRequest, context: grpc.aio.ServicerContext) -> Any:
        return bpb.GetBatchResponse(batch=job_proto(await self._job(request.batch_id, context)))

    @store_errors
    async def ListBatches(self, request: bpb.ListBatchesRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.intake.require(context, Need.STORE)
        size = min(request.page_size or DEFAULT_PAGE, MAX_PAGE)
        try:
            jobs, token = await self.db.rpc("list_jobs", current_tenant(), size, request.page_token)
        except ValueError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "page_token is not one this server gave")
        return bpb.ListBatchesResponse(batches=[job_proto(j) for j in jobs], next_page_token=token)

    @store_errors
    async def CancelBatch(self, request: bpb.CancelBatchRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.intake.require(context, Need.STORE)
        job = await self.db.rpc("cancel_job", current_tenant(), request.batch_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no batch {request.batch_id!r}")
        self.worker.notify(stopping=True)
        return bpb.CancelBatchResponse(batch=job_proto(job))

    @store_errors
    async def WatchBatch(
        self, request: bpb.WatchBatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bpb.WatchBatchResponse]:
        """An event now, then on every change (at most every ``min_interval_ms``) until the job is final.

        NOTE: with a shared store the stream waits for the job's change notifications (any replica's
        progress) and re-reads at ``ChangeFeed.poll_s`` at the latest; without one it polls.
        """
        interval = (request.min_interval_ms or 500) / 1000
        last, progress = None, ProgressRate()
        while True:
            mark = self.feed.mark()
            job = await self._job(request.batch_id, context)
            batch = job_proto(job)
            rate = progress.add(job.counts) if self.feed.store is not None else self.worker.rate(job.id)
            if batch != last:
                yield bpb.WatchBatchResponse(batch=batch, items_per_second=rate)
                last = batch
            if job.state in TERMINAL:
                return
            await asyncio.sleep(interval)
            await self.feed.wait(job.id, mark, self.feed.poll_s(interval) - interval)

    @store_errors
    async def GetBatchResults(
        self, request: bpb.GetBatchResultsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bpb.GetBatchResultsResponse]:
        await self._job(request.batch_id, context)
        by_completion = request.order == bpb.RESULT_ORDER_COMPLETION
        if by_completion and request.cursor and not _completion_cursor(request.cursor):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "cursor is not one of a completion-order stream")
        cursor, left = request.cursor, request.limit or None
        while True:
            page = await self.db.rpc("results", current_tenant(), request.batch_id, by_completion, cursor, 256)
            for r in page[:left]:
                yield result_proto(r)
            if left is not None:
                left -= min(left, len(page))
            if len(page) < 256 or left == 0:
                return
            cursor = page[-1].cursor


def _completion_cursor(cursor: str) -> bool:
    """A completion-order cursor is a result's sequence number: at most 18 ASCII digits.

    NOTE: ``str.isdigit`` alone let "²" through (int() refuses it), and a longer number fails int()
    past 4,300 digits or SQLite past 2**63: each was an UNKNOWN status instead of INVALID_ARGUMENT.
    """
    return cursor.isascii() and cursor.isdigit() and len(cursor) <= 18
