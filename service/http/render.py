"""Engine events (``inference.v1`` protos) -> OpenAI chat.completion / text_completion objects.

``Choices`` follows one request's events: text, log-probabilities and finish
reasons per choice, and the usage of the whole request. The same state feeds
a complete response (``response``) and stream chunks (``chunk``), so a
streamed and an unstreamed answer can only differ in framing.

A completions request with several prompts has ``Output.n`` choices per
prompt: choice ``i`` belongs to prompt ``i // n``, whose echo it shows and
whose prompt tokens count once in the usage. With ``echo`` and ``logprobs``
a choice's ``logprobs`` start with its prompt's tokens: the first one with a
null logprob (nothing comes before it), then each scored by the model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.http.requests import Output

# NOTE: a JSON document closed early within its budget (json_finish close, the default) is complete and
# valid: "stop" (OpenAI's "length" means cut off, and the SDK's parse helper refuses it); the choice then
# carries the extension field CLOSED_FIELD (true), absent otherwise (docs/openai.md).
FINISH = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_CLOSED: "stop"}
CLOSED_FIELD = "json_closed"
Json = dict[str, Any]


def _token(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def chat_logprob(e: pb.TokenLogprob) -> Json:
    """One position in a chat ``logprobs.content`` list (``bytes`` are exact, ``token`` decoded)."""
    top = [{"token": _token(t.token), "logprob": t.logprob, "bytes": list(t.token)} for t in e.top_logprobs]
    return {"token": _token(e.token), "logprob": e.logprob, "bytes": list(e.token), "top_logprobs": top}


def completion_logprobs(entries: Sequence[pb.TokenLogprob], offset: int, head: str | None = None) -> Json:
    """A completions ``logprobs`` object (``text_offset`` counts characters from ``offset``); ``head``: a
    first token without a logprob (a prompt's first token, echoed with logprobs)."""
    out: Json = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    rows: list[tuple[str, float | None, dict[str, float] | None]] = [] if head is None else [(head, None, None)]
    rows += [(_token(e.token), e.logprob, {_token(t.token): t.logprob for t in e.top_logprobs}) for e in entries]
    for token, logprob, top in rows:
        out["tokens"].append(token)
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(token)
    return out


def first_token(prompt: str, scored: Sequence[pb.TokenLogprob]) -> str:
    """The text of a prompt's first token: what its scored tokens (all after the first) leave of it
    ("" when the first is a BOS the text does not show)."""
    whole, rest = prompt.encode(), b"".join(e.token for e in scored)
    return _token(whole[: len(whole) - len(rest)]) if whole.endswith(rest) else ""


@dataclass
class Choice:
    text: str = ""
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    finish: str | None = None
    tool_calls: list[Json] | None = None
    closed: bool = False  # a JSON document closed early within its budget (finish "stop")
    prompt_logprobs: list[pb.TokenLogprob] = field(default_factory=list)  # echo with logprobs: tokens 1..
    reasoning: str = ""  # a reasoning model's thought (``text`` is then its answer alone)


@dataclass
class Choices:
    """The per-choice state and usage of one request (see the module docstring)."""

    output: Output
    request_id: str
    created: int = field(default_factory=lambda: int(time.time()))
    choices: dict[int, Choice] = field(default_factory=dict)
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens, those of thoughts (a reasoning model's chat)
    prompts: dict[int, tuple[int, int]] = field(default_factory=dict)  # prompt -> (its tokens, cached ones)
    # the usage counts the thought's tokens (a reasoning model's chat: ``output.thought``, or a batch result read so)
    thought_usage: bool = False

    def __post_init__(self) -> None:
        self.thought_usage = self.thought_usage or self.output.thought is not None

    def get(self, index: int) -> Choice:
        return self.choices.setdefault(index, Choice())

    def prompt_of(self, index: int) -> int:
        """The prompt choice ``index`` belongs to (several prompts: ``Output.n`` choices each)."""
        return index // self.output.n if self.output.n else 0

    def echo(self, index: int) -> str:
        """The echoed prompt of choice ``index`` ("" without echo)."""
        return self.output.echo[self.prompt_of(index)] if self.output.echo else ""

    def add_delta(self, d: pb.Delta) -> Choice:
        choice = self.get(d.choice_index)
        choice.text += d.text
        choice.logprobs.extend(d.logprobs)
        choice.prompt_logprobs.extend(d.prompt_logprobs)
        return choice

    def add_done(self, d: pb.Done) -> Choice:
        choice = self.get(d.choice_index)
        choice.finish = FINISH[d.finish_reason]
        choice.closed = d.finish_reason == pb.FINISH_REASON_CLOSED
        self.completion_tokens += d.usage.completion_tokens
        prompt = self.prompt_of(d.choice_index)
        cached = max(self.prompts.get(prompt, (0, 0))[1], min(d.usage.cached_tokens, d.usage.prompt_tokens))
        self.prompts[prompt] = (d.usage.prompt_tokens, cached)  # NOTE: a prompt counts once, whatever its n
        return choice

    @property
    def prompt_tokens(self) -> int:
        return sum(tokens for tokens, _ in self.prompts.values())

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache, each prompt counted once."""
        return sum(cached for _, cached in self.prompts.values())

    def usage(self) -> Json:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            **({"completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}
               if self.thought_usage else {}),
        }

    def _envelope(self, chunk: bool) -> Json:
        if self.output.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.output.model}

    def _logprobs(self, entries: list[pb.TokenLogprob], offset: int = 0, prompt_of: int | None = None) -> Json | None:
        """The logprobs object of ``entries``; with ``prompt_of`` (a choice index; echo with logprobs) its
        prompt's tokens first."""
        if self.output.logprobs is None:
            return None
        if self.output.chat:
            return {"content": [chat_logprob(e) for e in entries], "refusal": None}
        if prompt_of is None or not self.output.score:
            return completion_logprobs(entries, offset)
        scored = self.get(prompt_of).prompt_logprobs
        # NOTE: the prompt's tokens start the text: the object starts at offset 0, whatever ``offset``
        return completion_logprobs([*scored, *entries], 0, first_token(self.echo(prompt_of), scored))

    def _message(self, c: Choice) -> Json:
        message: Json = {"role": "assistant", "content": c.text or None if c.tool_calls else c.text, "refusal": None}
        if c.reasoning:  # NOTE: llama-server's and vLLM's name for the thought
            message["reasoning_content"] = c.reasoning
        if c.tool_calls:
            message["tool_calls"] = c.tool_calls
        return message

    def response(self) -> Json:
        """The complete (unstreamed) object."""
        out = self._envelope(chunk=False)
        rows = []
        for i, c in sorted(self.choices.items()):
            if self.output.chat:
                row = {"index": i, "message": self._message(c), "logprobs": self._logprobs(c.logprobs),
                       "finish_reason": c.finish}
            else:
                echo = self.echo(i)
                row = {"index": i, "text": echo + c.text, "logprobs": self._logprobs(c.logprobs, len(echo), i),
                       "finish_reason": c.finish}
            if c.closed:
                row[CLOSED_FIELD] = True
            rows.append(row)
        out["choices"] = rows
        out["usage"] = self.usage()
        return out

    def role_chunk(self, index: int) -> Json:
        """A chat stream's first chunk of choice ``index``: the role alone, as OpenAI sends it."""
        return self._chunk({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def chunk(self, index: int, *, text: str = "", entries: list[pb.TokenLogprob] | None = None,
              finish: str | None = None, tool_deltas: list[Json] | None = None, offset: int = 0,
              closed: bool = False, echoed: bool = False, reasoning: str = "") -> Json:
        """One stream chunk of choice ``index`` (chat: after its ``role_chunk``; ``tool_deltas``: OpenAI's
        ``delta.tool_calls`` entries; ``echoed``: completions, the chunk that starts with the echoed prompt, whose
        logprobs then start with the prompt's; ``reasoning``: thought text, ``delta.reasoning_content``)."""
        scored = echoed and self.output.score
        logprobs = self._logprobs(entries or [], offset, index if scored else None) if entries or scored else None
        if self.output.chat:
            delta: Json = {"content": text} if text else {}
            if reasoning:
                delta["reasoning_content"] = reasoning
            if tool_deltas:
                delta["tool_calls"] = tool_deltas
            row: Json = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            row = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        if closed:
            row[CLOSED_FIELD] = True
        return self._chunk(row)

    def _chunk(self, row: Json) -> Json:
        out = self._envelope(chunk=True)
        out["choices"] = [row]
        if self.output.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self) -> Json:
        """The last chunk with ``stream_options.include_usage``: no choices, the request's usage."""
        out = self._envelope(chunk=True)
        out["choices"] = []
        out["usage"] = self.usage()
        return out
