"""OpenAI error objects from the service's statuses, and events -> chat/completion objects and chunks."""

from __future__ import annotations

import json

from inference.v1 import inference_pb2 as pb

from service.http.answer import Answer
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
    c = Choices(Output(chat=False, model="m", logprobs=0, echo=("Say",)), "cmpl-1")
    c.add_delta(pb.Delta(text=" hi there", logprobs=[logprob(b" hi", -0.1), logprob(b" there", -0.2)]))
    c.add_done(done(pb.FINISH_REASON_STOP, 0, 2))
    row = c.response()["choices"][0]
    assert row["text"] == "Say hi there"
    assert row["logprobs"]["tokens"] == [" hi", " there"] and row["logprobs"]["text_offset"] == [3, 6]


class NoSchema:
    """The validator of an answer without a JSON Schema: never called."""

    async def compiled(self, kind: str, source: str, record: bool = True) -> None:
        raise AssertionError("no schema to compile")

    def validate(self, compiled: object, text: str) -> None:
        raise AssertionError("no schema to validate against")


def deltas(chunks: list[dict[str, object]]) -> list[object]:
    return [ch["choices"][0]["delta"] for ch in chunks]  # type: ignore[index]


async def test_chat_stream_opens_with_a_role_only_chunk_and_never_sends_empty_content() -> None:
    a = Answer(Choices(Output(chat=True, model="m", stream=True, include_usage=True), "chatcmpl-2"), NoSchema())
    first = a.on_delta(pb.Delta(text="", token_ids=[240]))  # half of a multi-byte character: no text yet
    assert deltas(first) == [{"role": "assistant", "content": ""}]
    assert first[0]["object"] == "chat.completion.chunk" and first[0]["usage"] is None
    assert deltas(a.on_delta(pb.Delta(text="é", token_ids=[169]))) == [{"content": "é"}]
    assert a.on_delta(pb.Delta(text="", token_ids=[240])) == []
    end = await a.on_done(done(pb.FINISH_REASON_STOP, 0, 3))
    assert [ch["choices"][0] for ch in end] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    last = a.choices.usage_chunk()
    assert last["choices"] == [] and last["usage"]["total_tokens"] == 8


async def test_each_chat_choice_gets_its_role_chunk_even_when_it_ends_at_once() -> None:
    a = Answer(Choices(Output(chat=True, model="m", stream=True), "chatcmpl-3"), NoSchema())
    assert deltas(a.on_delta(pb.Delta(text="Hi", token_ids=[1], choice_index=1))) == [
        {"role": "assistant", "content": ""}, {"content": "Hi"}]
    end = await a.on_done(done(pb.FINISH_REASON_LENGTH, 0, 0))
    assert [(ch["choices"][0]["index"], ch["choices"][0]["delta"]) for ch in end] == [
        (0, {"role": "assistant", "content": ""}), (0, {})]


async def test_completion_stream_echoes_the_prompt_once_and_skips_empty_deltas() -> None:
    a = Answer(Choices(Output(chat=False, model="m", stream=True, echo=("Say",)), "cmpl-4"), NoSchema())
    assert [ch["choices"][0]["text"] for ch in a.on_delta(pb.Delta(text="", token_ids=[240]))] == ["Say"]
    assert a.on_delta(pb.Delta(text="", token_ids=[240])) == []
    assert [ch["choices"][0]["text"] for ch in a.on_delta(pb.Delta(text=" hi", token_ids=[5]))] == [" hi"]


def test_several_prompts_count_each_prompt_once_and_echo_their_own() -> None:
    c = Choices(Output(chat=False, model="m", echo=("A:", "Bb:"), n=2), "cmpl-5")
    for i, text in enumerate(["1", "2", "3", "4"]):
        c.add_delta(pb.Delta(text=text, choice_index=i))
    usage = [(5, 2), (5, 2), (7, 0), (7, 0)]  # (prompt tokens, cached) of each choice's Done
    for i, (prompt, cached) in enumerate(usage):
        c.add_done(pb.Done(finish_reason=pb.FINISH_REASON_STOP, choice_index=i,
                           usage=pb.Usage(prompt_tokens=prompt, completion_tokens=1, cached_tokens=cached)))
    r = c.response()
    assert [x["text"] for x in r["choices"]] == ["A:1", "A:2", "Bb:3", "Bb:4"]
    assert r["usage"] == {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16,
                          "prompt_tokens_details": {"cached_tokens": 2}}


def test_echo_with_logprobs_leads_with_the_prompts_tokens_the_first_null() -> None:
    c = Choices(Output(chat=False, model="m", logprobs=1, echo=("Say hi",), score=True), "cmpl-6")
    c.add_delta(pb.Delta(prompt_logprobs=[logprob(b" hi", -2.0)]))  # tokens after the first: " hi"
    c.add_delta(pb.Delta(text=" there", logprobs=[logprob(b" there", -0.5)]))
    c.add_done(done(pb.FINISH_REASON_LENGTH, 0, 1))
    lp = c.response()["choices"][0]["logprobs"]
    assert lp["tokens"] == ["Say", " hi", " there"] and lp["text_offset"] == [0, 3, 6]
    assert lp["token_logprobs"] == [None, -2.0, -0.5] and lp["top_logprobs"][0] is None
    assert c.response()["choices"][0]["text"] == "Say hi there"


async def test_a_streamed_echo_with_logprobs_opens_with_the_prompts_tokens() -> None:
    a = Answer(Choices(Output(chat=False, model="m", stream=True, logprobs=0, echo=("Say hi",), score=True),
                       "cmpl-7"), NoSchema())
    first = a.on_delta(pb.Delta(prompt_logprobs=[logprob(b" hi", -2.0)]))
    row = first[0]["choices"][0]
    assert row["text"] == "Say hi" and row["logprobs"]["tokens"] == ["Say", " hi"]
    assert row["logprobs"]["token_logprobs"] == [None, -2.0]
    nxt = a.on_delta(pb.Delta(text=" there", logprobs=[logprob(b" there", -0.5)]))[0]["choices"][0]
    assert nxt["text"] == " there" and nxt["logprobs"]["text_offset"] == [6]
