"""Events the engine emits per request; the servicer turns them into protos."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.request.sequence import FinishReason, Sequence


@dataclass(frozen=True)
class Delta:
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[Any, ...] = ()  # logprobs.TokenLogprob per token (when asked)
    choice_index: int = 0
    prompt_logprobs: tuple[Any, ...] = ()  # logprobs.TokenLogprob of prompt tokens 1.. (once)


@dataclass(frozen=True)
class Done:
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    queue_ms: float
    ttft_ms: float
    total_ms: float
    preemptions: int
    choice_index: int = 0
    cache_hit: bool = False  # answered by the response cache (no engine work)
    semantic_cache_hit: bool = False

    @classmethod
    def cancelled(cls, choice_index: int = 0) -> Done:
        """A request cancelled before it reached the engine (nothing computed)."""
        return cls(FinishReason.CANCELLED, 0, 0, 0, 0.0, 0.0, 0.0, 0, choice_index)

    @classmethod
    def of(cls, seq: Sequence) -> Done:
        """Summary of a finished sequence (times in ms since arrival; 0 when not reached)."""

        def ms(t: float | None) -> float:
            return (t - seq.arrival) * 1e3 if t is not None else 0.0

        assert seq.finish_reason is not None
        return cls(
            seq.finish_reason,
            seq.num_prompt_tokens,
            seq.num_generated,
            seq.num_cached,
            ms(seq.first_scheduled),
            ms(seq.first_token_time),
            ms(seq.finish_time),
            seq.preemptions,
            seq.choice_index,
        )


# ``Error.reason`` of an UNAVAILABLE that says "this replica is going away: retry on another one".
DRAINING = "draining"  # the server shuts down (SIGTERM): refused, or cut when the grace period ended
ENGINE_FAILED = "engine_failed"  # the engine thread died or stalled; the process exits
LOADING = "loading"  # the model is not loaded yet (an RPC refused at its start)
# ``Error.reason`` of an INVALID_ARGUMENT: the finished output breaks a rule of its JSON Schema that the
# grammar could not enforce (a keyword it approximated, e.g. ``uniqueItems``, ``not``); a retry may pass.
SCHEMA_NOT_ENFORCED = "schema_not_enforced"


@dataclass(frozen=True)
class Error:
    """A per-request failure: ``status`` is a grpc.StatusCode name; ``reason`` one of the constants above, or ""."""

    status: str
    message: str
    reason: str = ""
    retry_after_ms: int = 0  # a refusal's retry hint (RESOURCE_EXHAUSTED, UNAVAILABLE)
    quota: str = ""  # the tenant quota that refused the request, if one did


Event = Delta | Done | Error  # what a request's front end receives: Delta*, then Done or Error


def take_output(seq: Sequence, finished: bool) -> list[Delta]:
    """The deltas a step produced for ``seq`` (its pending output is cleared).

    Prompt log-probabilities come once, in their own delta, when the prompt has
    been computed; then the text and tokens of the step (with the held-back text
    of a stop-string check flushed when the sequence finished normally).
    """
    out: list[Delta] = []
    if finished and seq.text is not None and seq.finish_reason is not FinishReason.ERROR:
        seq.out_text += seq.text.flush()
    if seq.needs_prompt_rows and seq.prompt_done:
        seq.prompt_logprobs_sent = True
        if seq.prompt_logprobs:
            scored, seq.prompt_logprobs = tuple(seq.prompt_logprobs), []
            out.append(Delta("", (), choice_index=seq.choice_index, prompt_logprobs=scored))
    if seq.out_tokens or seq.out_text:
        out.append(Delta(seq.out_text, tuple(seq.out_tokens), tuple(seq.out_logprobs), seq.choice_index))
        seq.out_text, seq.out_tokens, seq.out_logprobs = "", [], []
    return out
