"""The batch scheduler: feeds job items to the engine beside live traffic.

One asyncio task on the server's event loop. Each round it claims queued
items (``JobStore.claim`` marks them RUNNING and commits *before* anything
starts), prepares them like any request (``service.batch.items.prepare``) and
submits them in the batch tier through the intake (quotas, telemetry). At
most ``max_running`` items are in the engine at once (queued there or
running), so live batch-tier streams keep their share.

An item's terminal event (on the event loop) records its result in the store;
the item leaves the running set only after that commit. An item the engine
did not finish for its own reasons (drain cancelled it, the engine failed,
the queue was full) goes back to queued, never to failed. Items of a job
being cancelled or past its window are aborted (they end within one step).

Crash safety comes from the store: a process killed with items RUNNING gets
them back as queued at the next start (``recover``), and a result is only
recorded for the current claim, so no item ends with two results.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from inference.v1 import batch_pb2 as bpb
from opentelemetry import trace

from service.api.intake import Intake
from service.batch.items import StoreThread, outcome, prepare
from service.batch.store import Claim, ItemResult, ItemState, JobState
from service.continuous_batcher import Draining
from service.priority import QueueFull
from service.request.errors import BadRequest
from service.request.events import Done, Error
from service.request.sequence import Sequence

log = logging.getLogger("service.batch")
ABORT_WHY = {
    JobState.CANCELLING: ("CANCELLED", "the batch was cancelled while this item ran"),
    JobState.EXPIRED: ("DEADLINE_EXCEEDED", "the batch expired while this item ran"),
}


@dataclass
class Running:
    """One item in the engine."""

    claim: Claim
    seq: Sequence
    json_item: bool
    span: Any
    events: list[Any] = field(default_factory=list)
    aborted: JobState | None = None  # why we aborted it (job cancelled or expired)


class BatchWorker:
    """Claims items from the store and runs them on the intake's engine; see the module docstring."""

    def __init__(
        self, db: StoreThread, intake: Intake, max_running: int, sweep_s: float = 10.0, tracer: Any = None
    ) -> None:
        self.db = db
        self.tracer = tracer or trace.NoOpTracer()  # one span per item run, parent of its request span
        self.intake = intake
        self.max_running = max_running
        self.sweep_s = sweep_s
        self.running: dict[tuple[str, str], Running] = {}
        self.finished: collections.deque[tuple[float, str]] = collections.deque(maxlen=8192)
        self._wake = asyncio.Event()
        self._check_stopping = True
        self._pending: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._backoff_until = 0.0

    async def start(self) -> None:
        """Start the scheduling task (the store was recovered before the server listened)."""
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def notify(self, stopping: bool = False) -> None:
        """Something changed (new job, item finished, cancel): run a round now."""
        self._check_stopping |= stopping
        self._wake.set()

    async def stop(self) -> None:
        """Stop scheduling and wait for result writes in progress; items still in the engine stay
        RUNNING in the store (the next start requeues them)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    def rate(self, job_id: str | None = None, window_s: float = 10.0) -> float:
        """Items finished per second over the last ``window_s`` (one job's, or all)."""
        since = time.monotonic() - window_s
        n = sum(1 for t, j in reversed(self.finished) if t >= since and (job_id is None or j == job_id))
        return n / window_s

    # -- the loop -----------------------------------------------------------------------------
    async def _loop(self) -> None:
        last_sweep = 0.0
        while not self._stopping:
            self._wake.clear()
            try:
                if time.monotonic() - last_sweep >= self.sweep_s:
                    await self.db("sweep")
                    last_sweep, self._check_stopping = time.monotonic(), True
                if self._check_stopping:
                    self._check_stopping = False
                    await self._abort_stopping()
                if self._accepting():
                    await self._fill()
            except Exception:  # the store or a bug: log, wait a little, go on
                log.exception("batch scheduling round failed")
                await asyncio.sleep(1.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=1.0)

    def _accepting(self) -> bool:
        return self.intake.unavailable() is None and time.monotonic() >= self._backoff_until

    async def _abort_stopping(self) -> None:
        if not self.running:
            return
        stopping: dict[str, JobState] = await self.db("stopping_jobs")
        for run in list(self.running.values()):
            why = stopping.get(run.claim.job_id)
            if why is not None and run.aborted is None:
                run.aborted = why
                self.intake.abort(run.seq)

    async def _fill(self) -> None:
        free = self.max_running - len(self.running)
        if free <= 0:
            return
        claims = await self.db("claim", free)
        for n, claim in enumerate(claims):
            if not await self._launch(claim):  # the engine is full: the rest waits for the next round
                for rest in claims[n + 1 :]:
                    await self.db("requeue", rest)
                return

    async def _launch(self, claim: Claim) -> bool:
        """Prepare and submit one claimed item; False when the engine refused it (it is requeued)."""
        item = bpb.BatchItem.FromString(claim.request)
        try:
            seq = await prepare(self.intake, item, f"{claim.job_id}/{claim.attempt}/{claim.custom_id}")
        except BadRequest as exc:  # valid at upload, not now (e.g. the server's limits changed)
            await self._finish(claim, ItemState.FAILED, ItemResult(error_status=exc.status, error_message=str(exc)))
            return True
        except Exception as exc:
            log.exception("preparing a batch item failed")
            failed = ItemResult(error_status="INTERNAL", error_message=f"preparing the item failed: {exc!r}")
            await self._finish(claim, ItemState.FAILED, failed)
            return True
        seq.tenant = claim.tenant  # NOTE: the job's tenant, not the (absent) caller's
        span = self.tracer.start_span(
            "batch_item", attributes={"batch.id": claim.job_id, "batch.attempt": claim.attempt},
            links=_job_link(claim.trace),
        )
        run = Running(claim, seq, item.WhichOneof("request") == "generate_json", span)
        seq.emit = lambda ev: self._on_event(run, ev)
        self.running[(claim.job_id, claim.custom_id)] = run
        try:
            with trace.use_span(span, end_on_exit=False):  # the request's span becomes its child
                self.intake.submit(seq)
        except (QueueFull, Draining) as exc:
            del self.running[(claim.job_id, claim.custom_id)]
            span.end()
            await self.db("requeue", claim)
            self._backoff_until = time.monotonic() + 0.2
            log.debug("batch item requeued: %s", exc)
            return False
        return True

    def _on_event(self, run: Running, event: Any) -> None:
        """Event loop: collect the item's events; its terminal one is recorded in the store."""
        if self._stopping:
            return  # stopped without drain: the item stays RUNNING in the store and runs again later
        run.events.append(event)
        if isinstance(event, Done | Error):
            self.intake.finished(run.seq, event)
            task = asyncio.get_running_loop().create_task(self._record(run))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _record(self, run: Running) -> None:
        claim, last = run.claim, run.events[-1]
        try:
            state, result = outcome(run.seq, run.events, run.json_item, self.intake.grammar)
            not_ours = state is ItemState.CANCELLED and run.aborted is None
            if (isinstance(last, Error) and last.status == "UNAVAILABLE") or not_ours:
                await self.db("requeue", claim, True)  # drained or the engine failed: run it again later
            else:
                if state is ItemState.CANCELLED and run.aborted is not None:
                    # NOTE: only a run the abort actually cut; one that finished first keeps its result
                    status, message = ABORT_WHY[run.aborted]
                    result = replace(result, error_status=status, error_message=message)
                await self._finish(claim, state, result)
        except Exception:
            log.exception("recording a batch item's result failed; it stays running until the next start")
        finally:
            run.span.set_attribute("batch.item_state", str(run.events[-1].__class__.__name__))
            run.span.end()
            self.running.pop((claim.job_id, claim.custom_id), None)
            self.notify()

    async def _finish(self, claim: Claim, state: ItemState, result: ItemResult) -> None:
        if await self.db("finish", claim, state, result):
            self.finished.append((time.monotonic(), claim.job_id))



def _job_link(text: str) -> list[trace.Link]:
    """A link to the span of the CreateBatch call that made the job (none when it was not traced)."""
    trace_id, _, span_id = text.partition("-")
    if not span_id:
        return []
    ctx = trace.SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    return [trace.Link(ctx)]
