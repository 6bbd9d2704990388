"""The render endpoints against a real server: the token ids a request would prefill, without running it.

The ids must be the ones every other path of the server computes for the same request: gRPC
``Tokenize`` and ``CountTokens``, and the ``prompt_tokens`` a real request reports. Bad bodies get
the generation routes' own errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx2
import openai
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer

pytestmark = pytest.mark.model

SYSTEM = "You are a terse assistant for questions about the planets of the solar system."
CHATS = [
    [{"role": "user", "content": "Hi 🎉"}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which planet is largest?"}],
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Name a red planet."},
        {"role": "assistant", "content": "Mars."},
        {"role": "user", "content": "  And one with rings?\n"},
    ],
]


@pytest.fixture()
def http(api_server: RunningServer) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=f"http://127.0.0.1:{api_server.server.http_port}", timeout=120) as c:
        yield c


@pytest.fixture()
def stub(api_server: RunningServer) -> Iterator[Any]:
    with grpc.insecure_channel(api_server.target) as channel:
        yield pb_grpc.InferenceServiceStub(channel)


def grpc_messages(chat: list[dict[str, str]]) -> list[pb.ChatMessage]:
    return [pb.ChatMessage(role=m["role"], content=m["content"]) for m in chat]


@pytest.mark.parametrize("chat", CHATS, ids=["user", "system", "turns"])
def test_chat_render_ids_equal_tokenize_count_tokens_and_a_real_requests_prompt_tokens(
    http: httpx2.Client, stub: Any, client: openai.OpenAI, chat: list[dict[str, str]]
) -> None:
    r = http.post("/v1/chat/completions/render", json={"model": MODEL, "messages": chat})
    assert r.status_code == 200, r.text
    body = r.json()
    tok = stub.Tokenize(pb.TokenizeRequest(messages=grpc_messages(chat)), timeout=60)
    assert body["token_ids"] == list(tok.token_ids)
    assert body["prompt"] == tok.prompt and body["prompt"].endswith("assistant\n")
    count = stub.CountTokens(pb.CountTokensRequest(messages=grpc_messages(chat)), timeout=60).count
    assert len(body["token_ids"]) == count
    answer = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=1, temperature=0)  # type: ignore[arg-type]
    assert answer.usage is not None and answer.usage.prompt_tokens == count
    assert body["model"] == MODEL and body["features"] is None and len(body["request_id"]) == 32


def test_completions_render_is_a_list_of_one_prompt_with_the_ids_of_tokenize_and_of_a_real_request(
    http: httpx2.Client, stub: Any, client: openai.OpenAI
) -> None:
    prompt = "The planets of the solar system, in order: Mercury,"
    r = http.post("/v1/completions/render", json={"prompt": prompt})  # no model: llm-d sends none
    assert r.status_code == 200, r.text
    [body] = r.json()
    tok = stub.Tokenize(pb.TokenizeRequest(text=prompt), timeout=60)
    assert body["token_ids"] == list(tok.token_ids) and body["prompt"] == prompt
    answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    assert answer.usage is not None and answer.usage.prompt_tokens == len(body["token_ids"])


def test_completions_render_answers_each_prompt_in_order_and_a_token_id_prompt_as_given(
    http: httpx2.Client, stub: Any
) -> None:
    texts = ["Mercury is", "The second planet from the Sun is"]
    r = http.post("/v1/completions/render", json={"model": MODEL, "prompt": texts})
    assert r.status_code == 200, r.text
    bodies = r.json()
    assert [b["prompt"] for b in bodies] == texts
    assert [b["token_ids"] for b in bodies] == [list(stub.Tokenize(pb.TokenizeRequest(text=t), timeout=60).token_ids)
                                                for t in texts]
    ids = [*bodies[1]["token_ids"], *bodies[0]["token_ids"]]  # a token-id prompt goes as given: nothing added
    [given] = http.post("/v1/completions/render", json={"prompt": ids}).json()
    assert given["token_ids"] == ids and texts[1] in given["prompt"] and texts[0] in given["prompt"]


def test_the_render_ids_are_what_a_request_with_tools_prefills(http: httpx2.Client, client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "orbit", "parameters": {"type": "object"}}}]
    chat = [{"role": "user", "content": "How long is a year on Mars?"}]
    r = http.post("/v1/chat/completions/render", json={"messages": chat, "tools": tools})
    assert r.status_code == 200, r.text
    answer = client.chat.completions.create(model=MODEL, messages=chat, tools=tools, max_tokens=4)  # type: ignore[arg-type]
    assert answer.usage is not None and answer.usage.prompt_tokens == len(r.json()["token_ids"])
    assert "orbit" in r.json()["prompt"]  # the tool definitions are part of what is prefilled


def error_of(r: httpx2.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]  # type: ignore[no-any-return]


def test_another_model_is_404_model_not_found(http: httpx2.Client) -> None:
    r = http.post("/v1/chat/completions/render", json={"model": "gpt-9", "messages": CHATS[0]})
    assert r.status_code == 404
    assert error_of(r)["code"] == "model_not_found" and error_of(r)["param"] == "model"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions/render", {"messages": []}, None),
        ("/v1/chat/completions/render", {"messages": CHATS[0], "temperature": -1}, None),
        ("/v1/chat/completions/render", {"messages": CHATS[0], "max_tokens": 1 << 30}, "max_tokens"),
        ("/v1/chat/completions/render", {"messages": CHATS[0], "surprise": 1}, "surprise"),
        ("/v1/completions/render", {"prompt": [1, 2, 1 << 30]}, "prompt"),
        ("/v1/completions/render", {"prompt": ""}, None),
        (
            "/v1/chat/completions/render",
            {"messages": CHATS[0], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}}},
            None,
        ),
    ],
    ids=["no-messages", "temperature", "max-tokens", "unknown-field", "id-outside-vocab", "empty-prompt", "bad-schema"],
)
def test_a_bad_body_is_the_generation_routes_400(http: httpx2.Client, path: str, body: dict[str, Any], param: str | None) -> None:
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    error = error_of(r)
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param


def test_a_body_that_is_not_json_is_400_another_content_type_415_and_a_get_405(http: httpx2.Client) -> None:
    r = http.post("/v1/completions/render", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in error_of(r)["message"]
    r = http.post("/v1/chat/completions/render", content=b'{"messages": []}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 and error_of(r)["code"] == "unsupported_media_type"
    assert http.get("/v1/chat/completions/render").status_code == 405
