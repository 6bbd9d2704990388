"""Python client library, retry logic (no model): against tiny stub gRPC servers started here that
fail on purpose.

The stubs stand in for a flaky or overloaded *server*, never for the engine; the client against the
real server and model is tested in tests/model/client/test_client.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from inference_client import (
    NO_RETRY,
    AsyncInferenceClient,
    Delta,
    Done,
    InferenceClient,
    InferenceError,
    RetryPolicy,
    channel_options,
    retry_service_config,
)


class StubServicer(pb_grpc.InferenceServiceServicer):
    """Fails the first ``failures`` calls of each method with ``code``; records attempt times."""

    def __init__(
        self, code: grpc.StatusCode, failures: int, hint_ms: int | None = None, msg: str = ""
    ) -> None:
        self.code, self.failures, self.hint_ms, self.msg = code, failures, hint_ms, msg
        self.times: list[float] = []
        self.received: list[pb.GenerateRequest] = []
        self.lock = threading.Lock()

    def _attempt(self, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.times.append(time.monotonic())
            failing = len(self.times) <= self.failures
        if failing:
            if self.hint_ms is not None:
                context.set_trailing_metadata((("retry-after-ms", str(self.hint_ms)),))
            context.abort(self.code, self.msg or f"stub failure {len(self.times)}")

    def GetMetrics(self, request: Any, context: grpc.ServicerContext) -> pb.GetMetricsResponse:
        self._attempt(context)
        return pb.GetMetricsResponse(requests_total=42, model="stub")

    def Generate(self, request_iterator: Any, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        self._attempt(context)
        for req in request_iterator:
            self.received.append(req)
            if not req.cancel:
                yield pb.GenerateResponse(request_id=req.request_id, delta=pb.Delta(text="ok", token_ids=[1]))
                yield pb.GenerateResponse(
                    request_id=req.request_id, done=pb.Done(finish_reason=pb.FINISH_REASON_STOP)
                )


class QueueFullOnce(pb_grpc.InferenceServiceServicer):
    """Generate: the first request gets a RESOURCE_EXHAUSTED error event with a hint, retries succeed."""

    def __init__(self, hint_ms: int) -> None:
        self.hint_ms = hint_ms
        self.times: list[float] = []

    def Generate(self, request_iterator: Any, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        for req in request_iterator:
            self.times.append(time.monotonic())
            rid = req.request_id
            if len(self.times) == 1:
                message = f"queue full; retry after {self.hint_ms} ms"
                err = pb.Error(
                    code=8, status="RESOURCE_EXHAUSTED", message=message, retry_after_ms=self.hint_ms
                )
                yield pb.GenerateResponse(request_id=rid, error=err)
                continue
            yield pb.GenerateResponse(request_id=rid, delta=pb.Delta(text="fine", token_ids=[7]))
            yield pb.GenerateResponse(request_id=rid, done=pb.Done(finish_reason=pb.FINISH_REASON_STOP))


def serve_stub(servicer: Any) -> tuple[grpc.Server, str]:
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_InferenceServiceServicer_to_server(servicer, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    return srv, f"127.0.0.1:{port}"


@pytest.fixture()
def stub() -> Iterator[Callable[[Any], str]]:
    servers: list[grpc.Server] = []

    def start(servicer: Any) -> str:
        srv, target = serve_stub(servicer)
        servers.append(srv)
        return target

    yield start
    for srv in servers:
        srv.stop(0)


FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05)


def test_unavailable_is_retried_until_success(stub: Callable[[Any], str]) -> None:
    servicer = StubServicer(grpc.StatusCode.UNAVAILABLE, failures=2)
    with InferenceClient(stub(servicer), retry=FAST, timeout=10) as c:
        assert c.metrics().requests_total == 42
    assert len(servicer.times) == 3


def test_resource_exhausted_honours_retry_after_metadata(stub: Callable[[Any], str]) -> None:
    servicer = StubServicer(grpc.StatusCode.RESOURCE_EXHAUSTED, failures=1, hint_ms=300, msg="queue full")
    with InferenceClient(stub(servicer), retry=FAST, timeout=10) as c:
        assert c.metrics().model == "stub"
    assert len(servicer.times) == 2
    assert servicer.times[1] - servicer.times[0] >= 0.3, "the retry-after-ms hint was not honoured"


def test_resource_exhausted_honours_hint_in_message(stub: Callable[[Any], str]) -> None:
    servicer = StubServicer(grpc.StatusCode.RESOURCE_EXHAUSTED, failures=1, msg="busy; retry after 250 ms")
    with InferenceClient(stub(servicer), retry=FAST, timeout=10) as c:
        c.metrics()
    assert servicer.times[1] - servicer.times[0] >= 0.25


def test_invalid_argument_is_never_retried(stub: Callable[[Any], str]) -> None:
    servicer = StubServicer(grpc.StatusCode.INVALID_ARGUMENT, failures=5)
    with InferenceClient(stub(servicer), retry=FAST, timeout=10) as c, pytest.raises(InferenceError) as info:
        c.metrics()
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and info.value.attempts == 1
    assert len(servicer.times) == 1


def test_retry_budget_is_bounded(stub: Callable[[Any], str]) -> None:
    servicer = StubServicer(grpc.StatusCode.UNAVAILABLE, failures=100)
    policy = RetryPolicy(max_attempts=3, initial_backoff=0.01)
    with InferenceClient(stub(servicer), retry=policy) as c, pytest.raises(InferenceError) as info:
        c.metrics()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and info.value.attempts == 3
    assert len(servicer.times) == 3


def test_deadline_caps_retry_waits(stub: Callable[[Any], str]) -> None:
    servicer = StubServicer(grpc.StatusCode.RESOURCE_EXHAUSTED, failures=100, hint_ms=600_000)
    with InferenceClient(stub(servicer), retry=FAST, timeout=30.0) as c, pytest.raises(InferenceError) as info:
        c.metrics()
    # a 600 s wait would pass the 30 s deadline: it is not started, the first answer is final
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and info.value.retry_after == 600.0
    assert info.value.attempts == 1 and len(servicer.times) == 1


def test_unavailable_on_a_stopped_server() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once the socket is closed
    policy = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02)
    with InferenceClient(f"127.0.0.1:{port}", retry=policy, timeout=10) as c:
        for call in (c.metrics, c.health, lambda: list(c.generate("hi"))):
            with pytest.raises(InferenceError) as info:
                call()
            assert info.value.code == grpc.StatusCode.UNAVAILABLE
            assert info.value.attempts == 3


def test_stream_is_reestablished_before_any_response(stub: Callable[[Any], str]) -> None:
    servicer = StubServicer(grpc.StatusCode.UNAVAILABLE, failures=2)
    with InferenceClient(stub(servicer), retry=FAST, timeout=10) as c:
        events = list(c.generate("hello", request_id="r1"))
    assert [type(e) for e in events] == [Delta, Done]
    assert len(servicer.times) == 3
    assert [r.request_id for r in servicer.received] == ["r1"], "the request must be replayed exactly once"


def test_queue_full_error_event_is_retried_on_the_stream(stub: Callable[[Any], str]) -> None:
    servicer = QueueFullOnce(hint_ms=200)
    with InferenceClient(stub(servicer), retry=FAST, timeout=10) as c:
        assert c.generate("hello").text() == "fine"
    assert len(servicer.times) == 2 and servicer.times[1] - servicer.times[0] >= 0.2
    with InferenceClient(stub(QueueFullOnce(hint_ms=10)), retry=NO_RETRY) as c:
        with pytest.raises(InferenceError) as info:
            list(c.generate("hello"))
        assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and info.value.retry_after == 0.01


def test_native_grpc_retries_via_service_config(stub: Callable[[Any], str]) -> None:
    servicer = StubServicer(grpc.StatusCode.UNAVAILABLE, failures=2)
    config = retry_service_config(max_attempts=4, initial_backoff=0.01, max_backoff=0.05)
    with InferenceClient(stub(servicer), retry=NO_RETRY, options=channel_options(config), timeout=10) as c:
        assert c.metrics().requests_total == 42
    assert len(servicer.times) == 3


def test_service_config_json_shape() -> None:
    config = json.loads(retry_service_config(max_attempts=3, initial_backoff=0.25))
    (method,) = config["methodConfig"]
    assert {"service": "inference.v1.InferenceService"} in method["name"]
    policy = method["retryPolicy"]
    assert policy["maxAttempts"] == 3 and policy["initialBackoff"] == "0.25s"
    assert policy["retryableStatusCodes"] == ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]
    with pytest.raises(ValueError):
        retry_service_config(max_attempts=6)


def test_backoff_policy() -> None:
    policy = RetryPolicy(max_attempts=5, initial_backoff=0.1, multiplier=2, max_backoff=0.3, jitter=0.2)
    assert policy.delay(grpc.StatusCode.INVALID_ARGUMENT, 1) is None
    assert policy.delay(grpc.StatusCode.UNAVAILABLE, 5) is None
    for attempt, base in ((1, 0.1), (2, 0.2), (3, 0.3), (4, 0.3)):
        wait = policy.delay(grpc.StatusCode.UNAVAILABLE, attempt)
        assert wait is not None and base * 0.8 <= wait <= base * 1.2
    hinted = policy.delay(grpc.StatusCode.RESOURCE_EXHAUSTED, 1, hint=2.0)
    assert hinted is not None and 2.0 <= hinted <= 2.4


async def test_async_client_retries(stub: Callable[[Any], str]) -> None:
    servicer = StubServicer(grpc.StatusCode.UNAVAILABLE, failures=2)
    async with AsyncInferenceClient(stub(servicer), retry=FAST, timeout=10) as c:
        assert (await c.metrics()).requests_total == 42
        assert [type(e) for e in [e async for e in c.generate("x")]] == [Delta, Done]
    assert len(servicer.times) == 4  # 2 failures + metrics + generate
    bad = StubServicer(grpc.StatusCode.INVALID_ARGUMENT, failures=5)
    async with AsyncInferenceClient(stub(bad), retry=FAST) as c:
        with pytest.raises(InferenceError) as info:
            await c.metrics()
    assert info.value.attempts == 1 and len(bad.times) == 1
