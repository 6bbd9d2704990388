"""Logit bias and repetition penalties (service/model/penalties.py) on hand-made rows; no model."""

from __future__ import annotations

import numpy as np
import pytest

from service.model import penalties as pen
from service.request.sequence import SamplingParams, Sequence

VOCAB = 2000


def seq(prompt: list[int], output: list[int], **params: object) -> Sequence:
    s = Sequence(request_id="r", token_ids=list(prompt), params=SamplingParams(**params))  # type: ignore[arg-type]
    s.token_ids += output
    return s


def row(values: dict[int, float] | None = None) -> np.ndarray:
    r = np.zeros(VOCAB, dtype=np.float32)
    for t, v in (values or {}).items():
        r[t] = v
    return r


def test_frequency_and_presence_follow_openai_over_generated_tokens_only() -> None:
    s = seq([7, 7, 7], [5, 5, 9], frequency_penalty=0.5, presence_penalty=0.25)
    logits = np.stack([row({5: 1.0, 9: 1.0, 7: 1.0})])
    pen.penalize_rows(logits, [s])
    assert logits[0, 5] == pytest.approx(1.0 - 2 * 0.5 - 0.25)
    assert logits[0, 9] == pytest.approx(1.0 - 1 * 0.5 - 0.25)
    assert logits[0, 7] == 1.0  # a prompt token: not counted


def test_repetition_penalty_follows_llama_cpp_over_the_last_64_context_tokens() -> None:
    prompt = [11] + [3] * 70  # token 11 is older than the window
    s = seq(prompt, [12], repetition_penalty=2.0)
    logits = np.stack([row({3: 4.0, 12: -1.0, 11: 4.0, 13: 4.0})])
    pen.penalize_rows(logits, [s])
    assert logits[0, 3] == 2.0  # positive logit divided
    assert logits[0, 12] == -2.0  # negative logit multiplied
    assert logits[0, 11] == 4.0 and logits[0, 13] == 4.0


def test_logit_bias_adds_to_listed_tokens() -> None:
    s = seq([1], [], logit_bias=((4, -100.0), (8, 2.5)))
    logits = np.stack([row({4: 3.0})])
    pen.penalize_rows(logits, [s])
    assert logits[0, 4] == -97.0 and logits[0, 8] == 2.5
    assert np.count_nonzero(logits[0]) == 2


def test_masked_tokens_stay_masked_under_every_penalty() -> None:
    s = seq([1, 2], [2, 2, 3], frequency_penalty=-2.0, presence_penalty=-2.0, repetition_penalty=0.5,
            logit_bias=((2, 100.0),))
    logits = np.stack([row()])
    logits[0, [2, 3]] = -np.inf
    pen.penalize_rows(logits, [s])
    assert np.isneginf(logits[0, 2]) and np.isneginf(logits[0, 3])
    assert np.isfinite(logits[0, 4:]).all()


def test_rows_that_ask_for_nothing_are_not_touched() -> None:
    plain = seq([1, 2], [3, 3, 3])
    asking = seq([1, 2], [3, 3, 3], frequency_penalty=1.0)
    logits = np.stack([row({3: 1.0}), row({3: 1.0})])
    before = logits[1].copy()
    pen.penalize_rows(logits, [asking, plain])
    assert logits[0, 3] == -2.0
    np.testing.assert_array_equal(logits[1], before)
    assert not plain.params.penalized and asking.params.penalized


def test_dry_penalises_the_token_that_would_repeat_a_run() -> None:
    # ... 10 20 30 40 ... 10 20 30 -> 40 would repeat a run of 3 (k = 3: 0.8 * 1.75 ** 1)
    history = np.array([10, 20, 30, 40, 50, 10, 20, 30], dtype=np.int64)
    r = row()
    pen.dry(r, history, 0.8)
    assert r[40] == pytest.approx(-0.8 * 1.75)
    assert np.count_nonzero(r) == 1


def test_dry_grows_with_the_length_of_the_repeat() -> None:
    sentence = [101, 102, 103, 104, 105, 106]
    short, long_ = row(), row()
    pen.dry(short, np.array(sentence + sentence[:2], dtype=np.int64), 0.8)
    pen.dry(long_, np.array(sentence + sentence[:5], dtype=np.int64), 0.8)
    assert short[103] == pytest.approx(-0.8)  # k = 2: the allowed length, the smallest penalty
    assert long_[106] == pytest.approx(-0.8 * 1.75**3)


def test_dry_leaves_rows_the_grammar_narrows_alone() -> None:
    history = np.array([10, 20, 30, 40, 10, 20, 30], dtype=np.int64)
    narrow = np.full(VOCAB, -np.inf, dtype=np.float32)
    narrow[[40, 41, 42]] = 0.0  # an enum value: three tokens allowed
    pen.dry(narrow, history, 5.0)
    assert (narrow[[40, 41, 42]] == 0.0).all()


def test_json_repeat_penalty_applies_to_the_output_of_its_row() -> None:
    s = seq([10, 20, 30], [10, 20, 30, 40, 10, 20, 30], json_repeat_penalty=1.0)
    logits = np.stack([row()])
    pen.penalize_rows(logits, [s])
    assert logits[0, 40] == pytest.approx(-1.0 * 1.75)
