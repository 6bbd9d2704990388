"""OpenAI error objects from the service's statuses, and events -> chat/completion objects and chunks."""

from __future__ import annotations

import json

from inference.v1 import inference_pb2 as pb

from service.http.errors import from_status
from service.http.render import Choices
from service.http.requests import Output


def test_quota_refusal_is_429_with_retry_after_and_the_quota_named() -> None:
    err = from_status("RESOURCE_EXHAUSTED", "over quota", retry_after_ms=1500, quota="tokens_per_minute")
    assert (err.status, err.type, err.code) == (429, "rate_limit_error", "tokens_per_minute")
    assert err.headers() == {"retry-after": "2"}
    overload = from_status("RESOURCE_EXHAUSTED", "queue full", retry_after_ms=200)
    assert (overload.code, overload.headers()) == ("server_is_overloaded", {"retry-after": "1"})


def test_statuses_map_to_openai_http_codes_and_types() -> None:
    cases = {
        "INVALID_ARGUMENT": (400, "invalid_request_error"),
        "OUT_OF_RANGE": (400, "invalid_request_error"),
        "UNAUTHENTICATED": (401, "authentication_error"),
        "PERMISSION_DENIED": (403, "permission_error"),
        "NOT_FOUND": (404, "invalid_request_error"),
        "UNAVAILABLE": (503, "service_unavailable_error"),
        "INTERNAL": (500, "server_error"),
    }
    for status, want in cases.items():
        err = from_status(status, "x")
        assert (err.status, err.type) == want, status
    assert from_status("UNAVAILABLE", "draining").headers() == {"retry-after": "1"}
    body = json.loads(from_status("INVALID_ARGUMENT", "bad").response().body)
    assert body == {"error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}}


def logprob(token: bytes, lp: float) -> pb.TokenLogprob:
    return pb.TokenLogprob(token=token, logprob=lp, top_logprobs=[pb.TopLogprob(token=token, logprob=lp)])


def done(reason: int, index: int, completion: int) -> pb.Done:
    return pb.Done(finish_reason=reason, choice_index=index,
                   usage=pb.Usage(prompt_tokens=5, completion_tokens=completion, cached_tokens=2))


def test_chat_response_sums_choices_and_reports_logprobs_bytes() -> None:
    c = Choices(Output(chat=True, model="m", logprobs=1), "chatcmpl-1")
    c.add_delta(pb.Delta(text="Hé", logprobs=[logprob(b"H", -0.5), logprob("é".encode(), -0.25)]))
    c.add_delta(pb.Delta(text="Yo", choice_index=1, logprobs=[logprob(b"Yo", -1.0)]))
    c.add_done(done(pb.FINISH_REASON_STOP, 0, 2))
    c.add_done(done(pb.FINISH_REASON_LENGTH, 1, 1))
    r = c.response()
    assert r["object"] == "chat.completion" and r["model"] == "m"
    assert [(x["message"]["content"], x["finish_reason"]) for x in r["choices"]] == [("Hé", "stop"), ("Yo", "length")]
    first = r["choices"][0]["logprobs"]["content"][1]
    assert (first["token"], first["bytes"], first["logprob"]) == ("é", [195, 169], -0.25)
    assert r["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                          "prompt_tokens_details": {"cached_tokens": 2}}


def test_completion_logprobs_have_offsets_after_the_echoed_prompt() -> None:
    c = Choices(Output(chat=False, model="m", logprobs=0, echo="Say"), "cmpl-1")
    c.add_delta(pb.Delta(text=" hi there", logprobs=[logprob(b" hi", -0.1), logprob(b" there", -0.2)]))
    c.add_done(done(pb.FINISH_REASON_STOP, 0, 2))
    row = c.response()["choices"][0]
    assert row["text"] == "Say hi there"
    assert row["logprobs"]["tokens"] == [" hi", " there"] and row["logprobs"]["text_offset"] == [3, 6]


def test_stream_chunks_carry_role_first_and_usage_last() -> None:
    c = Choices(Output(chat=True, model="m", stream=True, include_usage=True), "chatcmpl-2")
    first = c.chunk(0, text="A", first=True)
    assert first["object"] == "chat.completion.chunk" and first["usage"] is None
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "A"}
    assert c.chunk(0, finish="stop")["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    c.add_done(done(pb.FINISH_REASON_STOP, 0, 1))
    last = c.usage_chunk()
    assert last["choices"] == [] and last["usage"]["total_tokens"] == 6
