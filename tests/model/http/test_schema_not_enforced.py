"""A generated document that breaks a keyword the grammar could not enforce is a clear 400, never a 500.

The schemas here leave the grammar one document, and that document breaks the schema: ``tags`` must hold
two items of an enum with one value, and ``uniqueItems`` (which llguidance does not enforce, so the grammar
drops it) forbids it; or ``3`` forced by ``minimum``/``maximum`` and forbidden by ``not``. Each dialect
answers with its own error object (code ``schema_not_enforced``, the format's parameter, a message naming
the keyword and the path), a streamed answer ends with the dialect's one error event, and gRPC
``GenerateJSON`` fails INVALID_ARGUMENT with the reason as its status detail (``google.rpc.ErrorInfo``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import grpc
import httpx2
import openai
import pytest
from google.rpc import error_details_pb2, status_pb2
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from inference_client import InferenceClient, InferenceError

from tests.model.http.conftest import MODEL
from tests.model.http.test_anthropic_messages import sse_lines
from tests.model.http.test_openai_batch import jsonl, wait_done
from tests.model.http.test_openai_responses import TERMINAL, events_of
from tests.support.server import RunningServer, assert_kv_clean

pytestmark = pytest.mark.model
TAGS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a"]}, "minItems": 2,
                                                  "maxItems": 2, "uniqueItems": True}},
        "required": ["tags"], "additionalProperties": False}
THREE = {"type": "integer", "minimum": 3, "maximum": 3, "not": {"const": 3}}
ASK = [{"role": "user", "content": "Give me the tags."}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "tags", "schema": TAGS}}
UNIQUE = "document breaks 'uniqueItems' at /tags"
APPROXIMATED = "schema compiled with approximations: ignored: uniqueItems"


@pytest.fixture()
def http(api_server: RunningServer) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=f"http://127.0.0.1:{api_server.server.http_port}", timeout=300) as c:
        yield c


def assert_not_enforced(error: dict[str, Any], param: str) -> None:
    """OpenAI's error object of a document that broke ``uniqueItems`` at /tags."""
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "schema_not_enforced", param)
    assert UNIQUE in error["message"] and APPROXIMATED in error["message"], error["message"]


def test_chat_document_breaking_unique_items_is_400_schema_not_enforced(http: httpx2.Client,
                                                                        api_server: RunningServer) -> None:
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "response_format": FORMAT,
                                                "max_tokens": 32, "temperature": 0})
    assert r.status_code == 400, r.text
    assert_not_enforced(r.json()["error"], "response_format")
    assert_kv_clean(api_server)


def test_chat_sdk_raises_bad_request_with_the_code(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, response_format=FORMAT, max_tokens=32,  # type: ignore[arg-type]
                                       temperature=0)
    assert info.value.status_code == 400 and info.value.code == "schema_not_enforced"
    assert info.value.param == "response_format" and UNIQUE in info.value.message


def test_chat_streamed_ends_with_one_error_event_then_done(http: httpx2.Client) -> None:
    body = {"model": MODEL, "messages": ASK, "response_format": FORMAT, "max_tokens": 32, "temperature": 0,
            "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        data = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    errors = [c for c in chunks if "error" in c]
    assert len(errors) == 1 and chunks[-1] is errors[0]
    assert not any(row.get("finish_reason") for c in chunks[:-1] for row in c["choices"])
    assert_not_enforced(errors[0]["error"], "response_format")


def test_chat_sdk_stream_raises_api_error_with_the_code(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=ASK, response_format=FORMAT,  # type: ignore[arg-type]
                                            max_tokens=32, temperature=0, stream=True)
    with pytest.raises(openai.APIError) as info:
        for _ in stream:
            pass
    assert info.value.code == "schema_not_enforced" and UNIQUE in info.value.message


def test_responses_text_format_names_text_format(http: httpx2.Client) -> None:
    fmt = {"type": "json_schema", "name": "tags", "schema": TAGS}
    body = {"model": MODEL, "input": "Give me the tags.", "text": {"format": fmt}, "max_output_tokens": 32,
            "temperature": 0}
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert_not_enforced(r.json()["error"], "text.format")
    with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as s:
        assert s.status_code == 200
        events = events_of(s.iter_lines())
    names = [n for n, _ in events]
    assert [n for n in names if n in TERMINAL] == ["response.failed"] and names[-1] == "response.failed"
    error = events[-1][1]["response"]["error"]
    assert error["code"] == "schema_not_enforced" and UNIQUE in error["message"]


def test_anthropic_output_format_is_invalid_request_error_naming_the_keyword(api_server: RunningServer) -> None:
    root = f"http://127.0.0.1:{api_server.server.http_port}"
    fmt = {"format": {"type": "json_schema", "schema": TAGS}}
    with anthropic.Anthropic(base_url=root, api_key="unused", max_retries=0, timeout=300) as claude, \
            pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model=MODEL, max_tokens=32, messages=ASK,  # type: ignore[arg-type]
                               extra_body={"output_config": fmt, "temperature": 0})
    assert info.value.status_code == 400 and info.value.body["error"]["type"] == "invalid_request_error"
    assert UNIQUE in info.value.body["error"]["message"]
    body = {"model": MODEL, "max_tokens": 32, "messages": ASK, "output_config": fmt, "temperature": 0, "stream": True}
    with httpx2.stream("POST", root + "/v1/messages", json=body, timeout=300) as r:
        assert r.status_code == 200
        events = sse_lines(r.iter_lines())
    names = [n for n, _ in events]
    assert names[-1] == "error" and names.count("error") == 1 and "message_stop" not in names
    assert events[-1][1]["error"]["type"] == "invalid_request_error" and UNIQUE in events[-1][1]["error"]["message"]


@pytest.mark.parametrize(("schema", "broken"), [(TAGS, "document breaks 'uniqueItems' at /tags"),
                                                (THREE, "document breaks 'not' at (root)")], ids=["uniqueItems", "not"])
def test_generate_json_is_invalid_argument_with_reason_schema_not_enforced(
    api_server: RunningServer, schema: dict[str, Any], broken: str
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{api_server.port}") as ch, pytest.raises(grpc.RpcError) as info:
        pb_grpc.InferenceServiceStub(ch).GenerateJSON(pb.GenerateJSONRequest(
            prompt="A JSON value:", json_schema=json.dumps(schema),
            sampling=pb.SamplingParams(temperature=0, max_tokens=32)))
    err: Any = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and broken in err.details(), err.details()
    trailers = dict(err.trailing_metadata())
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    detail = error_details_pb2.ErrorInfo()
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and status.details[0].Unpack(detail)
    assert (detail.reason, detail.domain) == ("schema_not_enforced", "inference.v1")


def test_a_batch_item_that_breaks_its_schema_is_a_400_in_the_error_file(client: openai.OpenAI) -> None:
    rows = [{"custom_id": "tags", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL, "messages": ASK, "response_format": FORMAT, "max_tokens": 32, "temperature": 0}}]
    upload = client.files.create(file=("in.jsonl", jsonl(rows)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    done: Any = wait_done(client, batch.id)
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (0, 1)
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["tags"]
    response = errors[0]["response"]
    assert response["status_code"] == 400 and response["body"]["error"]["type"] == "invalid_request_error"
    assert UNIQUE in response["body"]["error"]["message"]


def test_the_client_library_reports_the_reason(api_server: RunningServer) -> None:
    with InferenceClient(f"127.0.0.1:{api_server.port}", timeout=300) as client, \
            pytest.raises(InferenceError) as info:
        client.generate_json(TAGS, "A JSON value:", temperature=0, max_tokens=32)
    assert (info.value.code, info.value.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "schema_not_enforced")
    assert UNIQUE in info.value.message and not info.value.elsewhere
