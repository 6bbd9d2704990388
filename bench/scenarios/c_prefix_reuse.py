"""Scenario C — prefix reuse: cold vs warm time to first token.

Time to first token of a ~1,100-token prefix + short distinct suffix, cold
(the prefix was never seen) vs warm (a second request with the same prefix),
for several different prefixes; the same pairs against ``--no-prefix-cache``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.harness.config import BenchConfig, say
from bench.harness.grpc_load import Stream, channel
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.stats import pct, ratio
from bench.harness.tables import Row, fmt, table, verdict


async def _pairs(target: str, prefixes: list[str], maker: PromptMaker, max_tokens: int) -> list[dict]:
    rows = []
    async with channel(target) as ch:
        stream = Stream(ch)
        await stream.request("warm up", 2)
        for prefix in prefixes:
            cold = await stream.request(prefix + " " + maker.words(8), max_tokens)
            warm = await stream.request(prefix + " " + maker.words(8), max_tokens)
            rows.append(
                {
                    "prompt_tokens": cold.prompt_tokens,
                    "cold_ttft_ms": cold.ttft_ms,
                    "warm_ttft_ms": warm.ttft_ms,
                    "cold_server_ttft_ms": cold.server_ttft_ms,
                    "warm_server_ttft_ms": warm.server_ttft_ms,
                    "cold_cached_tokens": cold.cached_tokens,
                    "warm_cached_tokens": warm.cached_tokens,
                    "ok": cold.ok and warm.ok,
                    "error": cold.error or warm.error,
                }
            )
        await stream.close()
    return rows


def _pair_summary(rows: list[dict]) -> dict[str, Any]:
    cold = pct([r["cold_ttft_ms"] for r in rows if r["ok"]], 50)
    warm = pct([r["warm_ttft_ms"] for r in rows if r["ok"]], 50)
    red = ratio(warm, cold)
    return {
        "pairs": rows,
        "cold_ttft_p50_ms": cold,
        "warm_ttft_p50_ms": warm,
        "reduction_pct": None if red is None else (1 - red) * 100,
    }


def run(cfg: BenchConfig) -> dict[str, Any]:
    maker = PromptMaker(cfg.model, seed=99)
    n, length = (2, 300) if cfg.quick else (5, 1100)
    prefixes = [maker.text(length) for _ in range(n)]
    out: dict[str, Any] = {"prefix_tokens": length, "prefixes": n, "max_tokens": 4}
    for label, flags in (("prefix_cache", []), ("no_prefix_cache", ["--no-prefix-cache"])):
        with GrpcServer(f"C-{label}", cfg.model, *flags, threads=cfg.threads) as srv:
            out[label] = _pair_summary(asyncio.run(_pairs(srv.target, prefixes, maker, 4)))
        s = out[label]
        say(
            f"  {label}: cold TTFT p50 {s['cold_ttft_p50_ms']:.0f} ms, warm {s['warm_ttft_p50_ms']:.1f} ms "
            f"({s['reduction_pct']:.1f}% less)"
        )
    return out


# -- summary.md ------------------------------------------------------------------------------------
def _row(label: str, x: dict[str, Any]) -> Row:
    cached = [p["warm_cached_tokens"] for p in x["pairs"]]
    return [
        label.replace("_", " "),
        fmt(x["cold_ttft_p50_ms"], 0),
        fmt(x["warm_ttft_p50_ms"], 1),
        fmt(x["reduction_pct"]) + "%",
        f"{min(cached)}-{max(cached)}" if cached else "-",
    ]


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario C."""
    rows = [_row(label, r[label]) for label in ("prefix_cache", "no_prefix_cache")]
    red = r["prefix_cache"]["reduction_pct"]
    return "\n".join(
        [
            f"{r['prefixes']} different ~{r['prefix_tokens']}-token prefixes, each sent twice with a distinct "
            f"8-word suffix; {r['max_tokens']} output tokens; client-side TTFT medians.",
            "",
            table(
                ["server", "cold TTFT p50 ms", "warm TTFT p50 ms", "reduction", "warm cached tokens"], rows
            ),
            "",
            f"- Warm vs cold TTFT: **{fmt(red)}% less** (target >= 98%: {verdict(red, 98)})",
        ]
    )
