"""Scenarios C and D — prefix reuse.

C: time to first token of a ~1,100-token prefix + short distinct suffix, cold
(the prefix was never seen) vs warm (a second request with the same prefix),
for several different prefixes; the same pairs against ``--no-prefix-cache``.

D: 32 distinct ~500-token system prompts used round-robin by 8 concurrent
clients. A first pass over all 32 fills the cache; the measured passes report
the prefix hit rate (GetMetrics kv counters, delta over the measured passes)
and TTFT, against the same load with ``--no-prefix-cache``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.common import BenchConfig, latency_summary, pct, ratio, say
from bench.grpc_load import Stream, channel, closed_loop, get_metrics, summarize
from bench.procs import GrpcServer
from bench.prompts import PromptMaker

# -- C: cold vs warm ------------------------------------------------------------------------------


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


def run_cold_warm(cfg: BenchConfig) -> dict[str, Any]:
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


# -- D: many prefixes ------------------------------------------------------------------------------

D_CLIENTS = 8


def _round_robin(systems: list[str], maker: PromptMaker, rounds: int) -> list[list[str]]:
    """Requests k = 0, 1, ... use system prompt k % len(systems); client i takes every 8th request."""
    total = len(systems) * rounds
    reqs = [systems[k % len(systems)] + "\nUser: " + maker.words(12) for k in range(total)]
    return [reqs[i::D_CLIENTS] for i in range(D_CLIENTS)]


def _kv_counters(m: Any) -> tuple[int, int]:
    return m.kv.prefix_hit_tokens, m.kv.prompt_tokens


async def _many(target: str, fill: list[list[str]], measured: list[list[str]], max_tokens: int) -> dict:
    async with channel(target) as ch:
        first = None
        if fill:  # without a prefix cache the fill pass would change nothing: skipped
            t0 = time.perf_counter()
            first = summarize(await closed_loop(ch, fill, max_tokens), time.perf_counter() - t0)
        m0 = await get_metrics(ch)
        t0 = time.perf_counter()
        results = await closed_loop(ch, measured, max_tokens)
        row = summarize(results, time.perf_counter() - t0)
        m1 = await get_metrics(ch)
    hits, prompts = (a - b for a, b in zip(_kv_counters(m1), _kv_counters(m0), strict=True))
    row.update(
        first_pass=first,
        prefix_hit_tokens=hits,
        prompt_tokens=prompts,
        prefix_hit_rate=hits / prompts if prompts else None,
        evictions=m1.kv.evictions,
        holder_seq_ids=m1.kv.holder_seq_ids,
        blocks_cached=m1.kv.blocks_cached,
        server_ttft=latency_summary([r.server_ttft_ms for r in results if r.ok]),
    )
    return row


def run_many_prefixes(cfg: BenchConfig) -> dict[str, Any]:
    maker = PromptMaker(cfg.model, seed=4242)
    n_sys, length, rounds, ctx = (12, 150, 2, 8192) if cfg.quick else (32, 500, 2, 24576)
    systems = [maker.text(length) for _ in range(n_sys)]
    fill = _round_robin(systems, maker, 1)
    measured = _round_robin(systems, maker, rounds)
    out: dict[str, Any] = {
        "system_prompts": n_sys,
        "system_prompt_tokens": length,
        "clients": D_CLIENTS,
        "measured_requests": n_sys * rounds,
        "ctx": ctx,
        "max_tokens": 16,
    }
    # NOTE: the workload's working set (n_sys x length tokens) is sized into the
    # cache explicitly, as an operator would; the default cache is 2,048 tokens.
    cache = ["--prefix-cache-tokens", str(ctx - 4096)]
    out["prefix_cache_tokens"] = ctx - 4096
    for label, flags in (("prefix_cache", cache), ("no_prefix_cache", ["--no-prefix-cache"])):
        with GrpcServer(f"D-{label}", cfg.model, "--ctx", str(ctx), *flags, threads=cfg.threads) as srv:
            row = asyncio.run(_many(srv.target, fill if label == "prefix_cache" else [], measured, 16))
        out[label] = row
        say(
            f"  {label}: hit rate {(row['prefix_hit_rate'] or 0) * 100:.1f}%, TTFT p50 "
            f"{row['ttft']['p50_ms']:.0f} ms p99 {row['ttft']['p99_ms']:.0f} ms, {row['tok_s']:.1f} tok/s, "
            f"{row['failed']} failed"
        )
    out["slot_baseline_note"] = (
        f"A slot-based server (llama-server with {D_CLIENTS} slots) keeps at most one prompt per slot: "
        f"round-robin over {n_sys} distinct system prompts finds the same prompt in a slot only by chance "
        "after it was overwritten by another, so its hit rate is ~0%; --no-prefix-cache shows that cost."
    )
    return out
