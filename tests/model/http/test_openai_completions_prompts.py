"""Completions as clients send them, through the OpenAI SDK against a real server: several prompts, token-id
prompts and several token-id prompts (one choice set per prompt, index = prompt * n + choice, the usage
summed over the prompts), streamed and not; echo with logprobs scores the prompt (evaluation harnesses);
token ids outside the vocabulary, too many prompts and a prompt that fails are 400s for the whole request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx2
import openai
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from service.http.prompts import MAX_CHOICES
from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer, assert_kv_clean

pytestmark = pytest.mark.model
PROMPTS = ["The capital of France is", "1, 2, 3,", "Once upon a time"]


@pytest.fixture(scope="module")
def stub(api_server: RunningServer) -> Iterator[Any]:
    with grpc.insecure_channel(api_server.target) as channel:
        yield pb_grpc.InferenceServiceStub(channel)


def count(stub: Any, text: str) -> int:
    return int(stub.CountTokens(pb.CountTokensRequest(text=text), timeout=30).count)


def ids_of(stub: Any, text: str, add_special: bool = False) -> list[int]:
    return list(stub.Tokenize(pb.TokenizeRequest(text=text, add_special=add_special), timeout=30).token_ids)


def test_several_prompts_answer_one_choice_set_each_in_index_order(client: openai.OpenAI, stub: Any) -> None:
    r = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=4, n=2, temperature=0.9, seed=3, echo=True)
    assert [c.index for c in r.choices] == list(range(6))
    for c in r.choices:
        assert c.text.startswith(PROMPTS[c.index // 2]) and c.finish_reason in ("stop", "length")
    assert r.usage is not None
    assert r.usage.prompt_tokens == sum(count(stub, p) for p in PROMPTS)  # each prompt counted once, not per choice
    assert 0 < r.usage.completion_tokens <= 6 * 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_token_id_prompts_go_to_the_engine_as_they_are(client: openai.OpenAI, stub: Any) -> None:
    prompts = [ids_of(stub, p) for p in PROMPTS[:2]]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=3, temperature=0, echo=True, logprobs=0)
    assert [c.index for c in r.choices] == [0, 1]
    for c, text in zip(r.choices, PROMPTS[:2], strict=True):
        assert c.text.startswith(text)  # the ids echoed as their text
    assert r.usage is not None and r.usage.prompt_tokens == sum(len(p) for p in prompts)  # no BOS added, no re-tokenizing
    one = client.completions.create(model=MODEL, prompt=prompts[0], max_tokens=3, temperature=0)  # one id list
    assert one.usage is not None and one.usage.prompt_tokens == len(prompts[0]) and [c.index for c in one.choices] == [0]


def test_a_text_prompt_and_its_token_ids_score_alike(client: openai.OpenAI, stub: Any) -> None:
    text = "The quick brown fox jumps over the lazy dog"
    by_text = client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True, logprobs=1)
    by_ids = client.completions.create(model=MODEL, prompt=[ids_of(stub, text, add_special=True)], max_tokens=0,
                                       echo=True, logprobs=1)
    a, b = by_text.choices[0], by_ids.choices[0]
    assert a.text == text and b.text.endswith(text)
    assert a.logprobs is not None and b.logprobs is not None and a.logprobs.tokens == b.logprobs.tokens
    for x, y in zip(a.logprobs.token_logprobs or [], b.logprobs.token_logprobs or [], strict=True):
        assert (x is None and y is None) or abs(x - y) < 1e-3  # type: ignore[operator]


def test_echo_with_logprobs_returns_the_prompt_tokens_logprobs(client: openai.OpenAI, stub: Any) -> None:
    prompt = "Paris is the capital of France"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, echo=True, logprobs=2)
    c = r.choices[0]
    lp = c.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert r.usage is not None and len(lp.tokens) == r.usage.prompt_tokens + r.usage.completion_tokens
    k = r.usage.prompt_tokens
    assert "".join(lp.tokens[:k]) == prompt and "".join(lp.tokens) == c.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing before the first token
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs[1:])
    assert lp.text_offset is not None and lp.text_offset[:2] == [0, len(lp.tokens[0])]
    scored = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    s = scored.choices[0]
    assert s.text == prompt and s.logprobs is not None and s.logprobs.tokens == lp.tokens[:k]
    assert scored.usage is not None and scored.usage.completion_tokens == 0


def test_several_prompts_stream_every_choice_with_its_index(client: openai.OpenAI, stub: Any) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=5, n=2, temperature=0.7, seed=1,
                                            stream=True, echo=True, stream_options={"include_usage": True}))
    texts: dict[int, str] = {}
    finished = set()
    for ch in chunks[:-1]:
        (row,) = ch.choices
        assert row.index not in finished  # nothing after a choice's end
        texts[row.index] = texts.get(row.index, "") + row.text
        if row.finish_reason is not None:
            finished.add(row.index)
    assert finished == set(range(6))
    assert all(texts[i].startswith(PROMPTS[i // 2]) for i in range(6))
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.prompt_tokens == sum(count(stub, p) for p in PROMPTS)


@pytest.mark.parametrize(("body", "needle"), [
    ({"prompt": [[1, 2], [3, 49152]]}, "prompt[1][1] = 49152"),
    ({"prompt": [-5, 3]}, "prompt[0] = -5"),
    ({"prompt": [[1], []]}, "no empty token-id array"),
    ({"prompt": [[1], "text"]}, "not a mix"),
    ({"prompt": ["a"] * (MAX_CHOICES + 1)}, f"at most {MAX_CHOICES}"),
])
def test_bad_prompts_are_a_400_naming_prompt(client: openai.OpenAI, body: dict[str, Any], needle: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, max_tokens=2, **body)
    assert info.value.body["param"] == "prompt" and needle in info.value.body["message"]  # type: ignore[index]


def test_prompts_times_n_over_the_bound_is_a_400_naming_n(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=["a", "b"], n=MAX_CHOICES // 2 + 1, max_tokens=2)
    assert info.value.body["param"] == "n"  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True])
def test_one_failing_prompt_fails_the_whole_request(api_server: RunningServer, stub: Any, stream: bool) -> None:
    limit = stub.CountTokens(pb.CountTokensRequest(text="x"), timeout=30).context_size
    too_long = ids_of(stub, "word ") * limit  # longer than the context: refused when prepared
    body = {"model": MODEL, "prompt": [ids_of(stub, "Hello"), too_long[:limit], ids_of(stub, "Hi")], "max_tokens": 64,
            "ignore_eos": True, "stream": stream}
    with httpx2.Client(timeout=120) as http:
        r = http.post(f"http://127.0.0.1:{api_server.server.http_port}/v1/completions", json=body)
    assert r.status_code == 400, r.text  # the status line waits for every prompt's first event
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "context limit" in err["message"]
    assert_kv_clean(api_server)  # the other prompts' requests were cancelled


def test_a_batch_line_with_several_prompts_is_a_failed_item(client: openai.OpenAI) -> None:
    import io

    rows = [{"custom_id": "two", "method": "POST", "url": "/v1/completions",
             "body": {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 2}}]
    upload = client.files.create(file=("p.jsonl", io.BytesIO(json.dumps(rows[0]).encode())), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="1h")
    counts = client.batches.retrieve(batch.id).request_counts
    assert counts is not None and (counts.total, counts.failed) == (1, 1)


def test_a_client_that_leaves_cancels_every_prompts_request(api_server: RunningServer) -> None:
    import socket

    payload = json.dumps({"model": MODEL, "prompt": PROMPTS, "max_tokens": 2000, "ignore_eos": True,
                          "stream": True}).encode()
    engine = api_server.engine

    def cancelled() -> int:
        return sum(t.cancelled for t in engine.metrics.tiers.values())

    before = cancelled()
    with socket.create_connection(("127.0.0.1", api_server.server.http_port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(payload), payload))
        buf = b""
        while buf.count(b"data: {") < 3:  # the stream started: every prompt has produced its first event
            buf += sock.recv(65536)
    assert_kv_clean(api_server)
    assert cancelled() - before == 3  # all three cancelled, none ran its 2000 tokens
