"""The response cache as the request lifecycle sees it: plan a request, look it up, store its answer.

Flow of one request (event loop only; the lifecycle, ``service.api.intake``, makes these calls)::

    ticket = cache.ticket(seq, policy, ttl, semantic, prompt, messages, fmt, json_mode)
    hit = await cache.lookup(ticket, gave_up)   # exact, then semantic, then coalescing
    hit is None -> cache.record(ticket, delta)  # each delta of the answer, as it runs
                   cache.finish(ticket, done)   # at its terminal event: stored, followers woken
                   (or cache.abandon(ticket) if it is never submitted)

Only deterministic requests (``key.deterministic``) that replay as one text
(``key.replayable``) get a key; every other request passes through untouched.
Answers are stored on STOP or LENGTH only (never CANCELLED or errors; for
GenerateJSON never LENGTH, which is an error there).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.request.events import Delta, Done
from service.request.sequence import FinishReason, Sequence
from service.response_cache.coalesce import Coalescer
from service.response_cache.key import (
    ModelIdentity,
    deterministic,
    exact_key,
    replayable,
    semantic_scope,
    split_user_message,
)
from service.response_cache.store import Entry, MemoryStore, ResponseStore, SqliteStore

log = logging.getLogger("service.response_cache")
POLICIES = (
    pb.CACHE_POLICY_UNSPECIFIED,
    pb.CACHE_POLICY_BYPASS,
    pb.CACHE_POLICY_NO_STORE,
    pb.CACHE_POLICY_ONLY_IF_CACHED,
)


@dataclass(frozen=True)
class CacheConfig:
    capacity_bytes: int = 64 << 20
    db_path: str = ""
    max_ttl_s: float = 3600.0
    semantic: bool = False
    semantic_threshold: float = 0.95


@dataclass
class Ticket:
    """One request's use of the cache."""

    key: str | None  # None: not cacheable (stochastic, several choices, logprobs, cache off)
    read: bool = True
    write: bool = True
    only_if_cached: bool = False
    ttl_s: float = 0.0
    json_mode: bool = False
    leader: bool = False
    finished: bool = False
    scope: str | None = None  # semantic scope, when a semantic lookup was asked for
    user_text: str = ""
    vector: Any = None  # the user message's embedding, once computed
    texts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Hit:
    entry: Entry
    semantic: bool = False
    coalesced: bool = False


@dataclass
class Counters:
    hits: int = 0
    semantic_hits: int = 0
    misses: int = 0
    stores: int = 0
    coalesced: int = 0


class ResponseCache:
    """Exact cache + coalescing + optional semantic index, behind one object."""

    def __init__(self, config: CacheConfig, store: ResponseStore | None = None, semantic: Any = None) -> None:
        self.config = config
        self.store: ResponseStore = store or open_store(config)
        self.semantic = semantic  # service.response_cache.semantic.SemanticIndex, or None
        self.flights = Coalescer()
        self.counters = Counters()
        self.model: ModelIdentity | None = None  # set by ``bind`` once the model is loaded

    def bind(self, model: ModelIdentity) -> None:
        self.model = model

    # -- planning ---------------------------------------------------------------------------
    def ticket(
        self,
        seq: Sequence,
        policy: int,
        ttl_s: int | None,
        semantic: bool,
        prompt: str,
        messages: list[tuple[str, str]],
        fmt: tuple[str, str] | None,
        json_mode: bool = False,
    ) -> Ticket:
        """The request's ticket; raises ValueError for an unknown policy."""
        if policy not in POLICIES:
            raise ValueError(f"cache_policy {policy} is not a known CachePolicy value (0..3)")
        t = Ticket(
            key=None,
            read=policy != pb.CACHE_POLICY_BYPASS,
            write=policy in (pb.CACHE_POLICY_UNSPECIFIED, pb.CACHE_POLICY_BYPASS),
            only_if_cached=policy == pb.CACHE_POLICY_ONLY_IF_CACHED,
            ttl_s=min(float(ttl_s), self.config.max_ttl_s) if ttl_s is not None else self.config.max_ttl_s,
            json_mode=json_mode,
        )
        if self.model is None or self.config.capacity_bytes <= 0 or t.ttl_s <= 0:
            return t
        if not (deterministic(seq.params) and replayable(seq.params)):
            return t
        t.key = exact_key(self.model, seq.tenant, seq.token_ids, seq.params, fmt, json_mode)
        if semantic and self.semantic is not None:
            t.user_text, context = split_user_message(prompt, messages)
            if t.user_text:
                t.scope = semantic_scope(self.model, seq.tenant, context, seq.params, fmt, json_mode)
        return t

    # -- lookup -----------------------------------------------------------------------------
    async def lookup(
        self, t: Ticket, gave_up: Callable[[], bool] = lambda: False, on_follow: Callable[[], None] = lambda: None
    ) -> Hit | None:
        """A stored (or coalesced) answer, or None: then the caller runs the request (``t.leader``
        says whether it leads a flight) unless ``t.only_if_cached`` or ``gave_up()``. ``on_follow`` is
        called when the request starts waiting for an identical one that is running."""
        if t.key is None:
            return None
        if not t.read:  # BYPASS: computes (and leads, when nobody else computes this key)
            t.leader = self.flights.try_lead(t.key)
            return None
        while True:
            if (hit := await self._read(t)) is not None:
                return hit
            flight = self.flights.running(t.key)
            if flight is None:
                self.counters.misses += 1
                # NOTE: ONLY_IF_CACHED never leads: nothing may be generated for it.
                t.leader = not t.only_if_cached and self.flights.try_lead(t.key)
                return None
            self.counters.coalesced += 1
            on_follow()
            entry = await self.flights.follow(flight, gave_up)
            if entry is not None:
                self.counters.hits += 1
                return Hit(entry, coalesced=True)
            if gave_up():
                return None

    async def _read(self, t: Ticket) -> Hit | None:
        assert t.key is not None
        entry = self.store.get(t.key)
        if entry is not None:
            self.counters.hits += 1
            return Hit(entry)
        if t.scope is None or self.semantic is None:
            return None
        loop = asyncio.get_running_loop()
        if t.vector is None:
            t.vector = await loop.run_in_executor(None, self.semantic.embed, t.user_text)
        # NOTE: off the loop: a candidate's substituted words may need embedding (semantic.SYNONYM_MIN).
        key = await loop.run_in_executor(None, self.semantic.nearest, t.scope, t.user_text, t.vector, t.key)
        if key is None:
            return None
        entry = self.store.get(key)
        if entry is None:  # evicted or expired since: forget it
            self.semantic.remove(key)
            return None
        self.counters.hits += 1
        self.counters.semantic_hits += 1
        return Hit(entry, semantic=True)

    # -- storing ----------------------------------------------------------------------------
    def record(self, t: Ticket, delta: Delta) -> None:
        """Keep one delta of a running leader's answer (stored at its ``finish``)."""
        if t.key is not None and not t.finished:
            t.texts.append(delta.text)
            t.ids.extend(delta.token_ids)

    def finish(self, t: Ticket, done: Done | None) -> None:
        """The request ended (``done`` None: without an answer); stores it and wakes followers (once)."""
        if t.key is None or t.finished:
            return
        t.finished = True
        entry = self._entry(t, done)
        if entry is not None and t.write and self.store.put(t.key, entry, t.ttl_s):
            self.counters.stores += 1
            if t.scope is not None and t.vector is not None and self.semantic is not None:
                self.semantic.add(t.scope, t.user_text, t.vector, t.key)
        if t.leader:
            self.flights.finish(t.key, entry)

    def abandon(self, t: Ticket) -> None:
        """The request was never run (refused, cancelled before submission)."""
        self.finish(t, None)

    @staticmethod
    def _entry(t: Ticket, done: Done | None) -> Entry | None:
        ok = (FinishReason.STOP, FinishReason.CLOSED) if t.json_mode else (FinishReason.STOP, FinishReason.LENGTH)
        if done is None or done.finish_reason not in ok:
            return None
        return Entry(
            "".join(t.texts),
            tuple(t.ids),
            done.finish_reason.value,
            done.prompt_tokens,
            done.completion_tokens,
        )

    # -- metrics ----------------------------------------------------------------------------
    def metrics(self) -> pb.ResponseCacheMetrics:
        s, c = self.store.stats(), self.counters
        return pb.ResponseCacheMetrics(
            hits=c.hits,
            semantic_hits=c.semantic_hits,
            misses=c.misses,
            stores=c.stores,
            evictions=s.evictions,
            expirations=s.expirations,
            coalesced=c.coalesced,
            entries=s.entries,
            bytes=s.bytes,
            capacity_bytes=s.capacity_bytes,
        )

    def close(self) -> None:
        self.store.close()


def open_store(config: CacheConfig) -> ResponseStore:
    if config.db_path:
        return SqliteStore(config.db_path, config.capacity_bytes)
    return MemoryStore(config.capacity_bytes)
