"""When and how the engine speculates (prompt lookup); the rules themselves are in ``speculative``.

Before each plan, ``propose`` appends draft tokens to every eligible decoding
sequence (``Sequence.num_draft``); the scheduler computes them with logits at
every position, or drops them if they do not fit the step. After the decode,
``verify`` turns each drafted item's rows into the tokens to keep, which
``Scheduler.update`` appends (rolling back the rest).

NOTE: speculation is for a lone caller: it runs only while at most
``max_running`` sequences run and none waits (with more, the step is already
wide and extra positions would slow everyone), and not for requests whose rows
need per-token extras (a grammar, log-probabilities, prompt scoring).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

from service.engine.spec_payoff import SpecPayoff
from service.model.speculative import propose, verify_greedy, verify_sampled
from service.request.sequence import SeqStatus, Sequence
from service.scheduler.plan import Plan, ScheduledSeq
from service.scheduler.scheduler import Scheduler

log = logging.getLogger("service.engine")
COOLDOWN_STEPS = 8  # steps without drafting after a draft whose first token was rejected
MAX_COOLDOWN_STEPS = 512  # the cooldown doubles per consecutive outright rejection, up to this


@dataclass(frozen=True)
class SpecConfig:
    enabled: bool = True
    tokens: int = 7  # most draft tokens per step and sequence
    max_running: int = 2  # speculate only while at most this many sequences run


@dataclass
class SpecStats:
    """Counters for GetMetrics/OTel (engine thread writes, readers take a snapshot)."""

    steps: int = 0  # drafted items verified
    drafted: int = 0  # draft tokens computed
    accepted: int = 0  # draft tokens kept


class Speculator:
    """Proposes drafts before a plan and verifies them after the decode (engine thread only)."""

    def __init__(self, config: SpecConfig) -> None:
        self.config = config
        self.stats = SpecStats()
        self._lock = threading.Lock()
        self._width: dict[int, int] = {}  # seq uid -> its current draft length (adaptive)
        self._misses: dict[int, int] = {}  # seq uid -> drafts rejected outright in a row
        self.payoff = SpecPayoff()  # drafted vs plain lone steps, measured
        self._kept = 0  # draft tokens kept in the step being run

    def snapshot(self) -> SpecStats:
        with self._lock:
            return SpecStats(self.stats.steps, self.stats.drafted, self.stats.accepted)

    def propose(self, sched: Scheduler) -> None:
        """Append drafts to the eligible running sequences (nothing when the engine is busy)."""
        cfg = self.config
        self._kept = 0  # NOTE: a step that failed after verify never reached after_step
        if not cfg.enabled or cfg.tokens <= 0:
            return
        running = [s for s in sched.running if not s.paused]
        if len(running) > cfg.max_running or any(not s.paused and s.may_start() for s in sched.waiting):
            return
        self._width = {s.uid: w for s, w in ((s, self._width.get(s.uid)) for s in running) if w is not None}
        self._misses = {s.uid: self._misses[s.uid] for s in running if s.uid in self._misses}
        losing, allowed = self.payoff.losing(), self.payoff.allow()
        for seq in running:
            gated = losing and not _seeded(seq)  # NOTE: see _seeded: a seed's output must not depend on timing
            if gated and not allowed:  # drafts measured slower than plain steps here: probe rarely
                continue
            width = self._width.setdefault(seq.uid, cfg.tokens)
            if width < 0:  # cooling down after a draft that was rejected outright
                self._width[seq.uid] = width + 1
                continue
            room = min(max(width, 1), seq.params.max_tokens - seq.num_generated - 1)
            if gated:  # NOTE: a probe: the cheapest draft that still measures acceptance
                room = min(room, 1)
            if room > 0 and _eligible(seq):
                drafts = propose(seq.token_ids, room)
                seq.token_ids.extend(drafts)
                seq.num_draft = len(drafts)

    def verify(self, drafted: list[tuple[ScheduledSeq, np.ndarray]]) -> dict[int, list[int]]:
        """uid -> tokens to keep for each drafted item, from its rows (one per computed position)."""
        out: dict[int, list[int]] = {}
        for item, rows in drafted:
            seq = item.seq
            drafts = seq.token_ids[len(seq.token_ids) - item.draft :]
            try:
                if seq.params.greedy:
                    out[seq.uid] = verify_greedy(rows, drafts)
                else:
                    out[seq.uid] = verify_sampled(rows, drafts, seq.params, seq.rng)  # type: ignore[arg-type]
            except Exception as exc:  # this sequence only: it ends with an error
                log.exception("verifying speculative tokens failed")
                seq.error, seq.error_status = f"speculation failed: {type(exc).__name__}: {exc}", "INTERNAL"
                out[seq.uid] = [-1]
                continue
            kept = len(out[seq.uid]) - 1
            self._kept += kept
            self._adapt(seq.uid, item.draft, kept)
            with self._lock:
                self.stats.steps += 1
                self.stats.drafted += item.draft
                self.stats.accepted += kept
        return out

    def after_step(self, plan: Plan, seconds: float) -> None:
        """A finished step: a lone decode step (one item, no prompt tokens) feeds the payoff measure."""
        kept, self._kept = self._kept, 0
        if len(plan.items) != 1:
            return
        item = plan.items[0]
        if item.sample and item.num_tokens == 1 + item.draft and not item.echo:
            self.payoff.observe(item.draft > 0, 1 + kept, seconds)

    def _adapt(self, uid: int, drafted: int, kept: int) -> None:
        """Grow the draft length after a fully kept draft, shrink it after a partial one, and
        pause drafting after a draft rejected outright: ``COOLDOWN_STEPS`` steps, doubling with
        each further outright rejection in a row (up to ``MAX_COOLDOWN_STEPS``).

        NOTE: every drafted position costs a logits row (on this CPU, 8 positions cost
        ~4.5x one for a 262k vocabulary), so a sequence whose drafts keep failing drafts
        less; +2 / -1 is Hugging Face's assisted-generation rule. The doubling makes a
        sequence whose output never repeats its context (the 1.1B benchmark model's near-
        uniform output, free prose) pay for one draft in hundreds of steps, not one in nine,
        while one kept token restores the normal rhythm.
        """
        width = max(self._width.get(uid, self.config.tokens), 1)
        if kept == 0:
            misses = self._misses.get(uid, 0) + 1
            self._misses[uid] = misses
            self._width[uid] = -min(MAX_COOLDOWN_STEPS, COOLDOWN_STEPS << min(misses - 1, 16))
            return
        self._misses.pop(uid, None)
        width = width + 2 if kept == drafted else width - 1
        self._width[uid] = max(1, min(self.config.tokens, width))


def _seeded(seq: Sequence) -> bool:
    """A sampled request with a seed: the payoff measure (wall-clock rates) never changes its drafts.

    NOTE: sampled verification draws from the sequence's generator differently from
    plain sampling, so a draft decision that depended on timing would make the same
    seed give different text on an idle server; such sequences keep the per-sequence
    rules only (deterministic). Greedy and unseeded requests follow the measure.
    """
    return not seq.params.greedy and seq.params.seed is not None


def _eligible(seq: Sequence) -> bool:
    """Plain decoding: past the prompt, one token to compute, no per-token extras."""
    return (
        seq.status is SeqStatus.RUNNING
        and seq.num_draft == 0
        and seq.num_uncomputed == 1
        and seq.num_computed >= seq.num_prompt_tokens
        and seq.matcher is None
        and not seq.params.logprobs
        and not seq.params.penalized  # NOTE: drafts are verified on unpenalised rows
        and not seq.needs_prompt_rows
    )
