"""The model side of an engine step: one ``llama_decode`` over a plan, its rows, masks and samples.

``forward`` builds the step's batch from the plan (one row of logits per
sampling item; every position for prompt scoring and speculative drafts),
``sample`` masks constrained rows and draws one token per row, ``show_kept``
lets tests see the rows speculative tokens were kept from. The engine thread is
the only caller; logits rows are views valid until the next decode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Protocol

import numpy as np

from service.model.logprobs import prompt_logprobs, token_logprob
from service.model.penalties import penalize_rows
from service.model.runner import ModelRunner
from service.model.sampling import sample_rows_guarded
from service.observability.engine_metrics import EngineMetrics
from service.observability.step_clock import StepClock
from service.request.constraints import Matcher
from service.request.sequence import Sequence
from service.scheduler.plan import Plan, ScheduledSeq

log = logging.getLogger("service.engine")
Drafted = list[tuple[ScheduledSeq, np.ndarray]]  # (item with drafts, its rows)
LogitsHook = Callable[[list[Sequence], np.ndarray], None]


class MaskFiller(Protocol):
    """Masks the constrained rows of one step's logits (``service.grammar.mask.MaskBatch``)."""

    def fill_and_apply(self, matchers: Seq[Matcher], logits: np.ndarray, rows: list[int]) -> float:
        """Set disallowed tokens of ``logits[rows[i]]`` to -inf for each ``matchers[i]``; mean us per row."""
        ...


class RequestHooks(Protocol):
    """Per-request tracing hooks the engine thread calls (``service.observability.telemetry.Telemetry``).

    They run between decodes: each must be cheap and must not block.
    """

    @property
    def enabled(self) -> bool:
        """True: ``on_first_token`` is called (a per-token check otherwise skipped)."""
        ...

    def on_scheduled(self, seq: Sequence) -> None:
        """``seq`` left the queue and its prefill started (first time only)."""
        ...

    def on_first_token(self, seq: Sequence) -> None:
        """``seq``'s first token was sampled (only when ``enabled``)."""
        ...

    def on_preempted(self, seq: Sequence, reason: str) -> None:
        """``seq`` was preempted (``reason``: ``priority`` or ``kv_memory``); it is recomputed on resume."""
        ...


class ModelStep:
    """Decode and sample for the engine; complete once built (only the tests' ``logits_hook`` is set later)."""

    def __init__(
        self,
        runner: ModelRunner,
        metrics: EngineMetrics,
        hooks: RequestHooks,
        token_bytes: Seq[bytes],
        clock: StepClock | None = None,
        mask_batch: MaskFiller | None = None,
    ) -> None:
        self.runner = runner
        self.clock = clock or StepClock()
        self.metrics = metrics
        self.hooks = hooks
        self.token_bytes = token_bytes
        self.mask_batch = mask_batch  # grammar.mask.MaskBatch for constrained rows (None: no constraints)
        self.logits_hook: LogitsHook | None = None  # tests: sees each sampled row

    def forward(self, plan: Plan) -> tuple[np.ndarray, list[Sequence], Drafted]:
        """ONE decode over the plan: the sampling rows (one per sampling item, in order), their
        sequences, and the drafted items' rows; prompt log-probabilities are recorded on the way."""
        toks: list[int] = []
        pos: list[np.ndarray] = []
        lanes: list[int] = []
        want: list[int] = []
        sampling: list[Sequence] = []
        for item in plan.items:
            seq, n, start = item.seq, item.num_tokens, item.seq.num_computed
            toks.extend(seq.token_ids[start : start + n])
            pos.append(np.arange(start, start + n))
            lanes.extend([seq.lane] * n)  # type: ignore[list-item]
            want.extend([1] * n if item.echo or item.draft else [0] * (n - 1) + [1 if item.sample else 0])
            if item.sample and not item.draft:
                sampling.append(seq)
        args = (np.asarray(toks), np.concatenate(pos), np.asarray(lanes), np.asarray(want))
        self.clock.lap("batch")
        logits = self.runner.decode(*args)
        self.clock.lap("decode")
        prefill = sum(i.num_tokens for i in plan.items if not i.draft and (not i.sample or i.num_tokens > 1))
        self.metrics.on_step(len(plan.items), prefill, len(sampling))
        if not any(i.echo or i.draft for i in plan.items):
            return logits, sampling, []
        return self._split_rows(plan, logits)

    def _split_rows(self, plan: Plan, logits: np.ndarray) -> tuple[np.ndarray, list[Sequence], Drafted]:
        """Steps with several rows per item: score echoing prompts, set drafted items' rows aside
        (views, used before the next decode), and return the other items' sampling rows."""
        keep, r, drafted = [], 0, []
        for item in plan.items:
            if item.draft:
                drafted.append((item, logits[r : r + item.num_tokens]))
                r += item.num_tokens
                continue
            if item.echo:
                self._score_prompt(item, logits[r : r + item.num_tokens])
            r += item.num_rows
            if item.sample:
                keep.append(r - 1)
        sampling = [i.seq for i in plan.items if i.sample and not i.draft]
        return logits[keep], sampling, drafted  # NOTE: a copy, but only of the few sampling rows

    def _score_prompt(self, item: ScheduledSeq, rows: np.ndarray) -> None:
        """Record the prompt log-probabilities an echoing chunk's rows give; a failure fails the
        sequence only (its next sampled token becomes an INTERNAL error)."""
        seq, start = item.seq, item.seq.num_computed
        # Row j scores the token after position start + j; only prompt tokens not yet
        # scored (a recompute after preemption scores nothing twice).
        first = len(seq.prompt_logprobs) - start
        last = min(item.num_tokens, seq.num_prompt_tokens - 1 - start)
        if last <= first or first < 0:
            return
        targets = seq.token_ids[start + first + 1 : start + last + 1]
        try:
            seq.prompt_logprobs += prompt_logprobs(rows[first:last], targets, seq.params.top_logprobs, self.token_bytes)
        except Exception as exc:
            log.exception("scoring prompt tokens failed")
            seq.error, seq.error_status = f"prompt log-probabilities failed: {type(exc).__name__}", "INTERNAL"

    def sample(self, seqs: list[Sequence], logits: np.ndarray) -> dict[int, int]:
        """Mask constrained rows, apply the rows' own bias and penalties, sample every row, note
        log-probabilities; uid -> token (-1: failed)."""
        matchers = [(i, s.matcher) for i, s in enumerate(seqs) if s.matcher is not None]
        if matchers and self.mask_batch is not None:
            constrained = [i for i, _ in matchers]
            us = self.mask_batch.fill_and_apply([m for _, m in matchers], logits, constrained)
            self.metrics.on_mask(us, len(constrained), 0)
            for i in constrained:
                if (keys := seqs[i].keys) is not None:
                    keys.apply(logits[i])
        penalize_rows(logits, seqs)
        if self.logits_hook is not None:
            self.logits_hook(seqs, logits)
        tokens = sample_rows_guarded(logits, seqs)
        for i, s in enumerate(seqs):
            if s.error is not None:  # failed earlier in this step (prompt scoring): ends with its error
                tokens[i] = -1
            elif s.params.logprobs and tokens[i] >= 0:
                tokens[i] = self._note_logprob(s, logits[i], int(tokens[i]))
        if self.hooks.enabled:
            for s in seqs:
                if s.first_token_time is None:
                    self.hooks.on_first_token(s)
        return {s.uid: int(t) for s, t in zip(seqs, tokens, strict=True)}

    def _note_logprob(self, seq: Sequence, row: np.ndarray, token: int) -> int:
        """The sampled token's log-probability entry; -1 (the sequence fails alone) if it cannot be made."""
        p = seq.params
        try:
            seq.pending_logprob = token_logprob(row, token, p.temperature, p.top_logprobs, self.token_bytes)
        except Exception as exc:
            log.exception("computing log-probabilities failed")
            seq.error, seq.error_status = f"log-probabilities failed: {type(exc).__name__}", "INTERNAL"
            return -1
        return token

    def show_kept(self, drafted: Drafted, accepted: dict[int, list[int]]) -> None:
        """Tests: the logits hook sees one row per kept speculative token, as for sampled rows."""
        if self.logits_hook is None:
            return
        for item, rows in drafted:
            kept = len(accepted[item.seq.uid])
            self.logits_hook([item.seq] * kept, rows[:kept])
