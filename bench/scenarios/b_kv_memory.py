"""Scenario B — KV memory: a pool sized for the real need vs the naive per-request reservation.

8 concurrent requests, prompts of 50-500 tokens and 1-256 output tokens
(seeded, ignore_eos), each allowed a 4096-token context. The naive layout
reserves 8 x 4096 tokens; our server shares one pool of ``--ctx`` tokens and a
sequence takes blocks only as it grows. The same load runs against a server
with ``--ctx 32768`` (the naive reservation) to compare what llama.cpp
allocated (GetMetrics kv.kv_buffer_bytes) and the process RSS (VmRSS sampled
every 100 ms); blocks in use over time (and their peak) come from polling GetMetrics
every 50 ms.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import grpc

from bench.harness.config import BenchConfig, say
from bench.harness.grpc_load import ReqResult, Stream, channel, get_metrics
from bench.harness.procs import GrpcServer, RssSampler, rss_bytes
from bench.harness.prompts import PromptMaker
from bench.harness.stats import ratio
from bench.harness.tables import Row, fmt, mib, table, verdict

CLIENTS = 8
PER_REQUEST_CTX = 4096
POOL_CTX = 4096  # our pool for all 8 requests
NAIVE_CTX = CLIENTS * PER_REQUEST_CTX


def _workload(cfg: BenchConfig) -> list[tuple[str, int]]:
    rng = random.Random(7)
    maker = PromptMaker(cfg.model, seed=7)
    lo, hi, out_hi = (50, 120, 32) if cfg.quick else (50, 500, 256)
    return [(maker.text(rng.randint(lo, hi)), rng.randint(1, out_hi)) for _ in range(CLIENTS)]


async def _poll_blocks(ch: grpc.aio.Channel, stop: asyncio.Event, timeline: dict[str, list[Any]]) -> None:
    """Sample blocks in use and running requests every 50 ms into ``timeline`` (for the peak and the chart)."""
    t0 = time.perf_counter()
    while not stop.is_set():
        m = await get_metrics(ch)
        timeline["t_s"].append(round(time.perf_counter() - t0, 3))
        timeline["used"].append(m.kv.blocks_used)
        timeline["cached"].append(m.kv.blocks_cached)
        timeline["running"].append(m.running)
        await asyncio.sleep(0.05)


async def _drive(target: str, work: list[tuple[str, int]]) -> dict[str, Any]:
    timeline: dict[str, list[Any]] = {"t_s": [], "used": [], "cached": [], "running": []}
    async with channel(target) as ch:
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll_blocks(ch, stop, timeline))
        streams = [Stream(ch) for _ in work]
        t0 = time.perf_counter()
        results: list[ReqResult] = await asyncio.gather(
            *(s.request(p, n) for s, (p, n) in zip(streams, work, strict=True))
        )
        wall = time.perf_counter() - t0
        stop.set()
        await poller
        for s in streams:
            await s.close()
        m = await get_metrics(ch)
    return {
        "completed": sum(r.ok for r in results),
        "requests": len(results),
        "errors": sorted({r.error for r in results if not r.ok}),
        "tokens": sum(r.tokens for r in results),
        "wall_s": round(wall, 3),
        "preemptions": sum(r.preemptions for r in results),
        "preemptions_by_reason": dict(m.preemptions_by_reason),
        "peak_blocks_used": max(timeline["used"], default=0),
        "peak_running": max(timeline["running"], default=0),
        "blocks_total": m.kv.blocks_total,
        "block_size": m.kv.block_size,
        "bytes_per_block": m.kv.bytes_per_block,
        "kv_buffer_bytes": m.kv.kv_buffer_bytes,
        "blocks_timeline": timeline,  # GetMetrics every 50 ms: t_s, used, cached, running
    }


def _server_run(cfg: BenchConfig, ctx: int, work: list[tuple[str, int]]) -> dict[str, Any]:
    flags = ["--ctx", str(ctx), "--max-running", str(CLIENTS)]
    with GrpcServer(f"B-ctx{ctx}", cfg.model, *flags, threads=cfg.threads) as srv:
        idle_rss = rss_bytes(srv.pid)
        with RssSampler(srv.pid) as rss:
            row = asyncio.run(_drive(srv.target, work))
        row.update(ctx=ctx, rss_idle_bytes=idle_rss, rss_peak_bytes=rss.peak, rss_samples=rss.samples)
    say(
        f"  --ctx {ctx}: KV buffer {row['kv_buffer_bytes'] / 2**20:.1f} MiB, RSS peak "
        f"{row['rss_peak_bytes'] / 2**20:.0f} MiB, "
        f"peak blocks {row['peak_blocks_used']}/{row['blocks_total']}, "
        f"{row['completed']}/{row['requests']} completed, {row['preemptions']} preemptions"
    )
    return row


def _less(ours: float | None, naive: float | None) -> float | None:
    r = ratio(ours, naive)
    return None if r is None else (1.0 - r) * 100.0


def run(cfg: BenchConfig) -> dict[str, Any]:
    work = _workload(cfg)
    maker = PromptMaker(cfg.model, seed=7)
    prompt_tokens = [maker.tokens(p) for p, _ in work]
    ours = _server_run(cfg, POOL_CTX, work)
    naive = _server_run(cfg, NAIVE_CTX, work)
    bytes_per_token = ours["bytes_per_block"] / max(ours["block_size"], 1)
    naive_need = NAIVE_CTX * bytes_per_token
    peak_need = ours["peak_blocks_used"] * ours["bytes_per_block"]
    out = {
        "clients": CLIENTS,
        "per_request_context": PER_REQUEST_CTX,
        "prompt_tokens": prompt_tokens,
        "max_tokens": [n for _, n in work],
        "ours": ours,
        "naive": naive,
        "kv_bytes_naive_layout": naive_need,
        "kv_bytes_peak_in_use": peak_need,
        "pct_less_kv_buffer": _less(ours["kv_buffer_bytes"], naive["kv_buffer_bytes"]),
        "pct_less_peak_in_use_vs_naive": _less(peak_need, naive_need),
        "pct_less_rss_peak": _less(ours["rss_peak_bytes"], naive["rss_peak_bytes"]),
        "rss_peak_saved_bytes": naive["rss_peak_bytes"] - ours["rss_peak_bytes"],
        "all_completed": ours["completed"] == CLIENTS and naive["completed"] == CLIENTS,
    }
    say(
        f"  KV buffer {out['pct_less_kv_buffer']:.1f}% less; peak in use vs naive "
        f"{out['pct_less_peak_in_use_vs_naive']:.1f}% less; RSS peak {out['pct_less_rss_peak']:.1f}% less"
    )
    return out


# -- summary.md ------------------------------------------------------------------------------------
HEAD = [
    "server",
    "--ctx",
    "KV buffer MiB",
    "RSS idle MiB",
    "RSS peak MiB",
    "peak blocks used",
    "peak KV in use MiB",
    "completed",
    "preemptions",
]


def _row(label: str, x: dict[str, Any]) -> Row:
    return [
        label,
        str(x["ctx"]),
        mib(x["kv_buffer_bytes"]),
        mib(x["rss_idle_bytes"]),
        mib(x["rss_peak_bytes"]),
        f"{x['peak_blocks_used']}/{x['blocks_total']}",
        mib(x["peak_blocks_used"] * x["bytes_per_block"]),
        f"{x['completed']}/{x['requests']}",
        str(x["preemptions"]),
    ]


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario B."""
    rows = [
        _row(label, r[key]) for label, key in (("ours (shared pool)", "ours"), ("naive (8 x 4096)", "naive"))
    ]
    less = r["pct_less_kv_buffer"]
    return "\n".join(
        [
            f"{r['clients']} concurrent requests, prompts {min(r['prompt_tokens'])}-{max(r['prompt_tokens'])} "
            f"tokens, outputs {min(r['max_tokens'])}-{max(r['max_tokens'])} tokens (ignore_eos), up to "
            f"{r['per_request_context']} tokens of context each.",
            "",
            table(HEAD, rows),
            "",
            f"- KV buffer allocated: **{fmt(less)}% less** than the naive layout "
            f"(target >= 80%: {verdict(less, 80)})",
            f"- Peak KV in use ({mib(r['kv_bytes_peak_in_use'])} MiB) vs naive reservation "
            f"({mib(r['kv_bytes_naive_layout'])} MiB): {fmt(r['pct_less_peak_in_use_vs_naive'])}% less",
            f"- Process RSS peak: {fmt(r['pct_less_rss_peak'])}% less "
            f"({mib(r['rss_peak_saved_bytes'])} MiB saved; RSS includes weights and runtime)",
            f"- All requests completed on both servers: {'yes' if r['all_completed'] else 'NO'}",
        ]
    )
