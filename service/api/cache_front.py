"""The servicer's one call into the cache: ``CacheFront.before_submit``.

Between a request's preparation and its submission the servicer asks
``before_submit``; a ``Replay`` answers the request without the engine (a hit,
a NOT_FOUND for ONLY_IF_CACHED, a cancellation while it waited for an
identical request), None lets it run (its answer is then recorded through its
``emit`` and stored at its Done). ``submitted`` is told whether the submission
went through, so a refused leader releases the requests waiting for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.api.proto_convert import done_proto, response_format
from service.request.events import Delta, Done, Error
from service.request.sequence import FinishReason, Sequence
from service.response_cache.cache import Hit, ResponseCache, Ticket


@dataclass
class Replay:
    """A request's answer without the engine: ``events`` (Delta*, Done | Error) and their protos."""

    events: list[Any]
    hit: Hit | None = None
    deltas: list[pb.Delta] = field(default_factory=list)
    done: pb.Done | None = None
    error: tuple[str, str, int] | None = None


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
    )
    proto = done_proto(done)
    proto.cache_hit = True
    proto.semantic_cache_hit = hit.semantic
    delta = Delta(e.text, e.token_ids)
    deltas = [pb.Delta(text=e.text, token_ids=e.token_ids)] if e.text or e.token_ids else []
    return Replay([delta, done], hit, deltas, proto)


def _error(status: str, message: str) -> Replay:
    return Replay([Error(status, message)], error=(status, message, 0))


class CacheFront:
    """Ties a ResponseCache to the servicer's requests and telemetry."""

    def __init__(self, cache: ResponseCache | None, telemetry: Any) -> None:
        self.cache = cache
        self.telemetry = telemetry
        self._unsubmitted: dict[int, Ticket] = {}  # seq.uid -> ticket of a request about to be submitted

    async def before_submit(
        self, seq: Sequence, req: Any, json_mode: bool = False, gave_up: Callable[[], bool] = lambda: False
    ) -> Replay | None:
        """A Replay answering ``req`` (a GenerateRequest, or a GenerateJSONRequest with ``json_mode``),
        or None to run it. ``gave_up()`` turns true when the request is cancelled meanwhile."""
        if self.cache is None:  # the cache is off: nothing is ever cached
            if req.cache_policy == pb.CACHE_POLICY_ONLY_IF_CACHED:
                return _error("NOT_FOUND", "cache_policy ONLY_IF_CACHED: the response cache is off on this server")
            return None
        if json_mode:
            fmt: tuple[str, str] | None = ("json_schema", req.json_schema)
        else:
            fmt = response_format(req.response_format) if req.HasField("response_format") else None
        messages = [(m.role, m.content) for m in req.messages]
        ttl = req.cache_ttl_s if req.HasField("cache_ttl_s") else None
        try:
            t = self.cache.ticket(
                seq, req.cache_policy, ttl, req.semantic_cache, req.prompt, messages, fmt, json_mode
            )
        except ValueError as exc:
            return _error("INVALID_ARGUMENT", str(exc))
        if t.key is None:
            if t.only_if_cached:
                return _error(
                    "NOT_FOUND",
                    "cache_policy ONLY_IF_CACHED: this request is never cached "
                    "(only deterministic requests with one choice and no logprobs are)",
                )
            return None
        give_up = lambda: gave_up() or seq.expired(time.monotonic())  # noqa: E731
        hit = await self.cache.lookup(t, give_up)
        if hit is not None:
            replay = _hit_replay(seq, hit)
            self.telemetry.on_submit(seq)
            self.telemetry.cache_hit(seq, True)
            self.telemetry.on_finish(seq, replay.events[-1])
            return replay
        if gave_up():  # cancelled while waiting for an identical request
            self.cache.abandon(t)
            return Replay([], done=pb.Done(finish_reason=pb.FINISH_REASON_CANCELLED))
        if t.only_if_cached:
            return _error("NOT_FOUND", "cache_policy ONLY_IF_CACHED: no cached answer for this request")
        self._unsubmitted[seq.uid] = t
        return None

    def submitted(self, seq: Sequence, ok: bool) -> None:
        """``seq`` was submitted (``ok``) or refused; a refused leader releases its followers.

        NOTE: the answer is recorded from here (wrapping ``seq.emit`` as it is at submission):
        the engine delivers events on the event loop, so none can arrive before this runs.
        """
        t = self._unsubmitted.pop(seq.uid, None)
        if t is None or self.cache is None:
            return
        if ok:
            self.cache.tap(t, seq)
            self.telemetry.cache_hit(seq, False)
        else:
            self.cache.abandon(t)

    def metrics(self) -> pb.ResponseCacheMetrics | None:
        return self.cache.metrics() if self.cache is not None else None

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
