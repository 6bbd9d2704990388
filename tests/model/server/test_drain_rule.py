"""The drain rule, method by method, on a real server while it drains (service.api.intake: ``Need``).

While draining, calls that start engine work (a new Generate stream, a new request on an open one,
GenerateJSON, CreateBatch) are refused UNAVAILABLE, with the reason "draining" in the message and in
the trailing metadata (``inference-unavailable-reason``) or the error event's ``reason``; calls that
only read the model or the batch store are answered. The table below names every method of both
services, so a new method cannot be added without deciding where it stands.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.helpers import OpenStream, req
from tests.support.server import RunningServer, start_server

pytestmark = pytest.mark.model
REASON_KEY = "inference-unavailable-reason"
SCHEMA = '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}'


def item(cid: str) -> bpb.BatchItem:
    return bpb.BatchItem(
        custom_id=cid, generate=pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(max_tokens=2))
    )


def _first(stream: Any) -> Any:
    """The first message of a server stream (the call is cancelled after it)."""
    try:
        return next(iter(stream))
    finally:
        stream.cancel()


def calls(ch: grpc.Channel, batch_id: str) -> dict[str, Callable[[], Any]]:
    """One minimal, valid call of every method of both services."""
    inf, bat = pb_grpc.InferenceServiceStub(ch), bpb_grpc.BatchServiceStub(ch)
    t = 30
    return {
        "inference.v1.InferenceService.Generate": lambda: list(
            inf.Generate(iter([req("g", "Hi", 2)]), timeout=t)
        ),
        "inference.v1.InferenceService.GenerateJSON": lambda: inf.GenerateJSON(
            pb.GenerateJSONRequest(prompt="Hi", json_schema=SCHEMA), timeout=t
        ),
        "inference.v1.InferenceService.GetMetrics": lambda: inf.GetMetrics(pb.GetMetricsRequest(), timeout=t),
        "inference.v1.InferenceService.Tokenize": lambda: inf.Tokenize(
            pb.TokenizeRequest(text="Hi"), timeout=t
        ),
        "inference.v1.InferenceService.Detokenize": lambda: inf.Detokenize(
            pb.DetokenizeRequest(token_ids=[1, 2]), timeout=t
        ),
        "inference.v1.InferenceService.CountTokens": lambda: inf.CountTokens(
            pb.CountTokensRequest(text="Hi"), timeout=t
        ),
        "inference.v1.InferenceService.GetModelInfo": lambda: inf.GetModelInfo(
            pb.GetModelInfoRequest(), timeout=t
        ),
        "inference.v1.BatchService.CreateBatch": lambda: bat.CreateBatch(
            iter([bpb.CreateBatchRequest(items=[item("late")])]), timeout=t
        ),
        "inference.v1.BatchService.GetBatch": lambda: bat.GetBatch(
            bpb.GetBatchRequest(batch_id=batch_id), timeout=t
        ),
        "inference.v1.BatchService.ListBatches": lambda: bat.ListBatches(bpb.ListBatchesRequest(), timeout=t),
        "inference.v1.BatchService.WatchBatch": lambda: _first(
            bat.WatchBatch(bpb.WatchBatchRequest(batch_id=batch_id), timeout=t)
        ),
        "inference.v1.BatchService.GetBatchResults": lambda: list(
            bat.GetBatchResults(bpb.GetBatchResultsRequest(batch_id=batch_id), timeout=t)
        ),
        "inference.v1.BatchService.CancelBatch": lambda: bat.CancelBatch(
            bpb.CancelBatchRequest(batch_id=batch_id), timeout=t
        ),
    }


# The rule: True = answered while draining, False = refused UNAVAILABLE (reason "draining").
ANSWERED_WHILE_DRAINING = {
    "inference.v1.InferenceService.Generate": False,
    "inference.v1.InferenceService.GenerateJSON": False,
    "inference.v1.InferenceService.GetMetrics": True,
    "inference.v1.InferenceService.Tokenize": True,
    "inference.v1.InferenceService.Detokenize": True,
    "inference.v1.InferenceService.CountTokens": True,
    "inference.v1.InferenceService.GetModelInfo": True,
    "inference.v1.BatchService.CreateBatch": False,
    "inference.v1.BatchService.GetBatch": True,
    "inference.v1.BatchService.ListBatches": True,
    "inference.v1.BatchService.WatchBatch": True,
    "inference.v1.BatchService.GetBatchResults": True,
    "inference.v1.BatchService.CancelBatch": True,
}


def every_method() -> set[str]:
    services = (
        pb.DESCRIPTOR.services_by_name["InferenceService"],
        bpb.DESCRIPTOR.services_by_name["BatchService"],
    )
    return {m.full_name for s in services for m in s.methods}


def test_the_rule_names_every_method_of_both_services() -> None:
    assert set(ANSWERED_WHILE_DRAINING) == every_method()


def wait_for(cond: Callable[[], bool], timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met before the deadline"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def draining() -> Iterator[tuple[RunningServer, OpenStream, str]]:
    """A real server draining (``InferenceServer.drain``, as on SIGTERM) while one long request keeps it
    in its grace period; yields the server, the open stream of that request and an existing batch id.
    Shared by the module's tests (each only asks; nothing they do ends the drain)."""
    srv = start_server()
    ch = grpc.insecure_channel(srv.target)
    try:
        batch = bpb_grpc.BatchServiceStub(ch).CreateBatch(iter([bpb.CreateBatchRequest(items=[item("a")])]))
        hold = OpenStream(ch)
        hold.send(req("hold", "Tell me a long story.", 4000, ignore_eos=True))
        assert hold.next_event().WhichOneof("event") == "delta"
        drained = asyncio.run_coroutine_threadsafe(srv.server.drain(300.0), srv.loop)
        health = health_pb2_grpc.HealthStub(ch)
        serving = health_pb2.HealthCheckResponse.SERVING
        wait_for(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5).status != serving)
        yield srv, hold, batch.batch.id
        hold.send(pb.GenerateRequest(request_id="hold", cancel=True))
        hold.close()
        drained.result(60)
    finally:
        ch.close()
        srv.close()


def test_while_draining_work_is_refused_with_the_reason_and_reads_are_answered(
    draining: tuple[RunningServer, OpenStream, str],
) -> None:
    srv, _hold, batch_id = draining
    with grpc.insecure_channel(srv.target) as ch:
        for method, call in calls(ch, batch_id).items():
            if ANSWERED_WHILE_DRAINING[method]:
                call()  # answered: no RpcError
                continue
            with pytest.raises(grpc.RpcError) as refused:
                call()
            err = refused.value
            assert err.code() == grpc.StatusCode.UNAVAILABLE, method
            assert "shutting down" in err.details() and "another replica" in err.details(), method
            assert (REASON_KEY, "draining") in tuple(err.trailing_metadata() or ()), method


def test_a_new_request_on_an_open_stream_while_draining_is_refused_before_it_is_read(
    draining: tuple[RunningServer, OpenStream, str],
) -> None:
    _srv, hold, _batch_id = draining
    hold.send(req("late", "Hi", 0))  # max_tokens 0 is invalid: the drain rule comes first
    while (ev := hold.next_event()).request_id != "late":
        pass
    assert ev.WhichOneof("event") == "error", ev
    assert ev.error.status == "UNAVAILABLE" and ev.error.reason == "draining"
    assert "another replica" in ev.error.message


def test_requests_cut_when_the_grace_period_ends_carry_the_drain_reason() -> None:
    srv = start_server()
    try:
        with grpc.insecure_channel(srv.target) as ch:
            stream = OpenStream(ch)
            stream.send(req("cut", "Tell me a long story.", 4000, ignore_eos=True))
            assert stream.next_event().WhichOneof("event") == "delta"
            long_json = '{"type": "array", "items": {"type": "integer"}, "minItems": 2000}'
            json_call = pb_grpc.InferenceServiceStub(ch).GenerateJSON.future(
                pb.GenerateJSONRequest(
                    prompt="Numbers:", json_schema=long_json, sampling=pb.SamplingParams(max_tokens=4000)
                ),
                timeout=300,
            )
            wait_for(lambda: len(srv.engine.scheduler.running) == 2)
            srv.call(srv.server.drain(0.2))
            while (ev := stream.next_event()).WhichOneof("event") == "delta":
                pass
            stream.close()
            with pytest.raises(grpc.RpcError) as cut:
                json_call.result()
        assert ev.request_id == "cut" and ev.error.status == "UNAVAILABLE" and ev.error.reason == "draining"
        assert "grace period over" in ev.error.message and "another replica" in ev.error.message
        assert cut.value.code() == grpc.StatusCode.UNAVAILABLE and "grace period over" in cut.value.details()
        assert (REASON_KEY, "draining") in tuple(cut.value.trailing_metadata() or ())
    finally:
        srv.close()
