"""Service registration that answers undecodable messages with INVALID_ARGUMENT.

grpcio's generated ``add_*Servicer_to_server`` deserializes with ``FromString``;
a message that does not parse (corrupt wire format, a string field with bad
UTF-8) then surfaces as UNKNOWN with a Python exception text. Here the
deserializer returns the ``MALFORMED`` sentinel instead: unary handlers answer
INVALID_ARGUMENT before the servicer runs, and streaming handlers receive the
sentinel in their request iterator (``Generate`` answers it with an
INVALID_ARGUMENT event and keeps the stream's other requests running).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError


class _Malformed:
    def __repr__(self) -> str:
        return "MALFORMED"


MALFORMED: Any = _Malformed()


def _tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, UnicodeDecodeError, ValueError, RecursionError):
            return MALFORMED

    return deserialize


def _guard_unary(behavior: Callable[..., Any], type_name: str) -> Callable[..., Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request is MALFORMED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"message is not a valid {type_name}")
        return await behavior(request, context)

    return handler


def _guard_unary_stream(behavior: Callable[..., Any], type_name: str) -> Callable[..., Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request is MALFORMED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"message is not a valid {type_name}")
        async for item in behavior(request, context):
            yield item

    return handler


def add_servicer(server: grpc.aio.Server, servicer: Any, service: ServiceDescriptor) -> None:
    """Register every method of ``service`` implemented by ``servicer`` with tolerant decoding."""
    handlers = {}
    for method in service.methods:
        req_cls = message_factory.GetMessageClass(method.input_type)
        resp_cls = message_factory.GetMessageClass(method.output_type)
        behavior = getattr(servicer, method.name)
        kw = {
            "request_deserializer": _tolerant(req_cls.FromString),
            "response_serializer": resp_cls.SerializeToString,
        }
        name = method.input_type.full_name
        if method.client_streaming and method.server_streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(behavior, **kw)
        elif method.client_streaming:
            handlers[method.name] = grpc.stream_unary_rpc_method_handler(behavior, **kw)
        elif method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(_guard_unary_stream(behavior, name), **kw)
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(_guard_unary(behavior, name), **kw)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
