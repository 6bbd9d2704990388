"""A tiny Functionary v3.2 GGUF served for real (Llama 3's control tokens, the real template, seeded random weights:
built here, never committed), through the OpenAI SDK: every answer names its recipient first (the prompt ends with
``>>>``), so without a call reader (no tools, ``tool_choice: "none"``) the grammar writes ``all\\n`` and the content
is the text after it, streamed pieces concatenating to the unstreamed content; a ``json_schema`` response_format
gives a valid document as the content; the generated tokens (logprobs) show the header the content leaves out; a
gRPC ``Generate`` request (tools and ``TOOL_CHOICE_NONE``) has the same text as the HTTP content; gRPC
``GenerateJSON`` (messages, or a bare prompt rendered as a chat turn) returns a valid document in ``json``, the
header only in its generated tokens, and no reasoning; a BatchService item has the HTTP content as its text and no
``reasoning``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.family_models import family_server, openai_client
from tests.support.helpers import req, run_stream
from tests.support.server import RunningServer, assert_kv_clean

pytestmark = pytest.mark.model
TEMPLATE = "meetkai-functionary-medium-v3.2"
LLAMA = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
         "<|eom_id|>", "<|python_tag|>"]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
SCHEMA = {"type": "object", "properties": {"sunny": {"type": "boolean"}}, "required": ["sunny"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    path = tmp_path_factory.mktemp("functionary") / f"{TEMPLATE}.gguf"
    with family_server(path, TEMPLATE, LLAMA, "<|begin_of_text|>", "<|eot_id|>", [], 7) as srv:
        yield srv


def both(srv: RunningServer, **kw: Any) -> tuple[Any, str]:
    """The unstreamed choice and the streamed content (its pieces concatenated) of one greedy request."""
    client, model = openai_client(srv)
    args: dict[str, Any] = {"model": model, "messages": ASK, "max_tokens": 24, "temperature": 0, **kw}
    whole = client.chat.completions.create(**args).choices[0]
    chunks = list(client.chat.completions.create(**args, stream=True))
    return whole, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("tools", [{}, {"tools": [WEATHER], "tool_choice": "none"}], ids=["no tools", "none"])
def test_the_content_is_the_text_after_the_recipient_streamed_and_not(served: RunningServer,
                                                                      tools: dict[str, Any]) -> None:
    whole, streamed = both(served, logprobs=True, **tools)
    content = whole.message.content or ""
    written = b"".join(bytes(t.bytes or []) for t in whole.logprobs.content).decode("utf-8", "replace")
    assert written == "all\n" + content and content and streamed == content
    assert whole.message.tool_calls is None and whole.finish_reason in ("stop", "length")
    assert_kv_clean(served)


def test_a_json_schema_response_format_is_a_valid_document_after_the_recipient(served: RunningServer) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
    whole, streamed = both(served, response_format=fmt, max_tokens=48)
    assert whole.finish_reason == "stop", whole
    doc = json.loads(whole.message.content or "")
    assert set(doc) == {"sunny"} and isinstance(doc["sunny"], bool) and streamed == whole.message.content


def test_a_grpc_generate_request_with_tool_choice_none_has_the_same_text(served: RunningServer) -> None:
    whole, _ = both(served)
    tool = pb.Tool(name="get_weather", parameters=json.dumps(WEATHER["function"]["parameters"]))
    ask = req("r", max_tokens=24, messages=[pb.ChatMessage(role="user", content=ASK[0]["content"])])
    ask.tools.append(tool)
    ask.tool_choice = pb.TOOL_CHOICE_NONE
    with grpc.insecure_channel(served.target) as channel:
        got = run_stream(channel, [ask])["r"]
    assert got.error is None and got.done is not None, got.error
    assert got.text == whole.message.content and got.done.usage.reasoning_tokens == 0


@pytest.mark.parametrize("ask", [{"messages": [pb.ChatMessage(role="user", content=ASK[0]["content"])]},
                                 {"prompt": ASK[0]["content"]}], ids=["messages", "bare prompt"])
def test_a_grpc_generate_json_document_is_valid_and_holds_no_header(served: RunningServer,
                                                                    ask: dict[str, Any]) -> None:
    sampling = pb.SamplingParams(max_tokens=48, temperature=0, logprobs=True)
    with grpc.insecure_channel(served.target) as channel:
        resp = pb_grpc.InferenceServiceStub(channel).GenerateJSON(
            pb.GenerateJSONRequest(json_schema=json.dumps(SCHEMA), sampling=sampling, **ask), timeout=600)
    doc = json.loads(resp.json)
    assert set(doc) == {"sunny"} and isinstance(doc["sunny"], bool) and resp.finish_reason == pb.FINISH_REASON_STOP
    written = b"".join(e.token for e in resp.logprobs).decode("utf-8", "replace")
    assert written == "all\n" + resp.json and len(resp.logprobs) == resp.usage.completion_tokens
    assert (resp.reasoning, resp.usage.reasoning_tokens) == ("", 0)
    assert_kv_clean(served)


def test_a_batch_service_item_has_the_live_text_without_the_header_and_no_reasoning(served: RunningServer) -> None:
    """A batch item runs the live request's set-up: its text is the HTTP content (the header dropped), and a model
    that does not reason has no ``reasoning`` (unset, not empty)."""
    whole, _ = both(served)
    item = bpb.BatchItem(custom_id="f", generate=pb.GenerateRequest(
        messages=[pb.ChatMessage(role="user", content=ASK[0]["content"])],
        sampling=pb.SamplingParams(max_tokens=24, temperature=0.0)))
    with grpc.insecure_channel(served.target) as ch:
        stub = bpb_grpc.BatchServiceStub(ch)
        created = stub.CreateBatch(iter([bpb.CreateBatchRequest(items=[item])]), timeout=600).batch
        watched = list(stub.WatchBatch(bpb.WatchBatchRequest(batch_id=created.id, min_interval_ms=50), timeout=600))
        assert watched[-1].batch.state == bpb.BATCH_STATE_COMPLETED, watched[-1]
        (result,) = stub.GetBatchResults(bpb.GetBatchResultsRequest(batch_id=created.id), timeout=60)
    assert not result.HasField("error") and result.text == whole.message.content
    assert not result.text.startswith("all\n") and not result.HasField("reasoning")
    assert result.usage.reasoning_tokens == 0
