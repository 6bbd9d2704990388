"""Scenario T's pure figures (bench/scenarios/t_report.py): a phase's row, pooling rounds, the targets."""

from __future__ import annotations

from typing import Any

import pytest

from bench.harness.grpc_load import ReqResult
from bench.scenarios import t_report


def _req(ttft_ms: float, e2e_ms: float, ok: bool = True) -> ReqResult:
    return ReqResult(ok, 10.0, 10.0 + e2e_ms / 1000.0, ttft_ms if ok else None, 32 if ok else 0,
                     error="" if ok else "boom")


def _row(phase: str, reqs: list[ReqResult], batch_tok_s: float | None = None,
         steps: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"interactive": reqs, "wall_s": 1.0}
    if batch_tok_s is not None:
        out["batch_tok_s"] = batch_tok_s
    row = {"phase": phase, **t_report.phase_row(out, None, None)}
    if steps is not None:
        row["steps"] = steps
    return row


def test_phase_row_keeps_ok_samples_and_counts_failures() -> None:
    row = t_report.phase_row({"interactive": [_req(100, 500), _req(0, 0, ok=False)], "wall_s": 2.0}, None, None)
    assert row["interactive_requests"] == 2 and row["interactive_failed"] == 1
    assert row["ttft_samples_ms"] == [100.0] and row["e2e_samples_ms"] == [500.0]
    assert row["interactive_errors"] == ["boom"] and "steps" not in row


def _arm(alone_e2e: float, mixed_e2e: float, ttft: float, batch_alone: float, batch_mixed: list[float]) -> list[Any]:
    rows = [_row("alone", [_req(30, alone_e2e)] * 3), _row("batch", [], batch_alone)]
    rows += [_row("mixed", [_req(ttft, mixed_e2e)] * 4, b) for b in batch_mixed]
    return rows


def test_arm_summary_pools_samples_and_averages_rounds() -> None:
    s = t_report.arm_summary(_arm(400, 1000, 200, 200.0, [150.0, 170.0]))
    assert s["alone_e2e"]["p50_ms"] == pytest.approx(400)
    assert s["mixed_e2e"]["n"] == 8
    assert s["batch_tok_s_mixed"] == pytest.approx(160.0)
    assert "steps" not in s  # no step clock (the peer)


def test_checks_against_the_targets_and_the_peer() -> None:
    arms = {"ours": t_report.arm_summary(_arm(400, 1100, 450, 200.0, [160.0])),
            "llama_server": t_report.arm_summary(_arm(400, 9000, 9000, 200.0, [180.0]))}
    c = t_report.checks(arms, "ours")
    assert c["ttft_met"] and c["e2e_met"] and c["batch_vs_alone_met"]
    assert c["e2e_p99_vs_alone_p50"] == pytest.approx(1100 / 400)
    assert c["batch_vs_peer"] == pytest.approx(160 / 180) and not c["batch_vs_peer_met"]


def test_arithmetic_fits_the_alone_and_batch_steps() -> None:
    steps = {"alone": {"tokens_per_step": 1.0, "ms_per_step": 12.0},
             "batch": {"tokens_per_step": 32.0, "ms_per_step": 136.0}}
    ar = t_report.arithmetic(steps, {"batch_streams": 32, "interactive_tokens": 32, "interval_s": 2.0}, 40.0)
    assert ar["a_ms"] == pytest.approx(8.0) and ar["b_ms"] == pytest.approx(4.0)
    assert [p["cap"] for p in ar["predictions"]] == list(t_report.CAPS_SHOWN)
    assert all(p["e2e_vs_alone"] <= 3 and p["batch_vs_alone"] >= 0.75
               for p in ar["predictions"] if p["cap"] in ar["caps_meeting_both"])


def test_steps_line_names_each_phase_and_the_decode_share() -> None:
    steps = {p: {"ms_per_step": ms, "tokens_per_step": tok, "phases_ms": {"decode": 90.0, "emit": 10.0}}
             for p, ms, tok in (("alone", 12.0, 1.0), ("batch", 96.0, 31.0), ("mixed", 100.0, 32.0))}
    text = t_report.steps_line(steps)
    assert "alone 12.0 ms / 1.00 tokens per step" in text and "mixed 100.0 ms" in text
    assert text.endswith("decode 90.0% of the mixed step")
