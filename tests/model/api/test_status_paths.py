"""Every gRPC status path of the InferenceService servicer and the BatchService servicer, table-driven,
on the shared real server: the exact status and the words of its message."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.model.batch.test_batch import create, gen
from tests.support.helpers import wait_for
from tests.support.server import RunningServer, assert_kv_clean, wait_idle

pytestmark = pytest.mark.model

OBJECT = '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}'
LONG = '{"type":"array","items":{"type":"integer"},"minItems":600}'  # outlives short deadlines


def json_req(schema: str = OBJECT, prompt: str = "JSON:", **sampling: Any) -> pb.GenerateJSONRequest:
    sampling.setdefault("temperature", 0.0)
    return pb.GenerateJSONRequest(prompt=prompt, json_schema=schema, sampling=pb.SamplingParams(**sampling))


def raw(method: str) -> Callable[[grpc.Channel, bytes], Any]:
    """A unary call with raw bytes (a message the server cannot parse)."""
    return lambda ch, blob: ch.unary_unary(f"/inference.v1.InferenceService/{method}")(blob, timeout=30)


# (case, call(channel), status, words of the message)
INFERENCE: list[tuple[str, Callable[[grpc.Channel], Any], grpc.StatusCode, str]] = [
    ("json: empty schema", lambda ch: stub(ch).GenerateJSON(json_req(""), timeout=600),
     grpc.StatusCode.INVALID_ARGUMENT, "json_schema is empty"),
    ("json: schema not JSON", lambda ch: stub(ch).GenerateJSON(json_req("{nope"), timeout=600),
     grpc.StatusCode.INVALID_ARGUMENT, "not valid JSON"),
    ("json: schema over the size limit", lambda ch: stub(ch).GenerateJSON(json_req(" " * 70_000 + "{}"), timeout=600),
     grpc.StatusCode.INVALID_ARGUMENT, "the limit is 64000"),
    ("json: n > 1", lambda ch: stub(ch).GenerateJSON(json_req(n=2), timeout=600),
     grpc.StatusCode.INVALID_ARGUMENT, "GenerateJSON returns one document"),
    ("json: echo_prompt_logprobs", lambda ch: stub(ch).GenerateJSON(json_req(echo_prompt_logprobs=True), timeout=600),
     grpc.StatusCode.INVALID_ARGUMENT, "GenerateJSON returns one document"),
    ("json: a thinking budget with a raw prompt", lambda ch: stub(ch).GenerateJSON(pb.GenerateJSONRequest(
        prompt="JSON:", json_schema=OBJECT, raw_prompt=True,
        sampling=pb.SamplingParams(temperature=0.0, thinking_budget_tokens=8)), timeout=600),
     grpc.StatusCode.INVALID_ARGUMENT, "thinking_budget_tokens needs chat messages"),
    ("json: stop strings", lambda ch: stub(ch).GenerateJSON(json_req(stop=["}"]), timeout=600),
     grpc.StatusCode.INVALID_ARGUMENT, "stop strings cannot be combined with a JSON Schema"),
    ("json: empty prompt", lambda ch: stub(ch).GenerateJSON(json_req(prompt=""), timeout=600),
     grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty"),
    ("json: max_tokens below the shortest document (closing is the default)",
     lambda ch: stub(ch).GenerateJSON(json_req(max_tokens=2), timeout=600),
     grpc.StatusCode.OUT_OF_RANGE, "is below the shortest valid document for this schema"),
    ("json: cut off at max_tokens", lambda ch: stub(ch).GenerateJSON(
        json_req(max_tokens=2, json_finish=pb.JSON_FINISH_CUT_OFF), timeout=600),
     grpc.StatusCode.OUT_OF_RANGE, "JSON document cut off at max_tokens=2"),
    ("json: only-if-cached with the cache off", lambda ch: stub(ch).GenerateJSON(
        pb.GenerateJSONRequest(prompt="JSON:", json_schema=OBJECT, sampling=pb.SamplingParams(temperature=0.0),
                               cache_policy=pb.CACHE_POLICY_ONLY_IF_CACHED), timeout=600),
     grpc.StatusCode.NOT_FOUND, "ONLY_IF_CACHED: the response cache is off on this server"),
    ("json: malformed message", lambda ch: raw("GenerateJSON")(ch, b"\xff\xff\xff"),
     grpc.StatusCode.INVALID_ARGUMENT, "message is not a valid inference.v1.GenerateJSONRequest"),
    ("tokenize: malformed message", lambda ch: raw("Tokenize")(ch, b"\xff\xff\xff"),
     grpc.StatusCode.INVALID_ARGUMENT, "message is not a valid inference.v1.TokenizeRequest"),
    ("detokenize: id out of range", lambda ch: stub(ch).Detokenize(pb.DetokenizeRequest(token_ids=[10**8]), timeout=30),
     grpc.StatusCode.INVALID_ARGUMENT, "token_ids[0] = 100000000"),
    ("count tokens: bad role", lambda ch: stub(ch).CountTokens(
        pb.CountTokensRequest(messages=[pb.ChatMessage(role="robot", content="x")]), timeout=30),
     grpc.StatusCode.INVALID_ARGUMENT, "role"),
    ("metrics: malformed message", lambda ch: raw("GetMetrics")(ch, b"\xff\xff\xff"),
     grpc.StatusCode.INVALID_ARGUMENT, "message is not a valid inference.v1.GetMetricsRequest"),
]


def stub(ch: grpc.Channel) -> pb_grpc.InferenceServiceStub:
    return pb_grpc.InferenceServiceStub(ch)


@pytest.mark.parametrize(("case", "call", "code", "words"), INFERENCE, ids=[c[0] for c in INFERENCE])
def test_inference_service_status_paths(
    server: RunningServer, channel: grpc.Channel, case: str, call: Any, code: grpc.StatusCode, words: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call(channel)
    assert info.value.code() == code, (case, info.value.details())
    assert words in (info.value.details() or ""), (case, info.value.details())
    wait_idle(server)
    assert_kv_clean(server)


def test_generate_json_deadline_is_deadline_exceeded_and_frees_the_sequence(
    server: RunningServer, channel: grpc.Channel
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub(channel).GenerateJSON(json_req(LONG, "A long list:", max_tokens=2000), timeout=0.5)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_idle(server, timeout=30)
    assert_kv_clean(server)


def test_a_cancelled_generate_json_frees_its_sequence(server: RunningServer, channel: grpc.Channel) -> None:
    """The client cancels a running GenerateJSON: the engine drops its sequence and its KV blocks."""
    wait_idle(server)
    started = server.engine.metrics.snapshot()["tiers"]
    future = stub(channel).GenerateJSON.future(json_req(LONG, "A long list:", max_tokens=2000), timeout=600)
    assert wait_for(lambda: any(s.request_id.startswith("json-") for s in server.engine.scheduler.running))
    assert future.cancel()
    with pytest.raises(grpc.FutureCancelledError):
        future.result()
    wait_idle(server, timeout=30)
    assert not any(s.request_id.startswith("json-") for s in server.engine.scheduler.running)
    assert_kv_clean(server)
    assert server.engine.metrics.snapshot()["tiers"] != started  # it did reach the engine


# -- BatchService --------------------------------------------------------------------------------
def bstub(ch: grpc.Channel) -> bpb_grpc.BatchServiceStub:
    return bpb_grpc.BatchServiceStub(ch)


BATCH: list[tuple[str, Callable[[grpc.Channel], Any], grpc.StatusCode, str]] = [
    ("get: unknown job", lambda ch: bstub(ch).GetBatch(bpb.GetBatchRequest(batch_id="batch_nope"), timeout=30),
     grpc.StatusCode.NOT_FOUND, "no batch 'batch_nope'"),
    ("cancel: unknown job", lambda ch: bstub(ch).CancelBatch(bpb.CancelBatchRequest(batch_id="batch_nope"), timeout=30),
     grpc.StatusCode.NOT_FOUND, "no batch 'batch_nope'"),
    ("watch: unknown job", lambda ch: list(bstub(ch).WatchBatch(bpb.WatchBatchRequest(batch_id="batch_nope"), timeout=30)),
     grpc.StatusCode.NOT_FOUND, "no batch 'batch_nope'"),
    ("results: unknown job", lambda ch: list(bstub(ch).GetBatchResults(
        bpb.GetBatchResultsRequest(batch_id="batch_nope"), timeout=30)),
     grpc.StatusCode.NOT_FOUND, "no batch 'batch_nope'"),
    ("list: a page token this server never gave", lambda ch: bstub(ch).ListBatches(
        bpb.ListBatchesRequest(page_token="not-a-token"), timeout=30),
     grpc.StatusCode.INVALID_ARGUMENT, "page_token is not one this server gave"),
    ("create: malformed message", lambda ch: ch.stream_unary("/inference.v1.BatchService/CreateBatch")(
        iter([b"\xff\xff\xff"]), timeout=30),
     grpc.StatusCode.INVALID_ARGUMENT, "message is not a valid CreateBatchRequest"),
]


@pytest.mark.parametrize(("case", "call", "code", "words"), BATCH, ids=[c[0] for c in BATCH])
def test_batch_service_status_paths(
    channel: grpc.Channel, case: str, call: Any, code: grpc.StatusCode, words: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call(channel)
    assert info.value.code() == code, (case, info.value.details())
    assert words in (info.value.details() or ""), (case, info.value.details())


def test_batch_results_refuse_a_cursor_that_is_not_a_completion_cursor(channel: grpc.Channel) -> None:
    job = create(bstub(channel), [gen("a")])
    request = bpb.GetBatchResultsRequest(batch_id=job.id, order=bpb.RESULT_ORDER_COMPLETION, cursor="abc")
    with pytest.raises(grpc.RpcError) as info:
        list(bstub(channel).GetBatchResults(request, timeout=30))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cursor is not one of a completion-order stream" in (info.value.details() or "")


def test_list_batches_pages_through_every_job_once(channel: grpc.Channel) -> None:
    made = {create(bstub(channel), [gen(f"p{i}")]).id for i in range(5)}
    seen: list[str] = []
    token, pages = "", 0
    while True:
        page = bstub(channel).ListBatches(bpb.ListBatchesRequest(page_size=2, page_token=token), timeout=30)
        assert len(page.batches) <= 2
        seen += [b.id for b in page.batches]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == len(set(seen)) and made <= set(seen), seen  # no job twice, none missing
    assert pages >= 3


def test_a_client_that_disconnects_during_an_upload_leaves_no_job(
    server: RunningServer, channel: grpc.Channel
) -> None:
    def jobs() -> dict[str, int]:
        page = bstub(channel).ListBatches(bpb.ListBatchesRequest(page_size=100), timeout=30)
        return {b.id: b.state for b in page.batches}

    before = jobs()
    hold = threading.Event()

    def upload() -> Any:
        yield bpb.CreateBatchRequest(options=bpb.BatchOptions(), items=[gen("u0"), gen("u1")])
        hold.wait(60)  # the upload never finishes: the client goes away instead

    with grpc.insecure_channel(server.target) as ch:
        call = bstub(ch).CreateBatch.future(upload(), timeout=600)
        # the first message created the job server-side, still validating
        assert wait_for(lambda: len(jobs()) == len(before) + 1), jobs()
        (new,) = set(jobs()) - set(before)
        assert jobs()[new] == bpb.BATCH_STATE_VALIDATING
        call.cancel()
        with pytest.raises(grpc.FutureCancelledError):
            call.result()
        # NOTE: the request iterator is released only once the call is cancelled: released earlier,
        # its end (a half-close) can reach the server before the cancel and complete the upload
        hold.set()
    assert wait_for(lambda: new not in jobs()), jobs()  # the half-uploaded job was discarded
    with pytest.raises(grpc.RpcError) as info:
        bstub(channel).GetBatch(bpb.GetBatchRequest(batch_id=new), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    wait_idle(server)
    assert_kv_clean(server)
