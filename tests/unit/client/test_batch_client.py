"""The client's batch-input conversion (no model): OpenAI batch JSONL and simple lines into BatchItems."""

from __future__ import annotations

import json

import pytest
from inference.v1 import batch_pb2 as bpb
from inference.v1 import inference_pb2 as pb
from inference_client.batch import read_jsonl, result_to_dict, to_item


def test_openai_chat_completion_line_becomes_a_generate_item_with_its_sampling() -> None:
    item = to_item({
        "custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "x", "messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                 "max_tokens": 12, "temperature": 0, "top_p": 0.5, "seed": 7, "stop": "\n"},
    })
    g = item.generate
    assert item.custom_id == "r1" and [(m.role, m.content) for m in g.messages] == [("system", "Be brief."),
                                                                                     ("user", "Hi")]
    sp = g.sampling
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.seed, list(sp.stop)) == (12, 0.0, 0.5, 7, ["\n"])
    assert sp.HasField("temperature") and not sp.HasField("top_k")  # unset fields keep the server defaults


def test_response_format_makes_a_json_item_and_simple_lines_work_too() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    item = to_item({"custom_id": "j", "body": {"prompt": "p", "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}})
    assert item.WhichOneof("request") == "generate_json" and json.loads(item.generate_json.json_schema) == schema
    obj = to_item({"custom_id": "o", "body": {"prompt": "p", "response_format": {"type": "json_object"}}})
    assert json.loads(obj.generate_json.json_schema) == {"type": "object"}
    simple = to_item({"custom_id": 5, "prompt": "Once", "max_tokens": 3})
    assert simple.custom_id == "5" and simple.generate.prompt == "Once" and simple.generate.sampling.max_tokens == 3


def test_bad_lines_name_their_line_number() -> None:
    lines = ['{"custom_id": "a", "body": {"prompt": "x"}}', "", '{"body": {"prompt": "no id"}}']
    with pytest.raises(ValueError, match="line 3: every item needs a custom_id"):
        list(read_jsonl(lines))
    with pytest.raises(ValueError, match="line 1"):
        list(read_jsonl(['{"custom_id": "a", "body": {"prompt": ["two", "prompts"]}}']))


def test_result_line_has_text_usage_and_error() -> None:
    ok = bpb.GetBatchResultsResponse(custom_id="a", text="hi", finish_reason=pb.FINISH_REASON_LENGTH,
                                     usage=pb.Usage(prompt_tokens=3, completion_tokens=2), attempts=1)
    bad = bpb.GetBatchResultsResponse(custom_id="b", error=pb.Error(status="INVALID_ARGUMENT", message="empty"))
    assert result_to_dict(ok)["finish_reason"] == "length" and result_to_dict(ok)["usage"]["completion_tokens"] == 2
    assert result_to_dict(ok)["error"] is None
    assert result_to_dict(bad)["error"] == {"status": "INVALID_ARGUMENT", "message": "empty"}
    assert result_to_dict(bad)["finish_reason"] is None
    assert result_to_dict(ok)["reasoning"] is None


def test_result_line_keeps_a_reasoning_models_thought_apart_from_the_text() -> None:
    r = bpb.GetBatchResultsResponse(custom_id="t", text='{"ok": true}', reasoning="Two is less.",
                                    finish_reason=pb.FINISH_REASON_STOP,
                                    usage=pb.Usage(prompt_tokens=3, completion_tokens=9, reasoning_tokens=6))
    line = result_to_dict(r)
    assert (line["text"], line["reasoning"], line["usage"]["reasoning_tokens"]) == ('{"ok": true}', "Two is less.", 6)
