"""Queue policies: who is served next, and who gives way when room runs out.

Two implementations behind one interface, selected by ``--scheduling``:

* ``FCFSPolicy``: one queue in arrival order (preempted sequences first); a
  victim is the newest running sequence. This is what a FIFO server does.
* ``PriorityPolicy``: interactive before batch, FCFS within a tier. A batch
  request that has waited longer than ``aging_s`` is treated as interactive, so
  batch work never starves. Interactive work may preempt batch work (never the
  reverse); the victim is the batch sequence cheapest to resume.
"""

from __future__ import annotations

from collections.abc import Iterable

from service.sequence import Priority, Sequence


class QueuePolicy:
    """Interface: ordering of waiting sequences and choice of preemption victims."""

    name = "base"

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

    def __init__(self, aging_s: float = 30.0) -> None:
        self.aging_s = aging_s

    def effective_tier(self, seq: Sequence, now: float) -> Priority:
        if seq.priority is Priority.BATCH and now - seq.arrival >= self.aging_s:
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


def make_policy(name: str, aging_s: float = 30.0) -> QueuePolicy:
    if name == "fcfs":
        return FCFSPolicy()
    if name == "priority":
        return PriorityPolicy(aging_s)
    raise ValueError(f"unknown scheduling policy {name!r} (fcfs|priority)")
