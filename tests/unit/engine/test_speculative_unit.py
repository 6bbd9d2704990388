"""Prompt-lookup speculation without a model: the proposer and both acceptance rules."""

from __future__ import annotations

import numpy as np
import pytest

from service.engine.speculator import COOLDOWN_STEPS, MAX_COOLDOWN_STEPS, SpecConfig, Speculator
from service.model.sampling import distribution
from service.model.speculative import propose, verify_greedy, verify_sampled
from service.request.sequence import SamplingParams, SeqStatus, Sequence

# 99.9% quantile of the chi-square distribution with 4 degrees of freedom.
CHI2_4DF_999 = 18.47


def test_propose_continues_the_most_recent_occurrence_of_the_last_ngram() -> None:
    toks = [5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 0, 4, 1, 2, 3]
    assert propose(toks, 2) == [7, 8]  # the later "1 2 3" (followed by 7 8), not the first
    assert propose(toks, 10) == [7, 8, 0, 4, 1, 2, 3]


def test_propose_prefers_longer_ngrams_and_returns_nothing_without_a_repeat() -> None:
    toks = [4, 2, 6, 1, 2, 7, 1, 2]
    # The bigram "1 2" occurred before (followed by 7); the unigram "2" more recently (at the end).
    assert propose(toks, 3) == [7, 1, 2]
    assert propose([1, 2, 3, 4], 4) == []
    assert propose([1, 2, 3, 1], 0) == []


def test_verify_greedy_keeps_matching_drafts_then_adds_the_models_token() -> None:
    rows = np.full((4, 10), -5.0, dtype=np.float32)
    for i, best in enumerate([3, 4, 9, 6]):
        rows[i, best] = 5.0
    assert verify_greedy(rows, [3, 4, 5]) == [3, 4, 9]  # third draft wrong: replaced
    assert verify_greedy(rows, [3, 4, 9]) == [3, 4, 9, 6]  # all kept, plus the bonus token
    assert verify_greedy(rows[:1], []) == [3]


def _first_token_counts(row: np.ndarray, draft: int, params: SamplingParams, trials: int) -> np.ndarray:
    rng = np.random.default_rng(1234)
    rows = np.stack([row, row])
    counts = np.zeros(row.shape[0])
    for _ in range(trials):
        counts[verify_sampled(rows, [draft], params, rng)[0]] += 1
    return counts


@pytest.mark.parametrize(
    ("params", "draft"),
    [
        (SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), 2),  # a likely draft
        (SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0), 4),  # an unlikely draft
        (SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0), 4),  # draft outside top-k
    ],
)
def test_rejection_sampling_leaves_the_output_distribution_unchanged(params: SamplingParams, draft: int) -> None:
    row = np.log(np.asarray([0.35, 0.25, 0.2, 0.15, 0.05])).astype(np.float32)
    ids, probs = distribution(row, params)
    expected = np.zeros(5)
    expected[ids] = probs
    trials = 20000
    counts = _first_token_counts(row, draft, params, trials)
    assert counts[expected == 0].sum() == 0  # nothing outside the sampler's support
    mask = expected > 0
    chi2 = float((((counts - trials * expected) ** 2)[mask] / (trials * expected[mask])).sum())
    assert chi2 < CHI2_4DF_999, (counts / trials, expected)


def test_a_certain_draft_is_always_kept() -> None:
    row = np.full(6, -np.inf, dtype=np.float32)
    row[3] = 0.0
    rows = np.stack([row, row, row])
    rng = np.random.default_rng(0)
    assert verify_sampled(rows, [3, 3], SamplingParams(temperature=1.0), rng) == [3, 3, 3]


class _Sched:
    def __init__(self, running: list[Sequence]) -> None:
        self.running, self.waiting = running, []


def _decoding(tokens: list[int]) -> Sequence:
    seq = Sequence("r", list(tokens), SamplingParams(max_tokens=100, temperature=0.0))
    seq.num_prompt_tokens = len(tokens) - 1
    seq.num_computed = len(tokens) - 1
    seq.status = SeqStatus.RUNNING
    return seq


def test_draft_length_adapts_and_pauses_after_an_outright_rejection() -> None:
    spec = Speculator(SpecConfig(enabled=True, tokens=6, max_running=1))
    seq = _decoding([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2])
    spec.propose(_Sched([seq]))  # type: ignore[arg-type]
    assert seq.num_draft == 6 and seq.token_ids[-6:] == [3, 4, 5, 6, 7, 8]
    seq.drop_drafts()
    spec._adapt(seq.uid, 6, 0)  # the first draft token was wrong
    for _ in range(COOLDOWN_STEPS):
        spec.propose(_Sched([seq]))  # type: ignore[arg-type]
        assert seq.num_draft == 0
    spec.propose(_Sched([seq]))  # type: ignore[arg-type]
    assert seq.num_draft == 1  # back, at the smallest width
    seq.drop_drafts()
    spec._adapt(seq.uid, 1, 1)  # kept: grow by two
    spec.propose(_Sched([seq]))  # type: ignore[arg-type]
    assert seq.num_draft == 3


def test_no_drafts_while_more_sequences_run_than_allowed() -> None:
    spec = Speculator(SpecConfig(enabled=True, tokens=6, max_running=1))
    a, b = _decoding([1, 2, 1, 2]), _decoding([3, 4, 3, 4])
    spec.propose(_Sched([a, b]))  # type: ignore[arg-type]
    assert a.num_draft == b.num_draft == 0


def test_cooldown_doubles_with_each_outright_rejection_in_a_row_and_resets_on_a_kept_token() -> None:
    spec = Speculator(SpecConfig(enabled=True, tokens=6, max_running=1))
    seq = _decoding([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2])

    def idle_steps_before_next_draft() -> int:
        steps = 0
        while True:
            spec.propose(_Sched([seq]))  # type: ignore[arg-type]
            if seq.num_draft:
                seq.drop_drafts()
                return steps
            steps += 1

    pauses = []
    for _ in range(8):
        spec._adapt(seq.uid, 1, 0)
        pauses.append(idle_steps_before_next_draft())
    assert pauses == [8, 16, 32, 64, 128, 256, 512, 512]
    assert MAX_COOLDOWN_STEPS == 512
    spec._adapt(seq.uid, 1, 1)  # one kept token: the streak is over
    spec._adapt(seq.uid, 3, 0)
    assert idle_steps_before_next_draft() == COOLDOWN_STEPS
