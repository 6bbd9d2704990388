"""Logit bias and repetition penalties, applied in place to the rows that ask for them.

Four kinds, each with the semantics of the API it comes from:

* ``logit_bias`` (OpenAI): a fixed amount added to listed tokens' logits.
* ``frequency_penalty`` / ``presence_penalty`` (OpenAI): with ``c[t]`` the
  number of times token ``t`` was generated so far in this choice,
  ``logit[t] -= c[t] * frequency_penalty + (c[t] > 0) * presence_penalty``.
  Prompt tokens do not count.
* ``repetition_penalty`` (llama.cpp's ``penalty_repeat``): every token among
  the last ``REPEAT_LAST_N`` tokens of the context has a positive logit divided
  by it and a negative logit multiplied by it.
* ``json_repeat_penalty`` (this service, after llama.cpp's DRY sampler): where
  JSON output is free text, a token that would extend a run of ``k >=
  DRY_ALLOWED`` tokens already in the document has its logit lowered by
  ``json_repeat_penalty * DRY_BASE ** (k - DRY_ALLOWED)``: a two-token echo is
  nudged, a repeated sentence (or a ``{"bio":{"bio":...`` chain of free keys)
  soon becomes impossible in practice. "Free text" is a row where the grammar
  allows at least ``FREE_TEXT_MIN_ALLOWED`` tokens (inside a string, a free
  key): rows the schema narrows (an enum value, a pattern, a listed key, the
  structure between values) are never touched.

Masked logits (-inf) stay -inf under every operation, so no penalty ever makes
a token the grammar forbids possible, nor one it allows impossible.
``penalize_rows`` touches only the rows whose sequence asks for one of these:
the rest of the batch pays one attribute check per row.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from service.request.sequence import SamplingParams, Sequence

# NOTE: llama.cpp's default penalty_last_n. Its CLI and server feed the prompt to the sampler
# before generating ("push the prompt in the sampling context in order to apply repetition
# penalties later"), so the window covers prompt tokens until the output fills it.
REPEAT_LAST_N = 64
# NOTE: a JSON string where the grammar allows fewer tokens than this is an enum value, a
# pattern or a format (or a key's forced spelling): the schema decides it, not free text.
FREE_TEXT_MIN_ALLOWED = 1000
# NOTE: llama.cpp's DRY defaults (dry_base, dry_allowed_length); runs are measured up to
# DRY_MAX_RUN tokens over the latest DRY_OCCURRENCES occurrences, which bounds the work per row.
DRY_BASE = 1.75
DRY_ALLOWED = 2
DRY_MAX_RUN = 48
DRY_OCCURRENCES = 64


def penalize_rows(logits: np.ndarray, seqs: list[Sequence]) -> None:
    """Apply each row's own bias and penalties to ``logits[i]`` (in place), for rows that ask."""
    for i, s in enumerate(seqs):
        p = s.params
        if p.penalized:
            apply_params(logits[i], p, s.token_ids, s.num_prompt_tokens, len(s.token_ids) - s.num_draft)
        if p.json_repeat_penalty and s.num_generated > DRY_ALLOWED:
            dry(logits[i], np.asarray(s.token_ids[s.num_prompt_tokens :], dtype=np.int64), p.json_repeat_penalty)


def apply_params(row: np.ndarray, p: SamplingParams, token_ids: list[int], num_prompt: int, end: int) -> None:
    """logit_bias, then the repetition penalty, then frequency / presence (llama.cpp's order)."""
    if p.logit_bias:
        ids, bias = _bias_arrays(p.logit_bias)
        row[ids] += bias
    if p.repetition_penalty != 1.0:
        recent = np.unique(np.asarray(token_ids[max(0, end - REPEAT_LAST_N) : end], dtype=np.int64))
        repetition(row, recent, p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and end > num_prompt:
        ids, counts = np.unique(np.asarray(token_ids[num_prompt:end], dtype=np.int64), return_counts=True)
        frequency_presence(row, ids, counts, p.frequency_penalty, p.presence_penalty)


def repetition(row: np.ndarray, ids: np.ndarray, penalty: float) -> None:
    """llama.cpp's repeat penalty on the distinct token ``ids``: positive logits / penalty, others * penalty."""
    if len(ids):
        vals = row[ids]
        row[ids] = np.where(vals > 0, vals / penalty, vals * penalty)


def frequency_presence(
    row: np.ndarray, ids: np.ndarray, counts: np.ndarray, frequency: float, presence: float
) -> None:
    """OpenAI's penalties for the distinct token ``ids`` seen ``counts`` times."""
    if len(ids):
        row[ids] -= counts.astype(row.dtype) * frequency + presence


def dry(row: np.ndarray, history: np.ndarray, multiplier: float) -> None:
    """Penalise the tokens that would extend a repeated run at the end of ``history``.

    For each earlier occurrence ``j`` of the last token, ``k`` is how many
    tokens up to ``j`` equal the ones ending the history; the token that
    followed ``j`` would repeat that run one token further. Only the latest
    ``DRY_OCCURRENCES`` occurrences are looked at, runs are measured up to
    ``DRY_MAX_RUN``, and nothing is done on a row the grammar narrows.
    """
    n = len(history)
    if n < DRY_ALLOWED:
        return
    runs: dict[int, int] = {}
    for j in np.flatnonzero(history[:-1] == history[-1])[-DRY_OCCURRENCES:]:
        k = 1
        while k < DRY_MAX_RUN and j - k >= 0 and history[j - k] == history[n - 1 - k]:
            k += 1
        follower = int(history[j + 1])
        if k >= DRY_ALLOWED and k > runs.get(follower, 0):
            runs[follower] = k
    if runs and free_text(row):
        ids = np.fromiter(runs.keys(), dtype=np.int64, count=len(runs))
        k_arr = np.fromiter(runs.values(), dtype=np.float64, count=len(runs))
        row[ids] -= multiplier * DRY_BASE ** (k_arr - DRY_ALLOWED)


def free_text(row: np.ndarray) -> bool:
    """The grammar leaves this row open to free text (at least FREE_TEXT_MIN_ALLOWED tokens allowed)."""
    return int(np.count_nonzero(row > -np.inf)) >= FREE_TEXT_MIN_ALLOWED


@lru_cache(maxsize=256)
def _bias_arrays(pairs: tuple[tuple[int, float], ...]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, biases) of a logit_bias (the pairs are distinct ids, so ``row[ids] +=`` adds each once)."""
    ids = np.fromiter((t for t, _ in pairs), dtype=np.int64, count=len(pairs))
    bias = np.fromiter((b for _, b in pairs), dtype=np.float32, count=len(pairs))
    return ids, bias
