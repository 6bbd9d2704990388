"""Does speculation pay on this model and machine? Tokens per second of drafted vs plain steps.

The per-sequence rules (``Speculator._adapt``) only see acceptance. What a
draft costs depends on the model and the machine: on Gemma 3 270M (262k
vocabulary) eight positions cost ~4.5x one, on the 1.1B-shape model with 2
threads four positions cost ~3x one, so the same acceptance can win on one and
lose on the other. ``SpecPayoff`` measures the result instead: the generated
tokens per second of lone decode steps that verified drafts against those that
did not (EWMA each). While drafted steps are measured slower, the speculator
drafts only one step in ``probe_every`` (the measure stays current: acceptance
changes with the request).

Only steps with a single item that decodes (no prompt tokens) are compared:
speculation runs only then, and mixing in prefill would compare unlike steps.
Engine thread only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PayoffConfig:
    alpha: float = 0.2  # EWMA weight of the newest step
    margin: float = 0.0  # drafted steps must beat plain ones by this fraction to keep drafting freely
    probe_every: int = 32  # while losing: draft on one step in this many
    min_samples: int = 3  # steps of each kind before a verdict


class SpecPayoff:
    """EWMA tokens/s of drafted and of plain lone decode steps; ``allow()`` says whether to draft now."""

    def __init__(self, config: PayoffConfig | None = None) -> None:
        self.config = config or PayoffConfig()
        self.rate: dict[bool, float] = {}  # drafted? -> EWMA tokens per second
        self.samples: dict[bool, int] = {True: 0, False: 0}
        self._skipped = 0

    def observe(self, drafted: bool, tokens: int, seconds: float) -> None:
        """One lone decode step: ``tokens`` generated (kept drafts + 1) in ``seconds``."""
        if tokens <= 0 or seconds <= 0:
            return
        rate, a = tokens / seconds, self.config.alpha
        old = self.rate.get(drafted)
        self.rate[drafted] = rate if old is None else a * rate + (1 - a) * old
        self.samples[drafted] += 1

    def losing(self) -> bool:
        """Drafted steps measured slower than plain ones (after ``min_samples`` of each)."""
        n = self.config.min_samples
        if self.samples[True] < n or self.samples[False] < n:
            return False
        return self.rate[True] < self.rate[False] * (1 + self.config.margin)

    def allow(self) -> bool:
        """Draft on this step? Always while speculation pays (or is unmeasured); else one in ``probe_every``."""
        if not self.losing():
            self._skipped = 0
            return True
        self._skipped += 1
        if self._skipped >= self.config.probe_every:
            self._skipped = 0
            return True
        return False
