"""Python client library: against the real server (``server`` fixture, real model).

Every generation test runs on the real model. The retry logic, against tiny stub gRPC servers
that fail on purpose, is tested without a model in tests/unit/client/test_client_retry.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from inference.v1 import inference_pb2 as pb
from inference_client import (
    NO_RETRY,
    AsyncInferenceClient,
    Delta,
    Done,
    ErrorEvent,
    InferenceClient,
    InferenceError,
    RequestSpec,
    RetryPolicy,
    format_metrics,
)

LONG: dict[str, Any] = dict(max_tokens=200, ignore_eos=True)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture()
def client(server: Any) -> Iterator[InferenceClient]:
    with InferenceClient(server.target, timeout=600) as c:
        yield c


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def tier(metrics: pb.GetMetricsResponse, priority: int) -> pb.TierMetrics:
    return next(t for t in metrics.tiers if t.priority == priority)


class _CallCounter(grpc.StreamStreamClientInterceptor):
    def __init__(self) -> None:
        self.streams = 0

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        self.streams += 1
        return continuation(details, request_iterator)


# -- generation on the real server ---------------------------------------------------------------


@pytest.mark.model
def test_generate_streams_deltas_then_done(client: InferenceClient) -> None:
    events = list(client.generate("Once upon a time", max_tokens=8, temperature=0, ignore_eos=True))
    deltas = [e for e in events[:-1] if isinstance(e, Delta)]
    done = events[-1]
    assert deltas and len(deltas) == len(events) - 1
    assert isinstance(done, Done)
    assert done.finish_reason == "length"
    assert done.usage.completion_tokens == 8 == sum(len(d.token_ids) for d in deltas)
    assert done.usage.prompt_tokens > 0
    assert 0 <= done.timing.ttft_ms <= done.timing.total_ms
    assert "".join(d.text for d in deltas).strip()


@pytest.fixture(scope="module")
def exact_server() -> Iterator[Any]:
    """A server without prefix reuse: a repeated request computes bit-identical logits (on the shared
    server the repeat would reuse cached KV cells, another summation order)."""
    from tests.support.server import start_server

    srv = start_server(prefix_cache=False)
    yield srv
    srv.close()


@pytest.mark.model
def test_generate_is_reproducible_with_seed_and_accepts_chat(exact_server: Any) -> None:
    kwargs: dict[str, Any] = dict(max_tokens=12, temperature=0.9, seed=1234)
    with InferenceClient(exact_server.target, timeout=600) as client:
        first, again = (client.generate("The weather today", **kwargs).text() for _ in range(2))
        other_seed = client.generate("The weather today", **{**kwargs, "seed": 99}).text()
        gen = client.generate(messages=[{"role": "user", "content": "Say hi"}], max_tokens=6, priority="batch")
        result = gen.result()
    assert first == again and first != other_seed
    assert result.ok and result.done is not None and result.done.usage.completion_tokens <= 6


@pytest.mark.model
def test_invalid_argument_raises_and_is_not_retried(client: InferenceClient) -> None:
    with pytest.raises(InferenceError) as info:
        list(client.generate(""))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.status == "INVALID_ARGUMENT"
    assert info.value.attempts == 1
    with pytest.raises(InferenceError) as info:
        list(client.generate("hi", max_tokens=0))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.model
def test_generate_many_multiplexes_on_one_stream(server: Any) -> None:
    counter = _CallCounter()
    channel = grpc.intercept_channel(grpc.insecure_channel(server.target), counter)
    with InferenceClient(channel=channel, timeout=600) as c:
        stream = c.generate_many(["One", "Two", "Three", "Four"], max_tokens=16, ignore_eos=True)
        pairs = list(stream)
    channel.close()
    assert counter.streams == 1
    ids = stream.request_ids
    assert len(set(ids)) == 4
    dones = [rid for rid, ev in pairs if isinstance(ev, Done)]
    assert sorted(dones) == sorted(ids)
    first_done = next(i for i, (_, ev) in enumerate(pairs) if isinstance(ev, Done))
    assert len({rid for rid, _ in pairs[:first_done]}) >= 2, "events of different requests should interleave"
    for rid in ids:  # per request: deltas, then exactly one Done, last
        own = [ev for r, ev in pairs if r == rid]
        assert isinstance(own[-1], Done) and all(isinstance(e, Delta) for e in own[:-1])
        assert own[-1].usage.completion_tokens == 16


@pytest.mark.model
def test_generate_many_collects_results_and_isolates_failures(client: InferenceClient) -> None:
    specs: list[RequestSpec | str] = [
        RequestSpec(prompt="Count: one, two,", max_tokens=4, temperature=0, ignore_eos=True, request_id="a"),
        RequestSpec(prompt="", request_id="bad"),
        RequestSpec(messages=[("user", "Hello")], max_tokens=7, ignore_eos=True, request_id="c"),
        "A bare prompt",
    ]
    results = client.generate_many(specs, max_tokens=3, ignore_eos=True).collect()
    assert list(results)[:3] == ["a", "bad", "c"]
    assert results["a"].ok and results["a"].done and results["a"].done.usage.completion_tokens == 4
    assert results["c"].done and results["c"].done.usage.completion_tokens == 7
    bare = list(results.values())[3]
    assert bare.done and bare.done.usage.completion_tokens == 3 and bare.text
    bad = results["bad"]
    assert not bad.ok and bad.error is not None and bad.error.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.model
def test_cancel_through_the_handle(client: InferenceClient) -> None:
    gen = client.generate("Write a very long story about a dragon.", **LONG)
    deltas = 0
    for event in gen:
        if isinstance(event, Delta):
            deltas += 1
            if deltas == 2:
                assert gen.cancel()
    assert gen.done is not None and gen.done.finish_reason == "cancelled"
    assert gen.done.usage.completion_tokens < 200
    assert not gen.cancel(), "a finished request cannot be cancelled"


@pytest.mark.model
def test_client_cancel_by_request_id_on_a_multiplexed_stream(client: InferenceClient) -> None:
    assert not client.cancel("no-such-request")
    stream = client.generate_many(
        [
            RequestSpec(prompt="Tell me everything.", request_id="victim", **LONG),
            RequestSpec(prompt="Count to ten:", request_id="survivor", max_tokens=12, ignore_eos=True),
        ]
    )
    finishes: dict[str, str] = {}
    for rid, event in stream:
        if rid == "victim" and isinstance(event, Delta) and "victim" not in finishes:
            finishes["victim"] = "requested"
            assert client.cancel("victim")
        if isinstance(event, Done):
            finishes[rid] = event.finish_reason
    assert finishes == {"victim": "cancelled", "survivor": "length"}


@pytest.mark.model
def test_leaving_the_loop_cancels_the_request(client: InferenceClient) -> None:
    before = tier(client.metrics(), pb.PRIORITY_INTERACTIVE).requests_cancelled
    for event in client.generate("An endless poem:", **LONG):
        assert isinstance(event, Delta)
        break
    assert wait_for(lambda: tier(client.metrics(), pb.PRIORITY_INTERACTIVE).requests_cancelled > before), (
        "the server did not see the cancellation"
    )


@pytest.mark.model
def test_client_deadline(client: InferenceClient, server: Any) -> None:
    with pytest.raises(InferenceError) as info:
        list(client.generate("A long essay:", max_tokens=2000, ignore_eos=True, timeout=0.5))
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and info.value.attempts == 1
    assert wait_for(lambda: not server.engine.scheduler.has_work()), "the expired request still runs"


@pytest.mark.model
def test_generate_json(client: InferenceClient) -> None:
    doc = client.generate_json(PERSON, "Describe a person as JSON:", temperature=0, max_tokens=96)
    assert set(doc) == {"name", "age"}
    assert isinstance(doc["name"], str) and isinstance(doc["age"], int)
    with pytest.raises(InferenceError) as info:
        client.generate_json("{not json", "x")
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.model
def test_metrics_and_health(client: InferenceClient) -> None:
    before = client.metrics()
    out = list(client.generate("Hi", max_tokens=2))
    snapshot = client.metrics()
    # NOTE: the server is shared with other tests, but none runs concurrently: exact deltas.
    assert snapshot.requests_total - before.requests_total == 1
    assert snapshot.generated_tokens_total - before.generated_tokens_total == out[-1].usage.completion_tokens
    as_dict = client.metrics_dict()
    assert as_dict["requests_total"] >= snapshot.requests_total
    assert {"kv", "tiers", "mean_batch_size", "throughput_tok_s"} <= set(as_dict)
    table = format_metrics(snapshot)
    for needle in ("requests", "mean batch size", "kv blocks", "prefix cache", "interactive ttft", "p99"):
        assert needle in table
    assert client.health() == "SERVING"
    assert client.health("inference.v1.InferenceService") == "SERVING"
    with pytest.raises(InferenceError) as info:
        client.health("no.such.Service")
    assert info.value.code == grpc.StatusCode.NOT_FOUND


@pytest.mark.model
async def test_async_client(server: Any) -> None:
    async with AsyncInferenceClient(server.target, timeout=600) as c:
        events = [e async for e in c.generate("Once upon a time", max_tokens=6, ignore_eos=True)]
        assert isinstance(events[-1], Done) and events[-1].usage.completion_tokens == 6
        results = await c.generate_many(["a", "b", ""], max_tokens=4, ignore_eos=True).collect()
        oks = [r.ok for r in results.values()]
        assert oks == [True, True, False]
        gen = c.generate("A long tale:", request_id="async-victim", **LONG)
        async for event in gen:
            if isinstance(event, Delta):
                assert await c.cancel("async-victim")
                break
        async for _ in gen:
            pass
        assert gen.done is not None and gen.done.finish_reason == "cancelled"
        with pytest.raises(InferenceError) as info:
            await c.generate("").text()
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert await c.health() == "SERVING"
        assert (await c.metrics()).requests_total >= 3


@pytest.mark.model
async def test_async_open_stream_submit_and_cancel(server: Any) -> None:
    async with AsyncInferenceClient(server.target, timeout=600) as c:
        stream = c.open_stream()
        long_id = await stream.submit(RequestSpec(prompt="Go on and on:", **LONG))
        short_id = await stream.submit(RequestSpec(prompt="Hi", max_tokens=3, ignore_eos=True))
        await stream.close()
        finishes = {}
        async for rid, event in stream:
            if rid == short_id and isinstance(event, Done):
                assert await stream.cancel(long_id)
            if isinstance(event, Done | ErrorEvent):
                finishes[rid] = event
        assert finishes[short_id].finish_reason == "length"  # type: ignore[union-attr]
        assert finishes[long_id].finish_reason == "cancelled"  # type: ignore[union-attr]


@pytest.mark.model
def test_queue_full_requests_are_retried_on_a_real_overloaded_server() -> None:
    from tests.support.server import start_server

    srv = start_server(max_running=1, queue_limit_interactive=1)
    try:
        prompts = [f"Item {i}:" for i in range(8)]
        with InferenceClient(srv.target, retry=NO_RETRY, timeout=600) as c:
            results = c.generate_many(prompts, max_tokens=4, ignore_eos=True).collect()
            errors = [r.error for r in results.values() if r.error is not None]
            assert errors, "8 requests at once should overflow a queue of 1"
            assert all(e.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.retry_after for e in errors)
        patient = RetryPolicy(max_attempts=40, initial_backoff=0.05, max_backoff=0.5)
        with InferenceClient(srv.target, retry=patient, timeout=600) as c:
            results = c.generate_many(prompts, max_tokens=4, ignore_eos=True).collect()
            assert all(r.ok for r in results.values()), [r.error for r in results.values()]
            assert c.metrics().rejections_total > len(errors), "the retried requests were rejected first"
    finally:
        srv.close()
