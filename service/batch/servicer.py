"""gRPC servicer of inference.v1.BatchService: a thin translator onto the JobStore and the worker.

Every job belongs to the tenant of the call that created it
(``service.security.auth.current_tenant()``); another tenant's job is NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from opentelemetry import trace

from service.api.intake import Intake, Need
from service.api.tolerant_decoding import MALFORMED
from service.batch.convert import job_proto, result_proto, spec_of
from service.batch.items import StoreThread, check_custom_id, prepare, sort_key
from service.batch.store import TERMINAL, ItemError, Job, NewItem
from service.batch.worker import BatchWorker
from service.request.errors import BadRequest
from service.security.auth import current_tenant

log = logging.getLogger("service.batch")
MAX_ITEMS = 100_000
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
        upload = _Upload(self)
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


class _Upload:
    """One CreateBatch upload: the job is created at the first message and items are stored as they come."""

    def __init__(self, servicer: BatchServicer) -> None:
        self.s = servicer
        self.job: Job | None = None
        self.line = 0

    async def add(self, msg: bpb.CreateBatchRequest) -> Job | None:
        """Store ``msg``'s items; returns an existing job when the idempotency key was used before."""
        if self.job is None:
            ctx = trace.get_current_span().get_span_context()  # the RPC span (tracing on): items link to it
            spec = spec_of(msg.options, current_tenant())
            if ctx.is_valid:
                spec = replace(spec, trace=f"{ctx.trace_id:032x}-{ctx.span_id:016x}")
            job, created = await self.s.db("create_job", spec)
            if not created:
                return job
            self.job = job
        items: list[NewItem] = []
        errors: list[ItemError] = []
        for item in msg.items:
            self.line += 1
            checked = await self._check(item)
            if isinstance(checked, NewItem):
                items.append(checked)
            else:
                errors.append(checked)
        if items:
            for dup in await self.s.db("add_items", self.job.id, items):
                errors.append(ItemError(dup.line, dup.custom_id, "ALREADY_EXISTS", "duplicate custom_id in the job"))
        if errors:
            await self.s.db("add_errors", self.job.id, errors)
        return None

    async def _check(self, item: Any) -> NewItem | ItemError:
        line, cid = self.line, item.custom_id
        problem = check_custom_id(cid)
        if problem is None and line > MAX_ITEMS:
            problem = f"a job holds at most {MAX_ITEMS} items"
        if problem is not None:
            return ItemError(line, cid, "INVALID_ARGUMENT", problem)
        data = item.SerializeToString()
        try:
            seq = await prepare(self.s.intake, item, f"upload/{cid}")
        except BadRequest as exc:
            return NewItem(cid, line, data, error=ItemError(line, cid, exc.status, str(exc)))
        return NewItem(cid, line, data, sort_key(seq))

    async def finish(self) -> Job:
        if self.job is None:  # an upload without any message: an empty, failed job
            await self.add(bpb.CreateBatchRequest())
        assert self.job is not None
        job: Job = await self.s.db("start_job", self.job.id)
        self.job = None
        return job

    async def discard(self) -> None:
        if self.job is not None:
            job_id, self.job = self.job.id, None
            await self.s.db("discard_job", job_id)
