"""Per-token bookkeeping of one sequence: append, grammar, detokenize, decide whether it finished.

Called on the engine thread by ``Scheduler.update`` (through the engine) for
every sampled token. Everything here touches only the one ``Sequence``: a
failure (grammar, detokenizer, a row that could not be sampled) ends that
sequence with an error and never the step.
"""

from __future__ import annotations

import logging
from collections.abc import Container
from collections.abc import Sequence as Seq

from service.engine.json_finish import JsonFinisher
from service.model.logprobs import forced_logprob
from service.request.sequence import FinishReason, Sequence

log = logging.getLogger("service.engine")


class TokenAppender:
    """Appends sampled (and grammar-forced) tokens to sequences; counts the forced ones."""

    def __init__(self, eog_ids: Container[int], token_bytes: Seq[bytes]) -> None:
        self.eog_ids = eog_ids
        self.token_bytes = token_bytes
        self.forced = 0  # grammar-forced tokens appended (read and reset by the engine)
        self.finisher = JsonFinisher(eog_ids, token_bytes)

    def __call__(self, seq: Sequence, token: int) -> FinishReason | None:
        """Append ``token`` and any tokens the grammar then forces; say why ``seq`` finished, if it did."""
        if token < 0:  # sampling this row failed (sampling.sample_rows_guarded); seq.error says why
            return FinishReason.ERROR
        if seq.params.max_tokens == 0:  # prompt scoring only (echo_prompt_logprobs): nothing generated
            return FinishReason.LENGTH
        try:
            if seq.budget is not None and (completion := self.finisher.intercept(seq, token)) is not None:
                return self._close(seq, completion)
            return self._append_with_forced(seq, token)
        except Exception as exc:
            log.exception("processing a sampled token failed")
            seq.error = f"processing token {token} failed: {type(exc).__name__}: {exc}"
            seq.error_status = "INTERNAL"
            return FinishReason.ERROR

    def _append_with_forced(self, seq: Sequence, token: int) -> FinishReason | None:
        reason = self._append_one(seq, token)
        if reason is None and seq.matcher is not None:
            # NOTE: fast-forward: tokens the grammar forces are appended uncomputed,
            # so the next step computes them in one chunk instead of sampling each.
            forced = seq.matcher.forced_tokens()
            for t in forced:
                reason = self._append_one(seq, t)
                if reason is not None:
                    break
            self.forced += len(forced)
        return reason

    def _close(self, seq: Sequence, completion: list[int]) -> FinishReason:
        """Budget-aware completion: append ``completion`` (instead of the sampled token); the document ends."""
        seq.pending_logprob = None  # the sampled token is dropped
        for t in completion:
            reason = self._append_one(seq, t)
            if reason is FinishReason.ERROR:
                return reason
            if reason is not None:
                break
        self.forced += len(completion)
        assert seq.matcher is not None
        if not seq.matcher.is_accepting():
            seq.error, seq.error_status = "budget-aware completion did not complete the document", "INTERNAL"
            return FinishReason.ERROR
        return FinishReason.CLOSED

    def _note_logprob(self, seq: Sequence, token: int) -> None:
        """The sampled token's entry (computed by the engine), else a grammar-forced token's."""
        entry, seq.pending_logprob = seq.pending_logprob, None
        if entry is None or entry.token_id != token:
            entry = forced_logprob(token, seq.params.top_logprobs, self.token_bytes)
        seq.out_logprobs.append(entry)

    def _append_one(self, seq: Sequence, token: int) -> FinishReason | None:
        if seq.matcher is not None and (err := seq.matcher.error()) is not None:
            seq.error, seq.error_status = f"grammar failed: {err}", getattr(err, "status", "INTERNAL")
            return FinishReason.ERROR
        seq.token_ids.append(token)
        if token in self.eog_ids and not seq.params.ignore_eos:
            return FinishReason.STOP  # counted in usage, never sent as output
        seq.out_tokens.append(token)
        if seq.params.logprobs:
            self._note_logprob(seq, token)
        if seq.matcher is not None:
            try:
                seq.matcher.consume(token)
            except Exception as exc:
                seq.error = f"grammar rejected token {token}: {exc}"
                seq.error_status = getattr(exc, "status", "INTERNAL")
                return FinishReason.ERROR
            if seq.keys is not None:
                seq.keys.feed(self.token_bytes[token])
        if seq.text is not None:
            seq.out_text += seq.text.push(token)
            if seq.text.stopped:
                return FinishReason.STOP
        if seq.matcher is not None and seq.matcher.is_stopped():
            return FinishReason.STOP
        if seq.num_generated >= seq.params.max_tokens:
            return FinishReason.LENGTH
        return None
