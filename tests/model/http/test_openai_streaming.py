"""Chat streams as OpenAI sends them: a role-only first chunk per choice, then never a chunk of empty
content, even when a token is only part of a multi-byte character (emoji)."""

from __future__ import annotations

import json
from typing import Any

import grpc
import httpx2
import openai
import pytest
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer

pytestmark = pytest.mark.model
ROLE = {"role": "assistant", "content": ""}
EMOJI_PROMPTS = [
    "Reply with five party emoji and nothing else.",
    "Answer only in emoji: how was your day? 🎉🥳😀",
    "Translate to emoji: pizza, rocket, heart, family 👩‍👩‍👧.",
    "Use lots of emoji 🇫🇷🎂🚀 to describe a birthday in Paris.",
]


def chunks_of(api_server: RunningServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON chunks of one streamed chat request, read as raw server-sent events."""
    url = f"http://127.0.0.1:{api_server.server.http_port}/v1/chat/completions"
    with httpx2.Client(timeout=120) as http, http.stream("POST", url, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = r.read().decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    return [json.loads(e.removeprefix("data: ")) for e in events[:-2]]


def assert_openai_shaped(chunks: list[dict[str, Any]], choices: int = 1) -> str:
    """Each choice opens with the role-only chunk; after it, every delta has text, or ends the choice with
    ``{}``; returns choice 0's text."""
    seen: dict[int, list[dict[str, Any]]] = {}
    for c in chunks:
        (row,) = c["choices"]
        seen.setdefault(row["index"], []).append(row)
    assert sorted(seen) == list(range(choices))
    for rows in seen.values():
        assert rows[0]["delta"] == ROLE and rows[0]["finish_reason"] is None
        for row in rows[1:-1]:
            assert row["delta"].get("content"), row  # never an empty (or absent) content mid-stream
            assert "role" not in row["delta"]
        assert rows[-1]["delta"] == {} and rows[-1]["finish_reason"] in ("stop", "length")
    return "".join(row["delta"].get("content", "") for row in seen[0])


def test_a_token_that_is_half_an_emoji_is_never_an_empty_chunk(api_server: RunningServer) -> None:
    with grpc.insecure_channel(api_server.target) as channel:
        tok = pb_grpc.InferenceServiceStub(channel).Tokenize(pb.TokenizeRequest(text="🎉"), timeout=30)
    partial = [t for t, p in zip(tok.token_ids, tok.pieces, strict=True) if len(p) < 4]
    assert partial, "the emoji is one token here; the test needs a multi-token character"
    # NOTE: the first generated token forced to the emoji's first bytes: the first delta completes no character
    body = {"model": MODEL, "max_tokens": 6, "temperature": 0, "logit_bias": {str(partial[0]): 100},
            "messages": [{"role": "user", "content": "Party!"}]}
    chunks = chunks_of(api_server, body)
    assert_openai_shaped(chunks)
    assert len(chunks) < 2 + 6  # the role chunk, at most one per completed character, the finish chunk


@pytest.mark.parametrize("prompt", EMOJI_PROMPTS)
def test_emoji_streams_open_with_the_role_and_carry_no_empty_content(
    api_server: RunningServer, client: openai.OpenAI, prompt: str
) -> None:
    body = {"model": MODEL, "max_tokens": 24, "temperature": 0, "messages": [{"role": "user", "content": prompt}]}
    text = assert_openai_shaped(chunks_of(api_server, body))
    whole = client.chat.completions.create(**body)  # type: ignore[call-overload]
    assert text == whole.choices[0].message.content


def test_every_choice_of_n_opens_with_its_role_chunk(api_server: RunningServer) -> None:
    body = {"model": MODEL, "max_tokens": 12, "n": 3, "temperature": 0.9, "seed": 5,
            "messages": [{"role": "user", "content": EMOJI_PROMPTS[1]}]}
    assert_openai_shaped(chunks_of(api_server, body), choices=3)


def test_the_sdk_sees_the_role_first_and_text_after(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, stream=True,
                                            messages=[{"role": "user", "content": "Say hello."}])
    chunks = [c for c in stream if c.choices]
    assert (chunks[0].choices[0].delta.role, chunks[0].choices[0].delta.content) == ("assistant", "")
    assert all(c.choices[0].delta.content for c in chunks[1:-1])
