"""Token sampling from logits rows, vectorised with numpy.

Greedy rows of a step are argmax'ed together in one call. A sampled row applies,
in llama.cpp's order: top-k, temperature, then top-p and min-p on the softmax,
and draws with the sequence's own ``numpy.random.Generator`` (seeded from
``SamplingParams.seed``), so a seed makes the output reproducible regardless of
what else shares the batch.

NOTE: the vocabulary can be large (262k for Gemma 3): we never sort it. Top-k
uses ``argpartition``; top-p grows a candidate set by ``argpartition`` until it
holds the requested probability mass, which is exact and usually tiny.
"""

from __future__ import annotations

import logging

import numpy as np

from service.request.sequence import SamplingParams, Sequence

log = logging.getLogger("service.engine")


def sample_rows(
    logits: np.ndarray, params: list[SamplingParams], rngs: list[np.random.Generator]
) -> np.ndarray:
    """Sample one token per row of ``logits`` (n_rows, n_vocab); masked entries are -inf."""
    # NOTE: no fancy indexing of the logits: a row of a 262k vocabulary is 1 MB,
    # so ``logits[rows]`` would copy megabytes per step. Argmax the view instead.
    if all(p.greedy for p in params):
        return np.argmax(logits, axis=1)
    out = np.empty(len(params), dtype=np.int64)
    for i, p in enumerate(params):
        out[i] = int(np.argmax(logits[i])) if p.greedy else sample_one(logits[i], p, rngs[i])
    return out


def _candidates(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest logits (unordered)."""
    if k >= logits.shape[0]:
        return np.arange(logits.shape[0])
    return np.argpartition(logits, -k)[-k:]


def sample_one(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """Sample one token id from a single logits row."""
    ids, probs = distribution(logits, p)
    return int(ids[rng.choice(len(ids), p=probs)])


def distribution(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The sampler's distribution for one row: candidate ids (most likely first) and their
    probabilities after top-k, temperature, top-p and min-p (summing to 1)."""
    n_vocab = logits.shape[0]
    k = p.top_k if p.top_k > 0 else n_vocab
    finite = int(np.count_nonzero(np.isfinite(logits))) if not np.isfinite(logits).all() else n_vocab
    k = max(1, min(k, finite))
    # Start from a small candidate set; widen it only if top-p needs more mass.
    want = k if p.top_p >= 1.0 else min(k, 64)
    while True:
        idx = _candidates(logits, want)
        ids, probs = _probs(logits, idx, p.temperature, n_vocab, k)
        keep = _nucleus(probs, p.top_p)
        if keep is not None or want >= k:
            break
        want = min(k, want * 8)
    if keep is None:
        keep = len(probs)
    ids, probs = ids[:keep], probs[:keep]
    if p.min_p > 0.0:
        mask = probs >= p.min_p * probs[0]
        ids, probs = ids[mask], probs[mask]
    return ids, probs / probs.sum()


def _probs(
    logits: np.ndarray, idx: np.ndarray, temperature: float, n_vocab: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Candidates sorted by probability, with probabilities over the top-k set.

    With a partial candidate set the normaliser still covers the whole top-k
    set (computed once over the row), so top-p mass is measured exactly.
    """
    vals = logits[idx].astype(np.float64) / max(temperature, 1e-6)
    order = np.argsort(-vals)
    idx, vals = idx[order], vals[order]
    top = vals[0]
    if len(idx) < k:
        full = _candidates(logits, k) if k < n_vocab else slice(None)
        z = np.exp(logits[full].astype(np.float64) / max(temperature, 1e-6) - top).sum()
    else:
        z = np.exp(vals - top).sum()
    return idx, np.exp(vals - top) / z


def _nucleus(probs: np.ndarray, top_p: float) -> int | None:
    """How many leading candidates reach ``top_p`` mass; None if this set is too small."""
    if top_p >= 1.0:
        return len(probs)
    cum = np.cumsum(probs)
    hit = int(np.searchsorted(cum, top_p, side="left"))
    if hit >= len(probs):
        return None
    return hit + 1


def sample_rows_guarded(logits: np.ndarray, seqs: list[Sequence]) -> np.ndarray:
    """``sample_rows`` for a step's sequences; a row that cannot be sampled gets -1 and its
    sequence an error (``seq.error``), the other rows are unaffected."""
    try:
        return sample_rows(logits, [s.params for s in seqs], [s.rng for s in seqs])  # type: ignore[misc]
    except Exception:
        out = np.empty(len(seqs), dtype=np.int64)
        for i, s in enumerate(seqs):
            try:
                out[i] = sample_rows(logits[i : i + 1], [s.params], [s.rng])[0]  # type: ignore[list-item]
            except Exception as exc:
                log.exception("sampling a row failed")
                s.error, s.error_status = f"sampling failed: {type(exc).__name__}: {exc}", "INTERNAL"
                out[i] = -1
        return out
