"""Scenario K — response cache (issue #15).

Exact: one fixed request sequence drawn from a Zipf distribution over 200
distinct greedy prompts (``ZIPF_S`` chosen so that about half of the requests
repeat an earlier one), sent by ``CLIENTS`` closed-loop clients pulling from one
shared queue (so a repeat may arrive while its first copy still runs: coalescing).
The same sequence runs against a server with the response cache (default flags)
and one with ``--response-cache-bytes 0``; both keep the prefix cache. Reported:
throughput, client TTFT p50/p99, and the server-side TTFT of the hits
(``Done.timing.ttft_ms`` of the answers with ``cache_hit``; a hit shows as
``cached_tokens > prompt_tokens`` here), p99 target <= 5 ms.

Semantic: every pair of each labelled set (paraphrases that should hit,
near-misses that must not) through ``SemanticIndex.nearest`` with the stored
question as the only entry, at the server's default threshold: hit rate on
paraphrases, false-hit rate on near-misses, 95% intervals (Wilson;
Clopper-Pearson too when SciPy is installed), per kind and over a threshold
sweep. Sets: ``tuning`` (semantic_pairs.jsonl, the guard's rules were written
looking at it), ``heldout`` (semantic_heldout.jsonl; its two false hits were
looked at when the guard's second round of rules was written), ``heldout2``
(semantic_heldout2.jsonl, written and committed before it was evaluated; its one
false hit of that evaluation was then fixed, so it is no longer blind) and
``heldout3`` (semantic_heldout3.jsonl, written blind and committed before its
single evaluation at git 793ad4a: the blind figure); the pooled held-out figure
sums heldout, heldout2 and heldout3.

``BENCH_K_PARTS=semantic`` runs the semantic half only (about a minute, no
server) and keeps the exact half of the previous result file, marked with the
git revision and date it was measured at.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import numpy as np

from bench.harness.config import BenchConfig, results_dir, say
from bench.harness.grpc_load import ReqResult, Stream, channel, gen_request, get_metrics, next_id, summarize
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.stats import latency_summary, ratio
from bench.harness.tables import fmt
from bench.scenarios.k_semantic import render_semantic, run_semantic

PROMPTS = 200
ZIPF_S = 1.0
REPEAT_TARGET = 0.5  # share of requests that repeat an earlier one
CLIENTS = 8
MAX_TOKENS = 16


# -- exact ---------------------------------------------------------------------------------------
def workload(n: int, fresh_share: float, seed: int = 15) -> list[int]:
    """``n`` prompt indices: a ``fresh_share`` of one-off prompts (indices >= PROMPTS, never repeated),
    the rest Zipf (s = ZIPF_S) over the PROMPTS popular ones."""
    weights = 1.0 / np.arange(1, PROMPTS + 1) ** ZIPF_S
    rng = np.random.default_rng(seed)
    popular = rng.choice(PROMPTS, size=n, p=weights / weights.sum())
    fresh = rng.random(n) < fresh_share
    return [PROMPTS + i if fresh[i] else int(popular[i]) for i in range(n)]


def workload_for_repeats(n: int) -> tuple[float, list[int]]:
    """The fresh share (bisected) that makes about REPEAT_TARGET of the requests repeats, and its workload."""
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if repeat_share(workload(n, mid)) > REPEAT_TARGET else (lo, mid)
    return round(lo, 3), workload(n, lo)


def repeat_share(seq: list[int]) -> float:
    seen: set[int] = set()
    repeats = 0
    for i in seq:
        repeats += i in seen
        seen.add(i)
    return repeats / len(seq)


Run = tuple[list[tuple[int, ReqResult]], float, Any]


async def _drive(target: str, prompts: list[str], order: list[int]) -> Run:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in order:
        queue.put_nowait(i)
    async with channel(target) as ch:
        warm = Stream(ch)
        await warm.request("warm up", 2)
        await warm.close()
        before = (await get_metrics(ch)).response_cache

        async def client() -> list[tuple[int, ReqResult]]:
            stream, out = Stream(ch), []
            while not queue.empty():
                i = queue.get_nowait()
                out.append((i, await stream.send(gen_request(next_id(), prompts[i], MAX_TOKENS))))
            await stream.close()
            return out

        t0 = time.perf_counter()
        groups = await asyncio.gather(*(client() for _ in range(CLIENTS)))
        wall = time.perf_counter() - t0
        after = (await get_metrics(ch)).response_cache
    deltas = {f: getattr(after, f) - getattr(before, f) for f in ("hits", "misses", "coalesced", "stores")}
    return [r for g in groups for r in g], wall, deltas


def _split_hits(pairs: list[tuple[int, ReqResult]]) -> tuple[list[ReqResult], list[ReqResult]]:
    """Hits (``cached_tokens`` > prompt: the whole answer was cached) split into stored ones (an identical
    request had ended before this one was sent) and coalesced ones (it was still running)."""
    ends: dict[int, list[float]] = {}
    for i, r in pairs:
        ends.setdefault(i, []).append(r.end)
    stored: list[ReqResult] = []
    coalesced: list[ReqResult] = []
    for i, r in pairs:
        if r.ok and r.cached_tokens > r.prompt_tokens:
            (stored if any(e <= r.start for e in ends[i]) else coalesced).append(r)
    return stored, coalesced


def _exact_run(
    label: str, cfg: BenchConfig, prompts: list[str], order: list[int], *flags: str
) -> dict[str, Any]:
    with GrpcServer(f"K-{label}", cfg.model, *flags, threads=cfg.threads) as srv:
        pairs, wall, cache = asyncio.run(_drive(srv.target, prompts, order))
    out = summarize([r for _, r in pairs], wall)
    stored, coalesced = _split_hits(pairs)
    out["cache"] = cache
    out["hits_seen"] = len(stored) + len(coalesced)
    out["stored_hits"] = len(stored)
    out["coalesced_hits"] = len(coalesced)
    out["hit_server_ttft"] = latency_summary([r.server_ttft_ms for r in stored])
    out["hit_client_ttft"] = latency_summary([r.ttft_ms for r in stored if r.ttft_ms is not None])
    out["coalesced_server_ttft"] = latency_summary([r.server_ttft_ms for r in coalesced])
    say(
        f"  {label}: {fmt(out['req_s'], 2)} req/s, {fmt(out['tok_s'])} tok/s, TTFT p50 {fmt(out['ttft']['p50_ms'])} "
        f"p99 {fmt(out['ttft']['p99_ms'])} ms; stored hits {len(stored)} (server TTFT p99 "
        f"{fmt(out['hit_server_ttft']['p99_ms'], 2)} ms), coalesced {len(coalesced)} (server TTFT p50 "
        f"{fmt(out['coalesced_server_ttft']['p50_ms'])} ms)"
    )
    return out


def run_exact(cfg: BenchConfig) -> dict[str, Any]:
    maker = PromptMaker(cfg.model, seed=1515)
    n = 80 if cfg.quick else 400
    fresh_share, order = workload_for_repeats(n)
    prompts = maker.unique(PROMPTS + n, 40, 80)
    out: dict[str, Any] = {
        "prompts": PROMPTS,
        "zipf_s": ZIPF_S,
        "fresh_share": fresh_share,
        "requests": n,
        "repeat_share": repeat_share(order),
        "clients": CLIENTS,
        "max_tokens": MAX_TOKENS,
    }
    say(f"  {n} requests, {out['repeat_share']:.1%} repeat an earlier one")
    out["no_cache"] = _exact_run("no_cache", cfg, prompts, order, "--response-cache-bytes", "0")
    out["cache"] = _exact_run("cache", cfg, prompts, order, "--response-cache-bytes", str(64 << 20))
    out["throughput_ratio"] = ratio(out["cache"]["req_s"], out["no_cache"]["req_s"])
    out["ttft_p50_ratio"] = ratio(out["cache"]["ttft"]["p50_ms"], out["no_cache"]["ttft"]["p50_ms"])
    out["ttft_p99_ratio"] = ratio(out["cache"]["ttft"]["p99_ms"], out["no_cache"]["ttft"]["p99_ms"])
    return out


def _previous_exact() -> dict[str, Any]:
    """The exact half of the last result file, with where and when it was measured."""
    path = results_dir() / "response_cache.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    exact = doc.get("results", {}).get("exact")
    if exact is None:
        raise RuntimeError(f"BENCH_K_PARTS=semantic needs an earlier full K result in {path}")
    m = doc.get("machine", {})
    measured = exact.get("measured") or {k: m.get(k) for k in ("date", "git_rev", "loadavg_at_start")}
    return exact | {"measured": measured}


def run(cfg: BenchConfig) -> dict[str, Any]:
    parts = set(os.environ.get("BENCH_K_PARTS", "exact,semantic").split(","))
    if "exact" in parts:
        say("  exact cache: Zipf workload with and without the cache")
        exact = run_exact(cfg)
    else:
        exact = _previous_exact()
        say(
            f"  exact cache: kept from {exact['measured'].get('date')} (git {exact['measured'].get('git_rev')})"
        )
    say("  semantic cache: labelled pairs")
    return {"exact": exact, "semantic": run_semantic(cfg)}


# -- summary.md ------------------------------------------------------------------------------------
def _exact_row(label: str, x: dict[str, Any]) -> str:
    return (
        f"| {label} | {fmt(x['req_s'], 2)} | {fmt(x['tok_s'])} | {fmt(x['ttft']['p50_ms'])} | "
        f"{fmt(x['ttft']['p99_ms'])} | {x['stored_hits']} | {fmt(x['hit_server_ttft']['p99_ms'], 2)} | "
        f"{x['coalesced_hits']} | {fmt(x['coalesced_server_ttft']['p50_ms'])} |"
    )


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario K: the exact cache's table, then the semantic half's."""
    e, s = r["exact"], r["semantic"]
    out = [
        f"Exact: {e['requests']} greedy requests: {e['fresh_share']:.0%} one-off prompts, the rest Zipf "
        f"s={e['zipf_s']} over {e['prompts']} prompts ({e['repeat_share']:.0%} of all requests repeat an earlier "
        f"one), {e['clients']} clients, {e['max_tokens']} tokens each.",
        "",
        "| server | req/s | tok/s | TTFT p50 ms | TTFT p99 ms | stored hits | their TTFT p99 at the server, ms "
        "| coalesced | their TTFT p50 at the server, ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    out += [_exact_row(label, e[label]) for label in ("no_cache", "cache")]
    out.append(
        f"\nThroughput x{fmt(e['throughput_ratio'], 2)}; TTFT p50 x{fmt(e['ttft_p50_ratio'], 2)}, "
        f"p99 x{fmt(e['ttft_p99_ratio'], 2)} (cache / no cache)."
    )
    if "measured" in e:
        out.append(
            f"(Exact half measured {e['measured'].get('date')} at git {e['measured'].get('git_rev')}.)"
        )
    if "skipped" in s:
        out.append(f"\nSemantic: skipped ({s['skipped']}).")
        return "\n".join(out)
    return "\n".join(out + render_semantic(s))
