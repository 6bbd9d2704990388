"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` against a real server: the same answers as the gRPC
``Tokenize`` / ``Detokenize`` / ``CountTokens`` on the same text and messages, a round trip back to the
text, and every malformed body a 400 (or 404) in OpenAI's error shape, never a 500."""

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
TEXTS = ["Hello, world!", "Grüße aus Köln: naïve café", "日本語のテキスト", "emoji 🎉👩‍👩‍👧 and flags 🇫🇷 ✓",
         "<|im_start|>user literal markers"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 🎉"}]


@pytest.fixture(scope="module")
def http(api_server: RunningServer) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=f"http://127.0.0.1:{api_server.server.http_port}", timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def stub(api_server: RunningServer) -> Iterator[Any]:
    with grpc.insecure_channel(api_server.target) as channel:
        yield pb_grpc.InferenceServiceStub(channel)


def grpc_messages() -> list[pb.ChatMessage]:
    return [pb.ChatMessage(role=m["role"], content=m["content"]) for m in MESSAGES]


def ok(http: httpx2.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_a_prompt_equals_grpc_tokenize_and_count(http: httpx2.Client, stub: Any, text: str) -> None:
    out = ok(http, "/tokenize", {"model": MODEL, "prompt": text})
    want = stub.Tokenize(pb.TokenizeRequest(text=text), timeout=30)
    count = stub.CountTokens(pb.CountTokensRequest(text=text), timeout=30)
    assert set(out) == {"count", "max_model_len", "tokens"}
    assert out["tokens"] == list(want.token_ids) and out["count"] == count.count == len(want.token_ids)
    assert out["max_model_len"] == count.context_size
    bare = ok(http, "/tokenize", {"prompt": text, "add_special_tokens": False})  # model is optional
    assert bare["tokens"] == list(stub.Tokenize(pb.TokenizeRequest(text=text, add_special=False), timeout=30).token_ids)


def test_tokenize_messages_equals_grpc_and_the_chat_completions_prompt(
    http: httpx2.Client, stub: Any, client: openai.OpenAI
) -> None:
    out = ok(http, "/tokenize", {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": True})
    want = stub.Tokenize(pb.TokenizeRequest(messages=grpc_messages()), timeout=30)
    assert out["tokens"] == list(want.token_ids) and out["count"] == len(want.token_ids)
    usage = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1).usage  # type: ignore[arg-type]
    assert usage is not None and usage.prompt_tokens == out["count"]  # what chat completions prefills


def test_token_strs_spell_the_text(http: httpx2.Client, stub: Any) -> None:
    out = ok(http, "/tokenize", {"prompt": "Hello, world!", "return_token_strs": True, "add_special_tokens": False})
    assert len(out["token_strs"]) == out["count"] and "".join(out["token_strs"]) == "Hello, world!"
    chat = ok(http, "/tokenize", {"messages": MESSAGES, "return_token_strs": True})
    pieces = stub.Tokenize(pb.TokenizeRequest(messages=grpc_messages()), timeout=30).pieces
    assert chat["token_strs"] == [p.decode("utf-8", "replace") for p in pieces] and "<|im_start|>" in chat["token_strs"]


@pytest.mark.parametrize("text", TEXTS)
def test_detokenize_round_trips_a_prompt(http: httpx2.Client, stub: Any, text: str) -> None:
    tokens = ok(http, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
    assert ok(http, "/detokenize", {"model": MODEL, "tokens": tokens}) == {"prompt": text}
    want = stub.Detokenize(pb.DetokenizeRequest(token_ids=tokens, render_special=True), timeout=30)
    assert want.text == text


def test_detokenize_of_chat_tokens_is_the_rendered_prompt(http: httpx2.Client, stub: Any) -> None:
    tokens = ok(http, "/tokenize", {"messages": MESSAGES})["tokens"]
    rendered = stub.Tokenize(pb.TokenizeRequest(messages=grpc_messages()), timeout=30).prompt
    assert ok(http, "/detokenize", {"tokens": tokens})["prompt"].endswith(rendered)  # (+ BOS if the model adds one)
    assert ok(http, "/detokenize", {"tokens": []}) == {"prompt": ""}


@pytest.mark.parametrize(("path", "content", "status", "param"), [
    ("/tokenize", b"{not json", 400, None),
    ("/tokenize", b"[1]", 400, None),
    ("/tokenize", b"{}", 400, "prompt"),
    ("/tokenize", b'{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', 400, "prompt"),
    ("/tokenize", b'{"prompt": 5}', 400, "prompt"),
    ("/tokenize", b'{"prompt": ""}', 400, "prompt"),
    ("/tokenize", b'{"messages": []}', 400, "messages"),
    ("/tokenize", b'{"messages": [{"role": "robot", "content": "x"}]}', 400, "messages[0].role"),
    ("/tokenize", b'{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false}', 400,
     "add_generation_prompt"),
    ("/tokenize", b'{"prompt": "a", "add_special_tokens": "yes"}', 400, "add_special_tokens"),
    ("/tokenize", b'{"prompt": "a", "bogus": 1}', 400, "bogus"),
    ("/tokenize", b'{"prompt": "a", "model": "gpt-9"}', 404, "model"),
    ("/detokenize", b"{}", 400, "tokens"),
    ("/detokenize", b'{"tokens": "12"}', 400, "tokens"),
    ("/detokenize", b'{"tokens": [1, "2"]}', 400, "tokens"),
    ("/detokenize", b'{"tokens": [1, true]}', 400, "tokens"),
    ("/detokenize", b'{"tokens": [-1]}', 400, "tokens"),
    ("/detokenize", b'{"tokens": [49152]}', 400, "tokens"),
    ("/detokenize", b'{"tokens": [1e40]}', 400, "tokens"),
    ("/detokenize", b'{"tokens": [99999999999999999999]}', 400, "tokens"),
])
def test_malformed_bodies_are_openai_errors(http: httpx2.Client, path: str, content: bytes, status: int,
                                            param: str | None) -> None:
    r = http.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_a_prompt_over_the_tokenize_limit_is_a_400(http: httpx2.Client) -> None:
    r = http.post("/tokenize", json={"prompt": "a" * ((1 << 20) + 1)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert "at most 1048576 bytes" in r.json()["error"]["message"]


def test_get_is_method_not_allowed(http: httpx2.Client) -> None:
    r = http.get("/tokenize")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
