"""OpenAI's frequency_penalty, presence_penalty and logit_bias (and the repetition_penalty extension) reach the
sampler through the HTTP API (SamplingParams of issue 30), checked with the OpenAI SDK against a real server:
each changes greedy output as it should, and a value out of range is a 400 naming its parameter. A JSON
document closed within its budget (--json-finish close) is a finished, valid answer: finish_reason "stop"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import jsonschema
import openai
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.model.http.conftest import MODEL, base_url
from tests.support.server import RunningServer, assert_kv_clean, free_port, start_server

pytestmark = pytest.mark.model
CAPITAL = "The capital of France is"
REPEATS = "List: apple, apple, apple, apple,"


def token_id(srv: RunningServer, text: str) -> int:
    """The one token of ``text`` (the server's own tokenizer, over gRPC)."""
    with grpc.insecure_channel(srv.target) as ch:
        ids = pb_grpc.InferenceServiceStub(ch).Tokenize(pb.TokenizeRequest(text=text, add_special=False)).token_ids
    assert len(ids) == 1, (text, list(ids))
    return int(ids[0])


def greedy(client: openai.OpenAI, prompt: str, max_tokens: int, **kw: Any) -> tuple[str, list[str]]:
    """(text, generated tokens) of a greedy completion that ignores end-of-generation."""
    extra = {"ignore_eos": True, **kw.pop("extra_body", {})}
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, logprobs=0,
                                  extra_body=extra, **kw)
    c = r.choices[0]
    assert c.logprobs is not None and c.logprobs.tokens is not None
    return c.text, c.logprobs.tokens


def test_logit_bias_minus_100_bans_the_greedy_token(client: openai.OpenAI, api_server: RunningServer) -> None:
    text, _ = greedy(client, CAPITAL, 1)
    banned = token_id(api_server, text)
    other, _ = greedy(client, CAPITAL, 1, logit_bias={str(banned): -100})
    assert other != text and token_id(api_server, other) != banned


def test_logit_bias_plus_100_forces_a_token_in_chat_and_completions(client: openai.OpenAI,
                                                                    api_server: RunningServer) -> None:
    banana = token_id(api_server, " banana")
    text, tokens = greedy(client, CAPITAL, 3, logit_bias={str(banana): 100})
    assert text == " banana" * 3 and tokens == [" banana"] * 3
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4,
                                       temperature=0, logit_bias={str(banana): 100})
    assert r.choices[0].message.content == " banana" * 4 and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("kw", [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0},
                                {"extra_body": {"repetition_penalty": 1.5}}],
                         ids=["frequency_penalty", "presence_penalty", "repetition_penalty"])
def test_penalties_break_a_greedy_repetition(client: openai.OpenAI, kw: dict[str, Any]) -> None:
    plain_text, plain = greedy(client, REPEATS, 24)
    assert len(set(plain)) <= 3, plain_text  # the model repeats " apple," without a penalty
    text, tokens = greedy(client, REPEATS, 24, **kw)
    assert text != plain_text and len(set(tokens)) > len(set(plain)) + 3, text


def test_negative_and_neutral_penalties_leave_the_repetition(client: openai.OpenAI) -> None:
    plain_text, _ = greedy(client, REPEATS, 24)
    assert greedy(client, REPEATS, 24, frequency_penalty=-2.0)[0] == plain_text  # encouraged: the same repeats
    assert greedy(client, REPEATS, 24, presence_penalty=0, logit_bias={},
                  extra_body={"repetition_penalty": 1})[0] == plain_text


@pytest.mark.parametrize(("kw", "param"), [
    ({"frequency_penalty": 2.5}, "frequency_penalty"), ({"frequency_penalty": -2.1}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"), ({"presence_penalty": 9}, "presence_penalty"),
    ({"logit_bias": {"50": 101}}, "logit_bias"), ({"logit_bias": {"50": -250}}, "logit_bias"),
    ({"logit_bias": {"banana": 5}}, "logit_bias"), ({"logit_bias": {"49152": 5}}, "logit_bias"),
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"extra_body": {"repetition_penalty": 11}}, "repetition_penalty"),
], ids=lambda v: json.dumps(v) if isinstance(v, dict) else v)
def test_out_of_range_values_are_a_400_naming_the_parameter(client: openai.OpenAI, kw: dict[str, Any],
                                                            param: str) -> None:
    for call in (lambda: client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, **kw),
                 lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                        max_tokens=2, **kw)):
        with pytest.raises(openai.BadRequestError) as info:
            call()
        assert info.value.status_code == 400 and info.value.body["type"] == "invalid_request_error"
        assert info.value.body["param"] == param, info.value.body


@pytest.fixture(scope="module")
def closing_server() -> Iterator[RunningServer]:
    srv = start_server(http_port=free_port(), json_finish="close")
    yield srv
    srv.close()


def test_a_document_closed_within_its_budget_finishes_stop(closing_server: RunningServer) -> None:
    team = {"type": "object", "required": ["team", "members"], "properties": {
        "team": {"type": "string"},
        "members": {"type": "array", "minItems": 2, "items": {
            "type": "object", "required": ["name", "code"],
            "properties": {"name": {"type": "string"}, "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        }},
    }}
    fmt = {"type": "json_schema", "json_schema": {"name": "team", "schema": team}}
    messages = [{"role": "user", "content": "A team of three, as JSON."}]
    with openai.OpenAI(base_url=base_url(closing_server), api_key="unused", max_retries=0, timeout=600) as client:
        with pytest.raises(openai.BadRequestError) as info:  # below the shortest document: refused up front
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, response_format=fmt)
        minimum = int(info.value.message.rsplit("at least ", 1)[1].split()[0].strip("'\"}.,"))
        r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=minimum, temperature=0,
                                           response_format=fmt)
    assert r.choices[0].finish_reason == "stop" and r.usage is not None and r.usage.completion_tokens <= minimum
    assert closing_server.engine.metrics.snapshot()["grammar"]["documents_closed"] == 1  # closed, not natural
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), team)
    assert_kv_clean(closing_server)
