"""The request lifecycle: the one way into the engine for every front end.

Every request (one of a gRPC ``Generate`` stream's, a ``GenerateJSON``, an
HTTP request of any dialect, a batch item) is an ``Ask`` that its front end
runs through ``Intake.run`` once, as a ``Flight`` (``service.api.flight``).
The stages, in this order (``run`` calls 1-5, ``_on_event`` 6 and 7):

=============  ===================================================================  =======================
stage          what happens                                                         where
=============  ===================================================================  =======================
1 authenticate the caller's credential is still good (revoked: UNAUTHENTICATED)     ``Tenancy.recheck``
2 ready        the drain rule (loading, draining, engine failed: UNAVAILABLE)      ``service.api.readiness``
3 prepare      validate, render, tokenize, compile the grammar: off the event loop  ``service.api.preparer``
4 cache        response-cache lookup and coalescing; a hit is the answer to submit  ``CacheFront.admit``
5 submit       tenant quotas reserved, then engine admission (QueueFull, Draining)  ``Tenancy``, ``Engine``
               (a hit replayed instead); every end reaches 7 through ``seq.emit``
6 stream       each delta: kept for the cache, credential re-checked (<= 1/s),      ``_on_delta``
               delivered; pause and cancel act on the flight
7 finish       each choice's end: quota settled, then the cache record, then       ``_finish``
               telemetry, then delivery: exactly one terminal event per request
=============  ===================================================================  =======================

A refusal at any stage ends the flight with its ``Error`` (``rejection`` maps a
refused submission); nothing here raises to a front end for a bad request.
Event loop only; the engine's events arrive through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc

from service.api.ask import Ask
from service.api.cache_front import CacheFront, Replay
from service.api.flight import Flight, Observer, Sink
from service.api.grammar_service import GrammarService
from service.api.preparer import WORKERS, Preparer
from service.api.readiness import Need, Unavailable, unavailable, unavailable_metadata
from service.api.request_builder import RequestBuilder
from service.continuous_batcher import Draining, Engine
from service.priority import QueueFull
from service.request.errors import BadRequest
from service.request.events import Delta, Done, Error, Event
from service.request.sequence import Sequence
from service.security.auth import current_credential, current_tenant
from service.security.tenancy import Tenancy

log = logging.getLogger("service.rpc")
T = TypeVar("T")
RECHECK_S = 1.0  # a running request sees a revoked credential within this long (plus the file check)


class Refused(Exception):
    """A stage refused the request: the flight ends with ``error``."""

    def __init__(self, error: Error) -> None:
        super().__init__(error.message)
        self.error = error


def rejection(exc: QueueFull | Draining) -> Error:
    """A full queue or quota is RESOURCE_EXHAUSTED with its retry hint; draining or failed, UNAVAILABLE."""
    if isinstance(exc, QueueFull):
        return Error("RESOURCE_EXHAUSTED", str(exc), retry_after_ms=exc.retry_after_ms, quota=exc.quota)
    return Error("UNAVAILABLE", f"{exc}; retry on another replica", exc.reason, retry_after_ms=1000)


class Intake:
    """Runs requests through their lifecycle into one Engine (see the module docstring)."""

    # NOTE: built before the model loads (the server listens and answers health
    # NOT_SERVING meanwhile); ``attach`` supplies the engine once ready.
    engine: Engine
    builder: RequestBuilder
    grammar: GrammarService
    preparer: Preparer

    def __init__(self, telemetry: Observer, tenancy: Tenancy, cache: CacheFront) -> None:
        self.telemetry, self.tenancy, self.cache = telemetry, tenancy, cache
        self.ready = False
        self._runs: set[asyncio.Task[None]] = set()
        # NOTE: one bounded pool for all per-request CPU work (parsing a body, rendering, tokenizing).
        self.workers = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="prepare")

    def attach(self, engine: Engine, builder: RequestBuilder, grammar: GrammarService) -> None:
        self.engine, self.builder, self.grammar = engine, builder, grammar
        self.preparer = Preparer(builder, grammar, self.workers)
        self.ready = True

    async def offload(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` in the lifecycle's worker threads: work whose cost grows with the input
        (a front end's body parsing too) never runs on the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.workers, fn, *args)

    # -- the drain rule (service.api.readiness) -----------------------------------------------------
    def unavailable(self, need: Need = Need.WORK) -> Unavailable | None:
        """Why a call with this ``need`` is refused now, or None."""
        return unavailable(self.engine if self.ready else None, need)

    async def require(self, context: grpc.aio.ServicerContext, need: Need) -> None:
        """Abort the RPC with UNAVAILABLE (reason in the trailing metadata) if ``unavailable(need)``."""
        if (why := self.unavailable(need)) is not None:
            context.set_trailing_metadata(unavailable_metadata(why.reason))
            await context.abort(grpc.StatusCode.UNAVAILABLE, why.message)

    # -- the lifecycle ----------------------------------------------------------------------------
    def open(self, ask: Ask, sink: Sink, after: Flight | None = None) -> Flight:
        """A flight for ``ask`` (admitted after ``after``); the caller's credential and tenant come
        from the call's context."""
        return Flight(ask, sink, self, current_credential(), ask.tenant or current_tenant(), after=after)

    def start(self, ask: Ask, sink: Sink, after: Flight | None = None) -> Flight:
        """``open`` and ``run`` in a task of its own (a stream goes on reading meanwhile)."""
        flight = self.open(ask, sink, after)
        task = asyncio.get_running_loop().create_task(self.run(flight))
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)
        return flight

    async def collect(self, ask: Ask) -> list[Event]:
        """Run ``ask`` to its end: its events, the last one terminal. A cancelled caller cancels it."""
        events: list[Event] = []
        ended = asyncio.get_running_loop().create_future()

        def sink(event: Event, terminal: bool) -> None:
            events.append(event)
            if terminal and not ended.done():  # NOTE: done already when the caller was cancelled
                ended.set_result(None)

        flight = self.open(ask, sink)
        try:
            await self.run(flight)
            await ended
        except asyncio.CancelledError:
            flight.cancel()
            raise
        return events

    async def run(self, f: Flight) -> None:
        """Stages 1-5 for ``f`` (6 and 7 follow from the engine's events); a refusal ends the flight."""
        try:
            self._authenticate(f)
            if (why := self.unavailable(Need.WORK)) is not None:
                raise Refused(Error("UNAVAILABLE", why.message, why.reason, retry_after_ms=1000))
            seqs = await self.prepare(f.ask, f.tenant, f.arrival)
            if f.after is not None:  # NOTE: prepared in parallel, admitted in the order the stream sent them
                await f.after.settled.wait()
                f.after = None
            if self._stopped(f, len(seqs)):
                return
            hit = await self._cached(f, seqs)
            if not f.ended:
                self._submit(f, seqs, hit)
        except Refused as exc:
            self._end(f, exc.error)
        except BadRequest as exc:
            self._end(f, Error(exc.status, str(exc)))
        except Exception as exc:  # a bug or an environment failure: this request only
            log.exception("preparing request failed")
            self._end(f, Error("INTERNAL", f"preparing the request failed: {type(exc).__name__}"))
        finally:
            f.after = None  # NOTE: never a chain of ended flights on a long stream
            f.settled.set()

    def _authenticate(self, f: Flight) -> None:
        """Stage 1: the credential that authenticated the call is still in force."""
        if (denial := self.tenancy.recheck(f.credential)) is not None:
            raise Refused(Error(denial[0].name, denial[1]))
        f.checked_at = time.monotonic()

    async def prepare(self, ask: Ask, tenant: str = "anonymous", arrival: float | None = None) -> list[Sequence]:
        """Stage 3: the request's choices, not submitted; raises BadRequest (also batch uploads' check).

        ``arrival`` (monotonic; default now) is when the request came in: the scheduler orders by it.
        """
        return await self.preparer.prepare(ask, tenant, time.monotonic() if arrival is None else arrival)

    def _stopped(self, f: Flight, choices: int) -> bool:
        """A flight cancelled before submission ends here: each choice CANCELLED, or the cancel's error."""
        if not f.cancelled:
            return False
        ends: list[Event] = [f.cancel_error] if f.cancel_error else [Done.cancelled(i) for i in range(choices)]
        for end in ends[:-1]:
            f.sink(end, False)
        self._end(f, ends[-1])
        return True

    async def _cached(self, f: Flight, seqs: list[Sequence]) -> Replay | None:
        """Stage 4: the response cache's answer to submit (a hit), or None: run it (``f.ticket`` set
        when its answer is to be stored). A flight that ended meanwhile is ended here."""
        # NOTE: a request waiting for an identical one's answer lets its stream's next request go
        outcome = await self.cache.admit(f.ask, seqs[0], lambda: f.cancelled, f.settled.set)
        if isinstance(outcome, Replay) and outcome.hit is None:  # refused, or ended while it waited
            for delta in outcome.deltas:
                f.sink(delta, False)
            self._end(f, outcome.end)
            return None
        if isinstance(outcome, Replay):
            return outcome
        f.ticket = outcome
        if self._stopped(f, len(seqs)):
            self.cache.abandon(f.ticket)
        return None

    def _submit(self, f: Flight, seqs: list[Sequence], hit: Replay | None) -> None:
        """Stage 5: each choice through its tenant's quotas into the engine, or answered by the cache
        (``hit``). Every end, a refusal's too, reaches stage 7 through ``seq.emit``, as the engine's do."""
        for seq in seqs:
            seq.emit = functools.partial(self._on_event, f, seq)
            self.telemetry.on_submit(seq)  # NOTE: telemetry counts a hit as a request that ran
            if f.ticket is not None or hit is not None:
                self.telemetry.cache_hit(seq, hit is not None)
        if hit is not None:  # the answer replayed as the engine would have sent it (nothing to settle)
            f.left = 1
            for event in (*hit.deltas, hit.end):
                seqs[0].emit(event)
            return
        for n, seq in enumerate(seqs):
            try:
                self.tenancy.reserve(seq)  # QuotaExceeded is a QueueFull
                try:
                    self.engine.submit(seq)
                except BaseException:
                    self.tenancy.settle(seq, refused=True)
                    raise
            except (QueueFull, Draining) as exc:
                for earlier in seqs[:n]:  # their terminal events settle them and find the flight ended
                    self.engine.abort(earlier)
                f.refused, f.left = rejection(exc), 1
                seq.emit(f.refused)  # stage 7 as for any end (its reservation is settled already)
                return
        f.seqs, f.left = tuple(seqs), len(seqs)
        f.settled.set()
        for seq in seqs if f.paused else ():  # paused by its front end before it was submitted
            self.engine.pause(seq, True)

    # -- stages 6 and 7: the engine's events ---------------------------------------------------------
    def _on_event(self, f: Flight, seq: Sequence, ev: Event) -> None:
        if isinstance(ev, Delta):
            self._on_delta(f, ev)
        else:
            self._finish(f, seq, ev)

    def _on_delta(self, f: Flight, delta: Delta) -> None:
        """Stage 6: one delta of a running request."""
        if f.ended:
            return
        self.cache.record(f.ticket, delta)
        f.sink(delta, False)
        now = time.monotonic()
        if f.credential is not None and now - f.checked_at >= RECHECK_S:
            f.checked_at = now
            if (denial := self.tenancy.recheck(f.credential)) is not None:
                log.info("the credential of a running request was revoked; ending it")
                f.cancel(Error(denial[0].name, denial[1]))

    def _finish(self, f: Flight, seq: Sequence, ev: Done | Error) -> None:
        """Stage 7: one choice ended. The work at a request's end, in this order, for every choice."""
        self.tenancy.settle(seq)  # 1. quota: the reservation becomes the tokens used
        if not f.ended:
            self.cache.finish(f.ticket, ev)  # 2. response cache: the answer stored, followers woken
        self.telemetry.on_finish(seq, ev)  # 3. telemetry: the request's span and counters
        if f.ended:
            return  # a choice aborted after its request ended (another choice's error)
        f.left -= 1  # 4. delivery
        if isinstance(ev, Error):
            for other in f.seqs:  # one error ends the whole request
                if other is not seq:
                    self.engine.abort(other)
            self._end(f, ev)
        elif f.left > 0:
            f.sink(ev, False)
        else:
            self._end(f, ev)

    def _end(self, f: Flight, ev: Event) -> None:
        """The one place a request's terminal event is delivered."""
        if not f.ended:
            f.ended = True
            f.sink(ev, True)

    # -- what a flight asks of the engine (``service.api.flight.Control``) ---------------------------
    def abort(self, seq: Sequence, error: Error | None = None) -> None:
        """Cancel ``seq`` wherever it is (its terminal event follows from the engine)."""
        self.engine.abort(seq, error)

    def pause(self, seq: Sequence, paused: bool) -> None:
        self.engine.pause(seq, paused)

    def close(self) -> None:
        self.workers.shutdown(wait=False, cancel_futures=True)
