"""What the engine needs of a request's output constraints (Protocols; the grammar package implements them).

A constrained ``Sequence`` carries a ``Matcher`` (``service.json_grammar.GrammarMatcher``)
and may carry a ``KeyFilter`` (``service.grammar.json_keys.KeyGuard``) and a
``FinishBudget`` (budget-aware completion). The engine thread is their only
user once the request is submitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    import llguidance as llg


class Matcher(Protocol):
    """One sequence's grammar state."""

    @property
    def ll_matcher(self) -> llg.LLMatcher:
        """The llguidance matcher (token masks are computed for many matchers at once)."""
        ...

    def consume(self, token: int) -> None:
        """Advance by ``token``; raises (with a ``status``) if the grammar does not allow it."""
        ...

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (not consumed)."""
        ...

    def is_stopped(self) -> bool:
        """Nothing more may be generated."""
        ...

    def is_accepting(self) -> bool:
        """The output so far is a complete match."""
        ...

    def fork(self) -> Matcher:
        """An independent copy of this state (for looking one token ahead)."""
        ...

    def completion(self, limit: int) -> list[int] | None:
        """Tokens of the shortest completion found from here, at most ``limit``; None if none (or not JSON)."""
        ...

    def error(self) -> Exception | None:
        """Why the matcher failed, or None."""
        ...


class KeyFilter(Protocol):
    """Bans tokens that would close a duplicate object key."""

    def feed(self, data: bytes) -> None:
        """The bytes of a token appended to the document."""
        ...

    def apply(self, row: np.ndarray) -> int:
        """Ban the offending tokens in one logits row (in place); returns how many."""
        ...


@dataclass
class FinishBudget:
    """Budget-aware completion state of one sequence (engine thread).

    ``known`` is the length of the last completion computed (tokens), ``at``
    the number of generated tokens when it was computed.
    """

    known: int
    at: int = 0
