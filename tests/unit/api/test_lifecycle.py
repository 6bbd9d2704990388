"""The request lifecycle's contract (service/api/intake.py), without the model.

The engine and the prepare stage are stand-ins here (the engine records what it is asked; preparation
returns ready Sequences or blocks on an event); tenancy, quotas, the cache front and telemetry are the
real classes, recording the order in which the lifecycle calls them. The real engine and preparation
are covered by tests/model (api, http, batch).
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from service.api.ask import Ask
from service.api.cache_front import CacheFront
from service.api.intake import Intake
from service.api.preparer import Preparer as RealPreparer
from service.continuous_batcher import Draining
from service.model.chat import ChatTemplate
from service.observability.telemetry import Telemetry
from service.priority import QueueFull
from service.request.choices import link_choices
from service.request.errors import BadRequest
from service.request.events import Delta, Done, Error, Event
from service.request.sequence import FinishReason, Priority, SamplingParams, SeqStatus, Sequence
from service.response_cache.cache import Ticket
from service.security.tenancy import Tenancy

Order = list[str]


class Engine:
    """Records submits, aborts and pauses; ``refuse`` makes the next submit raise it."""

    failure: str | None = None
    draining = False

    def __init__(self) -> None:
        self.submitted: list[Sequence] = []
        self.aborted: list[tuple[Sequence, Error | None]] = []
        self.paused: list[tuple[Sequence, bool]] = []
        self.refuse: Exception | None = None

    def submit(self, seq: Sequence) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.submitted.append(seq)

    def abort(self, seq: Sequence, error: Error | None = None) -> None:
        self.aborted.append((seq, error))

    def pause(self, seq: Sequence, paused: bool) -> None:
        self.paused.append((seq, paused))


class Preparer:
    """Returns ``n`` linked Sequences; with ``gate``, waits for it in a worker thread first (slow preparation)."""

    def __init__(self, n: int = 1, gate: threading.Event | None = None, fail: Exception | None = None) -> None:
        self.n, self.gate, self.fail = n, gate, fail
        self.started = threading.Event()

    async def prepare(self, ask: Ask, tenant: str, arrival: float = 0.0) -> list[Sequence]:
        self.started.set()
        if self.gate is not None:
            await asyncio.to_thread(self.gate.wait, 30)
        if self.fail is not None:
            raise self.fail
        params = SamplingParams(max_tokens=4, n=self.n)
        seqs = [Sequence(ask.request_id, [1, 2, 3], params, arrival=arrival) for _ in range(self.n)]
        for seq in seqs:
            seq.tenant = tenant
        return link_choices(seqs)


class Recording(Telemetry):
    def __init__(self, order: Order) -> None:
        super().__init__()
        self.order = order

    def on_finish(self, seq: Sequence, event: Any) -> None:
        self.order.append("telemetry")


class RecordingTenancy(Tenancy):
    def __init__(self, order: Order) -> None:
        super().__init__()
        self.order = order

    def settle(self, seq: Sequence, refused: bool = False) -> None:
        self.order.append("settle refused" if refused else "settle")
        super().settle(seq, refused)


class RecordingCache(CacheFront):
    def __init__(self, order: Order) -> None:
        super().__init__(None)
        self.order = order

    def finish(self, ticket: Ticket | None, event: Done | Error) -> None:
        self.order.append("cache")

    def abandon(self, ticket: Ticket | None) -> None:
        self.order.append("cache abandoned")


class Harness:
    def __init__(self, preparer: Preparer) -> None:
        self.order: Order = []
        self.engine = Engine()
        self.intake = Intake(Recording(self.order), RecordingTenancy(self.order), RecordingCache(self.order))
        self.intake.engine = self.engine  # type: ignore[assignment]
        self.intake.preparer = preparer  # type: ignore[assignment]
        self.intake.ready = True
        self.events: list[tuple[Event, bool]] = []

    def sink(self, event: Event, terminal: bool) -> None:
        self.order.append("deliver terminal" if terminal else "deliver")
        self.events.append((event, terminal))

    def done(self, seq: Sequence) -> Done:
        seq.status, seq.finish_reason, seq.finish_time = SeqStatus.FINISHED, FinishReason.STOP, seq.arrival
        return Done.of(seq)


def ask(rid: str = "r") -> Ask:
    return Ask(rid, prompt="hi")


async def test_a_requests_end_is_settled_then_cached_then_traced_then_delivered_once() -> None:
    h = Harness(Preparer())
    flight = h.intake.open(ask(), h.sink)
    await h.intake.run(flight)
    (seq,) = h.engine.submitted
    seq.emit(Delta("ok", (5,)))
    h.order.clear()
    seq.emit(h.done(seq))
    seq.emit(h.done(seq))  # a second terminal event (a late abort) is never delivered
    assert h.order[:4] == ["settle", "cache", "telemetry", "deliver terminal"]
    assert [t for _, t in h.events] == [False, True]
    assert h.intake.tenancy.quotas.snapshot()["anonymous"]["in_flight"] == 0


async def test_each_choice_delivers_its_done_and_the_last_one_ends_the_request() -> None:
    h = Harness(Preparer(n=3))
    flight = h.intake.open(ask(), h.sink)
    await h.intake.run(flight)
    for seq in h.engine.submitted:
        seq.emit(h.done(seq))
    assert [(type(e).__name__, getattr(e, "choice_index", None), t) for e, t in h.events] == [
        ("Done", 0, False), ("Done", 1, False), ("Done", 2, True)
    ]


async def test_one_choices_error_ends_the_request_and_aborts_the_others() -> None:
    h = Harness(Preparer(n=2))
    flight = h.intake.open(ask(), h.sink)
    await h.intake.run(flight)
    first, second = h.engine.submitted
    first.emit(Error("INTERNAL", "boom"))
    assert h.events == [(Error("INTERNAL", "boom"), True)]
    assert [s for s, _ in h.engine.aborted] == [second]
    second.emit(Done.cancelled(1))  # the aborted choice ends later: settled and traced, not delivered
    assert h.order.count("settle") == 2 and h.order.count("telemetry") == 2
    assert len(h.events) == 1


class SlowBuilder:
    """The request builder's face, its tokenization held by ``gate`` (a huge chat being rendered)."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate, self.started = gate, threading.Event()
        self.thread: threading.Thread | None = None
        self.template = ChatTemplate(None)
        self.vocab = SimpleNamespace(token_bytes=[b"a"] * 8)

    def priority(self, value: int) -> Priority:
        return Priority.INTERACTIVE

    def prompt_ids(self, prompt: str, messages: list[Any], tools: Any = (), kwargs: str = "") -> list[int]:
        self.thread = threading.current_thread()
        self.started.set()
        self.gate.wait(30)
        return [1, 2, 3]

    def sampling(self, sp: Any, num_prompt: int, json_mode: bool = False, json_output: bool = False) -> SamplingParams:
        return SamplingParams(max_tokens=4)


async def test_the_event_loop_runs_while_a_request_is_prepared() -> None:
    """The real prepare stage renders and tokenizes in a worker thread: the loop turns meanwhile."""
    gate = threading.Event()
    builder = SlowBuilder(gate)
    h = Harness(Preparer())
    h.intake.preparer = RealPreparer(builder, None, h.intake.workers)  # type: ignore[arg-type]
    flight = h.intake.start(ask(), h.sink)
    await asyncio.to_thread(builder.started.wait, 30)
    ticks = 0
    for _ in range(5):  # the loop keeps turning while the preparation is held
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 5 and not flight.ended and h.engine.submitted == []
    assert builder.thread is not None and builder.thread is not threading.current_thread()
    gate.set()
    while not h.engine.submitted:
        await asyncio.sleep(0.01)
    assert h.engine.submitted[0].token_ids == [1, 2, 3]
    h.intake.close()


async def test_a_cancel_during_preparation_ends_every_choice_cancelled_without_the_engine() -> None:
    gate = threading.Event()
    h = Harness(Preparer(n=2, gate=gate))
    flight = h.intake.open(ask(), h.sink)
    run = asyncio.create_task(h.intake.run(flight))
    flight.cancel()
    gate.set()
    await run
    assert h.engine.submitted == []
    assert [(e, t) for e, t in h.events] == [(Done.cancelled(0), False), (Done.cancelled(1), True)]


async def test_a_cancel_with_an_error_before_submission_ends_with_that_error() -> None:
    gate = threading.Event()
    h = Harness(Preparer(gate=gate))
    flight = h.intake.open(ask(), h.sink)
    run = asyncio.create_task(h.intake.run(flight))
    flight.cancel(Error("UNAUTHENTICATED", "revoked"))
    gate.set()
    await run
    assert h.events == [(Error("UNAUTHENTICATED", "revoked"), True)]


@pytest.mark.parametrize(
    ("refusal", "status", "retry_ms"),
    [(QueueFull(Priority.BATCH, 4, 250), "RESOURCE_EXHAUSTED", 250), (Draining("draining"), "UNAVAILABLE", 1000)],
)
async def test_a_refused_submission_settles_refused_and_ends_with_the_refusal(
    refusal: Exception, status: str, retry_ms: int
) -> None:
    h = Harness(Preparer())
    h.engine.refuse = refusal
    flight = h.intake.open(ask(), h.sink)
    await h.intake.run(flight)
    assert flight.refused is not None and flight.refused.status == status
    assert flight.refused.retry_after_ms == retry_ms
    # the refused choice's end then runs stage 7 like any end: settle (nothing reserved any more),
    # the cache's followers woken without an answer, telemetry, delivery
    assert h.order == ["settle refused", "settle", "cache", "telemetry", "deliver terminal"]
    assert h.events == [(flight.refused, True)]


async def test_a_bad_request_ends_with_its_status_and_a_bug_with_internal() -> None:
    h = Harness(Preparer(fail=BadRequest("max_tokens too large", "OUT_OF_RANGE")))
    flight = h.intake.open(ask(), h.sink)
    await h.intake.run(flight)
    assert h.events == [(Error("OUT_OF_RANGE", "max_tokens too large"), True)]
    h = Harness(Preparer(fail=KeyError("secret detail")))
    flight = h.intake.open(ask(), h.sink)
    await h.intake.run(flight)
    ((event, terminal),) = h.events
    assert isinstance(event, Error) and event.status == "INTERNAL" and "secret" not in event.message and terminal


async def test_a_pause_before_submission_is_applied_at_submission() -> None:
    h = Harness(Preparer(n=2))
    flight = h.intake.open(ask(), h.sink)
    flight.pause(True)
    await h.intake.run(flight)
    assert h.engine.paused == [(s, True) for s in h.engine.submitted]


async def test_a_draining_server_refuses_before_preparing() -> None:
    preparer = Preparer()
    h = Harness(preparer)
    h.engine.draining = True
    flight = h.intake.open(ask(), h.sink)
    await h.intake.run(flight)
    ((event, _),) = h.events
    assert isinstance(event, Error) and (event.status, event.reason) == ("UNAVAILABLE", "draining")
    assert not preparer.started.is_set()


class GatedPreparer(Preparer):
    """Holds the preparation of the asks named in ``gates`` until their event is set."""

    def __init__(self, gates: dict[str, threading.Event]) -> None:
        super().__init__()
        self.gates = gates

    async def prepare(self, ask: Ask, tenant: str, arrival: float = 0.0) -> list[Sequence]:
        if (gate := self.gates.get(ask.request_id)) is not None:
            await asyncio.to_thread(gate.wait, 30)
        return await super().prepare(ask, tenant, arrival)


async def test_requests_of_one_stream_enter_the_engine_in_the_order_sent() -> None:
    """The first request's preparation is slow, the second's instant: the second still waits its turn."""
    slow = threading.Event()
    h = Harness(GatedPreparer({"first": slow}))
    first = h.intake.start(ask("first"), h.sink)
    second = h.intake.start(ask("second"), h.sink, after=first)
    third = h.intake.start(ask("third"), h.sink, after=second)
    for _ in range(20):
        await asyncio.sleep(0)
    assert h.engine.submitted == [] and not second.settled.is_set()
    slow.set()
    await asyncio.wait_for(third.settled.wait(), 30)
    assert [s.request_id for s in h.engine.submitted] == ["first", "second", "third"]
    arrivals = [s.arrival for s in h.engine.submitted]  # the scheduler's order: when each was sent
    assert arrivals == sorted(arrivals) and arrivals[0] == first.arrival
    assert second.after is None and third.after is None  # nothing chains ended flights together
