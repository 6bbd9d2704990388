"""Every bad input a 4xx (issue #35 items 4, 5, 7): text that is not Unicode, numbers past int()'s
limit, nesting past the limit, an oversized schema (permanent: 400 / INVALID_ARGUMENT, never a
retryable 429 / RESOURCE_EXHAUSTED), bodies that are not JSON, ambiguous credentials; over HTTP
(the OpenAI error object, with the parameter named) and over gRPC.

One in-process server with a tenants file: every call carries a bearer token.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx2
import openai
import pytest
from inference.v1 import batch_pb2 as bpb
from inference.v1 import batch_pb2_grpc as bpb_grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.helpers import req, run_stream
from tests.support.server import RunningServer, free_port, start_server

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct.Q4_1"
TOKEN = "tok-hostile-input"
AUTH = [("authorization", f"Bearer {TOKEN}")]
BIG_SCHEMA = {"type": "object", "description": "a" * 1_000_000}  # --max-schema-bytes is 64,000


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tenants = Path(tmp_path_factory.mktemp("hostile-input")) / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"t": {"token_sha256": [hashlib.sha256(TOKEN.encode()).hexdigest()]}}}))
    server = start_server(http_port=free_port(), auth_tokens=str(tenants))
    yield server
    server.close()


@pytest.fixture()
def http(srv: RunningServer) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=f"http://127.0.0.1:{srv.server.http_port}", timeout=120, headers=dict(AUTH)) as c:
        yield c


@pytest.fixture()
def client(srv: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"http://127.0.0.1:{srv.server.http_port}/v1", api_key=TOKEN, max_retries=2,
                       timeout=120) as c:
        yield c


@pytest.fixture()
def channel(srv: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(srv.target) as ch:
        yield ch


def chat(content: Any = "Hi", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2, **extra}


def post(http: httpx2.Client, path: str, body: dict[str, Any]) -> httpx2.Response:
    """``body`` as json.dumps writes it (a lone surrogate becomes the escape ``\\ud800``, as any JSON
    encoder with ASCII output writes it)."""
    return http.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def error_of(r: httpx2.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text[:300]
    error: dict[str, Any] = r.json()["error"]
    return error


DEEP = 150  # levels: past the limit of 100, well within what the JSON decoder takes
TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
CALL = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                             "function": {"name": "f", "arguments": "\ud800"}}]}


# -- item 4: lone surrogates, huge digit strings, nesting ----------------------------------------------
@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", chat("say \ud800"), "messages[0].content"),
    ("/v1/chat/completions", chat([{"type": "text", "text": "\udfff"}]), "messages[0].content[0].text"),
    ("/v1/completions", {"model": MODEL, "prompt": "x\ud800", "max_tokens": 2}, "prompt"),
    ("/v1/chat/completions", chat(stop=["\udc00"]), "stop[0]"),
    ("/v1/chat/completions", chat(tools=[{**TOOL, "function": {**TOOL["function"], "description": "\ud800"}}]),
     "tools[0].function.description"),
    ("/v1/chat/completions", {**chat(), "messages": [{"role": "user", "content": "x"}, CALL]},
     "messages[1].tool_calls[0].function.arguments"),
], ids=["chat-content", "content-part", "prompt", "stop", "tool-description", "tool-call-arguments"])
def test_a_lone_surrogate_is_a_400_naming_the_parameter(http: httpx2.Client, path: str, body: dict[str, Any],
                                                         param: str) -> None:
    error = error_of(post(http, path, body), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "lone UTF-16 surrogate" in error["message"]


def test_a_logit_bias_key_of_5000_digits_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       logit_bias={"1" * 5000: 1})
    assert info.value.status_code == 400 and info.value.param == "logit_bias"
    assert info.value.type == "invalid_request_error" and "5000 characters" in info.value.message


def test_nesting_past_the_limit_is_a_400_naming_the_parameter(http: httpx2.Client) -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(DEEP):
        deep = {"type": "array", "items": deep}
    tool = {"type": "function", "function": {"name": "f", "parameters": deep}}
    error = error_of(post(http, "/v1/chat/completions", chat(tools=[tool])), 400)
    assert error["param"] == "tools" and "nested more than 100 levels" in error["message"]
    error = error_of(post(http, "/v1/chat/completions", chat(metadata={"x": json.loads("[" * 900 + "]" * 900)})),
                     400)
    assert error["param"] == "metadata"


def test_a_deeply_nested_tool_call_argument_string_is_kept_as_text(http: httpx2.Client) -> None:
    arguments = "[" * 1100 + "]" * 1100  # the client's own text: past the decoder's recursion limit (~1,000)
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                 "function": {"name": "f", "arguments": arguments}}]}
    r = post(http, "/v1/chat/completions", {**chat(max_tokens=1), "messages": [{"role": "user", "content": "x"}, call]})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("path", ["/v1/files", "/v1/batches"])
def test_a_listing_limit_of_5000_digits_is_a_400(http: httpx2.Client, path: str) -> None:
    error = error_of(http.get(path, params={"limit": "9" * 5000}), 400)
    assert error["param"] == "limit" and error["type"] == "invalid_request_error"


# -- item 5: an oversized schema is permanent --------------------------------------------------------
def test_a_schema_over_the_size_limit_is_a_400_the_sdk_does_not_retry(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:  # was RateLimitError (429 server_is_overloaded)
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
            response_format={"type": "json_schema", "json_schema": {"name": "big", "schema": BIG_SCHEMA}})
    assert info.value.status_code == 400 and info.value.type == "invalid_request_error"
    assert "the limit is 64000" in info.value.message and info.value.code != "server_is_overloaded"


def test_grpc_a_schema_over_the_size_limit_is_invalid_argument(channel: grpc.Channel) -> None:
    schema = json.dumps(BIG_SCHEMA)
    with pytest.raises(grpc.RpcError) as info:
        pb_grpc.InferenceServiceStub(channel).GenerateJSON(
            pb.GenerateJSONRequest(prompt="JSON:", json_schema=schema), metadata=AUTH, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "the limit is 64000" in info.value.details()
    assert not any(k == "retry-after-ms" for k, _ in info.value.trailing_metadata() or ())
    results = run_stream(channel, [req("big", "JSON:", 4, response_format=pb.ResponseFormat(json_schema=schema))],
                         metadata=AUTH, timeout=60)
    error = results["big"].error
    assert error is not None and error.status == "INVALID_ARGUMENT" and error.retry_after_ms == 0


# -- item 7: content types and credentials -----------------------------------------------------------
def test_a_body_that_is_not_json_is_415_and_a_missing_content_type_is_taken_as_json(http: httpx2.Client) -> None:
    raw = json.dumps(chat()).encode()
    for kind in ("text/plain", "application/x-www-form-urlencoded"):
        error = error_of(http.post("/v1/chat/completions", content=raw, headers={"content-type": kind}), 415)
        assert error["type"] == "invalid_request_error" and error["code"] == "unsupported_media_type"
    tokenize = http.post("/tokenize", content=b'{"prompt": "hi"}', headers={"content-type": "text/plain"})
    assert error_of(tokenize, 415)["code"] == "unsupported_media_type"
    assert http.post("/v1/chat/completions", content=raw).status_code == 200  # no Content-Type: lenient
    utf8 = {"content-type": "application/json; charset=utf-8"}
    assert http.post("/v1/chat/completions", content=raw, headers=utf8).status_code == 200


def test_two_authorization_headers_never_authenticate(srv: RunningServer, channel: grpc.Channel) -> None:
    base = f"http://127.0.0.1:{srv.server.http_port}"
    with httpx2.Client(base_url=base, timeout=60) as http:
        for second in (f"Bearer {TOKEN}", "Bearer wrong"):
            r = http.get("/v1/models", headers=[("authorization", f"Bearer {TOKEN}"), ("authorization", second)])
            error = error_of(r, 401)
            assert error["type"] == "authentication_error" and "2 authorization headers" in error["message"]
        # one header: the scheme is case-insensitive and spaces around the token are dropped (RFC 6750)
        assert http.get("/v1/models", headers={"authorization": f"bearer   {TOKEN}"}).status_code == 200
    stub = pb_grpc.InferenceServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.CountTokens(pb.CountTokensRequest(text="hi"), metadata=AUTH + AUTH, timeout=30)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "2 authorization" in info.value.details()
    assert stub.CountTokens(pb.CountTokensRequest(text="hi"), metadata=AUTH, timeout=30).count > 0


# -- the batch tier: the same inputs in a batch file, and result cursors -----------------------------
def test_batch_lines_with_bad_input_are_refused_lines_not_a_500(http: httpx2.Client) -> None:
    def line(cid: str, body: dict[str, Any]) -> str:
        return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})

    nested: Any = []
    for _ in range(DEEP):
        nested = [nested]
    lines = [line("surrogate", chat("\ud800")), line("digits", chat(logit_bias={"1" * 5000: 1})),
             line("deep", chat(metadata={"x": nested}))]
    up = http.post("/v1/files", files={"file": ("in.jsonl", "\n".join(lines).encode())}, data={"purpose": "batch"})
    assert up.status_code == 200, up.text
    r = http.post("/v1/batches", json={"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions",
                                       "completion_window": "24h"})
    assert r.status_code == 200, r.text[:300]
    batch_id = r.json()["id"]
    end = time.monotonic() + 120
    while (batch := http.get(f"/v1/batches/{batch_id}").json())["status"] not in ("completed", "failed"):
        assert time.monotonic() < end, batch
        time.sleep(0.1)
    errors = {e["custom_id"]: e for e in map(json.loads, http.get(f"/v1/files/{batch['error_file_id']}/content")
                                             .text.splitlines())}
    assert set(errors) == {"surrogate", "digits", "deep"}
    message = {cid: json.dumps(e) for cid, e in errors.items()}
    assert "messages[0].content" in message["surrogate"] and "logit_bias" in message["digits"]
    assert "nested more than 100 levels" in message["deep"]


@pytest.mark.parametrize("cursor", ["\u00b2", "9" * 5000, "9" * 25], ids=["superscript-two", "5000-digits", "25-digits"])
def test_grpc_batch_results_cursor_out_of_range_is_invalid_argument(channel: grpc.Channel, cursor: str) -> None:
    stub = bpb_grpc.BatchServiceStub(channel)
    item = bpb.BatchItem(custom_id="a", generate=pb.GenerateRequest(prompt="Hi", sampling=pb.SamplingParams(max_tokens=2)))
    batch = stub.CreateBatch(iter([bpb.CreateBatchRequest(options=bpb.BatchOptions(), items=[item])]),
                             metadata=AUTH, timeout=60).batch
    request = bpb.GetBatchResultsRequest(batch_id=batch.id, order=bpb.RESULT_ORDER_COMPLETION, cursor=cursor)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.GetBatchResults(request, metadata=AUTH, timeout=60))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "cursor" in info.value.details()
