"""Budget-aware completion: a JSON document that would not fit max_tokens is closed in time.

For a sequence with ``SamplingParams.json_finish`` the engine keeps the
invariant "the document can still be completed within the tokens left":
``FinishBudget.known`` is the length of the completion found (by the matcher's
``completion``, ``service.grammar.completion``) the last time it was checked.
Before a sampled token is appended, ``JsonFinisher.intercept`` looks one token
ahead when the budget is close (or the token may have opened structure, or
the last check is old): on a copy of the matcher it consumes the token and the
tokens the grammar then forces, and searches for a completion within the
tokens that would then be left. If there
is one, the token is appended as usual; if not, the token is dropped and the
completion from the current state is appended instead, and the sequence ends
with ``FinishReason.CLOSED``.

NOTE: the look-ahead is exact (the completion it finds is the one that will be
forced), so no safety margin is needed; checks are skipped only while the
last known completion leaves more than ``WATCH`` tokens spare, which a single
token cannot use up unless it opens structure (a byte of ``STRUCTURAL``; those
tokens are checked from ``4 * WATCH`` spare tokens on), and the estimate is
refreshed every ``REFRESH`` tokens.
"""

from __future__ import annotations

from collections.abc import Container
from collections.abc import Sequence as Seq

from service.request.constraints import FinishBudget
from service.request.sequence import Sequence

WATCH = 24
REFRESH = 32
STRUCTURAL = frozenset(b'{[,:"')


class JsonFinisher:
    """Decides, per sampled token, whether a budget-aware document must be closed now (engine thread)."""

    def __init__(self, eog_ids: Container[int], token_bytes: Seq[bytes]) -> None:
        self.eog_ids = eog_ids
        self.token_bytes = token_bytes
        self.checks = 0  # look-aheads done (tests and benchmarks read it)

    def intercept(self, seq: Sequence, token: int) -> list[int] | None:
        """None: append ``token`` as usual. A list: append these tokens instead; the document is then complete."""
        budget, matcher = seq.budget, seq.matcher
        if budget is None or matcher is None or token in self.eog_ids:
            return None
        left = seq.params.max_tokens - seq.num_generated - 1  # after this token
        if not self._due(budget, seq.num_generated, left, token):
            return None
        self.checks += 1
        ahead = matcher.fork()
        try:
            ahead.consume(token)
            forced = ahead.forced_tokens()  # appended right after the token (fast-forward)
            for t in forced:
                ahead.consume(t)
        except Exception:  # the normal path reports the refused token
            return None
        room = left - len(forced)
        fits = ahead.completion(room) if room >= 0 else None
        if fits is not None:
            budget.known, budget.at = len(fits), seq.num_generated + 1 + len(forced)
            return None
        closing = matcher.completion(left + 1)
        if closing is None:  # nothing fits any more: cut off as without the option, and stop searching
            seq.budget = None
        return closing

    def _due(self, budget: FinishBudget, generated: int, left: int, token: int) -> bool:
        spare = left - budget.known
        if spare <= WATCH or generated - budget.at >= REFRESH:
            return True
        return spare <= 4 * WATCH and not STRUCTURAL.isdisjoint(self.token_bytes[token])
