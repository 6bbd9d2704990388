"""The lifecycle's cache stage: the response cache in front of the engine.

Between a request's preparation and its submission the lifecycle asks
``admit``: a ``Replay`` answers the request without the engine (a hit, a
NOT_FOUND for ONLY_IF_CACHED, a cancellation while it waited for an identical
request); None lets it run, and then the flight may hold a ``Ticket``: the
lifecycle hands the run's deltas to ``record`` and its terminal event to
``finish`` (stored on success, followers woken), or calls ``abandon`` when the
submission is refused. Event loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from inference.v1 import inference_pb2 as pb

from service.api.ask import Ask
from service.request.events import Delta, Done, Error
from service.request.sequence import FinishReason, Sequence
from service.response_cache.cache import Hit, ResponseCache, Ticket


@dataclass(frozen=True)
class Replay:
    """A request's answer without the engine: its deltas, then its end (``hit``: from a cached answer)."""

    end: Done | Error
    deltas: tuple[Delta, ...] = ()
    hit: Hit | None = None


def _hit_replay(seq: Sequence, hit: Hit) -> Replay:
    e = hit.entry
    ms = (time.monotonic() - seq.arrival) * 1e3
    done = Done(
        finish_reason=FinishReason(e.finish_reason),
        prompt_tokens=seq.num_prompt_tokens,
        completion_tokens=e.completion_tokens,
        cached_tokens=seq.num_prompt_tokens + e.completion_tokens,
        queue_ms=0.0,
        ttft_ms=ms,
        total_ms=ms,
        preemptions=0,
        cache_hit=True,
        semantic_cache_hit=hit.semantic,
    )
    deltas = (Delta(e.text, e.token_ids),) if e.text or e.token_ids else ()
    return Replay(done, deltas, hit)


def semantic_messages(ask: Ask) -> list[tuple[str, str]]:
    """The messages as the semantic cache compares them: (role, text), an assistant's calls and a result's
    call id and name in its text; the tools and template variables as turns of their own, first."""
    out = [("tool", f"{t.name}\x00{t.description}\x00{t.parameters}") for t in ask.tools]
    if ask.template_kwargs:
        out.append(("chat_template_kwargs", ask.template_kwargs))
    for m in ask.messages:
        extra = [m.tool_call_id, m.name, *(f"{c.id}\x00{c.name}\x00{c.arguments}" for c in m.tool_calls),
                 m.reasoning_content]
        out.append((m.role, "\x00".join([m.content, *extra]) if any(extra) else m.content))
    return out


def _error(status: str, message: str) -> Replay:
    return Replay(Error(status, message))


NEVER_CACHED = (
    "cache_policy ONLY_IF_CACHED: this request is never cached "
    "(only deterministic requests with one choice and no logprobs are)"
)


class CacheFront:
    """Ties a ResponseCache (or none) to the lifecycle's requests."""

    def __init__(self, cache: ResponseCache | None) -> None:
        self.cache = cache

    async def admit(
        self, ask: Ask, seq: Sequence, gave_up: Callable[[], bool], on_follow: Callable[[], None]
    ) -> Replay | Ticket | None:
        """A Replay answering the request, a Ticket to record its run with, or None to just run it.

        ``gave_up()`` turns true when the request is cancelled meanwhile; ``on_follow()`` is called
        when it starts waiting for an identical request's answer.
        """
        if not ask.cache.use:
            return None
        only = ask.cache.policy == pb.CACHE_POLICY_ONLY_IF_CACHED
        if self.cache is None:  # the cache is off: nothing is ever cached
            return _error("NOT_FOUND", "cache_policy ONLY_IF_CACHED: the response cache is off on this server") \
                if only else None
        c = ask.cache
        # NOTE: only the semantic cache reads the messages (the exact key hashes the prompt's tokens).
        messages = semantic_messages(ask) if c.semantic else []
        try:
            t = self.cache.ticket(seq, c.policy, c.ttl_s, c.semantic, ask.prompt, messages, ask.constraint,
                                  ask.json_mode)
        except ValueError as exc:
            return _error("INVALID_ARGUMENT", str(exc))
        if t.key is None:
            return _error("NOT_FOUND", NEVER_CACHED) if t.only_if_cached else None
        hit = await self.cache.lookup(t, lambda: gave_up() or seq.expired(time.monotonic()), on_follow)
        if hit is not None:
            return _hit_replay(seq, hit)
        if gave_up():  # cancelled while waiting for an identical request
            self.cache.abandon(t)
            return Replay(Done.cancelled())
        if t.only_if_cached:
            return _error("NOT_FOUND", "cache_policy ONLY_IF_CACHED: no cached answer for this request")
        return t

    def record(self, ticket: Ticket | None, delta: Delta) -> None:
        if ticket is not None and self.cache is not None:
            self.cache.record(ticket, delta)

    def finish(self, ticket: Ticket | None, event: Done | Error) -> None:
        """The run ended: a Done is stored (when cacheable); either way, followers are woken."""
        if ticket is not None and self.cache is not None:
            self.cache.finish(ticket, event if isinstance(event, Done) else None)

    def abandon(self, ticket: Ticket | None) -> None:
        """The request was never run (refused at submission)."""
        if ticket is not None and self.cache is not None:
            self.cache.abandon(ticket)

    def metrics(self) -> pb.ResponseCacheMetrics | None:
        return self.cache.metrics() if self.cache is not None else None

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
