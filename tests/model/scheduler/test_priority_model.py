"""Priority scheduling with the real model: fast interactive admission, exact resume, overload control."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from service.request.sequence import Priority
from tests.support.clock import ShiftedClock
from tests.support.helpers import (
    EngineHold,
    MarginRecorder,
    OpenStream,
    assert_same_greedy,
    req,
    run_stream,
    wait_for,
)
from tests.support.server import RunningServer, assert_kv_clean, start_server, wait_idle

pytestmark = pytest.mark.model

# The batch requests' length: the interactive one arrives a few steps in (the engine is held for it),
# so most of each preempted request's tokens come after its resume and are compared.
BATCH_TOKENS = 40
TOPICS = ("rivers", "mountains", "volcanoes", "deserts", "glaciers", "forests", "oceans", "islands")


def batch_reqs(n_tokens: int) -> list[pb.GenerateRequest]:
    return [
        req(
            f"b{i}",
            f"An encyclopedia entry about {t}:",
            n_tokens,
            ignore_eos=True,
            priority=pb.PRIORITY_BATCH,
        )
        for i, t in enumerate(TOPICS)
    ]


def test_interactive_preempts_full_batch_and_batch_output_is_unchanged(
    server: RunningServer, channel: grpc.Channel
) -> None:
    eng = server.engine
    assert eng.config.max_running == 8
    rec = MarginRecorder()
    eng.logits_hook = rec
    try:
        reference = run_stream(channel, batch_reqs(BATCH_TOKENS))  # never preempted
    finally:
        eng.logits_hook = None
    wait_idle(server)

    stream = OpenStream(channel)
    for r in batch_reqs(BATCH_TOKENS):
        stream.send(r)
    assert wait_for(lambda: len(eng.scheduler.running) == 8, interval=0.002), "the batch never filled every place"
    preempt_before = eng.scheduler.preemptions.copy()
    # NOTE: the engine holds after a step until "inter" is submitted: the batch cannot run on to its end
    # (and free places) while a busy machine delays the RPC.
    with EngineHold(eng, until=lambda: eng.admission.depth(Priority.INTERACTIVE) >= 1):
        stream.send(req("inter", "Quick question: what is 2+2?", 4, priority=pb.PRIORITY_INTERACTIVE))
        # Count engine steps from the moment the engine has the request (the RPC path before it is not ours).
        while not any(s.request_id == "inter" for s in list(eng.scheduler.waiting) + list(eng.scheduler.running)):
            time.sleep(0.001)
        steps_before = eng.metrics.steps
    results: dict[str, list[int]] = {}
    first_inter_step = None
    finished = set()
    while len(finished) < 9:
        ev = stream.next_event()
        kind = ev.WhichOneof("event")
        if kind == "delta":
            if ev.request_id == "inter" and first_inter_step is None:
                first_inter_step = eng.metrics.steps
            results.setdefault(ev.request_id, []).extend(ev.delta.token_ids)
        else:
            assert kind == "done", ev
            finished.add(ev.request_id)
    stream.close()
    stream.join()
    assert first_inter_step is not None and first_inter_step - steps_before <= 4, (
        steps_before,
        first_inter_step,
    )
    gained = eng.scheduler.preemptions - preempt_before
    assert gained[(Priority.BATCH, "priority")] >= 1, gained  # this test's own preemptions (a delta)
    for rid, ref in reference.items():
        assert_same_greedy(ref.token_ids, results[rid], rec.rows[rid])
    assert_kv_clean(server)


@pytest.fixture(scope="module")
def tight() -> RunningServer:
    srv = start_server(
        max_running=1, queue_limit_interactive=1, queue_limit_batch=1, kv_lanes=8, step_tokens=64
    )
    yield srv
    srv.close()


def test_queue_limit_rejects_with_retry_hint(tight: RunningServer) -> None:
    rejected_before = tight.engine.metrics.snapshot()["tiers"][0]["rejected"]

    def rejected_now() -> int:
        return int(tight.engine.metrics.snapshot()["tiers"][0]["rejected"] - rejected_before)

    # NOTE: "a" runs, "b" takes the one queue place (or is refused too, if it came before "a" left the
    # queue); the engine holds after a step until "c" and "d" were refused, so "a" cannot have
    # finished and freed the places first on a busy machine.
    with grpc.insecure_channel(tight.target) as ch:
        with EngineHold(tight.engine, until=lambda: rejected_now() >= 2):
            out = run_stream(
                ch,
                [
                    req("a", "Tell me a story.", 40, ignore_eos=True),
                    req("b", "Hi", 4),
                    req("c", "Hello", 4),
                    req("d", "Hey", 4),
                ],
            )
        errors = {k: r.error for k, r in out.items() if r.error is not None}
        assert errors, "a full interactive queue must reject"
        for e in errors.values():
            assert e.status == "RESOURCE_EXHAUSTED" and e.retry_after_ms > 0
            assert f"retry after {e.retry_after_ms} ms" in e.message
        assert out["a"].done is not None
        # Unary: RESOURCE_EXHAUSTED with trailing metadata.
        stream = OpenStream(ch)
        # NOTE: "long" must outlast the unary call's grammar compile, which runs
        # before admission; the stream is cancelled once the check is done.
        # "queued" goes only after "long" has left the queue, or it would be rejected itself.
        stream.send(req("long", "Tell me a long story.", 1000, ignore_eos=True))
        assert stream.next_event().request_id == "long"
        stream.send(req("queued", "Hi", 4))
        # NOTE: the stream's messages reach the server asynchronously; reject only
        # once "queued" really holds the one queue place.
        assert wait_for(lambda: tight.engine.admission.depth(Priority.INTERACTIVE) == 1)
        stub = pb_grpc.InferenceServiceStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.GenerateJSON(pb.GenerateJSONRequest(prompt="x", json_schema='{"type":"object"}'))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        meta = dict(info.value.trailing_metadata() or ())
        assert int(meta["retry-after-ms"]) > 0
        stream.call.cancel()
        stream.join()
    rejected = tight.engine.metrics.snapshot()["tiers"][0]["rejected"] - rejected_before
    assert rejected == len(errors) + 1  # the stream's rejections and the unary call
    assert_kv_clean(tight)


# A deadline far beyond the test's run: only the scheduler's clock, moved forward, reaches it.
RPC_TIMEOUT_S = 60.0


def test_deadline_expires_in_queue_without_running(tight: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine itself ends a queued request at its deadline: it is never scheduled, and the
    client gets the server's DEADLINE_EXCEEDED event (not just the RPC's own timeout).

    NOTE: the request's deadline is its RPC's (generous); the scheduler's clock jumps past it once
    the request is submitted, so the server's event comes at once and the RPC's own timer, a
    minute away, cannot race it on any machine.
    """
    wait_idle(tight)  # no other traffic: "long" below holds the only running place
    clock = ShiftedClock()
    monkeypatch.setattr(tight.engine.scheduler, "_clock", clock)
    submitted: list = []
    submit = tight.engine.submit

    def spy(seq: Any) -> None:
        submit(seq)
        submitted.append(seq)
        if seq.request_id == "late":
            clock.advance(2 * RPC_TIMEOUT_S)  # queued now: for the scheduler, its deadline has passed

    monkeypatch.setattr(tight.engine, "submit", spy)
    with grpc.insecure_channel(tight.target) as ch:
        stream = OpenStream(ch)
        # Same tier: no preemption; "long" holds the only running place for the whole test.
        stream.send(req("long", "Tell me a long story.", 2000, ignore_eos=True))
        stream.next_event()
        sent = time.monotonic()
        late = run_stream(ch, [req("late", "Hi", 4)], timeout=RPC_TIMEOUT_S)["late"]
        answered = time.monotonic()
        stream.call.cancel()
        stream.join()
    assert late.error is not None and late.error.status == "DEADLINE_EXCEEDED", late
    assert "queued" in late.error.message and late.text == ""
    seq = next(s for s in submitted if s.request_id == "late")
    # The deadline the scheduler expired is the RPC's (service.api.readiness.rpc_deadline), within
    # a second: gRPC's timeout header keeps few digits, rounded up.
    assert sent + RPC_TIMEOUT_S - 1.0 < seq.deadline < answered + RPC_TIMEOUT_S + 1.0
    assert seq.first_scheduled is None and seq.num_computed == 0  # never ran
    assert_kv_clean(tight)
