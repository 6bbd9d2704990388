"""What the scheduler decides for one step: a frozen ``Plan`` of ``ScheduledSeq`` items.

The engine executes a Plan (KV operations, then one decode) and never changes
it; the scheduler builds it (``StepBuilder``) and never calls the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.kv.blocks import KVOp
from service.request.sequence import Sequence


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence's share of a step: ``num_tokens`` to compute, and which rows need logits."""

    seq: Sequence
    num_tokens: int
    sample: bool  # the chunk reaches the last token: logits are needed
    echo: bool = False  # every position needs logits (prompt log-probabilities)
    draft: int = 0  # speculative tokens among num_tokens: every position needs logits

    @property
    def num_rows(self) -> int:
        """Logits rows this item takes from the decode (the sampling row is its last)."""
        return self.num_tokens if self.echo or self.draft else int(self.sample)


@dataclass(frozen=True)
class Plan:
    """One step: the items to decode, who was preempted or ended, and the KV ops to apply first."""

    items: tuple[ScheduledSeq, ...]
    preempted: tuple[Sequence, ...]
    preempt_reasons: tuple[str, ...]  # "priority" or "kv_memory", parallel to ``preempted``
    expired: tuple[Sequence, ...]  # deadline passed while queued; never ran
    kv_ops: tuple[KVOp, ...]
    failed: tuple[Sequence, ...] = ()  # can never fit the KV pool; ``seq.error`` says why

    @property
    def num_tokens(self) -> int:
        return sum(i.num_tokens for i in self.items)
