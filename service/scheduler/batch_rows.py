"""Fewer batch-tier decode rows per step while interactive work is present.

An arriving interactive request waits for the step in progress before its own
first-token step, and a step's time grows with its rows. So while interactive
requests are running or waiting, the scheduler decodes at most ``limit``
batch-tier rows per step. The batch rows left out are the ones decoded most
recently: a skipped row keeps its KV, its lane and its place, and is among the
first chosen next step (it loses a step, never its place). Interactive rows are
never capped.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq

from service.request.sequence import Priority, Sequence

TierOf = Callable[[Sequence, float], Priority]


class BatchRowCap:
    """Chooses which decoding rows run this step; ``limit`` batch rows at most while interactive work exists.

    Not thread-safe: the scheduler (engine thread) calls ``select`` once per planned step.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the batch row limit must be >= 1 (use no cap instead of 0)")
        self.limit = limit
        self._step = 0
        self._last: dict[int, int] = {}  # seq uid -> step it last decoded in
        self.skipped = 0  # batch rows left out of a step, in total

    def select(
        self, decoding: Seq[Sequence], interactive_present: bool, tier_of: TierOf, now: float
    ) -> list[Sequence]:
        """The rows of ``decoding`` (in order) to decode this step."""
        self._step += 1
        batch = [s for s in decoding if tier_of(s, now) is Priority.BATCH]
        if interactive_present and len(batch) > self.limit:
            # NOTE: least recently decoded first; ties (never skipped yet) keep their order.
            order = sorted(range(len(batch)), key=lambda i: (self._last.get(batch[i].uid, 0), i))
            keep = {batch[i].uid for i in order[: self.limit]}
            self.skipped += len(batch) - self.limit
            chosen = [s for s in decoding if s.uid in keep or tier_of(s, now) is not Priority.BATCH]
        else:
            chosen = list(decoding)
        for s in chosen:
            self._last[s.uid] = self._step
        if len(self._last) > 4 * max(len(decoding), 64):  # forget finished sequences now and then
            live = {s.uid for s in decoding}
            self._last = {u: t for u, t in self._last.items() if u in live}
        return chosen


def interactive_present(seqs: Seq[Sequence], tier_of: TierOf, now: float) -> bool:
    """Any unpaused sequence (running or waiting) of the interactive tier?"""
    return any(not s.paused and tier_of(s, now) is Priority.INTERACTIVE for s in seqs)
