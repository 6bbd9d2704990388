"""Scenario M — the API callers expect: the cost of logprobs, and n choices vs n requests.

1. Logprobs cost: 16 closed-loop streams, unique 30-60 token prompts, 64 greedy
   tokens each; every request with ``logprobs`` + ``top_logprobs 5`` vs none.
   The two modes alternate (off, on, off, on) on one server so drift and noisy
   neighbours hit both alike; tok/s is summed per mode.
2. n choices: one fresh ~500-token prompt, 8 choices of 32 sampled tokens, as
   one request with ``n=8`` vs 8 separate requests sent at once. Reported: time
   to the first token of any choice, time until all 8 are done, and the prompt
   tokens the server prefilled (GetMetrics ``prefill_tokens_total``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from bench.harness.config import BenchConfig, say
from bench.harness.grpc_load import Stream, channel, get_metrics, next_id
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.stats import latency_summary, ratio

STREAMS = 16
MAX_TOKENS = 64
CHOICES = 8
CHOICE_PROMPT_TOKENS = 500
CHOICE_TOKENS = 32


def _request(prompt: str, logprobs: bool) -> pb.GenerateRequest:
    sp = pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    if logprobs:
        sp.logprobs, sp.top_logprobs = True, 5
    return pb.GenerateRequest(request_id=next_id(), prompt=prompt, sampling=sp)


async def _closed_loop(
    ch: Any, prompts: list[list[str]], make: Callable[[str], pb.GenerateRequest]
) -> dict[str, Any]:
    async def client(mine: list[str]) -> int:
        stream, tokens = Stream(ch), 0
        try:
            for p in mine:
                r = await stream.send(make(p))
                tokens += r.tokens if r.ok else 0
        finally:
            await stream.close()
        return tokens

    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*(client(p) for p in prompts)))
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall}


async def _logprobs_cost(target: str, maker: PromptMaker, rounds: int, per_client: int) -> dict[str, Any]:
    totals = {"off": {"tokens": 0, "wall_s": 0.0}, "on": {"tokens": 0, "wall_s": 0.0}}
    async with channel(target) as ch:
        await _closed_loop(ch, [["warm up"]], lambda p: _request(p, False))
        for r in range(rounds):
            for mode in ("off", "on"):
                prompts = [maker.unique(per_client, 30, 60) for _ in range(STREAMS)]
                row = await _closed_loop(ch, prompts, lambda p, m=mode: _request(p, m == "on"))
                totals[mode]["tokens"] += row["tokens"]
                totals[mode]["wall_s"] += row["wall_s"]
                say(f"    round {r + 1} logprobs {mode}: {row['tokens'] / row['wall_s']:.1f} tok/s")
    out = {m: {**t, "tok_s": t["tokens"] / t["wall_s"]} for m, t in totals.items()}
    out["cost_pct"] = (1 - out["on"]["tok_s"] / out["off"]["tok_s"]) * 100
    say(f"    logprobs+top5 cost: {out['cost_pct']:.1f}% of tok/s at {STREAMS} streams")
    return out


async def _choices_run(ch: Any, prompt: str, as_n: bool) -> dict[str, Any]:
    """8 choices of ``prompt``: one n=8 request or 8 requests; first-token and all-done times, prefill."""
    before = (await get_metrics(ch)).prefill_tokens_total
    stub = pb_grpc.InferenceServiceStub(ch)
    sp = pb.SamplingParams(max_tokens=CHOICE_TOKENS, temperature=0.8, seed=7, ignore_eos=True)
    if as_n:
        sp.n = CHOICES
        reqs = [pb.GenerateRequest(request_id="n", prompt=prompt, sampling=sp)]
    else:
        reqs = [pb.GenerateRequest(request_id=f"s{i}", prompt=prompt, sampling=sp) for i in range(CHOICES)]
    t0 = time.perf_counter()
    first, dones = None, 0
    async for msg in stub.Generate(iter(reqs)):
        kind = msg.WhichOneof("event")
        if kind == "delta" and msg.delta.token_ids and first is None:
            first = time.perf_counter()
        elif kind == "done":
            dones += 1
        elif kind == "error":
            raise RuntimeError(f"{msg.error.status}: {msg.error.message}")
    end = time.perf_counter()
    after = (await get_metrics(ch)).prefill_tokens_total
    assert dones == CHOICES, dones
    return {
        "first_token_ms": ((first or end) - t0) * 1e3,
        "all_done_ms": (end - t0) * 1e3,
        "prefill_tokens": after - before,
    }


async def _choices(target: str, maker: PromptMaker, trials: int) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {"n8": [], "separate": []}
    async with channel(target) as ch:
        for t in range(trials):
            for mode in ("n8", "separate"):
                prompt = maker.text(CHOICE_PROMPT_TOKENS)  # fresh: the prefix cache cannot help across trials
                row = await _choices_run(ch, prompt, mode == "n8")
                rows[mode].append(row)
                say(
                    f"    trial {t + 1} {mode:>8}: first token {row['first_token_ms']:.0f} ms, all done "
                    f"{row['all_done_ms']:.0f} ms, prefilled {row['prefill_tokens']} tokens"
                )
    out: dict[str, Any] = {"prompt_tokens": CHOICE_PROMPT_TOKENS, "choices": CHOICES, "tokens": CHOICE_TOKENS}
    for mode, rs in rows.items():
        out[mode] = {
            "first_token": latency_summary([r["first_token_ms"] for r in rs]),
            "all_done": latency_summary([r["all_done_ms"] for r in rs]),
            "prefill_tokens_mean": sum(r["prefill_tokens"] for r in rs) / len(rs),
            "trials": rs,
        }
    out["prefill_ratio_n8_vs_one_prompt"] = out["n8"]["prefill_tokens_mean"] / CHOICE_PROMPT_TOKENS
    out["all_done_speedup"] = ratio(out["separate"]["all_done"]["p50_ms"], out["n8"]["all_done"]["p50_ms"])
    return out


def run(cfg: BenchConfig) -> dict[str, Any]:
    maker = PromptMaker(cfg.model, seed=4321)
    rounds, per_client, trials = (1, 1, 1) if cfg.quick else (2, 3, 3)
    with GrpcServer("api", cfg.model, "--max-running", "16", threads=cfg.server_threads()) as srv:
        say("  logprobs cost")
        cost = asyncio.run(_logprobs_cost(srv.target, maker, rounds, per_client))
        say("  n choices vs separate requests")
        choices = asyncio.run(_choices(srv.target, maker, trials))
    return {"logprobs": cost, "n_choices": choices}


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario M."""
    lp, ch = r["logprobs"], r["n_choices"]
    lines = [
        f"Logprobs + top_logprobs 5 on every request, {STREAMS} streams (alternating rounds):",
        "",
        "| | tokens | tok/s |",
        "|---|---|---|",
        f"| off | {lp['off']['tokens']} | {lp['off']['tok_s']:.1f} |",
        f"| on | {lp['on']['tokens']} | {lp['on']['tok_s']:.1f} |",
        "",
        f"Cost: **{lp['cost_pct']:.1f}%** of tok/s (target <= 5%).",
        "",
        f"{ch['choices']} choices of one {ch['prompt_tokens']}-token prompt, {ch['tokens']} tokens each "
        "(medians over trials):",
        "",
        "| | first token ms | all done ms | prompt tokens prefilled |",
        "|---|---|---|---|",
    ]
    for mode, label in (("n8", f"n={ch['choices']}"), ("separate", f"{ch['choices']} requests")):
        m = ch[mode]
        lines.append(
            f"| {label} | {m['first_token']['p50_ms']:.0f} | {m['all_done']['p50_ms']:.0f} | "
            f"{m['prefill_tokens_mean']:.0f} |"
        )
    lines += [
        "",
        f"n={ch['choices']} prefilled {ch['prefill_ratio_n8_vs_one_prompt']:.2f}x one prompt's tokens.",
    ]
    return "\n".join(lines)
