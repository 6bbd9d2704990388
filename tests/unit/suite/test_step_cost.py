"""The step-cost arithmetic of scenario T (bench/harness/step_cost.py): fit a + b*N, and what a batch row cap predicts."""

from __future__ import annotations

import pytest

from bench.harness.step_cost import caps_meeting, fit, predict


def test_fit_recovers_a_line() -> None:
    a, b = fit([(1, 12.0), (8, 40.0), (32, 136.0)])
    assert a == pytest.approx(8.0)
    assert b == pytest.approx(4.0)


def test_fit_needs_two_row_counts() -> None:
    with pytest.raises(ValueError):
        fit([(4, 10.0), (4, 12.0)])


def test_no_cap_shares_every_step_with_all_batch_rows() -> None:
    p = predict(8.0, 4.0, n=32, cap=0, tokens=32, interval_s=2.0)
    assert p.interactive_step_ms == pytest.approx(8.0 + 4.0 * 33)
    assert p.e2e_ms == pytest.approx(31 * 140.0)
    assert p.e2e_vs_alone == pytest.approx(140.0 / 12.0)
    assert p.busy_share == 1.0  # 4.34 s per request, one every 2 s: always present
    # the interactive row is the only loss: 32 rows per 140 ms instead of 32 per 136 ms
    assert p.batch_vs_alone == pytest.approx((32 / 140.0) / (32 / 136.0))


def test_a_cap_shortens_the_interactive_steps_and_costs_batch_work_while_present() -> None:
    p = predict(8.0, 4.0, n=32, cap=6, tokens=32, interval_s=2.0, ttft_ms=40.0)
    step = 8.0 + 4.0 * 7
    assert p.interactive_step_ms == pytest.approx(step)
    assert p.e2e_ms == pytest.approx(40.0 + 31 * step)
    assert p.e2e_alone_ms == pytest.approx(40.0 + 31 * 12.0)
    share = (40.0 + 31 * step) / 2000.0
    assert p.busy_share == pytest.approx(share)
    full, capped = 32 / 136.0 * 1000, 6 / step * 1000
    assert p.batch_tok_s_mixed == pytest.approx((1 - share) * full + share * capped)


def test_a_cap_above_the_batch_streams_is_no_cap() -> None:
    capped = predict(8.0, 4.0, n=8, cap=16, tokens=32, interval_s=2.0)
    free = predict(8.0, 4.0, n=8, cap=0, tokens=32, interval_s=2.0)
    assert (capped.interactive_step_ms, capped.batch_tok_s_mixed) == (free.interactive_step_ms, free.batch_tok_s_mixed)


def test_caps_meeting_both_targets() -> None:
    ok = caps_meeting(8.0, 4.0, n=32, tokens=32, interval_s=2.0, ttft_ms=40.0)
    assert ok == sorted(ok)
    for k in ok:
        p = predict(8.0, 4.0, n=32, cap=k, tokens=32, interval_s=2.0, ttft_ms=40.0)
        assert p.e2e_vs_alone <= 3.0 and p.batch_vs_alone >= 0.75
    # a large fixed cost a makes small batches dear: no cap meets both
    assert caps_meeting(60.0, 1.0, n=32, tokens=32, interval_s=2.0, e2e_max=1.1) == []
