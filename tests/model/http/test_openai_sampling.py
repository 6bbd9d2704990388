"""OpenAI's frequency_penalty, presence_penalty and logit_bias (and the repetition_penalty extension) reach the
sampler through the HTTP API (SamplingParams of issue 30), checked with the OpenAI SDK against a real server:
each changes greedy output as it should, and a value out of range is a 400 naming its parameter. (JSON
output's json_finish and json_repeat_penalty: tests/model/http/test_openai_json_finish.py.)"""

from __future__ import annotations

import json
from typing import Any

import grpc
import openai
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer

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
