"""Server reflection serves complete descriptors, and JSON requests can be invoked through them.

This is the path grpcurl takes: no generated stubs, only descriptors fetched
with grpcio-reflection's ``ProtoReflectionDescriptorDatabase``.
"""

from __future__ import annotations

import json

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from tests.support.server import RunningServer

pytestmark = pytest.mark.model

SERVICE = "inference.v1.InferenceService"


def _pool(channel: grpc.Channel) -> tuple[ProtoReflectionDescriptorDatabase, descriptor_pool.DescriptorPool]:
    db = ProtoReflectionDescriptorDatabase(channel)
    return db, descriptor_pool.DescriptorPool(db)


def test_reflection_lists_and_describes_everything(server: RunningServer) -> None:
    with grpc.insecure_channel(server.target) as ch:
        db, pool = _pool(ch)
        services = set(db.get_services())
        assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
        svc = pool.FindServiceByName(SERVICE)
        methods = {m.name: m for m in svc.methods}
        assert set(methods) == {
            "Generate", "GenerateJSON", "GetMetrics", "Tokenize", "Detokenize", "CountTokens", "GetModelInfo"
        }
        gen = methods["Generate"]
        assert gen.client_streaming and gen.server_streaming
        req = gen.input_type
        assert {
            "request_id",
            "prompt",
            "messages",
            "sampling",
            "priority",
            "cancel",
            "response_format",
        } <= set(req.fields_by_name)
        # Nested types resolve completely (what `grpcurl describe` prints).
        sampling = req.fields_by_name["sampling"].message_type
        assert "max_tokens" in sampling.fields_by_name and "stop" in sampling.fields_by_name
        resp = gen.output_type
        assert {o.name for o in resp.oneofs} == {"event"}
        done = resp.fields_by_name["done"].message_type
        assert done.fields_by_name["finish_reason"].enum_type.values_by_name["FINISH_REASON_CANCELLED"]


def test_json_encoded_generate_through_reflected_descriptors(server: RunningServer) -> None:
    with grpc.insecure_channel(server.target) as ch:
        _db, pool = _pool(ch)
        method = pool.FindServiceByName(SERVICE).methods_by_name["Generate"]
        req_cls = message_factory.GetMessageClass(method.input_type)
        resp_cls = message_factory.GetMessageClass(method.output_type)
        body = '{"request_id":"a","prompt":"Hello","sampling":{"max_tokens":8,"temperature":0}}'
        request = json_format.Parse(body, req_cls())
        call = ch.stream_stream(
            f"/{SERVICE}/Generate",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=resp_cls.FromString,
        )
        events = [json.loads(json_format.MessageToJson(r)) for r in call(iter([request]), timeout=600)]
    assert events[-1]["requestId"] == "a" and events[-1]["done"]["finishReason"] in (
        "FINISH_REASON_LENGTH",
        "FINISH_REASON_STOP",
    )
    assert any("delta" in e for e in events)


def test_json_encoded_generate_json_through_reflected_descriptors(server: RunningServer) -> None:
    with grpc.insecure_channel(server.target) as ch:
        _db, pool = _pool(ch)
        method = pool.FindServiceByName(SERVICE).methods_by_name["GenerateJSON"]
        req_cls = message_factory.GetMessageClass(method.input_type)
        resp_cls = message_factory.GetMessageClass(method.output_type)
        schema = {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
            "additionalProperties": False,
        }
        body = json.dumps(
            {"prompt": "Answer:", "jsonSchema": json.dumps(schema), "sampling": {"temperature": 0}}
        )
        call = ch.unary_unary(
            f"/{SERVICE}/GenerateJSON",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=resp_cls.FromString,
        )
        resp = call(json_format.Parse(body, req_cls()), timeout=600)
    assert isinstance(json.loads(resp.json)["ok"], bool)
