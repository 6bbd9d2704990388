"""Hostile and careless clients, and a failing engine: nothing hangs, nothing is lost.

Each test reproduces a defect that once existed (issue "Hardening"): every
request id gets exactly one terminal event, every stream ends, a failing
engine is reported (health, statuses, exit code) instead of hanging callers.
Faults are injected into the real server's components; the engine is never mocked.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from service.__main__ import ENGINE_FAILED_EXIT, run_until_stopped
from service.request.sequence import Priority
from tests.support.helpers import OpenStream, collect, req, run_stream
from tests.support.server import RunningServer, assert_kv_clean, start_server, wait_idle
from tests.support.waiting import until

pytestmark = pytest.mark.model


def terminals(events: list[pb.GenerateResponse]) -> Counter[str]:
    return Counter(e.request_id for e in events if e.WhichOneof("event") in ("done", "error"))


def drain(stream: OpenStream) -> list[pb.GenerateResponse]:
    out = []
    while not stream.events.empty():
        out.append(stream.events.get())
    return out


def prepare_until_cancelled(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hold grammar preparation (a slow schema compile) until the request's flight is cancelled."""
    intake, grammar = server.server.intake, server.server.intake.grammar
    real_open, real_matcher = intake.open, grammar.matcher_for
    flights: list[Any] = []

    def open_(*args: Any, **kwargs: Any) -> Any:
        flights.append(flight := real_open(*args, **kwargs))
        return flight

    async def slow(kind: str, source: str) -> Any:
        assert await until(lambda: all(f.cancelled for f in flights), timeout=600), "the cancel never came"
        return await real_matcher(kind, source)

    monkeypatch.setattr(intake, "open", open_)
    monkeypatch.setattr(grammar, "matcher_for", slow)


def fresh_schema() -> str:
    return json.dumps({"type": "object", "properties": {f"k{uuid.uuid4().hex[:8]}": {"type": "integer"}}})


def test_cancel_during_preparation_ends_the_stream(
    server: RunningServer, channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepare_until_cancelled(server, monkeypatch)  # the cancel provably comes during preparation
    stream = OpenStream(channel, timeout=600)
    stream.send(req("j", "x", 8, response_format=pb.ResponseFormat(json_schema=fresh_schema())))
    stream.send(pb.GenerateRequest(request_id="j", cancel=True))
    stream.close()
    stream.join(120)
    assert not hasattr(stream, "error"), stream.error  # the RPC completed: no DEADLINE_EXCEEDED
    events = drain(stream)
    assert [e.WhichOneof("event") for e in events] == ["done"]
    assert events[0].done.finish_reason == pb.FINISH_REASON_CANCELLED


def test_failure_inside_prepare_becomes_an_error_event(
    server: RunningServer, channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(kind: str, source: str) -> Any:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(server.server.intake.grammar, "matcher_for", broken)
    fmt = pb.ResponseFormat(json_schema=fresh_schema())
    out = run_stream(channel, [req("bad", "x", 4, response_format=fmt), req("ok", "Hello", 4)], timeout=600)
    assert out["bad"].error is not None and out["bad"].error.status == "INTERNAL"
    assert "injected" not in out["bad"].error.message  # no internals leak to the client
    assert out["ok"].done is not None and out["ok"].done.usage.completion_tokens == 4
    stub = pb_grpc.InferenceServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.GenerateJSON(pb.GenerateJSONRequest(prompt="x", json_schema=fresh_schema()), timeout=600)
    assert info.value.code() == grpc.StatusCode.INTERNAL


def test_stop_strings_with_a_json_schema_are_rejected_up_front(channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "string"}}})
    with pytest.raises(grpc.RpcError) as info:
        stub.GenerateJSON(
            pb.GenerateJSONRequest(prompt="x", json_schema=schema, sampling=pb.SamplingParams(stop=["}"])),
            timeout=30,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "stop" in info.value.details()
    fmt = pb.ResponseFormat(json_schema=schema)
    out = run_stream(channel, [req("s", "x", 8, response_format=fmt, stop=["}"])], timeout=600)
    assert out["s"].error is not None and out["s"].error.status == "INVALID_ARGUMENT"


def test_cancel_racing_completion_gives_exactly_one_terminal_event(channel: grpc.Channel) -> None:
    stream = OpenStream(channel, timeout=600)
    for i in range(30):
        stream.send(req(f"r{i}", "Hi", 1 + i % 3))
        stream.send(pb.GenerateRequest(request_id=f"r{i}", cancel=True))
    stream.send(req("after", "Hi", 2))
    seen = []
    while True:  # wait for "after" to finish, then cancel it late
        seen.append(ev := stream.next_event())
        if ev.request_id == "after" and ev.WhichOneof("event") == "done":
            break
    stream.send(pb.GenerateRequest(request_id="after", cancel=True))
    stream.send(pb.GenerateRequest(request_id="never-sent", cancel=True))
    stream.close()
    stream.join(60)
    assert not hasattr(stream, "error")
    events = seen + drain(stream)
    counts = terminals(events)
    assert {f"r{i}": 1 for i in range(30)} == {k: v for k, v in counts.items() if k.startswith("r")}
    assert counts["after"] == 1
    unknown = [e for e in events if e.request_id == "never-sent"]
    assert len(unknown) == 1 and unknown[0].error.status == "NOT_FOUND"


def test_one_failing_row_ends_only_its_own_request(
    server: RunningServer, channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A detokenizer failure on one row, in the step where the others finish: they all get done."""
    intake = server.server.intake
    real = intake.prepare

    class Failing:
        def __init__(self, inner: Any, at: int) -> None:
            self.inner, self.at, self.n = inner, at, 0
            self.stopped = False

        def push(self, token: int) -> str:
            self.n += 1
            if self.n == self.at:
                raise UnicodeError("injected detokenizer failure")
            return str(self.inner.push(token))

        def flush(self) -> str:
            return str(self.inner.flush())

    async def prepare(ask: Any, *args: Any) -> Any:
        seqs = await real(ask, *args)
        if ask.request_id == "bad":
            seqs[0].text = Failing(seqs[0].text, at=6)
        return seqs

    monkeypatch.setattr(intake, "prepare", prepare)
    reqs = [req(rid, "Hello there", 6, ignore_eos=True) for rid in ("ok1", "bad", "ok2")]
    out = run_stream(channel, reqs, timeout=600)
    assert out["bad"].error is not None and out["bad"].error.status == "INTERNAL"
    for rid in ("ok1", "ok2"):
        assert out[rid].done is not None and out[rid].done.usage.completion_tokens == 6, out[rid]
    assert_kv_clean(server)


def test_garbage_bytes_are_invalid_argument_on_every_method(channel: grpc.Channel) -> None:
    garbage = [b"\xff\xff\xff", b"\x0a\x02\xc3\x28", b"\x12\x05hello\x1a\xff"]  # bad wire, bad UTF-8
    for method in ("GenerateJSON", "GetMetrics"):
        call = channel.unary_unary(f"/inference.v1.InferenceService/{method}")
        for data in garbage:
            if method == "GetMetrics" and data == garbage[1]:
                continue  # an unknown length-delimited field: a legal (empty) GetMetricsRequest
            with pytest.raises(grpc.RpcError) as info:
                call(data, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, data)
            assert "Traceback" not in info.value.details() and len(info.value.details()) < 200
    gen = channel.stream_stream(
        "/inference.v1.InferenceService/Generate",
        request_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString(),
        response_deserializer=pb.GenerateResponse.FromString,
    )
    out = list(gen(iter([garbage[0], req("ok", "Hello", 3)]), timeout=600))
    errors = [r for r in out if r.WhichOneof("event") == "error"]
    assert [e.error.status for e in errors] == ["INVALID_ARGUMENT"]
    assert any(r.request_id == "ok" and r.WhichOneof("event") == "done" for r in out)


def test_long_request_ids_are_rejected(channel: grpc.Channel) -> None:
    big = "r" * 100_000
    out = run_stream(channel, [req(big, "Hi", 2), req("fine", "Hi", 2)], timeout=600)
    rejected = [r for rid, r in out.items() if rid != "fine"]
    assert len(rejected) == 1 and rejected[0].error.status == "INVALID_ARGUMENT"
    assert out["fine"].done is not None


def test_mixed_unicode_prompt_streams_and_ends(channel: grpc.Channel) -> None:
    """The 27-byte fuzz case that once got no event: it must stream and end within its deadline."""
    prompt = "\u4e2d\U00013000\ue000\u00e9\u00ff a"
    out = run_stream(channel, [req("r", prompt, 16, temperature=0.8, seed=3)], timeout=600)
    assert out["r"].done is not None


def duplicate_keys(document: str) -> list[str]:
    """Keys that appear twice in one object of ``document``."""
    dups: list[str] = []

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [k for k, _ in pairs]
        dups.extend(k for k in set(names) if names.count(k) > 1)
        return dict(pairs)

    json.loads(document, object_pairs_hook=pairs_hook)
    return dups


def test_duplicate_keys_are_never_generated(channel: grpc.Channel) -> None:
    """Issue regression: additionalProperties left open once let the model repeat "name"."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    stub = pb_grpc.InferenceServiceStub(channel)
    for seed in (1018, 1, 2):
        resp = stub.GenerateJSON(
            pb.GenerateJSONRequest(
                prompt="A user:",
                raw_prompt=True,
                json_schema=json.dumps(schema),
                sampling=pb.SamplingParams(seed=seed, max_tokens=400, temperature=0.8),
            ),
            timeout=300,
        )
        assert not duplicate_keys(resp.json), (seed, resp.json)


def test_retry_hint_is_cached_under_a_rejection_flood(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = server.engine
    calls = 0
    real = engine.metrics.snapshot

    def counting() -> Any:
        nonlocal calls
        calls += 1
        return real()

    monkeypatch.setattr(engine.metrics, "snapshot", counting)
    engine.hints._e2e.clear()
    hints = {engine.hints(Priority.BATCH, 100) for _ in range(2000)}
    assert calls <= 2 and len(hints) == 1


# -- engine failure: dedicated servers ---------------------------------------------------------------
def health(target: str) -> int:
    with grpc.insecure_channel(target) as ch:
        return int(health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status)


def wait_for(predicate: Any, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def test_engine_thread_death_is_reported_not_hidden() -> None:
    srv = start_server()
    try:

        def boom(seq: Any) -> None:
            raise RuntimeError("injected: engine loop broke")

        srv.engine.scheduler.add = boom  # type: ignore[method-assign]
        with grpc.insecure_channel(srv.target) as ch:
            out = run_stream(ch, [req("a", "Hi", 4)], timeout=600)
            assert out["a"].error is not None and out["a"].error.status == "UNAVAILABLE"
            assert wait_for(lambda: health(srv.target) == health_pb2.HealthCheckResponse.NOT_SERVING)
            with pytest.raises(grpc.RpcError) as info:
                run_stream(ch, [req("b", "Hi", 4)], timeout=600)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        code = srv.call(run_until_stopped(srv.server, asyncio.Event(), srv.config), timeout=600)
        assert code == ENGINE_FAILED_EXIT
    finally:
        srv.close()


def test_stalled_step_fails_requests_and_keeps_the_context_while_the_thread_runs() -> None:
    srv = start_server(step_timeout_s=1.0)
    release = threading.Event()
    try:
        real = srv.engine.runner.decode

        def stuck(*args: Any) -> Any:
            release.wait(60)  # stuck until the test has seen the watchdog act
            return real(*args)

        srv.engine.runner.decode = stuck  # type: ignore[method-assign]
        with grpc.insecure_channel(srv.target) as ch:
            out = run_stream(ch, [req("a", "Hi", 4), req("b", "Hello", 4)], timeout=600)
        for rid in ("a", "b"):
            assert out[rid].error is not None and out[rid].error.status == "UNAVAILABLE", out[rid]
            assert "engine step running for over 1 s" in out[rid].error.message
        assert wait_for(lambda: health(srv.target) == health_pb2.HealthCheckResponse.NOT_SERVING)
        assert srv.engine.stop(timeout=0.5) is False  # the thread is still inside decode
        assert srv.engine.runner.ctx  # so the context was not freed under it
        release.set()
        assert wait_for(lambda: not srv.engine._thread.is_alive(), timeout=15)
    finally:
        release.set()
        srv.close()


# -- backpressure -------------------------------------------------------------------------------------
SMALL_WINDOW = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]


def unread_stream(ch: grpc.Channel, rid: str, n: int) -> Any:
    """A Generate call for ``n`` tokens whose client reads one event and then stops reading.

    NOTE: a small HTTP/2 window (SMALL_WINDOW) makes the transport full after a few
    messages, so the server's own backlog grows as it would behind a slow client.
    """
    call = pb_grpc.InferenceServiceStub(ch).Generate(
        iter([req(rid, "Count to a thousand:", n, ignore_eos=True)]), timeout=600
    )
    next(call)
    return call


def test_unread_stream_pauses_resumes_and_others_are_unaffected() -> None:
    srv = start_server(stream_backlog=16, stream_stall_timeout_s=60.0, threads=1)  # see test_fuzz
    try:
        with grpc.insecure_channel(srv.target, options=SMALL_WINDOW) as ch:
            call = unread_stream(ch, "slow", 300)
            assert wait_for(lambda: any(s.paused for s in srv.engine.scheduler.running + srv.engine.scheduler.waiting))
            seq = next(s for s in srv.engine.scheduler.running + srv.engine.scheduler.waiting if s.paused)
            held = seq.num_generated
            time.sleep(1.0)
            assert seq.num_generated == held < 300  # nothing is generated while unread
            other = run_stream(ch, [req("other", "Hello", 8)], timeout=600)["other"]
            assert other.done is not None and other.done.usage.completion_tokens == 8
            rest = collect(call)  # the client reads again: generation resumes and completes
        assert rest["slow"].done is not None and rest["slow"].done.usage.completion_tokens == 300
        assert_kv_clean(srv)
    finally:
        srv.close()


def test_stream_left_unread_past_the_stall_timeout_is_cancelled() -> None:
    srv = start_server(stream_backlog=16, stream_stall_timeout_s=2.0, threads=1)
    try:
        with grpc.insecure_channel(srv.target, options=SMALL_WINDOW) as ch:
            call = unread_stream(ch, "stall", 1000)
            assert wait_for(lambda: not srv.engine.scheduler.has_work(), timeout=600)
            rest = collect(call)
        assert rest["stall"].error is not None and rest["stall"].error.status == "CANCELLED"
        assert "did not read" in rest["stall"].error.message
        assert_kv_clean(srv)
    finally:
        srv.close()


# The shed test: QUEUED requests wait behind one running place; with no request finished yet, the
# engine's estimate is about 1 s per queued request (service.scheduler.admission.RetryHints), far more
# than HURRY_TIMEOUT_S, which is itself far more than the request needs to reach admission.
QUEUED, HURRY_TIMEOUT_S = 24, 8.0


def test_deadline_that_cannot_be_met_is_shed_at_admission() -> None:
    srv = start_server(max_running=1, kv_lanes=8, step_tokens=64)
    try:
        with grpc.insecure_channel(srv.target) as ch:
            hold = OpenStream(ch)
            hold.send(req("long", "Tell me a long story.", 2000, ignore_eos=True))
            hold.next_event()
            queued = OpenStream(ch)
            for i in range(QUEUED):
                queued.send(req(f"queued{i}", "Tell me another story.", 50, ignore_eos=True))
            assert wait_for(lambda: srv.engine.admission.depth(Priority.INTERACTIVE) == QUEUED)
            out = run_stream(ch, [req("hurry", "Hi", 4)], timeout=HURRY_TIMEOUT_S)["hurry"]
            hold.call.cancel()
            queued.call.cancel()
        assert out.error is not None and out.error.status == "RESOURCE_EXHAUSTED"
        assert "deadline cannot be met" in out.error.message and out.error.retry_after_ms > HURRY_TIMEOUT_S * 1000
        wait_idle(srv)
    finally:
        srv.close()
