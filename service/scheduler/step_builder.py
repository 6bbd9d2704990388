"""One step's plan under construction: token budget, scheduled items, preemptions.

``Scheduler.schedule`` drives a ``StepBuilder``: ``run`` schedules a running
sequence's next chunk, ``admit`` starts a waiting one, and both preempt others
(through the policy) when lanes or KV blocks are short. A ``ScheduledSeq`` is one
item of the resulting ``Plan``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.kv.blocks import PrefixHit
from service.paged_kv import KVBlockManager
from service.priority import QueuePolicy
from service.request.sequence import Priority, SeqStatus, Sequence
from service.scheduler.plan import ScheduledSeq

Preempt = Callable[[Sequence, str], None]


def _echoing(seq: Sequence) -> bool:
    """Computing prompt positions whose log-probabilities are still to be reported."""
    return seq.needs_prompt_rows and seq.num_computed < seq.num_prompt_tokens


@dataclass(frozen=True)
class StepBudgets:
    """Per-step limits (``Scheduler``'s settings)."""

    step_tokens: int  # tokens computed in one step (decode tokens + prefill chunks)
    batch_prefill: int  # of which batch-tier prefill
    prompt_rows: int  # logits rows for prompt log-probabilities
    max_running: int  # sequences holding a lane
    recompute_step: int | None = None  # most tokens of a step that recomputes generated tokens (None: no cap)


@dataclass
class Queues:
    """The scheduler's lists, shared with the builder: ``admit`` moves a sequence from one to the other."""

    waiting: list[Sequence]
    running: list[Sequence]


class StepBuilder:
    """Accumulates one step's plan: budget, scheduled items and preemptions.

    It changes the scheduler's state only through ``queues`` (admission) and the
    ``preempt`` callback (the scheduler frees the victim's KV and requeues it).
    """

    def __init__(
        self, budgets: StepBudgets, kv: KVBlockManager, policy: QueuePolicy, queues: Queues, preempt: Preempt, now: float
    ) -> None:
        self.limits, self.kv, self.policy, self.queues = budgets, kv, policy, queues
        self._preempt_seq = preempt
        self.now = now
        self.budget = budgets.step_tokens
        self.batch_prefill_left = budgets.batch_prefill
        self.batch_prefill: dict[int, int] = {}  # uid -> tokens of batch-tier prefill this step
        self.prompt_rows_left = budgets.prompt_rows
        self.items: dict[int, ScheduledSeq] = {}
        self.preempted: list[Sequence] = []
        self.reasons: list[str] = []

    def cap_mixed(self, cap: int | None) -> None:
        """Once decode rows are planned, keep the whole step under ``cap`` tokens.

        No cap without decode rows, nor when they alone reach it (the step is a
        large one either way, and prefill must not starve).
        """
        used = self.limits.step_tokens - self.budget
        if cap is not None and 0 < used < cap:
            self.budget = min(self.budget, cap - used)

    def _room(self, seq: Sequence, wanted: int, prefill: bool, start: int | None = None) -> int:
        """Tokens ``seq`` may compute now (from ``start``, default its ``num_computed``): the step
        budget, for batch prefill its own cap, and for a recompute the rule of ``_recompute_room``.

        NOTE: capping batch-tier prefill per step bounds how long one step can
        take, which is what an arriving interactive request waits for.
        """
        n = min(wanted, self.budget)
        if prefill and self.policy.effective_tier(seq, self.now) is Priority.BATCH:
            n = min(n, self.batch_prefill_left)
        if _echoing(seq):
            n = min(n, self.prompt_rows_left)  # every position of the chunk takes a logits row
        return self._recompute_room(seq, n, seq.num_computed if start is None else start)

    def _recompute_room(self, seq: Sequence, n: int, start: int) -> int:
        """A preempted sequence recomputing what it had computed: its prompt in chunks that end
        where the prompt ends, and its generated tokens only in steps of at most ``recompute_step``.

        NOTE: llama.cpp's CPU flash attention takes a tiled kernel once a step has 64 or more
        rows (``service.model.runner.MIXED_BATCH_MAX``), whose results differ from the per-row
        kernel that computed every generated token (a decode row). Recomputed in such a step,
        a token's KV would differ from what decoding gave, and the resumed sequence would drift
        from the run that was never preempted; below it the recompute is bitwise the decode's
        (``tests/model/engine/test_recompute_exact.py``).
        """
        cap = self.limits.recompute_step
        if cap is None or start >= seq.recompute_until or seq.recompute_until <= seq.num_prompt_tokens:
            return n
        if start < seq.num_prompt_tokens:
            return min(n, seq.num_prompt_tokens - start)
        return min(n, cap - (self.limits.step_tokens - self.budget))

    def _add(self, seq: Sequence, n: int, prefill: bool) -> None:
        echo = _echoing(seq)
        draft = seq.num_draft if n == seq.num_uncomputed else 0
        recomputes = seq.num_prompt_tokens <= seq.num_computed < seq.recompute_until
        self.items[seq.uid] = ScheduledSeq(seq, n, seq.num_computed + n == seq.num_tokens, echo, draft)
        self.budget -= n
        if recomputes and self.limits.recompute_step is not None:  # the whole step stays per-row
            self.budget = min(self.budget, self.limits.recompute_step - (self.limits.step_tokens - self.budget))
        if echo:
            self.prompt_rows_left -= n
        if prefill and self.policy.effective_tier(seq, self.now) is Priority.BATCH:
            self.batch_prefill[seq.uid] = n
            self.batch_prefill_left -= n

    def _victim(self, candidate: Sequence) -> Sequence | None:
        """Who gives way to ``candidate``: a paused sequence first (its client is not reading), else
        the policy's choice."""
        paused = [v for v in self.queues.running if v.paused and v is not candidate]
        if paused:
            return min(paused, key=lambda v: v.num_computed)
        return self.policy.pick_victim(candidate, self.queues.running, self.now)

    def _preempt(self, victim: Sequence, reason: str) -> None:
        item = self.items.pop(victim.uid, None)
        self.batch_prefill_left += self.batch_prefill.pop(victim.uid, 0)
        if item is not None:
            self.budget += item.num_tokens
            self.prompt_rows_left += item.num_tokens if item.echo else 0
        self._preempt_seq(victim, reason)
        self.preempted.append(victim)
        self.reasons.append(reason)

    def run(self, seq: Sequence, prefill: bool = False) -> None:
        """Schedule a running sequence's next chunk, preempting others if KV is short."""
        if seq.status is not SeqStatus.RUNNING or seq.uid in self.items:
            return
        n = self._room(seq, seq.num_uncomputed, prefill)
        if seq.num_draft and (n < seq.num_uncomputed or not self.kv.append_slots(seq, n)):
            seq.drop_drafts()  # speculate only when the whole proposal fits
            n = self._room(seq, seq.num_uncomputed, prefill)
        if n <= 0:
            return
        while not self.kv.append_slots(seq, n):
            victim = self._victim(seq)
            if victim is None:
                self._preempt(seq, "kv_memory")  # nobody may give way: this one waits
                return
            self._preempt(victim, "kv_memory")
            n = self._room(seq, seq.num_uncomputed, prefill)
        self._add(seq, n, prefill)

    def admit(self, seq: Sequence) -> bool:
        """Try to start a waiting sequence; False stops admission for this step."""
        q = self.queues
        start = 0 if seq.needs_prompt_rows else self.kv.match_prefix(seq).num_tokens
        if self._room(seq, 1, prefill=True, start=start) <= 0:
            return False
        if len(q.running) >= self.limits.max_running:
            victim = self._victim(seq)
            if victim is None:
                return False
            self._preempt(victim, "priority")
        while True:
            # NOTE: prompt log-probabilities need logits at every prompt position: no reuse.
            hit = PrefixHit() if seq.needs_prompt_rows else self.kv.match_prefix(seq)
            n = self._room(seq, seq.num_tokens - hit.num_tokens, prefill=True, start=hit.num_tokens)
            if n <= 0:
                return False
            if self.kv.allocate(seq, hit, n):
                break
            victim = self._victim(seq)
            if victim is None:
                return False
            self._preempt(victim, "kv_memory")
        if seq.priority is Priority.BATCH and self.policy.effective_tier(seq, self.now) is Priority.INTERACTIVE:
            seq.promoted = True  # admitted by aging
        q.waiting.remove(seq)
        q.running.append(seq)
        seq.status = SeqStatus.RUNNING
        if seq.first_scheduled is None:
            seq.first_scheduled = self.now
        self._add(seq, n, prefill=True)
        return True
