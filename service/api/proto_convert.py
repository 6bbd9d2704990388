"""Conversions between engine events and ``inference.v1`` protos (pure functions)."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from inference.v1 import inference_pb2 as pb

from service.model.logprobs import TokenLogprob
from service.request.events import Delta, Done, Error, Event
from service.request.sequence import FinishReason

FINISH = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
    FinishReason.CLOSED: pb.FINISH_REASON_CLOSED,
}
FORMAT_KINDS = {"json_schema": "json_schema", "regex": "regex", "lark_grammar": "lark", "gbnf_grammar": "gbnf"}


def done_proto(d: Done) -> pb.Done:
    return pb.Done(
        finish_reason=FINISH.get(d.finish_reason, pb.FINISH_REASON_UNSPECIFIED),
        usage=pb.Usage(
            prompt_tokens=d.prompt_tokens,
            completion_tokens=d.completion_tokens,
            cached_tokens=d.cached_tokens,
        ),
        timing=pb.Timing(queue_ms=d.queue_ms, ttft_ms=d.ttft_ms, total_ms=d.total_ms),
        preemptions=d.preemptions,
        choice_index=d.choice_index,
        cache_hit=d.cache_hit,
        semantic_cache_hit=d.semantic_cache_hit,
    )


def logprob_proto(e: TokenLogprob) -> pb.TokenLogprob:
    top = [pb.TopLogprob(token_id=t.token_id, token=t.token, logprob=t.logprob) for t in e.top]
    return pb.TokenLogprob(token_id=e.token_id, token=e.token, logprob=e.logprob, top_logprobs=top)


def delta_proto(d: Delta) -> pb.Delta:
    return pb.Delta(
        text=d.text,
        token_ids=d.token_ids,
        logprobs=[logprob_proto(e) for e in d.logprobs],
        choice_index=d.choice_index,
        prompt_logprobs=[logprob_proto(e) for e in d.prompt_logprobs],
    )


def error_proto(status: str, message: str, retry_after_ms: int = 0, quota: str = "", reason: str = "") -> pb.Error:
    code = grpc.StatusCode[status]
    return pb.Error(
        code=code.value[0],
        status=status,
        message=message,
        retry_after_ms=retry_after_ms,
        quota=quota,
        reason=reason,
    )


def error_of(e: Error) -> pb.Error:
    """An Error event as its proto."""
    return error_proto(e.status, e.message, e.retry_after_ms, e.quota, e.reason)


STATUS_DETAILS_KEY = "grpc-status-details-bin"  # google.rpc.Status, as grpcio-status reads it
ERROR_DOMAIN = "inference.v1"


def status_details(e: Error) -> tuple[tuple[str, bytes], ...]:
    """Trailing metadata of a unary RPC that fails with ``e``: for an error with a reason, the rich
    status (``google.rpc.Status``) whose one detail is ``google.rpc.ErrorInfo(reason, domain
    "inference.v1")``, as the Generate stream's ``Error.reason`` carries it; none otherwise."""
    if not e.reason:
        return ()
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=e.reason, domain=ERROR_DOMAIN))
    status = status_pb2.Status(code=grpc.StatusCode[e.status].value[0], message=e.message, details=[info])
    return ((STATUS_DETAILS_KEY, status.SerializeToString()),)


def event_proto(request_id: str, ev: Event) -> pb.GenerateResponse:
    """One lifecycle event as the ``GenerateResponse`` that carries it."""
    if isinstance(ev, Delta):
        return pb.GenerateResponse(request_id=request_id, delta=delta_proto(ev))
    if isinstance(ev, Done):
        return pb.GenerateResponse(request_id=request_id, done=done_proto(ev))
    return pb.GenerateResponse(request_id=request_id, error=error_of(ev))


def response_format(rf: pb.ResponseFormat) -> tuple[str, str] | None:
    """(constraint kind, source) of a ResponseFormat, or None when none is set."""
    kind = rf.WhichOneof("format")
    if kind is None:
        return None
    return FORMAT_KINDS[kind], getattr(rf, kind)
