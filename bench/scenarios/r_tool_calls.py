"""Scenario R — tool calling vs llama.cpp's ``llama-server --jinja`` on the same GGUF (issue #36's benchmark).

The suite's face of ``bench.studies.tool_calls`` (method there and in docs/benchmarks.md): fixed
conversations (single, parallel, multi-turn with results, irrelevant tools), ``tool_choice: "auto"``,
on the default model and the 1.1B shape, each with Qwen 2.5's tool-capable template; and the
auto-mode grammar's cost per decoded token. It runs on those models whatever ``--model`` says.
Targets: 100% of returned calls parse and validate, streamed calls equal the unstreamed ones in
100% of answers with calls (this server), the grammar's overhead per token <= 3%.
"""

from __future__ import annotations

from typing import Any

from bench.harness.config import BenchConfig
from bench.harness.procs import llama_server_binary
from bench.harness.tables import fmt, table, verdict
from bench.studies.tool_calls import TITLE, measure

__all__ = ["TITLE", "render", "run"]


def run(cfg: BenchConfig) -> dict[str, Any]:
    llama_server_binary()  # skip early when the peer is not built
    if cfg.quick:
        return measure(per_kind=1, per_kind_1b=1, grammar_rounds=2, per_arm=1)
    return measure(per_kind=5, per_kind_1b=2, grammar_rounds=6)


def _share(k: int, n: int) -> str:
    return f"{k}/{n}" + (f" ({k / n:.0%})" if n else "")


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario R."""
    rows = []
    for model, m in r["models"].items():
        if "skipped" in m:
            rows.append([model, "skipped: " + m["skipped"], *["-"] * 6])
            continue
        for arm, s in m["summary"].items():
            rows.append([model, arm, _share(s["answers_with_calls"], s["answers"] - s["errors"]),
                         _share(s["calls_parse"], s["calls"]), _share(s["calls_valid"], s["calls"]),
                         _share(s["streamed_equal"], s["answers_with_calls"]),
                         f"{fmt(s['answer_ms_p50'], 0)} / {fmt(s['answer_ms_p99'], 0)}",
                         " - ".join(fmt(x, 1) for x in s["load1_range"] or [])])
    head = ["model", "server", "answers with calls", "calls parse", "calls validate", "streamed = unstreamed",
            "answer p50 / p99 ms", "load1"]
    g = r["grammar_cost"]
    cost = (f"Auto-mode tool grammar per decoded token: {fmt(g['median_ms_per_token']['tools'], 2)} vs "
            f"{fmt(g['median_ms_per_token']['plain'], 2)} ms = {g['overhead_by_medians']:+.1%} by medians, "
            f"{g['overhead_median_of_rounds']:+.1%} by the median of {g['rounds']} paired rounds "
            f"(<= 3% by both: {verdict(max(g['overhead_by_medians'], g['overhead_median_of_rounds']), 0.03, False)}).")
    return table(head, rows) + "\n\n" + cost
