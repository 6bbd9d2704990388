"""The batch scheduler: feeds job items to the engine beside live traffic.

One asyncio task on the server's event loop. Each round it claims queued
items (``JobStore.claim`` marks them RUNNING and commits *before* anything
starts) and runs each through the request lifecycle like any request
(``service.api.intake``: preparation, quotas, telemetry), in the batch tier. At
most ``max_running`` items are in the engine at once (queued there or
running), so live batch-tier streams keep their share.

A reasoning model's item is set up as its live request is (in preparation) and
its result keeps the thought apart (``service.batch.items.outcome``).
An item's terminal event (on the event loop) records its result in the store;
the item leaves the running set only after that commit. An item the engine
did not finish for its own reasons (drain cancelled it, the engine failed,
the queue was full) goes back to queued, never to failed. Items of a job
being cancelled or past its window are aborted (they end within one step).

Crash safety comes from the store: a process killed with items RUNNING gets
them back as queued at the next start (``recover``), and a result is only
recorded for the current claim, so no item ends with two results.

On a store shared by replicas (``SharedJobStore``) claims are leases: the
worker's ``LeaseKeeper`` renews them every ``lease_s / 3``, aborts the runs
whose lease another replica took over, and requeues every replica's expired
leases. Wake-ups come from the store (``ChangeFeed``: another replica started a
job, requeued items, cancelled one) besides local ``notify`` calls; the idle
poll (``idle_s``) is the fallback.

The store may become unreachable (database restart, link cut): a round that
raises ``StoreUnavailable`` is retried with exponential backoff (never past a
lease renewal period); a result write is retried while the item's run is still
ours, so a short outage costs no rework. Nothing here ever ends the server.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from inference.v1 import batch_pb2 as bpb
from opentelemetry import trace

from service.api.flight import Flight
from service.api.intake import Intake
from service.batch.items import item_ask, outcome
from service.batch.leases import LeaseKeeper
from service.batch.store import Claim, ItemResult, ItemState, JobState, StoreUnavailable
from service.batch.store_thread import StoreThread
from service.request.errors import BadRequest
from service.request.events import Error, Event

log = logging.getLogger("service.batch")
ABORT_WHY = {
    JobState.CANCELLING: ("CANCELLED", "the batch was cancelled while this item ran"),
    JobState.EXPIRED: ("DEADLINE_EXCEEDED", "the batch expired while this item ran"),
}
BACKOFF_S = (0.5, 10.0)  # first and longest wait after the store was unavailable
RECORD_RETRY_S = 30.0  # how long a result write is retried without leases (a store of one replica)


@dataclass
class Running:
    """One item in the lifecycle (being prepared, or in the engine)."""

    claim: Claim
    json_item: bool
    span: Any
    flight: Flight | None = None
    events: list[Event] = field(default_factory=list)
    aborted: JobState | None = None  # why we aborted it (job cancelled or expired)
    lost: bool = False  # its lease was taken over by another replica: nothing of it is recorded


class BatchWorker:
    """Claims items from the store and runs them on the intake's engine; see the module docstring."""

    def __init__(
        self, db: StoreThread, intake: Intake, max_running: int, sweep_s: float = 10.0, tracer: Any = None,
        lease_s: float | None = None,
    ) -> None:
        """``lease_s``: the shared store's lease (None: a store of one replica, no leases)."""
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
        self._stopped = asyncio.Event()
        self._backoff_until = 0.0
        self._store_backoff = 0.0
        self._last_sweep = 0.0
        self.lease_s = lease_s
        self.uploads: set[str] = set()  # job ids of uploads this replica is receiving (their leases)
        self.leases = LeaseKeeper(db, lease_s, self.uploads) if lease_s else None
        self.idle_s: Callable[[], float] = lambda: 1.0  # the poll between rounds without a wake-up

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
        self._stopped.set()
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
        while not self._stopping:
            self._wake.clear()
            wait = self.idle_s()
            try:
                await self._round()
                self._store_backoff = 0.0
            except StoreUnavailable:  # StoreThread logged it and reports it; back off, go on
                longest = BACKOFF_S[1] if self.leases is None else min(BACKOFF_S[1], self.leases.period_s)
                wait = self._store_backoff = min(max(self._store_backoff * 2, BACKOFF_S[0]), longest)
            except Exception:  # a bug: log, wait a little, go on
                log.exception("batch scheduling round failed")
                wait = 1.0
            if self.leases is not None and not self._store_backoff:
                wait = min(wait, self.leases.wait_s())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait)

    async def _round(self) -> None:
        """Leases (when due), sweep (every ``sweep_s``), aborts of stopping jobs, then new claims."""
        if self.leases is not None and self.leases.due():
            await self.leases.round([r.claim for r in self.running.values()], self._give_up)
        if time.monotonic() - self._last_sweep >= self.sweep_s:
            await self.db("sweep")
            self._last_sweep, self._check_stopping = time.monotonic(), True
        if self._check_stopping:
            await self._abort_stopping()
            self._check_stopping = False  # NOTE: only once done: a failed check is tried again
        if self._accepting():
            await self._fill()

    def _give_up(self, claim: Claim) -> bool:
        """Another replica took over ``claim``'s item (its lease ran out): abort our run, record nothing.

        NOTE: False for a run that already ended: the store answered "lost" because our own result
        write committed meanwhile (renew and finish run on different store threads), or that write
        will be refused; either way there is nothing to abort.
        """
        run = self.running.get((claim.job_id, claim.custom_id))
        if run is None or run.claim != claim or run.lost or run.flight is None or run.flight.ended:
            return False
        run.lost = True
        run.flight.cancel()
        return True

    def _accepting(self) -> bool:
        return self.intake.unavailable() is None and time.monotonic() >= self._backoff_until

    async def _abort_stopping(self) -> None:
        if not self.running:
            return
        stopping: dict[str, JobState] = await self.db("stopping_jobs")
        for run in list(self.running.values()):
            why = stopping.get(run.claim.job_id)
            if why is not None and run.aborted is None and run.flight is not None:
                run.aborted = why
                run.flight.cancel()

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
        """Run one claimed item through the lifecycle; False when the engine refused it (it is requeued)."""
        item = bpb.BatchItem.FromString(claim.request)
        try:
            ask = item_ask(item, f"{claim.job_id}/{claim.attempt}/{claim.custom_id}", claim.tenant)
        except BadRequest as exc:  # valid at upload, not now
            await self._finish(claim, ItemState.FAILED, ItemResult(error_status=exc.status, error_message=str(exc)))
            return True
        span = self.tracer.start_span(
            "batch_item", attributes={"batch.id": claim.job_id, "batch.attempt": claim.attempt},
            links=_job_link(claim.trace),
        )
        run = Running(claim, item.WhichOneof("request") == "generate_json", span)
        run.flight = flight = self.intake.open(ask, lambda ev, terminal: self._on_event(run, ev, terminal))
        self.running[(claim.job_id, claim.custom_id)] = run
        with trace.use_span(span, end_on_exit=False):  # the request's span becomes its child
            await self.intake.run(flight)
        if flight.refused is None:
            return True
        del self.running[(claim.job_id, claim.custom_id)]  # the engine or a quota is full: run it later
        span.end()
        await self.db("requeue", claim)
        self._backoff_until = time.monotonic() + 0.2
        log.debug("batch item requeued: %s", flight.refused.message)
        return False

    def _on_event(self, run: Running, event: Event, terminal: bool) -> None:
        """Event loop: collect the item's events; its terminal one is recorded in the store."""
        assert run.flight is not None
        if self._stopping or run.flight.refused is not None:
            return  # stopped without drain: the item stays RUNNING (runs again later); refused: requeued
        run.events.append(event)
        if terminal:
            task = asyncio.get_running_loop().create_task(self._record(run))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _record(self, run: Running) -> None:
        claim, last = run.claim, run.events[-1]
        try:
            thought = run.flight.ask.thought if run.flight is not None else None
            state, result = await outcome(run.events, run.json_item, _schema(run), self.intake.grammar, thought)
            not_ours = state is ItemState.CANCELLED and run.aborted is None
            if run.lost:
                pass  # NOTE: another replica runs the item now; the store would refuse this run's result
            elif (isinstance(last, Error) and last.status == "UNAVAILABLE") or not_ours:
                await self._retrying(run, "requeue", claim, True)  # drained or the engine failed: run it later
            else:
                if state is ItemState.CANCELLED and run.aborted is not None:
                    # NOTE: only a run the abort actually cut; one that finished first keeps its result
                    status, message = ABORT_WHY[run.aborted]
                    result = replace(result, error_status=status, error_message=message)
                if await self._retrying(run, "finish", claim, state, result):
                    self.finished.append((time.monotonic(), claim.job_id))
        except StoreUnavailable:
            log.warning("batch item %s/%s: result not recorded (store unavailable); it runs again once its "
                        "claim is given back (lease expiry or the next start)", claim.job_id, claim.custom_id)
        except Exception:
            log.exception("recording a batch item's result failed; it stays running until the next start")
        finally:
            run.span.set_attribute("batch.item_state", str(run.events[-1].__class__.__name__))
            run.span.end()
            self.running.pop((claim.job_id, claim.custom_id), None)
            self.notify()

    async def _retrying(self, run: Running, method: str, *args: Any) -> Any:
        """``db(method, *args)``, retried with backoff while the store is unavailable and the run is ours.

        NOTE: the run stays in ``running`` meanwhile, so its lease is renewed once the store answers;
        gives up (raises) when stopping, when the lease was lost, or after a lease period.
        """
        delay, deadline = BACKOFF_S[0], time.monotonic() + (self.lease_s or RECORD_RETRY_S)
        while True:
            try:
                return await self.db(method, *args)
            except StoreUnavailable:
                if self._stopping or run.lost or time.monotonic() + delay > deadline:
                    raise
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), delay)
            delay = min(delay * 2, BACKOFF_S[1])

    async def _finish(self, claim: Claim, state: ItemState, result: ItemResult) -> None:
        if await self.db("finish", claim, state, result):
            self.finished.append((time.monotonic(), claim.job_id))



def _schema(run: Running) -> str:
    """The JSON Schema an item's document is checked against (GenerateJSON, or a json_schema response
    format), "" for other items."""
    ask = run.flight.ask if run.flight is not None else None
    return ask.fmt[1] if ask is not None and ask.fmt is not None and ask.fmt[0] == "json_schema" else ""


def _job_link(text: str) -> list[trace.Link]:
    """A link to the span of the CreateBatch call that made the job (none when it was not traced)."""
    trace_id, _, span_id = text.partition("-")
    if not span_id:
        return []
    ctx = trace.SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    return [trace.Link(ctx)]
