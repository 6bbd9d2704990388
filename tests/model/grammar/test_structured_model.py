"""Structured output with the real model: GenerateJSON and constrained Generate streams."""

from __future__ import annotations

import json
import re

import grpc
import jsonschema
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.support.helpers import MarginRecorder, assert_same_greedy, req, run_stream
from tests.support.server import RunningServer, assert_kv_clean, wait_idle

pytestmark = pytest.mark.model

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "array": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 99},
        "minItems": 2,
        "maxItems": 4,
    },
    "enum": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "integer", "minimum": 1, "maximum": 10},
        },
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    "anyof_ref": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "anyOf": [{"$ref": "#/$defs/point"}, {"type": "string", "maxLength": 10}],
    },
    "formats": {
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email", "maxLength": 30},
            "day": {"type": "string", "format": "date"},
        },
        "required": ["email", "day"],
        "additionalProperties": False,
    },
    "oneof_unique": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 8},
                "maxItems": 3,
                "uniqueItems": True,
            },
            "kind": {"oneOf": [{"const": "a"}, {"const": "b"}]},
        },
        "required": ["tags", "kind"],
        "additionalProperties": False,
    },
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_generate_json_always_validates(channel: grpc.Channel, name: str) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    schema = SCHEMAS[name]
    for temperature in (0.0, 0.8):
        resp = stub.GenerateJSON(
            pb.GenerateJSONRequest(
                prompt=f"Produce a JSON value ({name}):",
                json_schema=json.dumps(schema),
                sampling=pb.SamplingParams(temperature=temperature, seed=3, max_tokens=200),
            )
        )
        jsonschema.validate(json.loads(resp.json), schema)
        assert resp.finish_reason == pb.FINISH_REASON_STOP
        assert resp.usage.completion_tokens > 0


def test_constrained_streams_validate_and_do_not_disturb_neighbours(
    server: RunningServer, channel: grpc.Channel
) -> None:
    rec = MarginRecorder()
    prompt = "The history of the printing press"
    server.engine.logits_hook = rec
    try:
        alone = run_stream(channel, [req("free", prompt, 40, ignore_eos=True)])["free"]
    finally:
        server.engine.logits_hook = None
    wait_idle(server)
    fmt_json = pb.ResponseFormat(json_schema=json.dumps(SCHEMAS["enum"]))
    fmt_regex = pb.ResponseFormat(regex=r"[0-9]{3}-[0-9]{4}")
    fmt_lark = pb.ResponseFormat(lark_grammar='start: "yes" | "no"')
    fmt_gbnf = pb.ResponseFormat(gbnf_grammar='root ::= "cat" | "dog"')
    out = run_stream(
        channel,
        [
            req("free", prompt, 40, ignore_eos=True),
            req("json", "A color and size:", 60, response_format=fmt_json),
            req("re", "Phone:", 20, response_format=fmt_regex),
            req("lark", "Answer:", 10, response_format=fmt_lark, temperature=0.9),
            req("gbnf", "Pet:", 10, response_format=fmt_gbnf),
        ],
    )
    jsonschema.validate(json.loads(out["json"].text), SCHEMAS["enum"])
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", out["re"].text), out["re"].text
    assert out["lark"].text in ("yes", "no")
    assert out["gbnf"].text in ("cat", "dog")
    for k in ("json", "re", "lark", "gbnf"):
        assert out[k].done.finish_reason == pb.FINISH_REASON_STOP
    # The unconstrained neighbour is unaffected by the masks in its batch.
    assert_same_greedy(alone.token_ids, out["free"].token_ids, rec.rows["free"])
    snap = server.engine.metrics.snapshot()["grammar"]
    assert snap["constrained_tokens"] > 0 and snap["forced_tokens"] > 0
    assert_kv_clean(server)


def test_truncated_json_is_an_error_not_a_document(channel: grpc.Channel) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    schema = {"type": "array", "items": {"type": "string"}, "minItems": 30}
    with pytest.raises(grpc.RpcError) as info:
        stub.GenerateJSON(
            pb.GenerateJSONRequest(
                prompt="List:", json_schema=json.dumps(schema),
                sampling=pb.SamplingParams(max_tokens=8, json_finish=pb.JSON_FINISH_CUT_OFF),
            )
        )
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "max_tokens" in info.value.details()


@pytest.mark.parametrize(
    ("schema", "status", "needle"),
    [
        ("{not json", grpc.StatusCode.INVALID_ARGUMENT, "JSON"),
        ('{"type": 12}', grpc.StatusCode.INVALID_ARGUMENT, "schema"),
        (
            '{"type": "object", "properties": {"a": {"$ref": "https://example.com/x.json"}}}',
            grpc.StatusCode.INVALID_ARGUMENT,
            "unsupported",
        ),
        (json.dumps({"type": "object", "description": "x" * 70_000}), None, "bytes"),
    ],
)
def test_bad_schemas(channel: grpc.Channel, schema: str, status: grpc.StatusCode | None, needle: str) -> None:
    stub = pb_grpc.InferenceServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.GenerateJSON(pb.GenerateJSONRequest(prompt="x", json_schema=schema))
    allowed = {status} if status else {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert info.value.code() in allowed, info.value
    assert needle.lower() in info.value.details().lower(), info.value.details()


def test_bad_grammars_on_a_stream_leave_others_running(channel: grpc.Channel) -> None:
    out = run_stream(
        channel,
        [
            req("ok", "Hello", 6),
            req("re", "x", 6, response_format=pb.ResponseFormat(regex="([0-9")),
            req("lark", "x", 6, response_format=pb.ResponseFormat(lark_grammar="start: (")),
            req("gbnf", "x", 6, response_format=pb.ResponseFormat(gbnf_grammar='root ::= "unterminated')),
            req("js", "x", 6, response_format=pb.ResponseFormat(json_schema="[1, 2")),
        ],
    )
    for k in ("re", "lark", "gbnf", "js"):
        assert out[k].error is not None and out[k].error.status == "INVALID_ARGUMENT", (k, out[k].error)
    assert out["ok"].done is not None and out["ok"].done.usage.completion_tokens == 6
