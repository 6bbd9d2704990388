"""Scenario D — many prefixes: 32 system prompts round-robin, prefix hit rate vs ``--no-prefix-cache``.

32 distinct ~500-token system prompts used round-robin by 8 concurrent
clients. A first pass over all 32 fills the cache; the measured passes report
the prefix hit rate (GetMetrics kv counters, delta over the measured passes)
and TTFT, against the same load with ``--no-prefix-cache``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.harness.config import BenchConfig, say
from bench.harness.grpc_load import channel, closed_loop, get_metrics, summarize
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.stats import latency_summary
from bench.harness.tables import Row, dig, fmt, table, verdict

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


def _slot_baseline_note(n_sys: int) -> str:
    return (
        f"A slot-based server (llama-server with {D_CLIENTS} slots) keeps at most one prompt per slot: "
        f"round-robin over {n_sys} distinct system prompts finds the same prompt in a slot only by chance "
        "after it was overwritten by another, so its hit rate is ~0%; --no-prefix-cache shows that cost."
    )


def run(cfg: BenchConfig) -> dict[str, Any]:
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
    out["slot_baseline_note"] = _slot_baseline_note(n_sys)
    return out


# -- summary.md ------------------------------------------------------------------------------------
HEAD = [
    "server",
    "prefix hit rate",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "first-pass TTFT p50 ms",
    "tok/s",
    "completed",
]


def _row(label: str, x: dict[str, Any]) -> Row:
    rate = x.get("prefix_hit_rate")
    return [
        label.replace("_", " "),
        "-" if rate is None else f"{rate * 100:.1f}%",
        fmt(dig(x, "ttft", "p50_ms"), 0),
        fmt(dig(x, "ttft", "p99_ms"), 0),
        fmt(dig(x, "first_pass", "ttft", "p50_ms"), 0),
        fmt(x.get("tok_s")),
        f"{x['completed']}/{x['requests']}",
    ]


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario D."""
    rows = [_row(label, r[label]) for label in ("prefix_cache", "no_prefix_cache")]
    rate = r["prefix_cache"].get("prefix_hit_rate")
    return "\n".join(
        [
            f"{r['system_prompts']} distinct ~{r['system_prompt_tokens']}-token system prompts, round-robin, "
            f"{r['clients']} concurrent clients, --ctx {r['ctx']}; one pass fills the cache, then "
            f"{r['measured_requests']} measured requests ({r['max_tokens']} output tokens).",
            "",
            table(HEAD, rows),
            "",
            f"- Prefix hit rate (GetMetrics kv counters over the measured requests): "
            f"**{'-' if rate is None else f'{rate * 100:.1f}%'}** (target >= 90%: "
            f"{verdict(None if rate is None else rate * 100, 90)})",
            f"- Slot-style baseline: {r['slot_baseline_note']}",
        ]
    )
