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

Semantic: every pair of bench/data/semantic_pairs.jsonl (paraphrases that
should hit, near-misses that must not) through ``SemanticIndex.nearest`` with
the stored question as the only entry, at the server's default threshold:
hit rate on paraphrases, false-hit rate on near-misses, 95% intervals (Wilson;
Clopper-Pearson too when SciPy is installed), per kind and over a threshold sweep.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import BenchConfig, fmt, latency_summary, ratio, say
from bench.grpc_load import ReqResult, Stream, channel, gen_request, get_metrics, next_id, summarize
from bench.procs import GrpcServer
from bench.prompts import PromptMaker
from service.config import ServerConfig

PROMPTS = 200
ZIPF_S = 1.0
REPEAT_TARGET = 0.5  # share of requests that repeat an earlier one
CLIENTS = 8
MAX_TOKENS = 16
PAIRS = Path(__file__).resolve().parent / "data" / "semantic_pairs.jsonl"
HELDOUT = Path(__file__).resolve().parent / "data" / "semantic_heldout.jsonl"  # written after the rules
SWEEP = (0.85, 0.88, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97)


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


# -- semantic ------------------------------------------------------------------------------------
def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def clopper_pearson(k: int, n: int) -> tuple[float, float] | None:
    try:
        from scipy.stats import beta
    except ImportError:
        return None
    lo = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return (lo, hi)


def _rate(k: int, n: int) -> dict[str, Any]:
    return {
        "k": k,
        "n": n,
        "rate": k / n if n else None,
        "wilson95": wilson(k, n),
        "clopper_pearson95": clopper_pearson(k, n),
    }


def _evaluate(rows: list[dict[str, Any]], vectors: dict[str, Any], index: Any, guard: bool) -> dict[str, Any]:
    """Hit rates of ``rows`` through ``index`` (one stored question at a time), or by similarity alone."""
    hits: dict[str, list[int]] = {}
    for r in rows:
        if guard:
            index.add("s", r["a"], vectors[r["a"]], "k")
            hit = index.nearest("s", r["b"], vectors[r["b"]]) == "k"
        else:
            hit = float(vectors[r["a"]] @ vectors[r["b"]]) >= index.threshold
        hits.setdefault(r["kind"], []).append(int(hit))
    para = hits.pop("paraphrase")
    near = [h for kind in hits.values() for h in kind]
    return {
        "hit": _rate(sum(para), len(para)),
        "false_hit": _rate(sum(near), len(near)),
        "false_hit_by_kind": {k: _rate(sum(v), len(v)) for k, v in sorted(hits.items())},
    }


def _semantic_set(model: Any, path: Path, threshold: float) -> dict[str, Any]:
    from service.response_cache.semantic import SemanticIndex

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
    vectors = dict(zip(texts, model.embed_many(texts), strict=True))
    out: dict[str, Any] = {"file": path.name, "pairs": len(rows)}
    out["default"] = _evaluate(rows, vectors, SemanticIndex(model, threshold), guard=True)
    out["similarity_only"] = _evaluate(rows, vectors, SemanticIndex(model, threshold), guard=False)
    out["sweep"] = {str(th): _evaluate(rows, vectors, SemanticIndex(model, th), guard=True) for th in SWEEP}
    d = out["default"]
    say(
        f"  {path.name} @ {threshold}: hit {d['hit']['rate']:.1%} of {d['hit']['n']} paraphrases, false hits "
        f"{d['false_hit']['k']}/{d['false_hit']['n']} = {d['false_hit']['rate']:.2%} "
        f"(95% Wilson upper {d['false_hit']['wilson95'][1]:.2%}); similarity alone: false "
        f"{out['similarity_only']['false_hit']['rate']:.2%}"
    )
    return out


def run_semantic(cfg: BenchConfig) -> dict[str, Any]:
    """The tuning set (the fact guard's rules were written looking at it) and the held-out set."""
    from service.response_cache.semantic import MiniLM, SemanticUnavailable

    try:
        model = MiniLM()
    except SemanticUnavailable as exc:
        return {"skipped": str(exc)}
    texts = [json.loads(line)["b"] for line in PAIRS.read_text().splitlines()[:50]]
    t0 = time.perf_counter()
    for t in texts:  # per-message latency, one at a time as the server embeds
        model.embed(t)
    threshold = ServerConfig().semantic_cache_threshold
    out: dict[str, Any] = {
        "threshold": threshold,
        "embed_ms_per_message": (time.perf_counter() - t0) * 1e3 / len(texts),
    }
    out["tuning"] = _semantic_set(model, PAIRS, threshold)
    out["heldout"] = _semantic_set(model, HELDOUT, threshold)
    return out


def run(cfg: BenchConfig) -> dict[str, Any]:
    say("  exact cache: Zipf workload with and without the cache")
    exact = run_exact(cfg)
    say("  semantic cache: labelled pairs")
    return {"exact": exact, "semantic": run_semantic(cfg)}


# -- summary.md ------------------------------------------------------------------------------------
def _pct(r: dict[str, Any]) -> str:
    lo, hi = r["wilson95"]
    return f"{r['k']}/{r['n']} = {r['rate']:.1%} (95% CI {lo:.1%}-{hi:.1%})"


def render(r: dict[str, Any]) -> str:
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
    for label in ("no_cache", "cache"):
        x = e[label]
        out.append(
            f"| {label} | {fmt(x['req_s'], 2)} | {fmt(x['tok_s'])} | {fmt(x['ttft']['p50_ms'])} | "
            f"{fmt(x['ttft']['p99_ms'])} | {x['stored_hits']} | {fmt(x['hit_server_ttft']['p99_ms'], 2)} | "
            f"{x['coalesced_hits']} | {fmt(x['coalesced_server_ttft']['p50_ms'])} |"
        )
    out.append(
        f"\nThroughput x{fmt(e['throughput_ratio'], 2)}; TTFT p50 x{fmt(e['ttft_p50_ratio'], 2)}, "
        f"p99 x{fmt(e['ttft_p99_ratio'], 2)} (cache / no cache)."
    )
    if "skipped" in s:
        out.append(f"\nSemantic: skipped ({s['skipped']}).")
        return "\n".join(out)
    out.append(f"\nSemantic, threshold {s['threshold']}, {s['embed_ms_per_message']:.1f} ms per embedding:")
    for name in ("tuning", "heldout"):
        x = s[name]
        d = x["default"]
        out.append(
            f"\n{name} set ({x['file']}, {x['pairs']} pairs): paraphrase hits {_pct(d['hit'])}; near-miss false "
            f"hits {_pct(d['false_hit'])}; similarity alone: false hits {_pct(x['similarity_only']['false_hit'])}."
        )
    out += [
        "",
        "| threshold | tuning: hit rate | false hits | 95% upper | held-out: hit rate | false hits | 95% upper |",
        "|---|---|---|---|---|---|---|",
    ]
    for th in s["tuning"]["sweep"]:
        cells = []
        for name in ("tuning", "heldout"):
            v = s[name]["sweep"][th]
            fh = v["false_hit"]
            cells.append(f"{v['hit']['rate']:.1%} | {fh['k']}/{fh['n']} | {fh['wilson95'][1]:.1%}")
        out.append(f"| {th} | " + " | ".join(cells) + " |")
    return "\n".join(out)
    d = s["default"]
    out += [
        f"\nSemantic ({s['pairs']} labelled pairs, threshold {s['threshold']}): paraphrase hits {_pct(d['hit'])}; "
        f"near-miss false hits {_pct(d['false_hit'])}; similarity alone: false hits "
        f"{_pct(s['similarity_only']['false_hit'])}.",
        "",
        "| threshold | paraphrase hit rate | false hits | false-hit 95% upper |",
        "|---|---|---|---|",
    ]
    for th, v in s["sweep"].items():
        fh = v["false_hit"]
        out.append(f"| {th} | {v['hit']['rate']:.1%} | {fh['k']}/{fh['n']} | {fh['wilson95'][1]:.1%} |")
    return "\n".join(out)
