"""Validation of the penalty, logit_bias and JSON fields of SamplingParams (service/api/request_builder.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from inference.v1 import inference_pb2 as pb

from service.api.request_builder import JsonDefaults, PromptLimits, RequestBuilder
from service.request.errors import BadRequest


@dataclass
class TinyVocab:
    n_vocab: int = 1000


def builder(json: JsonDefaults | None = None) -> RequestBuilder:
    return RequestBuilder(TinyVocab(), None, PromptLimits(max_context=4096), json)  # type: ignore[arg-type]


BAD: list[tuple[dict[str, Any], str]] = [
    ({"frequency_penalty": 2.5}, "frequency_penalty must be in [-2, 2], got 2.5"),
    ({"presence_penalty": -3.0}, "presence_penalty must be in [-2, 2], got -3.0"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty must be in [-2, 2], got nan"),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be in (0, 10] (1 = off), got 0.0"),
    ({"repetition_penalty": 11.0}, "repetition_penalty must be in (0, 10] (1 = off), got 11.0"),
    ({"logit_bias": {1000: 1.0}}, "logit_bias token id 1000 is outside the vocabulary (0..999)"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias token id -1 is outside the vocabulary (0..999)"),
    ({"logit_bias": {5: 101.0}}, "logit_bias for token 5 must be in [-100, 100], got 101.0"),
    ({"logit_bias": {i: 1.0 for i in range(1025)}}, "logit_bias has 1025 entries; at most 1024 are accepted (server flag --max-logit-bias)"),
    ({"json_repeat_penalty": 6.0}, "json_repeat_penalty must be in [0, 5], got 6.0"),
    ({"json_finish": 7}, "json_finish 7 is not a known JsonFinish value (0, 1 or 2)"),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[b[1][:40] for b in BAD])
def test_out_of_range_values_are_invalid_argument_naming_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(BadRequest) as err:
        builder().sampling(pb.SamplingParams(**fields), 10, json_mode=True)
    assert str(err.value) == message
    assert err.value.status == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"json_finish": pb.JSON_FINISH_CLOSE_WITHIN_BUDGET}, "json_finish CLOSE_WITHIN_BUDGET needs JSON output"),
        ({"json_repeat_penalty": 0.5}, "json_repeat_penalty needs JSON output"),
    ],
)
def test_json_fields_need_json_output(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        builder().sampling(pb.SamplingParams(**fields), 10)


def test_unset_fields_are_off_and_json_defaults_apply_to_generate_json_only() -> None:
    b = builder(JsonDefaults(close_within_budget=True, repeat_penalty=0.8))
    plain = b.sampling(pb.SamplingParams(), 10)
    assert (plain.frequency_penalty, plain.presence_penalty, plain.repetition_penalty) == (0.0, 0.0, 1.0)
    assert plain.logit_bias == () and not plain.penalized
    assert (plain.json_finish, plain.json_repeat_penalty) == (False, 0.0)
    generate_json = b.sampling(pb.SamplingParams(), 10, json_mode=True)
    assert (generate_json.json_finish, generate_json.json_repeat_penalty) == (True, 0.8)
    schema_stream = b.sampling(pb.SamplingParams(), 10, json_output=True)
    assert (schema_stream.json_finish, schema_stream.json_repeat_penalty) == (True, 0.0)


def test_explicit_values_override_the_server_defaults() -> None:
    b = builder(JsonDefaults(close_within_budget=True, repeat_penalty=0.8))
    sp = pb.SamplingParams(json_finish=pb.JSON_FINISH_CUT_OFF, json_repeat_penalty=0.0, logit_bias={3: 0.0, 2: -1.5})
    p = b.sampling(sp, 10, json_mode=True)
    assert (p.json_finish, p.json_repeat_penalty) == (False, 0.0)
    assert p.logit_bias == ((2, -1.5),)  # zero biases are dropped, ids sorted
