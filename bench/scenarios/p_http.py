"""Scenario P — the OpenAI HTTP API: this server over HTTP vs over gRPC vs llama.cpp's ``llama-server``.

The same closed-loop load on the benchmark model: C clients, each sending
unique 30-60 token prompts one after another, greedy, 64 tokens fixed by
``ignore_eos``, streamed. Three arms at C = 1, 8, 16, 32:

* ``http``: this server's ``/v1/completions`` (``--http-port``), SSE;
* ``grpc``: the same server process over ``Generate`` (one stream per client);
* ``llama_server``: llama.cpp's ``llama-server`` built from the llama.cpp that
  llama-cpp-python vendors (``make llama-tools``; ``LLAMA_SERVER`` overrides the
  path), ``-np C`` slots on one unified KV cache (``-kvu``) of the same size as
  ``--ctx``, the same threads.

Arms alternate within each level (the order reverses every round) so drift and
neighbours hit all three alike; each arm run gets fresh prompts (no prefix
reuse), and the load average (``uptime``) is recorded before every arm run.
Targets: HTTP >= 0.95x gRPC tok/s at every C; HTTP >= 1.1x llama-server tok/s
at every C; HTTP TTFT p50 below llama-server's at C >= 8.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.harness.config import BenchConfig, say
from bench.harness.grpc_load import ReqResult, channel, closed_loop, summarize
from bench.harness.procs import GrpcServer, LlamaServer, free_port, llama_server_binary
from bench.harness.prompts import PromptMaker
from bench.harness.results import load_now
from bench.harness.stats import ratio
from bench.harness.tables import fmt, table, verdict

LEVELS = (1, 8, 16, 32)
PER_CLIENT = {1: 8, 8: 3, 16: 2, 32: 2}  # requests per client in one arm run
QUICK_PER_CLIENT = {1: 2, 8: 1}
CTX = 8192
ARMS = ("grpc", "http", "llama_server")
TTFT_FROM = 8  # the TTFT target applies from this many streams


async def _arm(arm: str, ours: GrpcServer, http_url: str, peer_url: str, prompts: list[list[str]],
               max_tokens: int, model: str) -> list[ReqResult]:
    from bench.harness import sse_load  # NOTE: httpx is a bench-env dependency

    if arm == "grpc":
        async with channel(ours.target) as ch:
            return await closed_loop(ch, prompts, max_tokens)
    url = http_url if arm == "http" else peer_url
    return await sse_load.closed_loop(url, model if arm == "http" else "peer", prompts, max_tokens)


def _level(cfg: BenchConfig, ours: GrpcServer, http_port: int, c: int, maker: PromptMaker, rounds: int,
           max_tokens: int) -> dict[str, Any]:
    per = (QUICK_PER_CLIENT if cfg.quick else PER_CLIENT)[c]
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
    pooled: dict[str, list[ReqResult]] = {a: [] for a in ARMS}
    model = Path(cfg.model).name.removesuffix(".gguf")
    with LlamaServer(f"P-llama-server-np{c}", llama_server_binary(), cfg.model, parallel=c, ctx=CTX,
                     threads=cfg.server_threads()) as peer:
        warm = [["warm up the server"]]
        for url, name in ((f"http://127.0.0.1:{http_port}", model), (peer.base_url, "peer")):
            from bench.harness import sse_load

            asyncio.run(sse_load.closed_loop(url, name, warm, 4))
        for r in range(rounds):
            for arm in ARMS if r % 2 == 0 else tuple(reversed(ARMS)):
                load = load_now()
                prompts = [maker.unique(per, 30, 60) for _ in range(c)]
                t0 = time.perf_counter()
                results = asyncio.run(_arm(arm, ours, f"http://127.0.0.1:{http_port}", peer.base_url, prompts,
                                           max_tokens, model))
                row = summarize(results, time.perf_counter() - t0)
                runs[arm].append({"round": r, **load, **row})
                pooled[arm] += results
                say(f"    C={c:>2} round {r} {arm:>12}: {row['tok_s']:.1f} tok/s, TTFT p50 "
                    f"{row['ttft']['p50_ms']:.0f} ms p99 {row['ttft']['p99_ms']:.0f} ms "
                    f"({row['failed']} failed; load1 {load['load1']:.2f})")
    out: dict[str, Any] = {"requests_per_client": per, "runs": runs}
    for arm in ARMS:
        wall = sum(x["wall_s"] for x in runs[arm])
        out[arm] = summarize(pooled[arm], wall)  # tokens over the arm's summed wall time; pooled TTFTs
    return out


def run(cfg: BenchConfig) -> dict[str, Any]:
    llama_server_binary()  # skip early when the peer is not built
    levels = (1, 8) if cfg.quick else LEVELS
    rounds = 1 if cfg.quick else 2
    max_tokens = 16 if cfg.quick else 64
    http_port = free_port()
    maker = PromptMaker(cfg.model, seed=2727)
    out: dict[str, Any] = {"max_tokens": max_tokens, "prompt_tokens": "30-60", "rounds": rounds, "ctx": CTX,
                           "levels": {}}
    flags = ["--http-port", str(http_port), "--max-running", "32", "--ctx", str(CTX)]
    with GrpcServer("P-ours", cfg.model, *flags, threads=cfg.threads) as ours:
        for c in levels:
            say(f"  C={c}: arms {', '.join(ARMS)} alternating, {rounds} rounds")
            out["levels"][str(c)] = _level(cfg, ours, http_port, c, maker, rounds, max_tokens)
    out["ratios"] = _ratios(out["levels"])
    for k, v in out["ratios"].items():
        say(f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: -")
    return out


def _ratios(levels: dict[str, Any]) -> dict[str, float | None]:
    r: dict[str, float | None] = {}
    for c, lv in levels.items():
        r[f"http_vs_grpc_C{c}"] = ratio(lv["http"]["tok_s"], lv["grpc"]["tok_s"])
        r[f"http_vs_llama_server_C{c}"] = ratio(lv["http"]["tok_s"], lv["llama_server"]["tok_s"])
        r[f"ttft_p50_http_over_llama_server_C{c}"] = ratio(
            lv["http"]["ttft"]["p50_ms"], lv["llama_server"]["ttft"]["p50_ms"]
        )
    return r


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario P."""
    rows = []
    for c, lv in r["levels"].items():
        h, g, p = lv["http"], lv["grpc"], lv["llama_server"]
        ttft_ok = "n/a" if int(c) < TTFT_FROM else ("met" if h["ttft"]["p50_ms"] < p["ttft"]["p50_ms"] else "NOT met")
        rows.append([
            c, fmt(h["tok_s"]), fmt(g["tok_s"]), fmt(p["tok_s"]),
            fmt(r["ratios"][f"http_vs_grpc_C{c}"], 3) + " " + verdict(r["ratios"][f"http_vs_grpc_C{c}"], 0.95),
            fmt(r["ratios"][f"http_vs_llama_server_C{c}"], 2) + " "
            + verdict(r["ratios"][f"http_vs_llama_server_C{c}"], 1.1),
            f"{fmt(h['ttft']['p50_ms'], 0)} / {fmt(h['ttft']['p99_ms'], 0)}",
            f"{fmt(g['ttft']['p50_ms'], 0)} / {fmt(g['ttft']['p99_ms'], 0)}",
            f"{fmt(p['ttft']['p50_ms'], 0)} / {fmt(p['ttft']['p99_ms'], 0)}", ttft_ok,
        ])
    head = ["C", "HTTP tok/s", "gRPC tok/s", "llama-server tok/s", "HTTP/gRPC (>= 0.95)",
            "HTTP/llama-server (>= 1.1)", "HTTP TTFT p50/p99 ms", "gRPC TTFT p50/p99", "llama-server TTFT p50/p99",
            "TTFT p50 < peer (C >= 8)"]
    note = (f"{r['max_tokens']} greedy tokens (ignore_eos) per request, {r['prompt_tokens']}-token unique prompts, "
            f"{r['rounds']} alternating rounds per level; llama-server -np C -kvu -c {r['ctx']}.")
    return note + "\n\n" + table(head, rows)
