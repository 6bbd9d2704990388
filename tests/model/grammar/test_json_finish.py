"""Structured output that finishes, with the real model and a real server.

Budget-aware completion (json_finish CLOSE_WITHIN_BUDGET, the server's
default: --json-finish close), the old cut-off one option away
(JSON_FINISH_CUT_OFF), the up-front refusal, repetition control and penalties on the wire, GenerateJSON's
defaults (chat template for a bare prompt, compact or pretty layout) and the
document metrics.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import jsonschema
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.server import RunningServer, assert_kv_clean

pytestmark = pytest.mark.model

CHARACTER = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "description": {"type": "string"}},
    "required": ["name", "description"],
}
TEAM = {
    "type": "object",
    "properties": {
        "team": {"type": "string"},
        "members": {
            "type": "array",
            "minItems": 2,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "role": {"enum": ["lead", "dev", "ops"]},
                    "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                },
                "required": ["name", "role", "code"],
            },
        },
    },
    "required": ["team", "members"],
}
REVIEW = {
    "type": "object",
    "properties": {
        "product": {"type": "string"},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "pros": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "cons": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "summary": {"type": "string"},
    },
    "required": ["product", "rating", "pros", "cons", "summary"],
}
CLOSE = pb.JSON_FINISH_CLOSE_WITHIN_BUDGET
CUT_OFF = pb.JSON_FINISH_CUT_OFF


def generate_json(channel: grpc.Channel, schema: dict[str, Any], **sampling: Any) -> pb.GenerateJSONResponse:
    req = pb.GenerateJSONRequest(
        prompt="Invent a character.", json_schema=json.dumps(schema), sampling=pb.SamplingParams(**sampling)
    )
    return pb_grpc.InferenceServiceStub(channel).GenerateJSON(req, timeout=300)


def shortest(channel: grpc.Channel, schema: dict[str, Any]) -> int:
    """The minimum the server names when max_tokens is 1 (the request is refused up front)."""
    with pytest.raises(grpc.RpcError) as err:
        generate_json(channel, schema, max_tokens=1, json_finish=CLOSE)
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
    details = err.value.details() or ""
    assert "is below the shortest valid document for this schema" in details
    return int(details.rsplit("at least ", 1)[1])


@pytest.mark.parametrize("schema", [CHARACTER, TEAM], ids=["character", "team"])
def test_close_within_budget_never_ends_out_of_range(channel: grpc.Channel, schema: dict[str, Any]) -> None:
    minimum = shortest(channel, schema)
    for spare, seed in [(0, 1), (1, 2), (3, 3), (12, 4), (40, 5)]:
        resp = generate_json(channel, schema, max_tokens=minimum + spare, seed=seed, json_finish=CLOSE)
        assert resp.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_CLOSED)
        assert resp.usage.completion_tokens <= minimum + spare
        jsonschema.validate(json.loads(resp.json), schema)


def test_below_the_minimum_is_refused_up_front_naming_it(channel: grpc.Channel) -> None:
    minimum = shortest(channel, TEAM)
    with pytest.raises(grpc.RpcError) as err:
        generate_json(channel, TEAM, max_tokens=minimum - 1, json_finish=CLOSE)
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert f"raise max_tokens to at least {minimum}" in (err.value.details() or "")


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_by_default_a_review_closes_within_its_budget(channel: grpc.Channel, seed: int) -> None:
    req = pb.GenerateJSONRequest(prompt="Write a detailed review of a laptop as JSON.", json_schema=json.dumps(REVIEW),
                                 sampling=pb.SamplingParams(max_tokens=256, seed=seed))
    resp = pb_grpc.InferenceServiceStub(channel).GenerateJSON(req, timeout=300)  # no json_finish: the default
    assert resp.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_CLOSED)
    assert resp.usage.completion_tokens <= 256
    jsonschema.validate(json.loads(resp.json), REVIEW)


def test_with_cut_off_a_long_document_is_still_cut_off(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as err:
        generate_json(channel, TEAM, max_tokens=12, temperature=0.0, json_finish=CUT_OFF)
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "or set json_finish CLOSE_WITHIN_BUDGET" in (err.value.details() or "")


def test_a_closed_document_says_so_on_a_generate_stream(channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    req = pb.GenerateRequest(
        request_id="closed",
        prompt="A team of three, as JSON:",
        sampling=pb.SamplingParams(max_tokens=40, temperature=0.0, json_finish=CLOSE),
        response_format=pb.ResponseFormat(json_schema=json.dumps(TEAM)),
    )
    events = list(stub.Generate(iter([req]), timeout=300))
    done = events[-1].done
    text = "".join(e.delta.text for e in events if e.HasField("delta"))
    assert done.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_CLOSED)
    assert done.usage.completion_tokens <= 40
    jsonschema.validate(json.loads(text), TEAM)


def test_document_metrics_count_each_ending(server: RunningServer, channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    before = stub.GetMetrics(pb.GetMetricsRequest()).grammar
    minimum = shortest(channel, TEAM)
    closed = generate_json(channel, TEAM, max_tokens=minimum, temperature=0.0, json_finish=CLOSE)
    with pytest.raises(grpc.RpcError):
        generate_json(channel, TEAM, max_tokens=minimum, temperature=0.0, json_finish=CUT_OFF)
    natural = generate_json(channel, {"type": "boolean"}, temperature=0.0)
    after = stub.GetMetrics(pb.GetMetricsRequest()).grammar
    assert closed.finish_reason == pb.FINISH_REASON_CLOSED
    assert natural.finish_reason == pb.FINISH_REASON_STOP
    assert after.documents_closed - before.documents_closed == 1
    assert after.documents_cut_off - before.documents_cut_off == 1
    assert after.documents_natural - before.documents_natural == 1
    assert_kv_clean(server)


def test_a_bare_prompt_is_rendered_with_the_chat_template_unless_raw(channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    chat = stub.CountTokens(pb.CountTokensRequest(messages=[pb.ChatMessage(role="user", content="Invent a character.")]))
    raw = stub.CountTokens(pb.CountTokensRequest(text="Invent a character."))
    schema = json.dumps({"type": "boolean"})
    default = stub.GenerateJSON(pb.GenerateJSONRequest(prompt="Invent a character.", json_schema=schema))
    as_is = stub.GenerateJSON(pb.GenerateJSONRequest(prompt="Invent a character.", json_schema=schema, raw_prompt=True))
    assert default.usage.prompt_tokens == chat.count
    assert as_is.usage.prompt_tokens == raw.count < chat.count


def test_pretty_returns_the_document_indented_and_the_default_is_compact(channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    schema = json.dumps(TEAM)
    sampling = pb.SamplingParams(temperature=0.0, max_tokens=200, json_finish=CLOSE)
    compact = stub.GenerateJSON(pb.GenerateJSONRequest(prompt="A team:", json_schema=schema, sampling=sampling))
    pretty = stub.GenerateJSON(
        pb.GenerateJSONRequest(prompt="A team:", json_schema=schema, sampling=sampling, pretty=True)
    )
    # NOTE: two greedy runs need not produce the same document (logits move with the KV cells in use),
    # so each response is checked on its own; the exact layout is tests/unit/api/test_json_layout.py's.
    assert "\n" not in compact.json and ": " not in compact.json.split('"')[0]
    jsonschema.validate(json.loads(pretty.json), TEAM)
    assert pretty.json.startswith('{\n  "team": ') and pretty.json.endswith("\n}")


@pytest.mark.parametrize(
    ("sampling", "needle"),
    [
        ({"frequency_penalty": 3.0}, "frequency_penalty must be in [-2, 2]"),
        ({"repetition_penalty": -1.0}, "repetition_penalty must be in (0, 10]"),
        ({"logit_bias": {49152: 1.0}}, "logit_bias token id 49152 is outside the vocabulary"),
        ({"json_repeat_penalty": 9.0}, "json_repeat_penalty must be in [0, 5]"),
    ],
)
def test_bad_penalties_are_invalid_argument(channel: grpc.Channel, sampling: dict[str, Any], needle: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        generate_json(channel, CHARACTER, **sampling)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (err.value.details() or "")


def test_json_fields_on_plain_generate_are_invalid_argument_for_that_request_only(channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    bad = pb.GenerateRequest(request_id="bad", prompt="Hi", sampling=pb.SamplingParams(json_finish=CLOSE))
    good = pb.GenerateRequest(request_id="good", prompt="Hi", sampling=pb.SamplingParams(max_tokens=4))
    events = list(stub.Generate(iter([bad, good]), timeout=300))
    error = next(e.error for e in events if e.request_id == "bad")
    assert error.status == "INVALID_ARGUMENT" and "needs JSON output" in error.message
    assert any(e.request_id == "good" and e.HasField("done") for e in events)


def test_logit_bias_bans_the_greedy_choice(channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)

    def first_token(**sampling: Any) -> int:
        req = pb.GenerateRequest(
            request_id="b", prompt="The capital of France is", sampling=pb.SamplingParams(max_tokens=1, temperature=0.0, **sampling)
        )
        events = list(stub.Generate(iter([req]), timeout=300))
        return next(e.delta.token_ids[0] for e in events if e.HasField("delta") and e.delta.token_ids)

    greedy = first_token()
    assert first_token(logit_bias={greedy: -100.0}) != greedy
