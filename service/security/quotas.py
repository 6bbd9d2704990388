"""Per-tenant quotas and counters, decided at the edge (before a request reaches the engine).

Quotas (from the tenants file; 0 = unlimited):

* ``max_concurrent``: requests accepted and not finished (queued or running);
* ``max_queued``: accepted requests that have not started yet;
* ``tokens_per_minute``: prompt + ``max_tokens`` are *reserved* at admission;
  on completion the reservation is *settled* to the tokens really used
  (prompt + generated) and stays in a sliding 60-second window.

A request over quota is refused with ``QuotaExceeded`` (a ``QueueFull``, so the
servicer answers RESOURCE_EXHAUSTED with ``retry_after_ms``); its ``quota``
names the quota, which the servicer also puts in the ``inference-quota``
trailing metadata key / ``Error.quota`` so a caller can tell a quota from
server overload.

Threads: ``reserve`` and ``settle`` run on the event loop (the request
lifecycle calls them: ``service.api.intake``). ``snapshot`` may run on any thread (a lock guards the books).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from service.priority import QueueFull
from service.request.sequence import Priority, Sequence
from service.security.tenants import ANONYMOUS, Tenant

WINDOW_S = 60.0
QUOTA_METADATA_KEY = "inference-quota"


class QuotaExceeded(QueueFull):
    """A tenant's quota refuses the request; ``quota`` names which one."""

    def __init__(self, tenant: str, quota: str, detail: str, retry_after_ms: int) -> None:
        Exception.__init__(
            self,
            f"tenant {tenant!r} is over its {quota} quota ({detail}); this is a per-tenant quota, "
            f"not server overload; retry after {retry_after_ms} ms",
        )
        self.priority = Priority.BATCH
        self.retry_after_ms = retry_after_ms
        self.quota = quota
        self.tenant = tenant


@dataclass
class _Books:
    """One tenant's usage and counters."""

    in_flight: dict[int, Sequence] = field(default_factory=dict)
    reserved: dict[int, int] = field(default_factory=dict)  # uid -> tokens reserved
    window: deque[tuple[float, int]] = field(default_factory=deque)  # (settled at, tokens)
    window_tokens: int = 0
    e2e_ms: float = 1000.0  # moving average of request duration (retry hints)
    requests: int = 0
    rejected: int = 0
    finished: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0

    def expire(self, now: float) -> None:
        while self.window and self.window[0][0] <= now - WINDOW_S:
            self.window_tokens -= self.window.popleft()[1]

    def queued(self) -> int:
        return sum(1 for s in self.in_flight.values() if s.first_scheduled is None)


def _clamp_ms(ms: float) -> int:
    return int(min(60_000.0, max(100.0, ms)))


class TenantQuotas:
    """Admission against per-tenant quotas, settlement on completion, and per-tenant counters."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._books: dict[str, _Books] = {}

    def _get(self, name: str) -> _Books:
        books = self._books.get(name)
        if books is None:
            books = self._books[name] = _Books()
        return books

    def reserve(self, seq: Sequence, tenant: Tenant | None) -> None:
        """Check ``tenant``'s quotas and reserve ``seq``'s tokens; raises QuotaExceeded (nothing kept).

        Every reservation is ended by exactly one ``settle`` (the request's end, or its refusal).
        """
        name = seq.tenant or ANONYMOUS
        need = seq.num_prompt_tokens + seq.params.max_tokens
        with self._lock:
            books = self._get(name)
            if tenant is not None:
                try:
                    self._check(tenant, books, need)
                except QuotaExceeded:
                    books.rejected += 1
                    raise
            books.in_flight[seq.uid] = seq
            books.reserved[seq.uid] = need
            books.requests += 1

    def _check(self, t: Tenant, books: _Books, need: int) -> None:
        now = self._clock()
        if t.max_concurrent and len(books.in_flight) >= t.max_concurrent:
            raise QuotaExceeded(
                t.name, "max_concurrent", f"{t.max_concurrent} requests in flight", _clamp_ms(books.e2e_ms)
            )
        if t.max_queued and books.queued() >= t.max_queued:
            raise QuotaExceeded(
                t.name, "max_queued", f"{t.max_queued} requests queued", _clamp_ms(books.e2e_ms)
            )
        if not t.tokens_per_minute:
            return
        books.expire(now)
        if need > t.tokens_per_minute:
            raise QuotaExceeded(
                t.name,
                "tokens_per_minute",
                f"one request reserves {need} tokens (prompt + max_tokens), "
                f"more than {t.tokens_per_minute} per minute; lower max_tokens",
                60_000,
            )
        used = books.window_tokens + sum(books.reserved.values())
        if used + need > t.tokens_per_minute:
            detail = f"{used} of {t.tokens_per_minute} tokens per minute used or reserved, {need} more asked"
            raise QuotaExceeded(t.name, "tokens_per_minute", detail, self._tpm_retry(t, books, need, now))

    @staticmethod
    def _tpm_retry(t: Tenant, books: _Books, need: int, now: float) -> int:
        """When enough settled tokens leave the window (or, if reservations hold the room, a request's time)."""
        excess = books.window_tokens + sum(books.reserved.values()) + need - t.tokens_per_minute
        for at, tokens in books.window:
            excess -= tokens
            if excess <= 0:
                return _clamp_ms((at + WINDOW_S - now) * 1000.0)
        return _clamp_ms(books.e2e_ms)

    def settle(self, seq: Sequence, refused: bool = False) -> None:
        """Release ``seq``'s place and turn its reservation into the tokens it used (``refused``: none).

        Idempotent: a sequence without a reservation is left alone.
        """
        name = seq.tenant or ANONYMOUS
        now = self._clock()
        with self._lock:
            books = self._get(name)
            if books.in_flight.pop(seq.uid, None) is None:
                return
            books.reserved.pop(seq.uid, None)
            if refused:
                books.requests -= 1
                return
            used = seq.num_prompt_tokens + max(seq.num_generated, 0)
            books.window.append((now, used))
            books.window_tokens += used
            books.finished += 1
            books.prompt_tokens += seq.num_prompt_tokens
            books.generated_tokens += max(seq.num_generated, 0)
            books.e2e_ms = 0.8 * books.e2e_ms + 0.2 * (now - seq.arrival) * 1000.0

    def snapshot(self, names: list[str] | None = None) -> dict[str, dict[str, int]]:
        """Counters per tenant (``names``: also list these, with zeros, if they have none yet)."""
        with self._lock:
            for name in names or []:
                self._get(name)
            now = self._clock()
            out = {}
            for name, b in self._books.items():
                b.expire(now)
                out[name] = {
                    "requests": b.requests,
                    "rejected": b.rejected,
                    "finished": b.finished,
                    "in_flight": len(b.in_flight),
                    "queued": b.queued(),
                    "prompt_tokens": b.prompt_tokens,
                    "generated_tokens": b.generated_tokens,
                    "window_tokens": b.window_tokens + sum(b.reserved.values()),
                }
            return out
