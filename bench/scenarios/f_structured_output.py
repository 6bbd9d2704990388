"""Scenario F — structured output overhead: GenerateJSON vs unconstrained generation of the same length.

(Part "overhead"; part "finish", documents that end on real-world schemas, is
bench/scenarios/f_finish.py. ``BENCH_F_PARTS`` picks the parts, default both;
a part not run is kept from the previous result file.)

GenerateJSON runs first (greedy, a small bounded schema) at 1 and 8 concurrent
clients; each request's completion tokens are recorded. Then unconstrained
Generate runs the same prompts with ``max_tokens`` equal to those counts and
ignore_eos, at the same concurrency. Mask time and the share of forced tokens
come from GetMetrics' grammar fields (deltas over the JSON run). The server runs
with ``--no-prefix-cache`` so the second pass over the same prompts gets no
prefill advantage.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import grpc
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from bench.harness.config import BenchConfig, results_dir, say
from bench.harness.grpc_load import ReqResult, Stream, channel, get_metrics
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.results import Skipped
from bench.harness.stats import ratio
from bench.harness.tables import Row, fmt, table
from bench.scenarios import f_finish

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "tags", "active"],
    "additionalProperties": False,
}
MAX_TOKENS = 256


class Unimplemented(Exception):
    """GenerateJSON answered UNIMPLEMENTED."""


async def _json_one(stub: pb_grpc.InferenceServiceStub, prompt: str) -> ReqResult:
    req = pb.GenerateJSONRequest(
        prompt=prompt,
        json_schema=json.dumps(SCHEMA),
        sampling=pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
    )
    t0 = time.perf_counter()
    try:
        resp = await stub.GenerateJSON(req, timeout=600)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise Unimplemented(exc.details() or "UNIMPLEMENTED") from exc
        return ReqResult(False, t0, time.perf_counter(), None, 0, error=f"{exc.code().name}: {exc.details()}")
    return ReqResult(
        True,
        t0,
        time.perf_counter(),
        resp.timing.ttft_ms,
        resp.usage.completion_tokens,
        resp.usage.prompt_tokens,
        resp.usage.cached_tokens,
        server_ttft_ms=resp.timing.ttft_ms,
    )


async def _run_json(ch: grpc.aio.Channel, groups: list[list[str]]) -> tuple[list[list[ReqResult]], float]:
    stub = pb_grpc.InferenceServiceStub(ch)

    async def client(prompts: list[str]) -> list[ReqResult]:
        return [await _json_one(stub, p) for p in prompts]

    t0 = time.perf_counter()
    out = await asyncio.gather(*(client(g) for g in groups))
    return list(out), time.perf_counter() - t0


async def _run_plain(
    ch: grpc.aio.Channel, groups: list[list[str]], lengths: list[list[int]]
) -> tuple[list[ReqResult], float]:
    async def client(prompts: list[str], ns: list[int]) -> list[ReqResult]:
        stream = Stream(ch)
        res = [await stream.request(p, n) for p, n in zip(prompts, ns, strict=True)]
        await stream.close()
        return res

    t0 = time.perf_counter()
    out = await asyncio.gather(*(client(g, n) for g, n in zip(groups, lengths, strict=True)))
    return [r for g in out for r in g], time.perf_counter() - t0


def _grammar(m: Any) -> dict[str, float]:
    g = m.grammar
    return {
        "constrained": g.constrained_tokens,
        "forced": g.forced_tokens,
        "mask_us_p50": g.mask_us_p50,
        "mask_us_p99": g.mask_us_p99,
        "compiles": g.compiles,
        "cache_hits": g.cache_hits,
    }


async def _level(target: str, groups: list[list[str]]) -> dict[str, Any]:
    async with channel(target) as ch:
        g0 = _grammar(await get_metrics(ch))
        json_res, json_wall = await _run_json(ch, groups)
        g1 = _grammar(await get_metrics(ch))
        lengths = [[max(1, r.tokens) if r.ok else 1 for r in g] for g in json_res]
        plain, plain_wall = await _run_plain(ch, groups, lengths)
    flat = [r for g in json_res for r in g]
    ok = [r for r in flat if r.ok]
    constrained = g1["constrained"] - g0["constrained"]
    json_tok_s = sum(r.tokens for r in ok) / json_wall
    plain_tok_s = sum(r.tokens for r in plain if r.ok) / plain_wall
    return {
        "clients": len(groups),
        "requests": len(flat),
        "json_ok": len(ok),
        "json_errors": sorted({r.error for r in flat if not r.ok})[:5],
        "completion_tokens": [r.tokens for r in flat],
        "json_tok_s": json_tok_s,
        "plain_tok_s": plain_tok_s,
        "json_vs_plain": ratio(json_tok_s, plain_tok_s),
        "overhead_pct": None if not plain_tok_s else (1 - json_tok_s / plain_tok_s) * 100,
        "json_wall_s": json_wall,
        "plain_wall_s": plain_wall,
        "mask_us_p50": g1["mask_us_p50"],
        "mask_us_p99": g1["mask_us_p99"],
        "constrained_tokens": constrained,
        "forced_tokens": g1["forced"] - g0["forced"],
        "forced_share": (g1["forced"] - g0["forced"]) / constrained if constrained else None,
        "grammar_compiles": g1["compiles"] - g0["compiles"],
        "grammar_cache_hits": g1["cache_hits"] - g0["cache_hits"],
    }


def run(cfg: BenchConfig) -> dict[str, Any]:
    """Part "overhead" (GenerateJSON vs plain at 1 and 8 clients; ``Skipped`` when the server lacks
    GenerateJSON) and part "finish" (``f_finish``), as ``BENCH_F_PARTS`` says."""
    parts = set(os.environ.get("BENCH_F_PARTS", "overhead,finish").split(","))
    out = _run_overhead(cfg) if "overhead" in parts else _previous("levels", "schema", "max_tokens")
    if "finish" in parts:
        say("  finish: 120 dev schemas x 3 arms (today / repetition control / + budget-aware completion)")
        out["finish"] = f_finish.run(cfg)
    else:
        out |= _previous("finish")
    return out


def _previous(*keys: str) -> dict[str, Any]:
    """``keys`` of the last result file's results, marked with where and when they were measured."""
    path = results_dir() / "structured_output.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    found = {k: doc["results"][k] for k in keys if k in doc.get("results", {})}
    if not found:
        return {}
    m = doc.get("machine", {})
    return found | {f"{keys[0]}_measured": {k: m.get(k) for k in ("date", "git_rev", "loadavg_at_start")}}


def _run_overhead(cfg: BenchConfig) -> dict[str, Any]:
    maker = PromptMaker(cfg.model, seed=31)
    per_client = {1: 2, 8: 1} if cfg.quick else {1: 8, 8: 3}
    out: dict[str, Any] = {"schema": SCHEMA, "max_tokens": MAX_TOKENS, "levels": {}}
    with GrpcServer("F-structured", cfg.model, "--no-prefix-cache", threads=cfg.threads) as srv:
        for c, n in per_client.items():
            groups = [
                [f"Invent a person. Reply with JSON only. Hint: {maker.words(12)}\n" for _ in range(n)]
                for _ in range(c)
            ]
            try:
                row = asyncio.run(_level(srv.target, groups))
            except Unimplemented as exc:
                say(f"  skipped: GenerateJSON answered UNIMPLEMENTED ({exc})")
                raise Skipped(f"GenerateJSON UNIMPLEMENTED: {exc}") from exc
            out["levels"][str(c)] = row
            say(
                f"  C={c}: JSON {row['json_tok_s']:.1f} tok/s vs plain {row['plain_tok_s']:.1f} tok/s "
                f"({row['overhead_pct'] or 0:.1f}% overhead); mask p50 {row['mask_us_p50']:.0f} us "
                f"p99 {row['mask_us_p99']:.0f} us; forced {100 * (row['forced_share'] or 0):.1f}%; "
                f"{row['json_ok']}/{row['requests']} valid"
            )
    return out


# -- summary.md ------------------------------------------------------------------------------------
HEAD = [
    "clients",
    "GenerateJSON tok/s",
    "unconstrained tok/s",
    "overhead (< 0: faster)",
    "mask p50 us",
    "mask p99 us",
    "forced tokens",
    "tokens per doc",
    "valid docs",
]


def _row(c: str, x: dict[str, Any]) -> Row:
    toks = x["completion_tokens"]
    share = x.get("forced_share")
    return [
        c,
        fmt(x["json_tok_s"]),
        fmt(x["plain_tok_s"]),
        fmt(x["overhead_pct"]) + "%",
        fmt(x["mask_us_p50"], 0),
        fmt(x["mask_us_p99"], 0),
        "-" if share is None else f"{share * 100:.1f}%",
        f"{min(toks)}-{max(toks)}" if toks else "-",
        f"{x['json_ok']}/{x['requests']}",
    ]


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario F (both parts)."""
    finish = ["", f_finish.render(r["finish"])] if "finish" in r else []
    if "levels" not in r:
        return "\n".join(finish[1:])
    return "\n".join(
        [
            "GenerateJSON (greedy, small bounded schema) first; then unconstrained Generate of the same prompts "
            "with max_tokens = each document's token count (ignore_eos). Mask percentiles are GetMetrics' window "
            "(cumulative over the levels). Forced tokens are fast-forwarded, several per decode step, "
            "which can make constrained generation faster than unconstrained.",
            "",
            table(HEAD, [_row(c, x) for c, x in r["levels"].items()]),
            *finish,
        ]
    )
