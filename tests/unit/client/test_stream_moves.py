"""The client's stream bookkeeping (``_mux.MuxState``): which refused requests move to a new Generate
call (another replica), which are retried on the same one, and which are reported; and acknowledgements."""

from __future__ import annotations

import grpc
from inference.v1 import inference_pb2 as pb
from inference_client._mux import ACK_EVERY, MuxState
from inference_client.errors import InferenceError
from inference_client.events import Done, ErrorEvent
from inference_client.retry import Deadline, RetryPolicy, retry_delay


def unavailable(rid: str, reason: str) -> pb.GenerateResponse:
    err = pb.Error(code=14, status="UNAVAILABLE", message="server is shutting down", retry_after_ms=1000, reason=reason)
    return pb.GenerateResponse(request_id=rid, error=err)


def state(*rids: str) -> MuxState:
    s = MuxState(RetryPolicy(max_attempts=3), Deadline(None))
    for rid in rids:
        s.register(pb.GenerateRequest(request_id=rid, prompt="hi"))
    return s


def test_a_request_cut_by_a_draining_replica_before_any_token_moves_to_a_new_leg() -> None:
    s = state("a", "b")
    old = s.current
    outcome = s.on_response(old, unavailable("a", "draining"))
    assert outcome is not None and outcome.move and outcome.event is None
    assert s.current is not old and s.legs == [old, s.current]
    assert [m.request_id for m in s.take_moved()] == ["a"]
    assert s.current.log[0].request_id == "a"  # replayed should the new call fail before a response
    assert not s.should_half_close(old)  # "b" still runs there
    done = s.on_response(old, pb.GenerateResponse(request_id="b", done=pb.Done(finish_reason=1)))
    assert done is not None and isinstance(done.event, Done)
    assert s.should_half_close(old)  # idle and no longer current


def test_a_request_that_had_tokens_is_reported_not_moved() -> None:
    s = state("a")
    s.on_response(s.current, pb.GenerateResponse(request_id="a", delta=pb.Delta(text="x", token_ids=[1])))
    outcome = s.on_response(s.current, unavailable("a", "draining"))
    assert outcome is not None and not outcome.move and isinstance(outcome.event, ErrorEvent)
    assert outcome.event.error.reason == "draining" and outcome.event.error.elsewhere


def test_unavailable_without_a_reason_is_retried_on_the_same_leg_after_the_hint() -> None:
    s = state("a")
    leg = s.current
    outcome = s.on_response(leg, unavailable("a", ""))
    assert outcome is not None and not outcome.move and outcome.retry_after is not None
    assert outcome.retry_after >= 1.0 and s.current is leg


def test_moves_stop_at_the_retry_budget() -> None:
    s = state("a")
    for _ in range(2):  # max_attempts=3: two moves
        assert s.on_response(s.current, unavailable("a", "engine_failed")).move  # type: ignore[union-attr]
        s.take_moved()
    last = s.on_response(s.current, unavailable("a", "engine_failed"))
    assert last is not None and isinstance(last.event, ErrorEvent) and last.event.error.attempts == 3


def test_acks_only_when_the_server_accepted_them_every_16_messages_and_when_idle() -> None:
    s = state("a")
    leg = s.current
    delta = pb.GenerateResponse(request_id="a", delta=pb.Delta(text="x", token_ids=[1]))
    s.on_response(leg, delta)
    assert leg.ack_due(idle=True) is None  # the server did not accept acknowledgements
    leg.acks = True
    assert leg.ack_due(idle=True) == pb.GenerateRequest(ack=1)
    for _ in range(ACK_EVERY - 1):
        s.on_response(leg, delta)
        assert leg.ack_due() is None
    s.on_response(leg, delta)
    assert leg.ack_due() == pb.GenerateRequest(ack=ACK_EVERY + 1)


class Refused(grpc.RpcError):
    """A failed unary call as gRPC reports it: code, details and trailing metadata."""

    def __init__(self, reason: str) -> None:
        self._trailers = (("retry-after-ms", "5000"), ("inference-unavailable-reason", reason))

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "server is shutting down; retry on another replica"

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailers


def test_a_unary_call_refused_by_a_draining_replica_is_retried_after_the_policy_backoff_not_the_hint() -> None:
    policy = RetryPolicy(max_attempts=3, initial_backoff=0.1, jitter=0.0)
    assert retry_delay(Refused("draining"), policy, 1, Deadline(None)) == 0.1  # another replica: no wait
    assert retry_delay(Refused(""), policy, 1, Deadline(None)) == 5.0  # no reason: the server's hint
    err = InferenceError.from_rpc_error(Refused("engine_failed"))
    assert err.reason == "engine_failed" and err.elsewhere
