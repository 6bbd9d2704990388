"""Prompt-lookup speculative decoding: propose from the sequence's own tokens, verify in one decode.

A sequence that is decoding alone (or nearly: see ``Engine``) has idle width in
its step: computing 8 positions costs little more than 1. ``propose`` looks up
the sequence's last n-gram earlier in its own prompt and output and proposes the
tokens that followed it (extraction, JSON over given data and edits repeat long
spans). The engine appends the proposal as uncomputed tokens, computes them all
in the step's one ``llama_decode`` with logits at every position, and keeps the
longest prefix the sampler would have produced:

* greedy (temperature 0): draft i is kept while it equals the argmax of the row
  before it; the first mismatch is replaced by that argmax (the "bonus" token).
  Output equals non-speculative decoding up to numerical near-ties between
  batched and single-position logits (as between batch sizes).
* sampled: the standard rejection rule (Leviathan et al. 2023; Chen et al.
  2023) with a deterministic proposal q = one-hot(draft): keep draft i with
  probability p(draft i) under the sampler's distribution (after top-k,
  temperature, top-p, min-p); on rejection draw from p with the draft removed and
  renormalised. Each emitted token then has exactly the distribution p.

Pure functions; the engine owns the sequence state and the KV rollback.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from service.model.sampling import distribution
from service.request.sequence import SamplingParams

MAX_NGRAM = 3
MIN_NGRAM = 1
# Only look back this far: bounds the proposer's cost per step on long contexts.
LOOKBACK = 4096


def propose(tokens: Seq[int], k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the last n-gram.

    Tries the longest n-gram first (``max_ngram`` down to ``min_ngram``); [] when none recurs.
    """
    if k <= 0 or len(tokens) < min_ngram + 1:
        return []
    arr = np.asarray(tokens[-LOOKBACK:], dtype=np.int64)
    n_tok = len(arr)
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        tail = arr[n_tok - n :]
        # Candidate starts: positions whose token equals the n-gram's first, leaving room for
        # at least one following token and ending before the tail itself.
        starts = np.flatnonzero(arr[: n_tok - n] == tail[0])
        for s in starts[::-1]:  # most recent first
            if s + n < n_tok and np.array_equal(arr[s : s + n], tail):
                follow = arr[s + n : s + n + k]
                if len(follow):
                    return [int(t) for t in follow]
    return []


def verify_greedy(rows: np.ndarray, drafts: Seq[int]) -> list[int]:
    """Accepted tokens: the drafts that match each row's argmax, then one token from the next row.

    ``rows[i]`` is the logits row before draft i; ``rows`` has ``len(drafts) + 1`` rows.
    """
    best = np.argmax(rows, axis=1)
    out: list[int] = []
    for i, d in enumerate(drafts):
        if int(best[i]) != d:
            out.append(int(best[i]))
            return out
        out.append(d)
    out.append(int(best[len(drafts)]))
    return out


def verify_sampled(
    rows: np.ndarray, drafts: Seq[int], params: SamplingParams, rng: np.random.Generator
) -> list[int]:
    """Accepted tokens under the rejection rule (module docstring); at least one token."""
    out: list[int] = []
    for i, d in enumerate(drafts):
        ids, probs = distribution(rows[i], params)
        hit = np.flatnonzero(ids == d)
        p_d = float(probs[hit[0]]) if len(hit) else 0.0
        if rng.random() < p_d:
            out.append(d)
            continue
        out.append(_residual_draw(ids, probs, hit, rng))
        return out
    ids, probs = distribution(rows[len(drafts)], params)
    out.append(int(ids[rng.choice(len(ids), p=probs)]))
    return out


def _residual_draw(ids: np.ndarray, probs: np.ndarray, hit: np.ndarray, rng: np.random.Generator) -> int:
    """A draw from ``probs`` with the rejected draft (``hit``) removed and the rest renormalised."""
    if len(hit):
        probs = probs.copy()
        probs[hit[0]] = 0.0
        total = probs.sum()
        if total <= 0.0:  # the draft was the only candidate: it cannot have been rejected
            return int(ids[hit[0]])
        probs /= total
    return int(ids[rng.choice(len(ids), p=probs)])
