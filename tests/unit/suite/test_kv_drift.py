"""Scenario U's greedy-drift comparison (bench/scenarios/u_kv_cache_types.py): identical outputs, the
first differing position, and the logprob difference over the common prefix only."""

from __future__ import annotations

import pytest

from bench.scenarios.u_kv_cache_types import compare


def test_identical_outputs_report_no_difference_and_their_largest_logprob_gap() -> None:
    row = compare(([1, 2, 3], [-0.1, -0.5, -1.0]), ([1, 2, 3], [-0.1, -0.7, -1.05]))
    assert row["identical"] is True and row["first_difference"] is None
    assert row["max_abs_logprob_diff"] == pytest.approx(0.2)


def test_a_divergent_output_is_compared_only_before_it_differs() -> None:
    # position 2 holds different tokens: its logprobs (-9.0 vs -0.2) are not like for like
    row = compare(([1, 2, 3, 4], [-0.1, -0.5, -0.2, -0.3]), ([1, 2, 7, 8], [-0.15, -0.5, -9.0, -0.1]))
    assert row["identical"] is False and row["first_difference"] == 2
    assert row["max_abs_logprob_diff"] == pytest.approx(0.05)


def test_a_shorter_output_is_not_identical() -> None:
    row = compare(([1, 2, 3], [0.0, 0.0, 0.0]), ([1, 2], [0.0, 0.0]))
    assert row["identical"] is False and row["first_difference"] == 2


def test_a_difference_at_the_first_token_has_no_common_prefix() -> None:
    assert compare(([5], [-1.0]), ([6], [-2.0]))["max_abs_logprob_diff"] == 0.0
