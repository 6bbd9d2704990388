"""Scenario S's pure parts: the request mix, censoring-aware per-rate percentiles, goodput (no model, no guidellm)."""

from __future__ import annotations

import math
from typing import Any

from bench.harness.goodput import (
    LENGTHS,
    N_SYSTEM_PROMPTS,
    QUICK_LENGTHS,
    SUMMARISE,
    arrivals_broken,
    goodput,
    meets_slo,
    mix_rows,
    nearest_rank,
    rate_summary,
    request_samples,
)


def words(n: int) -> str:
    return " ".join(["w"] * n)  # one "token" per word


SYSTEMS = [f"system {i}" for i in range(N_SYSTEM_PROMPTS)]


def test_the_mix_is_seeded_and_holds_all_three_kinds_with_their_lengths() -> None:
    rows = mix_rows(words, 400, 7, SYSTEMS)
    assert rows == mix_rows(words, 400, 7, SYSTEMS) and rows != mix_rows(words, 400, 8, SYSTEMS)
    kinds = {k: [r for r in rows if r["kind"] == k] for k in LENGTHS}
    assert 0.4 < len(kinds["chat"]) / 400 < 0.6 and 0.12 < len(kinds["summarise"]) / 400 < 0.28
    for kind, group in kinds.items():
        (plo, phi), (olo, ohi) = LENGTHS[kind]
        for r in group:
            body = r["prompt"].removeprefix(SUMMARISE) if kind == "summarise" else r["prompt"]
            assert plo <= len(body.split()) <= phi and olo <= r["output_tokens_count"] <= ohi
            assert (r["system"] in SYSTEMS) if kind == "shared_system" else r["system"] == ""
    assert all(r["prompt"].startswith(SUMMARISE) for r in kinds["summarise"])
    assert len({r["system"] for r in kinds["shared_system"]}) == N_SYSTEM_PROMPTS  # a few prompts, shared
    short = mix_rows(words, 50, 7, SYSTEMS, QUICK_LENGTHS)
    assert max(r["output_tokens_count"] for r in short) <= max(o[1] for _, o in QUICK_LENGTHS.values())


def done(ttft: float, itl: float, out: int = 50) -> dict[str, Any]:
    return {"time_to_first_token_ms": ttft, "inter_token_latency_ms": itl, "output_tokens": out}


def cancelled(waited_s: float, first_token_after_s: float | None = None, sent: bool = True) -> dict[str, Any]:
    t = {"request_start": 100.0 if sent else None, "targeted_start": 100.0, "resolve_end": 100.0 + waited_s,
         "first_token_iteration": None if first_token_after_s is None else 100.0 + first_token_after_s}
    return {"info": {"timings": t}}


def bench(successful: list[Any], errored: int = 0, incomplete: list[Any] | None = None) -> dict[str, Any]:
    return {"requests": {"successful": successful, "errored": [{}] * errored, "incomplete": incomplete or []},
            "scheduler_metrics": {"measure_start_time": 0.0, "measure_end_time": 10.0}}


def test_cancelled_requests_that_waited_past_the_bound_count_as_ttft_misses() -> None:
    s = request_samples(bench([done(100, 20)] * 5, errored=1,
                              incomplete=[cancelled(3.0), cancelled(0.5), cancelled(4.0, first_token_after_s=2.5),
                                          cancelled(9.0, sent=False)]))
    # misses: the errored one and the one waiting 3 s; 0.5 s: unknown, left out; never sent: not a request
    assert s["ttft_ms"].count(math.inf) == 2
    assert 2500 in [round(x) for x in s["ttft_ms"] if x != math.inf] and len(s["ttft_ms"]) == 8
    assert (s["completed"], s["late_cancelled"], s["itl_ms"]) == (5, 1, [20.0] * 5)
    one_token = request_samples(bench([done(100, 0.0, out=1)]))
    assert one_token["itl_ms"] == []  # no inter-token gap in a one-token answer


def test_rate_summary_pools_rounds_and_applies_the_slo() -> None:
    fast = request_samples(bench([done(100 + i, 50) for i in range(100)]))
    summary = rate_summary([fast, fast])
    assert summary["completed_rps"] == 10.0 and summary["slo_met"]
    assert (summary["ttft_p50_ms"], summary["ttft_p99_ms"], summary["itl_p99_ms"]) == (149.0, 198.0, 50.0)
    late = request_samples(bench([done(100, 50)] * 98, errored=2))  # 2% misses: p99 is a miss
    pooled = rate_summary([late])
    assert not pooled["slo_met"] and pooled["ttft_p99_ms"] is None and pooled["errored"] == 2
    slow_tokens = request_samples(bench([done(100, 250)] * 10))
    assert not rate_summary([slow_tokens])["slo_met"]


def test_goodput_is_the_highest_rate_meeting_the_slo_with_all_lower_rates() -> None:
    assert goodput({0.5: True, 1.0: True, 2.0: True, 4.0: False}) == 2.0
    assert goodput({0.5: True, 1.0: False, 2.0: True}) == 0.5  # a pass above a failure is not capacity
    assert goodput({1.0: False, 2.0: False}) is None
    assert goodput({2.0: True, 1.0: True}) == 2.0  # order of the sweep does not matter
    assert meets_slo(2000.0, 200.0) and not meets_slo(2000.1, 10.0) and not meets_slo(10.0, 200.1)
    assert not meets_slo(None, 10.0) and not meets_slo(10.0, None)


def test_nearest_rank_handles_infinities_and_empty_lists() -> None:
    assert nearest_rank([], 99) is None
    assert nearest_rank([1.0, math.inf], 50) == 1.0 and nearest_rank([1.0, math.inf], 99) == math.inf
    assert nearest_rank(list(range(1, 101)), 99) == 99 and nearest_rank(list(range(1, 101)), 50) == 50


def test_a_raced_poisson_schedule_is_detected() -> None:
    ok = {"requests": {"successful": [{"info": {"timings": {"targeted_start": 1000.5}}}], "errored": None},
          "scheduler_metrics": {"start_time": 1000.0}}
    raced = {"requests": {"incomplete": [{"info": {"timings": {"targeted_start": 3.2}}}]},
             "scheduler_metrics": {"start_time": 1000.0}}
    assert not arrivals_broken(ok) and arrivals_broken(raced)


def test_the_short_requests_ttft_figure_leaves_summarisation_out() -> None:
    long_slow = [{**done(5000, 50), "prompt_tokens": 1300}] * 5
    short_fast = [{**done(100, 50), "prompt_tokens": 60}] * 95
    summary = rate_summary([request_samples(bench(long_slow + short_fast))])
    assert not summary["slo_met"] and summary["ttft_p99_ms"] == 5000
    assert summary["slo_met_short"] and summary["ttft_p99_short_ms"] == 100
