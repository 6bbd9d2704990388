"""A prefix-cache router over KV-cache events: each request goes to the replica holding its longest prefix.

What llm-d's precise prefix-cache scorer does for vLLM, written here from the published formats
(docs/scale-out.md): llm-d's own indexer (the Go module github.com/llm-d/llm-d-kv-cache) cannot be
fetched on this machine, so this is the consumer we test the events with (issue #38 item 4).

* **Index**: one ``Subscriber`` (``bench.harness.kv_events``, a decoder written from vLLM's wire
  format) per replica keeps the block hashes the replica holds, per medium (``cpu``: the KV pool,
  ``cpu_host``: the host tier). With the replica's replay endpoint a late or lossy subscription
  catches up.
* **Tokens**: a request's token ids come from a replica's render endpoint
  (``POST /v1/chat/completions/render``; every replica renders alike, so the renders rotate over them).
* **Hashes**: its block hash chain is computed as the server computes its prefix-cache keys:
  ``h_i = hash((h_{i-1}, tuple(block_i)))`` over ``block_size`` token ids, ``h_{-1} = 0`` (Python's
  tuple hash of ints: the same in every process), sent as ``h & (2**64 - 1)``. Only the blocks
  before the prompt's last token count: the server always computes that token (it needs its logits).
* **Choice**: the replica holding the most consecutive blocks of the chain from the first (either
  tier); ties go to the fewest requests in flight (this router's), then the fewest blocks held, then
  the fewest requests routed so far, so cold prefixes spread over the replicas.

NOTE: a request routed to a replica counts as holding its whole chain there until it finishes
(``_pending``): its blocks are registered only once its prefill is done, and two requests with a
new prefix arriving together would otherwise land on two replicas and cache it twice. llm-d's scorer
reads only the events; this is our addition.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx2

from bench.harness.kv_events import Subscriber

U64 = (1 << 64) - 1


def chain_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The wire (uint64) hashes of the whole blocks a request can find cached, in order."""
    out: list[int] = []
    parent = 0
    for i in range((len(token_ids) - 1) // block_size):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        out.append(parent & U64)
    return out


@dataclass(frozen=True)
class Endpoint:
    """One replica as the router sees it: its HTTP base URL and its event sockets."""

    name: str
    http: str  # e.g. http://10.226.0.11:8000
    events: str  # the PUB endpoint, e.g. tcp://10.226.0.11:5557
    replay: str = ""  # the ROUTER endpoint ("": gaps are skipped)


@dataclass(frozen=True)
class Decision:
    """Where a request went: ``replica``, holding ``blocks`` of its chain; ``scores`` per replica."""

    replica: int
    blocks: int
    scores: tuple[int, ...]
    chain: tuple[int, ...]


class PrefixRouter:
    """Subscriptions to every replica's events and the choice per request (see the module docstring)."""

    def __init__(self, endpoints: Sequence[Endpoint], block_size: int = 16, timeout: float = 600.0) -> None:
        self.endpoints = list(endpoints)
        self.block_size = block_size
        self.subs = [Subscriber(e.events, topic=b"kv@", replay=e.replay) for e in self.endpoints]
        self.http = httpx2.Client(timeout=timeout)
        self._lock = threading.Lock()
        n = len(self.endpoints)
        self.in_flight = [0] * n
        self.routed = [0] * n
        self._pending: list[Counter[int]] = [Counter() for _ in range(n)]
        self._renders = itertools.count()

    # -- tokens ------------------------------------------------------------------------------
    def render_chat(self, messages: list[dict[str, str]], **body: Any) -> list[int]:
        """The token ids a replica would prefill for this chat (its render endpoint)."""
        base = self.endpoints[next(self._renders) % len(self.endpoints)].http
        reply = self.http.post(f"{base}/v1/chat/completions/render", json={"messages": messages, **body})
        reply.raise_for_status()
        return list(reply.json()["token_ids"])

    # -- the choice --------------------------------------------------------------------------
    def held(self, i: int) -> dict[str, frozenset[int]]:
        """Replica ``i``'s index as rebuilt from its events: medium -> block hashes held."""
        sub = self.subs[i]
        with sub.lock:
            return {medium: frozenset(hashes) for medium, hashes in sub.index.held.items()}

    def _depth(self, i: int, chain: Sequence[int]) -> int:
        """Consecutive blocks of ``chain`` from the first that replica ``i`` holds (or will, in flight)."""
        sub, pending = self.subs[i], self._pending[i]
        with sub.lock:
            tiers = list(sub.index.held.values())
            return next((d for d, h in enumerate(chain) if h not in pending and not any(h in t for t in tiers)),
                        len(chain))

    def _size(self, i: int) -> int:
        sub = self.subs[i]
        with sub.lock:
            return sum(len(t) for t in sub.index.held.values())

    def choose(self, token_ids: Sequence[int]) -> Decision:
        """Pick a replica for a request of ``token_ids`` and count it in flight there (``done`` ends it)."""
        chain = chain_hashes(token_ids, self.block_size)
        with self._lock:
            n = len(self.endpoints)
            scores = tuple(self._depth(i, chain) for i in range(n))
            sizes = [self._size(i) for i in range(n)]
            best = min(range(n), key=lambda i: (-scores[i], self.in_flight[i], sizes[i], self.routed[i], i))
            self.in_flight[best] += 1
            self.routed[best] += 1
            self._pending[best].update(chain)
        return Decision(best, scores[best], scores, tuple(chain))

    def done(self, decision: Decision) -> None:
        """The request ``decision`` placed has finished (its blocks are in the replica's events now)."""
        with self._lock:
            self.in_flight[decision.replica] -= 1
            pending = self._pending[decision.replica]
            for h in decision.chain:
                pending[h] -= 1
                if pending[h] <= 0:
                    del pending[h]

    @contextmanager
    def route(self, token_ids: Sequence[int]) -> Iterator[Decision]:
        """``choose``, then ``done`` when the block ends (send the request inside it)."""
        decision = self.choose(token_ids)
        try:
            yield decision
        finally:
            self.done(decision)

    def close(self) -> None:
        for sub in self.subs:
            sub.close()
        self.http.close()

    def __enter__(self) -> PrefixRouter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
