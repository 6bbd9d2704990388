"""Scenario T's figures: one phase's row, the per-arm pooling, the targets, the cap arithmetic and summary.md.

Pure functions over the rows ``t_mixed_peer`` measures (tested in tests/unit/suite/test_t_report.py), plus
the two small types the scenario passes around.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from statistics import mean
from typing import Any

from bench.harness import step_cost
from bench.harness.grpc_load import ReqResult
from bench.harness.stats import latency_summary, pct, ratio
from bench.harness.tables import fmt, table, verdict

TTFT_P99_MAX_MS = 500.0
E2E_VS_ALONE_MAX = 3.0
BATCH_VS_ALONE_MIN = 0.75
BATCH_VS_PEER_MIN = 0.95
OURS = ("ours", "ours_cap")
CAPS_SHOWN = (0, 2, 4, 6, 8, 12, 16)


@dataclass(frozen=True)
class Load:
    batch_streams: int
    batch_tokens: int
    interactive_tokens: int
    interval_s: float
    ramp_s: float
    window_s: float
    alone_requests: int
    rounds: int


@dataclass(frozen=True)
class Target:
    """One server arm: its HTTP base URL and model name, how to wait until idle, our gRPC port (None: the peer)."""

    url: str
    model: str
    wait_idle: Callable[[], Awaitable[None]]
    grpc: str | None

    async def metrics(self) -> Any:
        if self.grpc is None:
            return None
        from bench.harness.grpc_load import channel, get_metrics

        async with channel(self.grpc) as ch:
            return await get_metrics(ch)


def phase_row(out: dict[str, Any], m0: Any, m1: Any) -> dict[str, Any]:
    """A phase's JSON row: interactive TTFT / end-to-end samples, batch figures, and (ours) the step clock."""
    inter: list[ReqResult] = out.pop("interactive")
    ok = [r for r in inter if r.ok]
    row: dict[str, Any] = dict(out)
    row.update(interactive_requests=len(inter), interactive_failed=len(inter) - len(ok),
               interactive_errors=sorted({r.error for r in inter if not r.ok})[:3],
               ttft_samples_ms=[round(r.ttft_ms, 1) for r in ok if r.ttft_ms is not None],
               e2e_samples_ms=[round(r.e2e_ms, 1) for r in ok])
    if m0 is not None and m1 is not None:
        steps = step_cost.phases_delta(m0, m1)
        steps["ms_per_step_total"] = round(sum(steps["ms_per_step"].values()), 2)
        row["steps"] = steps
    return row


def line(row: dict[str, Any]) -> str:
    """One progress line of a phase."""
    parts = []
    if row["interactive_requests"]:
        t, e = row["ttft_samples_ms"], row["e2e_samples_ms"]
        parts.append(f"interactive TTFT p50 {fmt(pct(t, 50), 0)} p99 {fmt(pct(t, 99), 0)} ms, e2e p50 "
                     f"{fmt(pct(e, 50), 0)} p99 {fmt(pct(e, 99), 0)} ms ({row['interactive_failed']} failed)")
    if "batch_tok_s" in row:
        parts.append(f"batch {row['batch_tok_s']:.1f} tok/s")
    if "steps" in row:
        parts.append(f"{row['steps']['ms_per_step_total']} ms/step, {row['steps']['tokens_per_step']} tok/step")
    return "; ".join(parts)


def _pooled(rows: list[dict[str, Any]], phase: str, key: str) -> list[float]:
    return [x for r in rows if r["phase"] == phase for x in r[key]]


def arm_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """An arm's rounds pooled: latency samples pooled, batch tok/s the mean of the rounds."""
    def tok(phase: str) -> float | None:
        vals = [r["batch_tok_s"] for r in rows if r["phase"] == phase]
        return mean(vals) if vals else None

    out: dict[str, Any] = {
        "alone_ttft": latency_summary(_pooled(rows, "alone", "ttft_samples_ms")),
        "alone_e2e": latency_summary(_pooled(rows, "alone", "e2e_samples_ms")),
        "mixed_ttft": latency_summary(_pooled(rows, "mixed", "ttft_samples_ms")),
        "mixed_e2e": latency_summary(_pooled(rows, "mixed", "e2e_samples_ms")),
        "mixed_failed": sum(r["interactive_failed"] for r in rows if r["phase"] == "mixed"),
        "batch_tok_s_alone": tok("batch"),
        "batch_tok_s_mixed": tok("mixed"),
    }
    steps = {p: [r["steps"] for r in rows if r["phase"] == p and "steps" in r] for p in ("alone", "batch", "mixed")}
    if all(steps.values()):
        out["steps"] = {p: {"ms_per_step": mean(s["ms_per_step_total"] for s in v),
                            "tokens_per_step": mean(s["tokens_per_step"] or 0.0 for s in v),
                            "phases_ms": v[-1]["ms_per_step"]} for p, v in steps.items()}
    return out


def checks(arms: dict[str, dict[str, Any]], arm: str) -> dict[str, Any]:
    """The four targets for one arm (the peer's batch tok/s under the same load is the reference)."""
    a, peer = arms[arm], arms["llama_server"]
    e2e = ratio(a["mixed_e2e"]["p99_ms"], a["alone_e2e"]["p50_ms"])
    alone = ratio(a["batch_tok_s_mixed"], a["batch_tok_s_alone"])
    vs_peer = ratio(a["batch_tok_s_mixed"], peer["batch_tok_s_mixed"])
    ttft = a["mixed_ttft"]["p99_ms"]
    return {
        "ttft_p99_ms": ttft, "ttft_met": ttft is not None and ttft <= TTFT_P99_MAX_MS,
        "e2e_p99_vs_alone_p50": e2e, "e2e_met": e2e is not None and e2e <= E2E_VS_ALONE_MAX,
        "batch_vs_alone": alone, "batch_vs_alone_met": alone is not None and alone >= BATCH_VS_ALONE_MIN,
        "batch_vs_peer": vs_peer, "batch_vs_peer_met": vs_peer is not None and vs_peer >= BATCH_VS_PEER_MIN,
    }


def arithmetic(steps: dict[str, Any], load: dict[str, Any], ttft_ms: float | None) -> dict[str, Any]:
    """``a + b*N`` from the step clock of the alone and batch phases, and what each cap predicts."""
    points = [(steps[p]["tokens_per_step"], steps[p]["ms_per_step"]) for p in ("alone", "batch")]
    if len({x for x, _ in points}) < 2:
        return {}
    a, b = step_cost.fit(points)
    kw = {"n": load["batch_streams"], "tokens": load["interactive_tokens"], "interval_s": load["interval_s"],
          "ttft_ms": ttft_ms or 0.0}
    preds = [step_cost.predict(a, b, cap=k, **kw) for k in CAPS_SHOWN]
    return {"a_ms": round(a, 2), "b_ms": round(b, 3),
            "predictions": [{"cap": p.cap, "interactive_step_ms": round(p.interactive_step_ms, 1),
                             "e2e_vs_alone": round(p.e2e_vs_alone, 2), "busy_share": round(p.busy_share, 2),
                             "batch_vs_alone": round(p.batch_vs_alone, 3)} for p in preds],
            "caps_meeting_both": step_cost.caps_meeting(a, b, **kw)}


def model_result(runs: dict[str, list[dict[str, Any]]], load: Any, cap: int) -> dict[str, Any]:
    arms = {arm: arm_summary(rows) for arm, rows in runs.items()}
    out: dict[str, Any] = {"cap": cap, "runs": runs, "arms": arms, "checks": {arm: checks(arms, arm) for arm in OURS}}
    if "steps" in arms["ours"]:
        out["arithmetic"] = arithmetic(arms["ours"]["steps"], load.__dict__, arms["ours"]["alone_ttft"]["p50_ms"])
    return out


HEAD = ["model", "arm", "interactive alone TTFT / e2e p50 ms", "mixed TTFT p50 / p99 ms", "mixed e2e p50 / p99 ms",
        "e2e p99 / alone (<= 3)", "batch tok/s alone", "batch tok/s mixed", "batch mixed / alone (>= 0.75)",
        "batch / llama-server (>= 0.95)", "ms/step batch / mixed"]


def _row(tag: str, arm: str, a: dict[str, Any], c: dict[str, Any] | None) -> list[str]:
    st = a.get("steps")
    e2e = ratio(a["mixed_e2e"]["p99_ms"], a["alone_e2e"]["p50_ms"])
    return [tag, arm, f"{fmt(a['alone_ttft']['p50_ms'], 0)} / {fmt(a['alone_e2e']['p50_ms'], 0)}",
            f"{fmt(a['mixed_ttft']['p50_ms'], 0)} / {fmt(a['mixed_ttft']['p99_ms'], 0)}"
            + ("" if c is None else " " + verdict(c["ttft_p99_ms"], TTFT_P99_MAX_MS, False)),
            f"{fmt(a['mixed_e2e']['p50_ms'], 0)} / {fmt(a['mixed_e2e']['p99_ms'], 0)}",
            fmt(e2e, 2) + ("" if c is None else " " + verdict(e2e, E2E_VS_ALONE_MAX, False)),
            fmt(a["batch_tok_s_alone"]), fmt(a["batch_tok_s_mixed"]),
            fmt(ratio(a["batch_tok_s_mixed"], a["batch_tok_s_alone"]), 2)
            + ("" if c is None else " " + verdict(c["batch_vs_alone"], BATCH_VS_ALONE_MIN)),
            "-" if c is None else fmt(c["batch_vs_peer"], 2) + " " + verdict(c["batch_vs_peer"], BATCH_VS_PEER_MIN),
            "-" if st is None else f"{fmt(st['batch']['ms_per_step'])} / {fmt(st['mixed']['ms_per_step'])}"]


def steps_line(steps: dict[str, Any]) -> str:
    """The step-time breakdown of an arm: ms and tokens per step by phase, and decode's share of the mixed step."""
    parts = [f"{p} {fmt(steps[p]['ms_per_step'])} ms / {fmt(steps[p]['tokens_per_step'], 2)} tokens per step"
             for p in ("alone", "batch", "mixed")]
    phases = steps["mixed"]["phases_ms"]
    share = ratio(phases.get("decode"), sum(phases.values()))
    return "; ".join(parts) + f"; llama.cpp's decode {fmt(None if share is None else share * 100)}% of the mixed step"


def render(r: dict[str, Any]) -> str:
    load = r["load"]
    rows, notes = [], []
    for tag, m in r["models"].items():
        if "skipped" in m:
            notes.append(f"- {tag}: skipped ({m['skipped']})")
            continue
        for arm, a in m["arms"].items():
            label = arm if arm != "ours_cap" else f"ours cap {r['cap']}"
            rows.append(_row(tag, label, a, m["checks"].get(arm)))
            if "steps" in a:
                notes.append(f"- {tag}, {label}: " + steps_line(a["steps"]))
        ar = m.get("arithmetic") or {}
        if ar:
            notes.append(f"- {tag}: step = {ar['a_ms']} + {ar['b_ms']} x rows ms (ours, step clock); caps whose "
                         f"prediction meets e2e <= 3x and batch >= 0.75x alone: {ar['caps_meeting_both'] or 'none'}")
    head = (f"{load['batch_streams']} closed-loop batch streams ({load['batch_tokens']} tokens) plus one interactive "
            f"request ({load['interactive_tokens']} tokens) every {load['interval_s']:.0f} s for {load['window_s']:.0f} s "
            f"after a {load['ramp_s']:.0f} s ramp; HTTP, greedy, ignore_eos; {load['rounds']} alternating rounds; "
            f"llama-server -np {r['slots']} -kvu -c {r['ctx']}. Targets (Gemma): TTFT p99 <= 500 ms, e2e p99 <= 3x "
            "the request's p50 alone, batch >= 0.75x alone and >= 0.95x llama-server's.")
    return head + "\n\n" + table(HEAD, rows) + ("\n\n" + "\n".join(notes) if notes else "")
