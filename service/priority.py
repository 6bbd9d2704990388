"""Queue policies: who is served next, and who gives way when room runs out.

Two implementations behind one interface, selected by ``--scheduling``:

* ``FCFSPolicy``: one queue in arrival order (preempted sequences first); a
  victim is the newest running sequence. This is what a FIFO server does.
* ``PriorityPolicy``: interactive before batch, FCFS within a tier. A batch
  request that has waited longer than ``aging_s`` is treated as interactive, so
  batch work never starves (it keeps that rank while it runs). Interactive work may preempt batch work (never the
  reverse); the victim is the batch sequence cheapest to resume. With a tenant order
  (``FairShare``, when tenants are configured), tenants take turns inside each tier (``service.scheduler.fair_share``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Protocol

from service.request.sequence import Priority, Sequence


class TenantOrder(Protocol):
    """Orders waiting sequences between tenants inside groups (``service.scheduler.fair_share.FairShare``)."""

    def order(self, waiting: list[Sequence], group: Callable[[Sequence], Hashable]) -> list[Sequence]:
        """``waiting`` in service order: by ``group(seq)`` ascending, tenants taking turns inside a group."""
        ...


class QueuePolicy:
    """Interface: ordering of waiting sequences and choice of preemption victims."""

    name = "base"
    # Give a step to interactive work alone when an interactive request awaits its first token.
    isolate_first_tokens = False

    def effective_tier(self, seq: Sequence, now: float) -> Priority:
        return Priority.INTERACTIVE

    def order(self, waiting: Iterable[Sequence], now: float) -> list[Sequence]:
        """Waiting sequences in service order (preempted ones lead their tier)."""
        return sorted(waiting, key=lambda s: (self.effective_tier(s, now), s.queue_key))

    def can_preempt(self, candidate: Sequence, victim: Sequence, now: float) -> bool:
        """May ``candidate`` (waiting or running) take room from running ``victim``?"""
        raise NotImplementedError

    def pick_victim(self, candidate: Sequence, running: Iterable[Sequence], now: float) -> Sequence | None:
        """The running sequence to preempt for ``candidate``, or None if none may be."""
        allowed = [v for v in running if v is not candidate and self.can_preempt(candidate, v, now)]
        if not allowed:
            return None
        return min(allowed, key=lambda v: self.victim_cost(v, now))

    def victim_cost(self, seq: Sequence, now: float) -> tuple[float, ...]:
        # Cheapest to resume: fewest tokens to recompute; ties go to the newest.
        return (seq.num_computed, -seq.arrival)


class FCFSPolicy(QueuePolicy):
    """First come, first served; memory pressure preempts the newest sequence."""

    name = "fcfs"

    def can_preempt(self, candidate: Sequence, victim: Sequence, now: float) -> bool:
        # Only to keep older running work going when memory runs out (never for admission).
        return candidate.status.value == "running" and victim.arrival > candidate.arrival

    def victim_cost(self, seq: Sequence, now: float) -> tuple[float, ...]:
        return (-seq.arrival,)


class PriorityPolicy(QueuePolicy):
    """Two tiers with aging; interactive work may preempt batch work."""

    name = "priority"
    isolate_first_tokens = True

    def __init__(self, aging_s: float = 30.0, fair: TenantOrder | None = None) -> None:
        self.aging_s = aging_s
        self.fair = fair  # fair share between tenants within each tier (None: FCFS within a tier)

    def order(self, waiting: Iterable[Sequence], now: float) -> list[Sequence]:
        if self.fair is None:
            return super().order(waiting, now)
        # Preempted sequences still lead their tier; tenants take turns inside each group.
        return self.fair.order(list(waiting), lambda s: (self.effective_tier(s, now), s.queue_key[0]))

    def effective_tier(self, seq: Sequence, now: float) -> Priority:
        # NOTE: aging counts time spent *waiting*, not age: a batch request that is
        # running is not starving, and must stay preemptible by interactive work.
        if seq.priority is Priority.BATCH and (
            seq.promoted or (seq.status.value == "waiting" and now - seq.enqueued_at >= self.aging_s)
        ):
            return Priority.INTERACTIVE
        return seq.priority

    def can_preempt(self, candidate: Sequence, victim: Sequence, now: float) -> bool:
        mine, theirs = self.effective_tier(candidate, now), self.effective_tier(victim, now)
        if mine < theirs:
            return True
        # Same tier: only under memory pressure of a running sequence, and only newer work gives way.
        return mine == theirs and candidate.status.value == "running" and victim.arrival > candidate.arrival

    def victim_cost(self, seq: Sequence, now: float) -> tuple[float, ...]:
        return (-self.effective_tier(seq, now), seq.num_computed, -seq.arrival)


class QueueFull(Exception):
    """The tier's queue limit is reached; ``retry_after_ms`` is a hint for the client."""

    quota = ""  # set by service.security.quotas.QuotaExceeded: the tenant quota that refused the request

    def __init__(self, priority: Priority, limit: int, retry_after_ms: int) -> None:
        super().__init__(
            f"{priority.name.lower()} queue is full ({limit} waiting); retry after {retry_after_ms} ms"
        )
        self.priority = priority
        self.retry_after_ms = retry_after_ms


class AdmissionControl:
    """Per-tier queue limits, checked when a request arrives (any thread).

    A request counts against its tier from ``enter`` until ``leave`` (it was
    scheduled for the first time, or ended while still queued).
    """

    def __init__(self, limits: dict[Priority, int]) -> None:
        self.limits = dict(limits)
        self._lock = threading.Lock()
        self._queued = {p: 0 for p in Priority}
        self._members: set[int] = set()

    def enter(self, seq: Sequence, retry_hint_ms: Callable[[Priority, int], int]) -> None:
        """Count ``seq`` as queued, or raise QueueFull (nothing is counted then)."""
        with self._lock:
            depth = self._queued[seq.priority]
            if depth >= self.limits[seq.priority]:
                raise QueueFull(seq.priority, self.limits[seq.priority], retry_hint_ms(seq.priority, depth))
            self._queued[seq.priority] = depth + 1
            self._members.add(seq.uid)

    def leave(self, seq: Sequence) -> bool:
        """Stop counting ``seq``; False if it was not counted (idempotent)."""
        with self._lock:
            if seq.uid not in self._members:
                return False
            self._members.discard(seq.uid)
            self._queued[seq.priority] -= 1
            return True

    def depth(self, priority: Priority) -> int:
        return self._queued[priority]


def make_policy(name: str, aging_s: float = 30.0, fair: TenantOrder | None = None) -> QueuePolicy:
    """The ``--scheduling`` policy; ``fair`` (priority only) shares each tier between tenants."""
    if name == "fcfs":
        return FCFSPolicy()
    if name == "priority":
        return PriorityPolicy(aging_s, fair)
    raise ValueError(f"unknown scheduling policy {name!r} (fcfs|priority)")
