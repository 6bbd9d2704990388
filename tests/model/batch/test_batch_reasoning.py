"""Batch jobs of a reasoning model keep the thought apart, for real: tiny GGUFs of reasoning families (the tiny
vocabulary with the family's tokens, its real chat template, seeded random weights; as in
tests/model/http/test_reasoning_models.py, whose forced requests these are) run through the OpenAI batch API (the
``openai`` SDK's files and batches) and the BatchService stubs. The thought runs to the budget (its end marker's
logit lowered), so it must come back as ``reasoning_content`` / ``reasoning`` with exactly the budget's tokens, the
answer alone in ``content`` / ``text``, and the answer's JSON Schema applied after the thought and validated."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import grpc
import openai
import pytest
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb

from tests.model.http.test_reasoning_models import ASK, BUDGET, CASES, SCHEMA, forced, think_ids
from tests.model.http.test_reasoning_models import served as served
from tests.support.family_models import openai_client
from tests.support.server import assert_kv_clean

pytestmark = pytest.mark.model
# NOTE: ``served`` is the reasoning tests' module fixture (a server of each family's tiny GGUF), set up anew here
SHORT = 3  # a second, smaller budget: the thought follows each line's own
FINAL = ("completed", "failed", "cancelled", "expired")


def markers(name: str) -> int:
    """The thought's marker tokens its count includes: </think>, and <think> where the model opens it."""
    return 1 if CASES[name][4] else 2


def line_body(name: str, model: str, budget: int) -> dict[str, Any]:
    """The live chat request of ``forced`` as one batch line's body (its extra_body merged in)."""
    kw = forced(name)
    body = {"model": model, **{k: v for k, v in kw.items() if k != "extra_body"}, **kw["extra_body"]}
    body["thinking_budget_tokens"] = budget
    return body


def wait_done(c: openai.OpenAI, batch_id: str, timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while (b := c.batches.retrieve(batch_id)).status not in FINAL:
        assert time.monotonic() < deadline, f"batch still {b.status}"
        time.sleep(0.1)
    return b


def live(c: openai.OpenAI, body: dict[str, Any]) -> dict[str, Any]:
    """The live /v1/chat/completions answer to a line's body."""
    known = ("model", "messages", "max_tokens", "temperature", "logit_bias", "response_format")
    extra = {k: v for k, v in body.items() if k not in known}
    return c.chat.completions.create(**{k: body[k] for k in known}, extra_body=extra).model_dump(exclude_none=True)


def test_openai_batch_lines_have_the_thought_as_reasoning_content_as_the_live_answer(served: tuple[str, Any]) -> None:
    name, srv = served
    c, model = openai_client(srv)
    bodies = {cid: line_body(name, model, budget) for cid, budget in (("full", BUDGET), ("short", SHORT), ("off", 0))}
    rows = [{"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": b} for cid, b in bodies.items()]
    upload = c.files.create(file=("in.jsonl", io.BytesIO("\n".join(map(json.dumps, rows)).encode())), purpose="batch")
    batch = c.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_done(c, batch.id)
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", 3, 0), done
    lines = c.files.content(done.output_file_id).text.splitlines()
    out = {r["custom_id"]: r["response"]["body"] for r in map(json.loads, lines)}
    for cid, budget in (("full", BUDGET), ("short", SHORT)):
        choice = out[cid]["choices"][0]
        message, thought = choice["message"], choice["message"]["reasoning_content"]
        assert choice["finish_reason"] == "stop" and json.loads(message["content"]) == {"ok": True}, out[cid]
        assert thought and "<think>" not in thought and "</think>" not in thought and "<think>" not in message["content"]
        assert out[cid]["usage"]["completion_tokens_details"] == {"reasoning_tokens": budget + markers(name)}
    off = out["off"]["choices"][0]["message"]  # a budget of 0: thinking off
    assert "reasoning_content" not in off and json.loads(off["content"]) == {"ok": True}
    for cid, body in bodies.items():  # the live answer's shape and thought tokens
        same = live(c, body)
        assert set(out[cid]["choices"][0]["message"]) - {"refusal"} == set(same["choices"][0]["message"]), cid
        assert set(out[cid]["usage"]) == set(same["usage"])
        details = same["usage"]["completion_tokens_details"]["reasoning_tokens"]
        assert out[cid]["usage"]["completion_tokens_details"] == {"reasoning_tokens": details}, cid
    assert_kv_clean(srv)


def grpc_item(name: str, cid: str, budget: int, **extra: Any) -> bpb.BatchItem:
    """The forced request as a BatchService ``generate`` item (its JSON Schema as the response format)."""
    open_id, close_id = think_ids(name)
    bias = {close_id: -100.0, **({} if CASES[name][4] else {open_id: 100.0})}
    sp = pb.SamplingParams(max_tokens=48, temperature=0.0, logit_bias=bias, thinking_budget_tokens=budget)
    req = pb.GenerateRequest(messages=[pb.ChatMessage(**m) for m in ASK], sampling=sp,
                             response_format=pb.ResponseFormat(json_schema=json.dumps(SCHEMA)),
                             chat_template_kwargs=json.dumps(CASES[name][3]), **extra)
    return bpb.BatchItem(custom_id=cid, generate=req)


def test_batch_service_results_keep_the_thought_in_reasoning_and_the_document_in_text_generate_and_json_items(
    served: tuple[str, Any],
) -> None:
    name, srv = served
    items = [grpc_item(name, "full", BUDGET), grpc_item(name, "short", SHORT), grpc_item(name, "off", 0)]
    g = items[0].generate  # the same request as a GenerateJSON item: the thought, then the document
    items.append(bpb.BatchItem(custom_id="json", generate_json=pb.GenerateJSONRequest(
        messages=g.messages, json_schema=g.response_format.json_schema, sampling=g.sampling)))
    raw = bpb.BatchItem(custom_id="raw", generate=pb.GenerateRequest(
        prompt="Is 2 less than 3?", sampling=pb.SamplingParams(max_tokens=4, thinking_budget_tokens=BUDGET)))
    with grpc.insecure_channel(srv.target) as ch:
        stub = bpb_grpc.BatchServiceStub(ch)
        created = stub.CreateBatch(iter([bpb.CreateBatchRequest(items=[*items, raw])]), timeout=600).batch
        watched = list(stub.WatchBatch(bpb.WatchBatchRequest(batch_id=created.id, min_interval_ms=50), timeout=600))
        assert watched[-1].batch.state == bpb.BATCH_STATE_COMPLETED, watched[-1]
        got = {r.custom_id: r for r in stub.GetBatchResults(bpb.GetBatchResultsRequest(batch_id=created.id),
                                                            timeout=60)}
    job = watched[-1].batch
    assert job.usage.reasoning_tokens == sum(r.usage.reasoning_tokens for r in got.values()) > 0
    for cid, budget in (("full", BUDGET), ("short", SHORT), ("json", BUDGET)):
        r = got[cid]
        assert not r.HasField("error") and r.finish_reason == pb.FINISH_REASON_STOP, r
        assert json.loads(r.text) == {"ok": True}  # the document alone, validated against its schema
        assert r.reasoning and "</think>" not in r.reasoning and "<think>" not in r.text
        assert r.usage.reasoning_tokens == budget + markers(name)
        assert r.usage.completion_tokens > r.usage.reasoning_tokens
    closed_at_once = 1 if CASES[name][4] else 0  # a prompt that opened the thought has it closed: its end marker
    assert got["off"].HasField("reasoning") and got["off"].reasoning == ""  # read for a thought: none
    assert got["off"].usage.reasoning_tokens == closed_at_once
    assert json.loads(got["off"].text) == {"ok": True}
    # a budget needs chat messages, as on Generate: the item fails at upload, the job goes on
    assert got["raw"].error.status == "INVALID_ARGUMENT" and "needs chat messages" in got["raw"].error.message
    assert created.errors[0].custom_id == "raw"
    assert_kv_clean(srv)
