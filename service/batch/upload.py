"""One job upload (``CreateBatch``, or the HTTP API's ``POST /v1/batches``): items validated and stored as they come.

The job is created at the first message (or at ``start``) and each item is
validated exactly as its live call would be (``service.batch.items.prepare``).
A bad item is stored as a failed item with its error when its ``custom_id``
is usable, else recorded in the job's errors; the upload goes on. ``finish``
ends the upload (the job starts, or fails when no item is runnable);
``discard`` deletes a job whose upload broke off (its creator never got its id).

A line may also arrive already refused, as ``(custom_id, message)``: the HTTP
API parses JSONL lines before they are items, and a line it cannot turn into
one is recorded here the same way (INVALID_ARGUMENT).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

from inference.v1 import batch_pb2 as bpb
from opentelemetry import trace

from service.api.intake import Intake
from service.batch.convert import spec_of
from service.batch.items import check_custom_id, prepare, sort_key
from service.batch.store import ItemError, Job, NewItem, StoreUnavailable
from service.batch.store_thread import StoreThread
from service.request.errors import BadRequest
from service.security.auth import current_tenant

log = logging.getLogger("service.batch")
MAX_ITEMS = 100_000
Refused = tuple[str, str]  # (custom_id, why): a line that could not become an item


class Upload:
    """One job upload (see the module docstring); the caller's tenant owns the job."""

    def __init__(self, db: StoreThread, intake: Intake, uploads: set[str]) -> None:
        self.db, self.intake = db, intake
        self.uploads = uploads  # jobs being uploaded: the worker renews their leases meanwhile
        self.job: Job | None = None
        self.line = 0

    async def start(self, options: bpb.BatchOptions) -> Job | None:
        """Create the job (once); returns an existing job when the idempotency key was used before."""
        if self.job is not None:
            return None
        ctx = trace.get_current_span().get_span_context()  # the RPC span (tracing on): items link to it
        spec = spec_of(options, current_tenant())
        if ctx.is_valid:
            spec = replace(spec, trace=f"{ctx.trace_id:032x}-{ctx.span_id:016x}")
        job, created = await self.db.rpc("create_job", spec)
        if not created:
            return job
        self.job = job
        self.uploads.add(job.id)  # NOTE: its lease is renewed while the upload goes on
        return None

    async def add(self, msg: bpb.CreateBatchRequest) -> Job | None:
        """Store ``msg``'s items; returns an existing job when the idempotency key was used before."""
        if (existing := await self.start(msg.options)) is not None:
            return existing
        await self.add_items(msg.items)
        return None

    async def add_items(self, lines: Iterable[bpb.BatchItem | Refused]) -> None:
        """Validate and store the next lines of the upload (``start`` first)."""
        assert self.job is not None
        items: list[NewItem] = []
        errors: list[ItemError] = []
        for line in lines:
            self.line += 1
            checked = await self._check(line)
            if isinstance(checked, NewItem):
                items.append(checked)
            else:
                errors.append(checked)
        if items:
            for dup in await self.db.rpc("add_items", self.job.id, items):
                errors.append(ItemError(dup.line, dup.custom_id, "ALREADY_EXISTS", "duplicate custom_id in the job"))
        if errors:
            await self.db.rpc("add_errors", self.job.id, errors)

    async def _check(self, item: bpb.BatchItem | Refused) -> NewItem | ItemError:
        line = self.line
        cid = item[0] if isinstance(item, tuple) else item.custom_id
        problem = check_custom_id(cid)
        if problem is None and line > MAX_ITEMS:
            problem = f"a job holds at most {MAX_ITEMS} items"
        if problem is not None:
            return ItemError(line, cid, "INVALID_ARGUMENT", problem)
        if isinstance(item, tuple):
            return NewItem(cid, line, b"", error=ItemError(line, cid, "INVALID_ARGUMENT", item[1]))
        data = item.SerializeToString()
        try:
            seq = await prepare(self.intake, item, f"upload/{cid}")
        except BadRequest as exc:
            return NewItem(cid, line, data, error=ItemError(line, cid, exc.status, str(exc)))
        return NewItem(cid, line, data, sort_key(seq))

    async def finish(self) -> Job:
        if self.job is None:  # an upload without any message: an empty, failed job
            await self.add(bpb.CreateBatchRequest())
        assert self.job is not None
        job: Job = await self.db.rpc("start_job", self.job.id)
        self.uploads.discard(job.id)
        self.job = None
        return job

    async def discard(self) -> None:
        """Delete the job of a broken upload; if the store is down, its lease lapses instead."""
        if self.job is not None:
            job_id, self.job = self.job.id, None
            self.uploads.discard(job_id)
            try:
                await self.db.rpc("discard_job", job_id)
            except StoreUnavailable:
                log.info("batch %s: broken upload left to lapse (store unavailable)", job_id)
