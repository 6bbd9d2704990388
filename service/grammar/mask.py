"""Logit masking for the constrained rows of one decode step (llguidance's parallel executor)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import llguidance as llg
import numpy as np


class HasLLMatcher(Protocol):
    """A per-sequence grammar state (``service.json_grammar.GrammarMatcher``): its llguidance matcher."""

    @property
    def ll_matcher(self) -> llg.LLMatcher: ...


class MaskBatch:
    """Per-step mask filling for the constrained rows of one decode step (engine thread only)."""

    def __init__(
        self, ll_tokenizer: llg.LLTokenizer, n_vocab: int, max_rows: int, *, threads: int | None = None
    ) -> None:
        self.n_vocab = n_vocab
        self.tok_vocab = min(int(ll_tokenizer.vocab_size), n_vocab)
        self._words = (int(ll_tokenizer.vocab_size) + 31) // 32
        self._exec = llg.LLExecutor(threads)
        self._alloc(max(1, max_rows))

    def _alloc(self, rows: int) -> None:
        # NOTE: llguidance writes native-endian u32 words; '<i4' + little bit order below assume a
        # little-endian host (x86-64, aarch64).
        self._mask = np.zeros((rows, self._words), dtype="<i4")

    def fill_and_apply(self, matchers: Sequence[HasLLMatcher], logits: np.ndarray, rows: list[int]) -> float:
        """Set ``logits[rows[i], t] = -inf`` for every token ``t`` that ``matchers[i]`` disallows.

        Masks are computed in parallel outside the GIL by llguidance's LLExecutor;
        columns beyond the tokenizer's vocabulary are always disallowed. The buffer
        grows if more rows than ``max_rows`` arrive. Returns the mean microseconds
        per row spent computing masks.
        """
        n = len(matchers)
        if n == 0:
            return 0.0
        if n > self._mask.shape[0]:
            self._alloc(n)
        t0 = time.perf_counter()
        self._exec.unsafe_compute_mask_ptr(
            [(m.ll_matcher, i) for i, m in enumerate(matchers)],
            self._mask.ctypes.data,
            self._words * 4,
            self._mask.shape[0],
        )
        us = (time.perf_counter() - t0) * 1e6 / n
        bits = np.unpackbits(self._mask[:n].view(np.uint8), axis=1, bitorder="little")[:, : self.tok_vocab]
        banned = bits == 0
        for i, r in enumerate(rows):
            row = logits[r]
            np.copyto(row[: self.tok_vocab], -np.inf, where=banned[i])
            row[self.tok_vocab :] = -np.inf
        return us
