"""Scenario A — throughput: continuous batching vs sequential vs the raw engine vs llama_cpp.server.

C closed-loop clients, each sending unique 30-60 token prompts one after
another with 64 greedy output tokens (ignore_eos). Every server sees every
prompt once (a fresh prompt set per concurrency level), so the prefix cache
cannot help.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import time
from typing import Any

from bench.harness.config import PYTHON, ROOT, BenchConfig, say
from bench.harness.grpc_load import channel, closed_loop, get_metrics, summarize
from bench.harness.procs import GrpcServer, LlamaCppServer
from bench.harness.prompts import PromptMaker
from bench.harness.stats import ratio
from bench.harness.tables import Row, dig, fmt, table, verdict

# concurrency -> requests per client (total requests = C x this)
FULL_LOADS = {1: 8, 4: 4, 8: 3, 16: 3, 32: 2}
QUICK_LOADS = {1: 2, 4: 1, 16: 1}
PEER_LEVELS = (1, 8, 16)
RATIO_C = 16


def _prompt_sets(cfg: BenchConfig, loads: dict[int, int]) -> dict[int, list[list[str]]]:
    maker = PromptMaker(cfg.model, seed=1234)
    return {c: [maker.unique(n, 30, 60) for _ in range(c)] for c, n in loads.items()}


def _batch_hist(m: Any) -> dict[int, int]:
    return {b.sequences: b.steps for b in m.batch_sizes}


def _mean_batch(before: dict[int, int], after: dict[int, int]) -> float | None:
    steps = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    n = sum(steps.values())
    return sum(k * v for k, v in steps.items()) / n if n else None


async def _grpc_levels(target: str, sets: dict[int, list[list[str]]], max_tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with channel(target) as ch:
        await closed_loop(ch, [["warm up the server with a short request"]], 4)
        for c, prompts in sets.items():
            before = _batch_hist(await get_metrics(ch))
            t0 = time.perf_counter()
            results = await closed_loop(ch, prompts, max_tokens)
            wall = time.perf_counter() - t0
            row = summarize(results, wall)
            row["mean_batch_size"] = _mean_batch(before, _batch_hist(await get_metrics(ch)))
            out[str(c)] = row
            say(
                f"    C={c:>2}: {row['tok_s']:.1f} tok/s, {row['req_s']:.2f} req/s, "
                f"TTFT p50 {row['ttft']['p50_ms']:.0f} ms p99 {row['ttft']['p99_ms']:.0f} ms, "
                f"mean batch {row['mean_batch_size'] or 0:.1f} ({row['failed']} failed)"
            )
    return out


def _ours(cfg: BenchConfig, label: str, flags: list[str], sets: dict[int, list[list[str]]], n: int) -> dict:
    say(f"  {label}: {' '.join(flags)}")
    with GrpcServer(f"A-{label}", cfg.model, *flags, threads=cfg.threads) as srv:
        return {"flags": flags, "levels": asyncio.run(_grpc_levels(srv.target, sets, n))}


def _peer(cfg: BenchConfig, sets: dict[int, list[list[str]]], max_tokens: int) -> dict:
    # NOTE: imported here: httpx is a bench-env dependency, and summary.md renders without it
    from bench.harness.openai_load import closed_loop as http_closed_loop

    say("  llama_cpp.server (OpenAI /v1/completions, stream=true)")
    levels: dict[str, Any] = {}
    with LlamaCppServer("A-llama_cpp_server", cfg.model, n_ctx=4096, threads=cfg.server_threads()) as srv:
        asyncio.run(http_closed_loop(srv.base_url, [["warm up the server"]], 4))
        for c, prompts in sets.items():
            t0 = time.perf_counter()
            results = asyncio.run(http_closed_loop(srv.base_url, prompts, max_tokens))
            row = summarize(results, time.perf_counter() - t0)
            row["tokens_requested"] = len(results) * max_tokens
            levels[str(c)] = row
            say(
                f"    C={c:>2}: {row['tok_s']:.1f} tok/s, TTFT p50 {row['ttft']['p50_ms']:.0f} ms "
                f"p99 {row['ttft']['p99_ms']:.0f} ms, tokens {row['tokens']}/{row['tokens_requested']}"
            )
    return {
        "levels": levels,
        "note": "sequential server: requests queue on its model lock "
        "(--interrupt_requests False); min_tokens=max_tokens stands in for ignore_eos",
    }


def _raw(cfg: BenchConfig, batches: list[int], prompts: list[str], steps: int) -> dict:
    say(f"  raw engine (ModelRunner, no server): B in {batches}")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    cmd = [
        PYTHON,
        "-m",
        "bench.harness.engine_ceiling",
        "--model",
        str(cfg.model),
        "--prompts-json",
        f.name,
        "--batches",
        ",".join(map(str, batches)),
        "--steps",
        str(steps),
        "--threads",
        str(cfg.server_threads()),
        "--repeat",
        "1" if cfg.quick else "2",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"engine_ceiling failed: {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout)
    for r in data["results"]:
        say(f"    B={r['batch']:>2}: {r['tok_s']:.1f} tok/s decode ({r['step_ms']:.1f} ms/step)")
    return {"levels": {str(r["batch"]): r for r in data["results"]}, "threads": data["threads"]}


def run(cfg: BenchConfig) -> dict[str, Any]:
    loads = QUICK_LOADS if cfg.quick else FULL_LOADS
    max_tokens = 16 if cfg.quick else 64
    sets = _prompt_sets(cfg, loads)
    out: dict[str, Any] = {
        "max_tokens": max_tokens,
        "prompt_tokens": "30-60",
        "loads": {str(c): n for c, n in loads.items()},
    }
    out["batcher"] = _ours(cfg, "batcher", ["--max-running", "32"], sets, max_tokens)
    out["sequential"] = _ours(cfg, "sequential", ["--max-running", "1"], sets, max_tokens)
    biggest = max(loads)
    out["raw"] = _raw(cfg, list(loads), [p for group in sets[biggest] for p in group][:biggest], max_tokens)
    peer_sets = {c: s for c, s in sets.items() if c in PEER_LEVELS}
    try:
        out["llama_cpp_server"] = _peer(cfg, peer_sets, max_tokens)
    except Exception as exc:
        say(f"  llama_cpp.server skipped: {exc}")
        out["llama_cpp_server"] = {"skipped": str(exc)}
    out["ratios"] = _ratios(out, list(loads))
    for k, v in out["ratios"].items():
        say(f"  {k}: {v:.2f}" if isinstance(v, float) else f"  {k}: -")
    return out


def _tok_s(section: dict, level: int, key: str = "tok_s") -> float | None:
    row = section.get("levels", {}).get(str(level))
    return row.get(key) if row else None


def _ratios(out: dict[str, Any], levels: list[int]) -> dict[str, float | None]:
    c = RATIO_C if RATIO_C in levels else max(levels)
    r: dict[str, float | None] = {
        f"batcher_vs_sequential_C{c}": ratio(_tok_s(out["batcher"], c), _tok_s(out["sequential"], c)),
        f"batcher_vs_raw_B{c}": ratio(_tok_s(out["batcher"], c), _tok_s(out["raw"], c)),
        # NOTE: the server's requests also prefill their prompts; the decode-only
        # ceiling above leaves that work out, this one includes it.
        f"batcher_vs_raw_with_prefill_B{c}": ratio(
            _tok_s(out["batcher"], c), _tok_s(out["raw"], c, "tok_s_with_prefill")
        ),
    }
    for level in PEER_LEVELS:
        if level in levels:
            r[f"batcher_vs_llama_cpp_server_C{level}"] = ratio(
                _tok_s(out["batcher"], level), _tok_s(out["llama_cpp_server"], level)
            )
    return r


# -- summary.md ------------------------------------------------------------------------------------
HEAD = [
    "C (=B)",
    "batcher tok/s",
    "req/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "mean batch",
    "sequential tok/s",
    "req/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "raw engine tok/s (B=C)",
    "llama_cpp.server tok/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
]
TARGETS = {"batcher_vs_sequential": (2.5, "x"), "batcher_vs_raw": (0.9, "")}


def _row(r: dict[str, Any], c: str) -> Row:
    b, s = dig(r, "batcher", "levels", c) or {}, dig(r, "sequential", "levels", c) or {}
    raw, peer = dig(r, "raw", "levels", c) or {}, dig(r, "llama_cpp_server", "levels", c) or {}
    return [
        c,
        fmt(b.get("tok_s")),
        fmt(b.get("req_s"), 2),
        fmt(dig(b, "ttft", "p50_ms"), 0),
        fmt(dig(b, "ttft", "p99_ms"), 0),
        fmt(b.get("mean_batch_size")),
        fmt(s.get("tok_s")),
        fmt(s.get("req_s"), 2),
        fmt(dig(s, "ttft", "p50_ms"), 0),
        fmt(dig(s, "ttft", "p99_ms"), 0),
        fmt(raw.get("tok_s")),
        fmt(peer.get("tok_s")),
        fmt(dig(peer, "ttft", "p50_ms"), 0),
        fmt(dig(peer, "ttft", "p99_ms"), 0),
    ]


def _ratio_line(key: str, value: float | None) -> str:
    base = key.rsplit("_", 1)[0]
    target = TARGETS.get(base)
    pct_form = base.startswith("batcher_vs_raw")
    shown = "-" if value is None else (f"{value * 100:.0f}%" if pct_form else f"{value:.2f}x")
    note = ""
    if target:
        tgt = f"{target[0] * 100:.0f}%" if base == "batcher_vs_raw" else f"{target[0]}x"
        note = f" (target >= {tgt}: {verdict(value, target[0])})"
    return f"- {key.replace('_', ' ')}: **{shown}**{note}"


def _peer_lines(peer: dict[str, Any]) -> list[str]:
    if "skipped" in peer:
        return [f"- llama_cpp.server: skipped ({peer['skipped']})"]
    if peer.get("note"):
        got = ", ".join(f"C={c}: {v['tokens']}/{v['tokens_requested']}" for c, v in peer["levels"].items())
        return [f"- llama_cpp.server: {peer['note']}; tokens received {got}"]
    return []


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario A."""
    levels = list(r["loads"])
    out = [
        f"{sum(int(c) * n for c, n in r['loads'].items())} requests per server over C in "
        f"{', '.join(levels)}; unique {r['prompt_tokens']}-token prompts, {r['max_tokens']} greedy "
        "tokens each (ignore_eos); closed loop. Raw engine = ModelRunner decode loop with no server "
        "(decode steps only).",
        "",
        table(HEAD, [_row(r, c) for c in levels]),
        "",
    ]
    out += [_ratio_line(key, value) for key, value in r.get("ratios", {}).items()]
    out += _peer_lines(r.get("llama_cpp_server", {}))
    return "\n".join(out)
