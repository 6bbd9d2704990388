"""BatchService end to end: real default model, real in-process servers, and one real process killed with SIGKILL.

Jobs complete with one result per custom_id; cancel stops queued items and
cuts running ones; a retried create is the same job; bad items are reported
per item; tenants never see each other's jobs; a server stopped without drain
(in-process) or killed with SIGKILL (real process) and started again on the
same database finishes the job with exactly one result per custom_id.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb

from tests.support.helpers import wait_for
from tests.support.server import RunningServer, ServerProcess, assert_kv_clean, start_server, wait_batch_store

pytestmark = pytest.mark.model
FINAL = {bpb.BATCH_STATE_COMPLETED, bpb.BATCH_STATE_FAILED, bpb.BATCH_STATE_CANCELLED, bpb.BATCH_STATE_EXPIRED}
PROMPTS = ["The capital of France is", "Two plus two equals", "Once upon a time", "My favourite colour is"]


def gen(cid: str, prompt: str = "Hello", max_tokens: int = 4, **sampling: Any) -> bpb.BatchItem:
    sampling.setdefault("temperature", 0.0)
    sp = pb.SamplingParams(max_tokens=max_tokens, **sampling)
    return bpb.BatchItem(custom_id=cid, generate=pb.GenerateRequest(prompt=prompt, sampling=sp))


def create(stub: Any, items: list[bpb.BatchItem], chunk: int = 16, md: Any = None, **options: Any) -> bpb.Batch:
    msgs = [bpb.CreateBatchRequest(options=bpb.BatchOptions(**options), items=items[:chunk])]
    msgs += [bpb.CreateBatchRequest(items=items[i : i + chunk]) for i in range(chunk, len(items), chunk)]
    return stub.CreateBatch(iter(msgs), timeout=600, metadata=md).batch


def get(stub: Any, batch_id: str, md: Any = None) -> bpb.Batch:
    return stub.GetBatch(bpb.GetBatchRequest(batch_id=batch_id), timeout=10, metadata=md).batch


def wait_until(stub: Any, batch_id: str, done: Any, timeout: float = 600, md: Any = None) -> bpb.Batch:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        b = get(stub, batch_id, md)
        if done(b):
            return b
        time.sleep(0.05)
    raise AssertionError(f"job not there in {timeout} s: {b}")


def final(stub: Any, batch_id: str, md: Any = None) -> bpb.Batch:
    return wait_until(stub, batch_id, lambda b: b.state in FINAL, md=md)


def results(stub: Any, batch_id: str, md: Any = None, **kw: Any) -> list[bpb.GetBatchResultsResponse]:
    req = bpb.GetBatchResultsRequest(batch_id=batch_id, **kw)
    return list(stub.GetBatchResults(req, timeout=30, metadata=md))


def assert_one_completed_result_each(stub: Any, batch_id: str, ids: list[str], md: Any = None) -> list[Any]:
    out = results(stub, batch_id, md)
    assert [r.custom_id for r in out] == sorted(ids)  # exactly one result per custom_id
    assert all(not r.HasField("error") and r.usage.completion_tokens > 0 for r in out), out
    return out


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The module's server, once on each store: a SQLite file, and PostgreSQL (tests/support/pg.py)."""
    folder = tmp_path_factory.mktemp("batch")
    if request.param == "sqlite":
        db = str(folder / "batch.db")
    else:
        from tests.support.pg import cluster, database_name

        db = cluster().url(database_name(str(folder)))
        cluster().create_database(database_name(str(folder)))
    s = start_server(batch_db=db, batch_max_running=6, replica_id="solo")
    wait_batch_store(s)
    yield s
    s.close()


@pytest.fixture()
def stub(srv: RunningServer) -> Iterator[Any]:
    with grpc.insecure_channel(srv.target) as ch:
        yield bpb_grpc.BatchServiceStub(ch)


def test_many_small_items_complete_with_one_result_each_in_both_orders(srv: RunningServer, stub: Any) -> None:
    items = [gen(f"item-{i:03d}", PROMPTS[i % 4], max_tokens=1 + i % 4) for i in range(30)]
    schema = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
    sp = pb.SamplingParams(max_tokens=24, temperature=0.0)
    # NOTE: the document closes within its 24 tokens: greedy output depends on which items share its
    # steps, and a full CI run once saw it add keys past 24 tokens (cut off: a failed item)
    closing = pb.SamplingParams(max_tokens=24, temperature=0.0, json_finish=pb.JSON_FINISH_CLOSE_WITHIN_BUDGET)
    items.append(bpb.BatchItem(custom_id="json", generate_json=pb.GenerateJSONRequest(
        prompt="Answer in JSON:", json_schema=schema, sampling=closing, raw_prompt=True)))
    chat = [pb.ChatMessage(role="user", content="Say hi")]
    items.append(bpb.BatchItem(custom_id="chat", generate=pb.GenerateRequest(messages=chat, sampling=sp)))
    created = create(stub, items, display_name="small", metadata={"team": "a"})
    assert created.state == bpb.BATCH_STATE_IN_PROGRESS and created.counts.total == 32
    watched = list(stub.WatchBatch(bpb.WatchBatchRequest(batch_id=created.id, min_interval_ms=50), timeout=600))
    assert watched[-1].batch.state == bpb.BATCH_STATE_COMPLETED  # the stream ends in the final state
    job = get(stub, created.id)
    failed = [(r.custom_id, r.error.status, r.error.message) for r in results(stub, created.id) if r.HasField("error")]
    assert (job.counts.completed, job.counts.failed, job.counts.running, job.counts.queued) == (32, 0, 0, 0), failed
    assert job.options.metadata["team"] == "a" and job.HasField("completed_at") and job.HasField("finalizing_at")
    out = assert_one_completed_result_each(stub, created.id, [i.custom_id for i in items])
    by_id = {r.custom_id: r for r in out}
    for i in range(30):
        assert by_id[f"item-{i:03d}"].usage.completion_tokens <= 1 + i % 4
    assert json.loads(by_id["json"].text)["ok"] in (True, False)
    assert sum(r.usage.completion_tokens for r in out) == job.usage.completion_tokens
    assert sum(r.usage.prompt_tokens for r in out) == job.usage.prompt_tokens
    done_order = results(stub, created.id, order=bpb.RESULT_ORDER_COMPLETION, limit=10)
    rest = results(stub, created.id, order=bpb.RESULT_ORDER_COMPLETION, cursor=done_order[-1].cursor)
    assert len(done_order) == 10 and sorted(r.custom_id for r in done_order + rest) == sorted(by_id)
    assert_kv_clean(srv)


def test_cancel_mid_job_keeps_finished_results_and_never_starts_queued_items(srv: RunningServer, stub: Any) -> None:
    items = [gen(f"c{i:02d}", PROMPTS[i % 4], max_tokens=24, ignore_eos=True) for i in range(30)]
    created = create(stub, items)
    wait_until(stub, created.id, lambda b: b.counts.completed >= 1)
    cancelling = stub.CancelBatch(bpb.CancelBatchRequest(batch_id=created.id), timeout=10).batch
    assert cancelling.state in (bpb.BATCH_STATE_CANCELLING, bpb.BATCH_STATE_CANCELLED)
    job = final(stub, created.id)
    assert job.state == bpb.BATCH_STATE_CANCELLED and job.HasField("cancelled_at")
    c = job.counts
    assert c.completed >= 1 and c.completed + c.cancelled == 30 and c.running == c.queued == 0
    out = results(stub, created.id)
    assert len(out) == 30
    cancelled = [r for r in out if r.HasField("error")]
    assert all(r.error.status == "CANCELLED" for r in cancelled)
    never_started = [r for r in cancelled if r.attempts == 0]
    assert len(never_started) >= 30 - 6 - c.completed  # at most --batch-max-running were in the engine
    cut = [r for r in cancelled if r.attempts == 1]
    assert all(r.finish_reason == pb.FINISH_REASON_CANCELLED and r.usage.completion_tokens < 24 for r in cut)
    assert all(r.usage.completion_tokens == 24 for r in out if not r.HasField("error"))  # kept whole
    assert_kv_clean(srv)


def test_a_retried_create_with_the_same_idempotency_key_is_the_same_job(stub: Any) -> None:
    first = create(stub, [gen("a"), gen("b")], idempotency_key="nightly-2026-11-23")
    again = create(stub, [gen("a"), gen("b"), gen("c")], idempotency_key="nightly-2026-11-23")
    other = create(stub, [gen("a")], idempotency_key="nightly-2026-11-24")
    assert again.id == first.id and other.id != first.id
    assert final(stub, first.id).counts.total == 2  # the retry added nothing
    listed = stub.ListBatches(bpb.ListBatchesRequest(page_size=100), timeout=10).batches
    assert sum(1 for b in listed if b.options.idempotency_key == "nightly-2026-11-23") == 1


def test_bad_items_are_reported_per_item_and_a_job_of_only_bad_items_fails(stub: Any) -> None:
    bad_schema = bpb.BatchItem(custom_id="bad-schema", generate_json=pb.GenerateJSONRequest(
        prompt="x", json_schema="{not json"))
    items = [
        gen("good-1"),
        gen("empty", prompt=""),
        gen("hot", temperature=-1.0),
        gen("good-1"),  # duplicate custom_id
        gen(""),  # no custom_id
        gen("two", n=2),
        bad_schema,
        bpb.BatchItem(custom_id="nothing"),
        gen("good-2"),
    ]
    created = create(stub, items, chunk=4)
    errors = {(e.line, e.custom_id): e.status for e in created.errors}
    assert errors == {
        (2, "empty"): "INVALID_ARGUMENT", (3, "hot"): "INVALID_ARGUMENT", (4, "good-1"): "ALREADY_EXISTS",
        (5, ""): "INVALID_ARGUMENT", (6, "two"): "INVALID_ARGUMENT", (7, "bad-schema"): "INVALID_ARGUMENT",
        (8, "nothing"): "INVALID_ARGUMENT",
    }
    assert created.error_count == 7 and created.counts.total == 7 and created.counts.failed == 5
    job = final(stub, created.id)
    assert job.state == bpb.BATCH_STATE_COMPLETED and job.counts.completed == 2
    out = {r.custom_id: r for r in results(stub, created.id)}
    assert set(out) == {"good-1", "good-2", "empty", "hot", "two", "bad-schema", "nothing"}
    assert out["empty"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and out["empty"].attempts == 0
    failed = create(stub, [gen("x", prompt=""), gen("")])
    assert failed.state == bpb.BATCH_STATE_FAILED and "invalid" in failed.failure
    with pytest.raises(grpc.RpcError) as err:
        get(stub, "batch_does_not_exist")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_stop_without_drain_then_drain_then_restart_gives_one_result_per_custom_id_and_tenants_stay_apart(
    tmp_path: Path,
) -> None:
    from tests.model.security.test_security import TOKENS, sha, tenants_doc

    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps(tenants_doc({"one": {"token_sha256": [sha("tok-one")], "max_concurrent": 1}})))
    alpha, ops = (("authorization", f"Bearer {TOKENS['alpha']}"),), (("authorization", f"Bearer {TOKENS['ops']}"),)
    db = str(tmp_path / "batch.db")
    ids = [f"r{i:02d}" for i in range(20)]
    first = start_server(batch_db=db, batch_max_running=4, auth_tokens=str(tenants))
    try:
        with grpc.insecure_channel(first.target) as ch:
            stub = bpb_grpc.BatchServiceStub(ch)
            items = [gen(cid, PROMPTS[i % 4], max_tokens=24, ignore_eos=True) for i, cid in enumerate(ids)]
            job_id = create(stub, items, md=alpha).id
            wait_until(stub, job_id, lambda b: b.counts.completed >= 3 and b.counts.running > 0, md=alpha)
            for call, req in ((stub.GetBatch, bpb.GetBatchRequest), (stub.CancelBatch, bpb.CancelBatchRequest)):
                with pytest.raises(grpc.RpcError) as err:
                    call(req(batch_id=job_id), timeout=10, metadata=ops)
                assert err.value.code() == grpc.StatusCode.NOT_FOUND  # another tenant's job does not exist
            assert stub.ListBatches(bpb.ListBatchesRequest(), timeout=10, metadata=ops).batches == []
    finally:
        first.close()  # stop without drain: items in the engine stay RUNNING in the store
    second = start_server(batch_db=db, batch_max_running=4, auth_tokens=str(tenants))
    try:
        with grpc.insecure_channel(second.target) as ch:
            stub = bpb_grpc.BatchServiceStub(ch)
            wait_until(stub, job_id, lambda b: b.counts.completed >= 8 and b.counts.running > 0, md=alpha)
        second.call(second.server.drain(0.05))  # SIGTERM's drain: a short grace, running items requeued
    finally:
        second.close()
    third = start_server(batch_db=db, batch_max_running=4, auth_tokens=str(tenants))
    try:
        with grpc.insecure_channel(third.target) as ch:
            stub = bpb_grpc.BatchServiceStub(ch)
            job = final(stub, job_id, md=alpha)
            assert job.state == bpb.BATCH_STATE_COMPLETED and job.counts.completed == 20 and job.counts.failed == 0
            out = assert_one_completed_result_each(stub, job_id, ids, md=alpha)
            # items running at the stop and at the drain ran again from scratch (at least one each time)
            assert sum(r.attempts for r in out) - len(ids) >= 2
            assert all(r.usage.completion_tokens == 24 for r in out)
            with pytest.raises(grpc.RpcError) as err:  # another tenant's job does not exist for ops
                results(stub, job_id, md=ops)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND, err.value.details()
            # a tenant quota of 1 concurrent request refuses most of the 4 slots: those items wait, none fails
            one = (("authorization", "Bearer tok-one"),)
            small = create(stub, [gen(f"q{i}") for i in range(5)], md=one).id
            assert final(stub, small, md=one).counts.completed == 5
            assert [r.attempts for r in results(stub, small, md=one)] == [1] * 5
    finally:
        third.close()


def test_sigkill_mid_job_and_restart_finishes_every_item_exactly_once(tmp_path: Path) -> None:
    db = str(tmp_path / "batch.db")
    ids = [f"k{i:02d}" for i in range(8)]

    def serve() -> tuple[ServerProcess, str]:
        proc = ServerProcess("--batch-db", db, "--batch-max-running", "4", env={"INFERENCE_LOG_FORMAT": "json"})
        target = json.loads(proc.wait_for("listening on"))["msg"].split()[2].rstrip(";")
        proc.wait_for("SERVING after")
        return proc, target

    proc, target = serve()
    try:
        with grpc.insecure_channel(target) as ch:
            stub = bpb_grpc.BatchServiceStub(ch)
            items = [gen(cid, PROMPTS[i % 4], max_tokens=16, ignore_eos=True) for i, cid in enumerate(ids)]
            job_id = create(stub, items).id
            before = wait_until(stub, job_id, lambda b: b.counts.completed >= 1 and b.counts.running > 0)
        proc.proc.kill()  # SIGKILL: no drain, no cleanup
        proc.proc.wait(10)
        assert before.state == bpb.BATCH_STATE_IN_PROGRESS
        proc, target = serve()
        with grpc.insecure_channel(target) as ch:
            stub = bpb_grpc.BatchServiceStub(ch)
            job = final(stub, job_id)
            assert job.state == bpb.BATCH_STATE_COMPLETED and job.counts.completed == 8
            out = assert_one_completed_result_each(stub, job_id, ids)
            assert any(r.attempts == 2 for r in out), "items running at the kill ran again"
            assert sum(r.attempts for r in out) <= 8 + 4  # only the (at most 4) running items ran twice
    finally:
        proc.kill()


def test_cli_submits_openai_batch_jsonl_and_writes_one_result_line_per_item(
    srv: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from inference_client.cli import main

    lines = [
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4, "temperature": 0}},
        {"custom_id": "text", "body": {"prompt": "Once upon a time", "max_tokens": 4}},
        {"custom_id": "doc", "body": {"prompt": "A user as JSON:", "max_tokens": 40, "temperature": 0,
                                      "response_format": {"type": "json_object"}}},
        {"custom_id": "empty", "body": {"prompt": "", "max_tokens": 4}},
    ]
    path = tmp_path / "input.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    base = ["--target", srv.target, "batch"]
    assert main([*base, "submit", str(path), "--name", "cli"]) == 0
    job_id = capsys.readouterr().out.strip()
    assert main([*base, "status", job_id]) == 0  # returns once the job is final
    assert "COMPLETED: 3 completed, 1 failed" in capsys.readouterr().out
    assert main([*base, "results", job_id]) == 0
    out = {r["custom_id"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert sorted(out) == ["chat", "doc", "empty", "text"]
    assert isinstance(json.loads(out["doc"]["text"]), dict)
    assert out["empty"]["error"]["status"] == "INVALID_ARGUMENT" and out["text"]["error"] is None
    assert main([*base, "list"]) == 0 and job_id in capsys.readouterr().out


def test_each_item_run_has_a_span_linked_to_the_create_call_and_parent_of_its_request_span() -> None:
    from opentelemetry.trace import SpanKind

    from tests.model.observability.test_observability import TRACE_ID, TRACEPARENT, Traced

    traced = Traced()  # max_running 1: the batch cap is 1
    try:
        with grpc.insecure_channel(traced.srv.target) as ch:
            stub = bpb_grpc.BatchServiceStub(ch)
            job_id = create(stub, [gen("s1"), gen("s2")], md=TRACEPARENT).id
            assert final(stub, job_id).counts.completed == 2
        # the RPC and item spans end just after the last answer
        def ended() -> bool:
            spans = traced.spans.get_finished_spans()
            rpc = [s for s in spans if s.context.trace_id == TRACE_ID and s.kind is SpanKind.SERVER]
            return bool(rpc) and len([s for s in spans if s.name == "batch_item"]) == 2

        assert wait_for(ended, timeout=600)
        spans = traced.spans.get_finished_spans()
        rpc = next(s for s in spans if s.context.trace_id == TRACE_ID and s.kind is SpanKind.SERVER)
        assert rpc.name == "/inference.v1.BatchService/CreateBatch"
        items = [s for s in spans if s.name == "batch_item"]
        assert len(items) == 2 and all(s.attributes["batch.id"] == job_id for s in items)
        assert all([link.context.span_id for link in s.links] == [rpc.context.span_id] for s in items)
        requests = [s for s in spans if s.parent is not None and s.parent.span_id in {i.context.span_id for i in items}]
        assert len(requests) == 2 and all(s.name.startswith("text_completion") for s in requests)
    finally:
        traced.srv.close()


def test_batch_service_is_listed_by_reflection_and_has_its_own_health(srv: RunningServer) -> None:
    from google.protobuf import descriptor_pool
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(srv.target) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        assert "inference.v1.BatchService" in set(db.get_services())
        service = descriptor_pool.DescriptorPool(db).FindServiceByName("inference.v1.BatchService")
        assert {m.name for m in service.methods} == {
            "CreateBatch", "GetBatch", "ListBatches", "CancelBatch", "WatchBatch", "GetBatchResults"
        }
        request = health_pb2.HealthCheckRequest(service="inference.v1.BatchService")
        assert health_pb2_grpc.HealthStub(ch).Check(request, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
