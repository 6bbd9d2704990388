"""The scheduler plans each engine step; it never calls the model.

``schedule()`` returns a frozen ``Plan``: which sequences run, how many tokens
each computes, who was preempted and which KV cell operations must be applied
before the decode. ``update(plan, sampled)`` applies the step's results.

Per-step token budget, in this order::

    [ decode tokens of running sequences ][ prefill chunks, interactive tier ][ ... batch tier ]
      1 token each (or a few forced ones)   running prefills, then admissions   (chunked to fit)
    |<------------- at most ``mixed_step_tokens`` when decode rows are present ------------->|

so decoding never starves behind prefill, interactive prefill goes before batch
prefill, and a long prompt is split across steps. Inside a tier, prompts with
more than ``long_prompt_tokens`` left to compute go after the shorter ones, so a
chat turn never waits for a summarisation's prefill. A step with no decode rows
(an idle server's prompt, or an interactive short prompt's first-token step) may use the whole
``step_tokens``: the runner is fastest on prompt-only batches, and slow on large
batches that mix decodes with prompts (see ``runner.MIXED_BATCH_MAX``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping

from service.observability.views import SchedulerLoad
from service.paged_kv import KVBlockManager
from service.priority import QueuePolicy
from service.request.sequence import FinishReason, Priority, SeqStatus, Sequence
from service.scheduler.batch_rows import BatchRowCap, interactive_present
from service.scheduler.plan import Plan, ScheduledSeq
from service.scheduler.step_builder import Queues, StepBudgets, StepBuilder

__all__ = ["DECODE_MAX_TOKENS", "Scheduler"]

# A running sequence past its prompt with at most this many uncomputed tokens is
# "decoding" (more than one happens when a grammar forces tokens).
DECODE_MAX_TOKENS = 16


def _is_decoding(seq: Sequence) -> bool:
    """Past its prompt, with only sampled (or grammar-forced) tokens left to compute."""
    return seq.num_computed >= seq.num_prompt_tokens and seq.num_uncomputed <= DECODE_MAX_TOKENS


FinishCheck = Callable[[Sequence, int], FinishReason | None]


def _per_tier(seqs: list[Sequence]) -> dict[Priority, int]:
    counts = dict.fromkeys(Priority, 0)
    for s in seqs:
        counts[s.priority] += 1
    return counts


class Scheduler:
    """Owns the waiting and running lists; plans steps under token, lane and KV limits."""

    def __init__(
        self,
        kv: KVBlockManager,
        policy: QueuePolicy,
        *,
        max_running: int,
        step_tokens: int,
        append_token: FinishCheck,
        batch_prefill_budget: int | None = None,
        mixed_step_tokens: int | None = None,
        prompt_rows: int = 32,
        clock: Callable[[], float] = time.monotonic,
        batch_rows: BatchRowCap | None = None,
        long_prompt_tokens: int | None = None,
    ) -> None:
        if step_tokens < max_running:
            raise ValueError("step_tokens must be >= max_running so every running sequence can decode")
        self.kv = kv
        self.policy = policy
        self.max_running = max_running
        self.step_tokens = step_tokens
        self.batch_prefill_budget = step_tokens if batch_prefill_budget is None else batch_prefill_budget
        self.mixed_step_tokens = mixed_step_tokens  # cap on steps with decode rows (None: no cap)
        self.prompt_rows = prompt_rows  # logits rows per step for prompt log-probabilities
        self._append_token = append_token
        self._clock = clock
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.preemptions: Counter[tuple[Priority, str]] = Counter()
        self._isolated_last = False
        self.batch_rows = batch_rows  # fewer batch decode rows beside interactive work (None: no cap)
        # prompts with more than this many tokens left to compute go after shorter ones (None: arrival order)
        self.long_prompt_tokens = long_prompt_tokens

    # -- requests ----------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def abort(self, seq: Sequence, reason: FinishReason = FinishReason.CANCELLED) -> bool:
        """Remove ``seq`` wherever it is and free its KV. False if it already finished."""
        if seq in self.running:
            self.running.remove(seq)
            self.kv.free(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        else:
            return False
        self._finish(seq, reason)
        return True

    def has_work(self) -> bool:
        """Any request not finished (paused ones included)."""
        return bool(self.waiting or self.running)

    def has_runnable(self) -> bool:
        """Anything a step could do: a request that is not paused."""
        return any(not s.paused and s.may_start() for s in self.waiting) or any(not s.paused for s in self.running)

    def view(self) -> SchedulerLoad:
        """Per-tier counts and preemptions, for metrics (any thread: reads copies of the lists).

        NOTE: the engine thread may change the lists or the counter meanwhile; copying a list is
        atomic under the GIL, but copying the counter may raise RuntimeError (resized during
        iteration): readers retry (``service.observability.otel_metrics``).
        """
        running, waiting = list(self.running), list(self.waiting)
        return SchedulerLoad(
            running=_per_tier(running), waiting=_per_tier(waiting), preemptions=dict(self.preemptions)
        )

    # -- planning ------------------------------------------------------------------
    def schedule(self) -> Plan:
        now = self._clock()
        expired = tuple(s for s in self.waiting if s.expired(now))
        for seq in expired:
            self.waiting.remove(seq)
            self._finish(seq, FinishReason.CANCELLED)
        failed = self._fail_oversized()
        budgets = StepBudgets(
            self.step_tokens, self.batch_prefill_budget, self.prompt_rows, self.max_running, self.mixed_step_tokens
        )
        step = StepBuilder(budgets, self.kv, self.policy, Queues(self.waiting, self.running), self.preempt, now)
        tier_of = self.policy.effective_tier
        tiered = sorted((s for s in self.running if not s.paused), key=lambda s: (tier_of(s, now), s.arrival))
        decoding = [s for s in tiered if _is_decoding(s)]
        prefilling = [s for s in tiered if not _is_decoding(s)]
        isolated = self._isolate(prefilling, now)
        self._isolated_last = isolated
        tiers = (Priority.INTERACTIVE,) if isolated else tuple(Priority)
        if not isolated:
            for seq in self._decode_rows(decoding, now):
                step.run(seq)
            step.cap_mixed(self.mixed_step_tokens)
        queue = self.policy.order([s for s in self.waiting if not s.paused and s.may_start()], now)
        for tier in tiers:
            running = [s for s in prefilling if tier_of(s, now) == tier]
            waiting = [s for s in queue if tier_of(s, now) == tier]
            admitting = True
            for part in self._by_length(running, waiting):
                admitting = self._prefill(step, *part, admitting)
        for seq in self.running:  # speculative tokens not scheduled in full this step are dropped
            item = step.items.get(seq.uid)
            if seq.num_draft and (item is None or not item.draft):
                seq.drop_drafts()
        return Plan(
            tuple(step.items.values()),
            tuple(step.preempted),
            tuple(step.reasons),
            expired,
            tuple(self.kv.take_ops()),
            failed,
        )

    def _by_length(
        self, running: list[Sequence], waiting: list[Sequence]
    ) -> list[tuple[list[Sequence], list[Sequence]]]:
        """One tier's prefill candidates as (running, waiting) parts: short prompts, then long ones.

        NOTE: a short prompt arriving while a long one prefills would otherwise wait for the
        whole long prefill (seconds on a CPU): its time to first token is what users feel,
        while the long prompt loses one short prefill's worth of tokens. Long prompts still
        get every token the short ones leave, so they wait only while short prompts keep
        arriving faster than steps complete (an overload that the queue limits bound).
        """
        if self.long_prompt_tokens is None:
            return [(running, waiting)]
        parts: tuple[tuple[list[Sequence], list[Sequence]], ...] = (([], []), ([], []))
        for group, seqs in ((0, running), (1, waiting)):
            for seq in seqs:
                parts[self._long_prompt(seq)][group].append(seq)
        return list(parts)

    def _long_prompt(self, seq: Sequence) -> bool:
        """More than ``long_prompt_tokens`` prompt tokens left to compute (a waiting one's cached prefix aside)."""
        limit = self.long_prompt_tokens
        left = seq.num_tokens - seq.num_computed
        if limit is None or left <= limit:
            return False
        if seq.status is SeqStatus.WAITING and not seq.needs_prompt_rows:
            left -= self.kv.match_prefix(seq).num_tokens
        return left > limit

    @staticmethod
    def _prefill(step: StepBuilder, running: list[Sequence], waiting: list[Sequence], admitting: bool) -> bool:
        """Chunks of ``running`` prefills, then admissions from ``waiting`` in order; False once one is refused
        (admission stops for the step, running prefills go on)."""
        for seq in running:
            step.run(seq, prefill=True)
        for seq in waiting if admitting else ():
            if not step.admit(seq):
                return False
        return admitting

    def _decode_rows(self, decoding: list[Sequence], now: float) -> list[Sequence]:
        """This step's decode rows: all, or fewer batch-tier ones while interactive work exists."""
        if self.batch_rows is None:
            return decoding
        tier_of = self.policy.effective_tier
        present = interactive_present([*self.running, *self.waiting], tier_of, now)
        return self.batch_rows.select(decoding, present, tier_of, now)

    def _fail_oversized(self) -> tuple[Sequence, ...]:
        """End waiting sequences that could not fit the whole KV pool even alone (never admissible).

        NOTE: requests are validated against the pool size before admission, so
        this only guards against waiting forever if that check is ever bypassed.
        """
        cap = self.kv.capacity_tokens
        failed = tuple(s for s in self.waiting if s.num_tokens > cap)
        for seq in failed:
            self.waiting.remove(seq)
            seq.error = f"request of {seq.num_tokens} tokens does not fit the KV pool of {cap} tokens"
            seq.error_status = "INVALID_ARGUMENT"
            self._finish(seq, FinishReason.ERROR)
        return failed

    def _isolate(self, prefilling: list[Sequence], now: float) -> bool:
        """Make this step interactive prefill only? (An interactive request awaits its first token.)

        NOTE: a step's duration grows with every sequence in it, and an
        interactive request's first token has to wait for a whole step. A step of
        interactive prompts alone (no decode rows, the whole token budget) keeps
        TTFT close to an idle server's; never two isolated steps in a row, so
        running sequences lose at most every other step.
        """
        if not self.policy.isolate_first_tokens or self._isolated_last:
            return False
        return any(
            s.first_token_time is None
            and self.policy.effective_tier(s, now) is Priority.INTERACTIVE
            and not self._long_prompt(s)
            for s in (*self.waiting, *prefilling)
        )

    def preempt(self, victim: Sequence, reason: str) -> None:
        """Preempt by recompute: free the victim's KV, keep its tokens, queue it at the front."""
        self.running.remove(victim)
        self.kv.free(victim)
        victim.reset_for_recompute()
        victim.enqueued_at = self._clock()
        self.waiting.append(victim)
        self.preemptions[(victim.priority, reason)] += 1

    # -- results -------------------------------------------------------------------
    def update(
        self, plan: Plan, sampled: Mapping[int, int], accepted: Mapping[int, list[int]] | None = None
    ) -> list[Sequence]:
        """Apply a step's results; return sequences that finished.

        ``sampled``: seq uid -> token; ``accepted``: for items with speculative tokens, uid ->
        the tokens verification kept (accepted drafts, then one token of the model's).
        """
        finished = []
        now = self._clock()
        for item in plan.items:
            seq = item.seq
            if seq.status is not SeqStatus.RUNNING:
                continue
            if item.draft:
                reason = self._accept(item, (accepted or {}).get(seq.uid, [-1]))
                if reason is not None:
                    self.running.remove(seq)
                    self.kv.free(seq)
                    self._finish(seq, reason)
                    finished.append(seq)
                continue
            seq.num_computed += item.num_tokens
            self.kv.commit(seq)
            if seq.num_computed >= seq.num_prompt_tokens:
                seq.prompt_done = True  # other choices of the request may now share its prompt
            if not item.sample or seq.uid not in sampled:
                continue
            if seq.first_token_time is None:
                seq.first_token_time = now
            reason = self._append_token(seq, sampled[seq.uid])
            if reason is not None:
                self.running.remove(seq)
                self.kv.free(seq)
                self._finish(seq, reason)
                finished.append(seq)
        return finished

    def _accept(self, item: ScheduledSeq, tokens: list[int]) -> FinishReason | None:
        """Keep the verified prefix of a speculative item; roll back the rest (tokens and KV cells).

        ``tokens`` = m accepted drafts + 1 token of the model's. The step computed the last
        sampled token and ``item.draft`` drafts; the cells of the rejected ones are queued for
        removal, the accepted ones stay computed.
        """
        seq, k, m = item.seq, item.draft, len(tokens) - 1
        seq.drop_drafts()
        seq.num_computed += 1  # the last sampled token
        self.kv.forget_cells(seq, seq.num_computed + m, seq.num_computed + k)
        reason = None
        for j, token in enumerate(tokens):
            reason = self._append_token(seq, token)
            if reason is not None:
                break
            if j < m:
                seq.num_computed += 1  # an accepted draft: its cells are already there
        self.kv.commit(seq)
        return reason

    def fail(self, seq: Sequence) -> None:
        """End one sequence with an error (the caller reports it); others are untouched."""
        self.abort(seq, FinishReason.ERROR)

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = self._clock()
