"""OpenAI batch JSONL <-> BatchService protos: lines become items or refusals, results become output lines."""

from __future__ import annotations

import json

from inference.v1 import batch_pb2 as bpb
from inference.v1 import inference_pb2 as pb

from service.http.batch_lines import KEY_ENDPOINT, KEY_INPUT, batch_object, output_line, parse_lines

CHAT = "/v1/chat/completions"


def line(cid: str, body: dict[str, object], url: str = CHAT) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def test_lines_become_items_or_refusals_with_their_reason_and_a_thinking_budget_is_kept() -> None:
    good = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    data = "\n".join([
        line("a", good),
        line("b", {**good, "stream": True}),
        line("c", good, url="/v1/completions"),
        line("d", {**good, "model": "other"}),
        "{not json",
        "",
        line("e", {**good, "temperature": "hot"}),
        line("f", {**good, "thinking_budget_tokens": 8}),
    ]).encode()
    out = parse_lines(data, CHAT, "m")
    assert isinstance(out[0], bpb.BatchItem) and out[0].custom_id == "a"
    assert out[0].generate.messages[0].content == "hi" and out[0].generate.sampling.max_tokens == 4
    refusals = {x[0]: x[1] for x in out[1:] if isinstance(x, tuple)}
    assert "cannot stream" in refusals["b"] and "url /v1/chat/completions" in refusals["c"]
    assert "model must be 'm'" in refusals["d"] and "'temperature' must be a number" in refusals["e"]
    assert refusals[""] == "line 5 is not valid JSON"
    budget = next(x for x in out if isinstance(x, bpb.BatchItem) and x.custom_id == "f")
    assert budget.generate.sampling.thinking_budget_tokens == 8  # planned when the item runs
    assert len(out) == 7 and "f" not in refusals


def batch(state: int = bpb.BATCH_STATE_COMPLETED) -> bpb.Batch:
    b = bpb.Batch(id="batch_1", state=state, counts=bpb.BatchCounts(total=3, completed=2, failed=1))
    b.options.completion_window_s = 86400
    b.options.metadata.update({KEY_ENDPOINT: CHAT, KEY_INPUT: "file-1", "team": "x"})
    b.created_at.FromSeconds(100)
    b.in_progress_at.FromSeconds(101)
    return b


def test_batch_object_hides_the_internal_metadata_and_names_the_files() -> None:
    o = batch_object(batch())
    assert (o["object"], o["status"], o["endpoint"], o["input_file_id"]) == ("batch", "completed", CHAT, "file-1")
    assert (o["output_file_id"], o["error_file_id"]) == ("file-out-batch_1", "file-err-batch_1")
    assert o["metadata"] == {"team": "x"} and o["completion_window"] == "24h"
    assert (o["created_at"], o["in_progress_at"], o["completed_at"]) == (100, 101, None)
    assert o["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    running = batch_object(batch(bpb.BATCH_STATE_IN_PROGRESS))
    assert running["output_file_id"] is None and running["status"] == "in_progress"


def test_results_become_chat_completion_lines_or_error_lines() -> None:
    ok = bpb.GetBatchResultsResponse(custom_id="a", cursor="a", text="Hello", finish_reason=pb.FINISH_REASON_LENGTH,
                                     usage=pb.Usage(prompt_tokens=3, completion_tokens=2))
    failed, raw = output_line(ok, batch(), "m")
    row = json.loads(raw)
    assert not failed and row["custom_id"] == "a" and row["response"]["status_code"] == 200
    body = row["response"]["body"]
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == "Hello"
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["total_tokens"] == 5
    bad = bpb.GetBatchResultsResponse(custom_id="b", error=pb.Error(status="CANCELLED", message="batch cancelled"))
    failed, raw = output_line(bad, batch(), "m")
    row = json.loads(raw)
    assert failed and row["response"]["status_code"] == 503
    assert row["response"]["body"]["error"]["message"] == "batch cancelled"


def test_a_document_closed_within_its_budget_is_a_stop_marked_json_closed() -> None:
    from service.batch.convert import result_proto
    from service.batch.store import ItemResult, ItemState, StoredResult

    stored = StoredResult("j", "j", ItemState.COMPLETED, 1, ItemResult(text='{"x":0}', finish_reason="closed"))
    r = result_proto(stored)
    assert r.finish_reason == pb.FINISH_REASON_CLOSED  # GetBatchResults says so too
    choice = json.loads(output_line(r, batch(), "m")[1])["response"]["body"]["choices"][0]
    assert (choice["finish_reason"], choice["json_closed"]) == ("stop", True)
    plain = json.loads(output_line(bpb.GetBatchResultsResponse(custom_id="p", finish_reason=pb.FINISH_REASON_STOP),
                                   batch(), "m")[1])
    assert "json_closed" not in plain["response"]["body"]["choices"][0]


def test_a_reasoning_models_result_line_has_the_thought_as_reasoning_content_and_its_tokens_in_the_usage() -> None:
    r = bpb.GetBatchResultsResponse(custom_id="t", cursor="t", text='{"ok": true}', reasoning="two is less",
                                    finish_reason=pb.FINISH_REASON_STOP,
                                    usage=pb.Usage(prompt_tokens=9, completion_tokens=12, reasoning_tokens=7))
    body = json.loads(output_line(r, batch(), "m")[1])["response"]["body"]
    message = body["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ('{"ok": true}', "two is less")
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 7}
    assert body["usage"]["total_tokens"] == 21
    none = bpb.GetBatchResultsResponse(custom_id="n", text="Hi", reasoning="", finish_reason=pb.FINISH_REASON_STOP)
    empty = json.loads(output_line(none, batch(), "m")[1])["response"]["body"]
    assert "reasoning_content" not in empty["choices"][0]["message"]  # no thought (a budget of 0): as live
    assert empty["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    none.ClearField("reasoning")  # not read for a thought: another model's, or a result stored before
    plain = json.loads(output_line(none, batch(), "m")[1])["response"]["body"]
    assert "completion_tokens_details" not in plain["usage"] and plain["choices"][0]["message"]["content"] == "Hi"
