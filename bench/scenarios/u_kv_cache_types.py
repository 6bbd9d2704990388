"""Scenario U — KV-cache quantization: ``--kv-cache-type f16`` vs ``q8_0`` vs ``q4_0`` (issue #39 item 3).

One server per type, all started first with the same flags. Per type:

* **memory**: the KV bytes per token the server reports (``GetModelInfo.kv_bytes_per_token``, checked by
  the runner against the buffer llama.cpp allocated) and the buffer itself at ``--ctx`` (``GetMetrics``);
  then the most sequences of 2,048 tokens that fit a fixed KV budget (``BUDGET_MIB``):
  ``floor(budget / (2048 x bytes per token))``;
* **speed**: closed-loop tokens/s at 1, 16 and 32 streams (scenario A's load: unique 30-60 token prompts,
  64 greedy tokens, ``ignore_eos``); the types alternate within each level, their order reversed every
  round, the load average recorded before every arm run;
* **quality drift**: 8 greedy 200-token outputs of fixed prompts with log-probabilities; against f16's:
  how many outputs are token-for-token identical, where the others first differ, and the largest
  |logprob difference| of the chosen token over the positions where both outputs still agree.

Targets: q8_0 holds >= 1.8x the sequences of f16 in the same memory, runs >= 0.95x f16's tokens/s at
16 streams, and >= 6 of 8 greedy outputs are identical to f16's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

from bench.harness.config import BenchConfig, say
from bench.harness.grpc_load import channel, closed_loop, summarize
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.results import load_now
from bench.harness.stats import ratio
from bench.harness.tables import dig, fmt, table, verdict

TYPES = ("f16", "q8_0", "q4_0")
CTX = 8192
BUDGET_MIB = 1024  # the KV memory a CPU pod might give the cache
SEQ_TOKENS = 2048
LEVELS = {1: 6, 16: 2, 32: 2}  # streams -> requests per client in one arm run
QUICK_LEVELS = {1: 1, 16: 1}
DRIFT_PROMPTS = 8
DRIFT_TOKENS = 200
TOPICS = ("the history of the printing press", "how tides work", "a recipe for bread", "the rules of chess",
          "why the sky is blue", "how a bicycle gear works", "the life of honey bees", "how vaccines train cells")


def _memory(target: str) -> dict[str, Any]:
    import grpc

    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        kv = stub.GetMetrics(pb.GetMetricsRequest(), timeout=10).kv
    per_token = int(info.kv_bytes_per_token)
    return {"kv_cache_type": info.kv_cache_type, "bytes_per_token": per_token,
            "kv_buffer_bytes": int(kv.kv_buffer_bytes), "ctx": CTX,
            "sequences_in_budget": (BUDGET_MIB << 20) // (SEQ_TOKENS * per_token) if per_token else None}


async def _greedy(target: str, prompt: str, max_tokens: int) -> tuple[list[int], list[float]]:
    """One greedy request with log-probabilities: (token ids, logprob of each)."""
    sampling = pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=True)
    req = pb.GenerateRequest(request_id="drift", prompt=prompt, sampling=sampling)
    ids: list[int] = []
    lps: list[float] = []
    async with channel(target) as ch:
        call = pb_grpc.InferenceServiceStub(ch).Generate(iter([req]), timeout=600)
        async for msg in call:
            if msg.WhichOneof("event") == "delta":
                ids += list(msg.delta.token_ids)
                lps += [t.logprob for t in msg.delta.logprobs]
            elif msg.WhichOneof("event") == "error":
                raise RuntimeError(f"drift request failed: {msg.error.message}")
    return ids, lps


def compare(ref: tuple[list[int], list[float]], other: tuple[list[int], list[float]]) -> dict[str, Any]:
    """Token-for-token agreement of ``other`` with ``ref``: identical?, first differing position, and the
    largest |logprob difference| of the chosen token over the positions where both agree."""
    (a_ids, a_lp), (b_ids, b_lp) = ref, other
    agree = 0
    while agree < min(len(a_ids), len(b_ids)) and a_ids[agree] == b_ids[agree]:
        agree += 1
    identical = agree == len(a_ids) == len(b_ids)
    # NOTE: the position where they first differ counts too: its two logprobs are of different
    # tokens, so only the common prefix (same token, same context) is a like-for-like comparison.
    diffs = [abs(x - y) for x, y in zip(a_lp[:agree], b_lp[:agree], strict=True)]
    return {"identical": identical, "first_difference": None if identical else agree,
            "max_abs_logprob_diff": max(diffs) if diffs else 0.0}


def _drift(targets: dict[str, str], quick: bool) -> dict[str, Any]:
    n = 2 if quick else DRIFT_PROMPTS
    prompts = [f"Write a short essay about {t}." for t in TOPICS[:n]]
    outs = {k: [asyncio.run(_greedy(t, p, 48 if quick else DRIFT_TOKENS)) for p in prompts]
            for k, t in targets.items()}
    drift: dict[str, Any] = {}
    for kind in TYPES[1:]:
        rows = [compare(r, o) for r, o in zip(outs["f16"], outs[kind], strict=True)]
        drift[kind] = {"outputs": len(rows), "identical": sum(r["identical"] for r in rows),
                       "max_abs_logprob_diff": max(r["max_abs_logprob_diff"] for r in rows),
                       "per_output": rows}
        say(f"    drift {kind}: {drift[kind]['identical']}/{len(rows)} identical to f16, largest |dlogprob| "
            f"{drift[kind]['max_abs_logprob_diff']:.4f}")
    return drift


def _speed(targets: dict[str, str], maker: PromptMaker, levels: dict[int, int], rounds: int) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {k: {str(c): [] for c in levels} for k in TYPES}
    for c, per in levels.items():
        for r in range(rounds):
            for kind in TYPES if r % 2 == 0 else tuple(reversed(TYPES)):
                load = load_now()
                prompts = [maker.unique(per, 30, 60) for _ in range(c)]
                t0 = time.perf_counter()
                results = asyncio.run(_load(targets[kind], prompts))
                row = summarize(results, time.perf_counter() - t0)
                runs[kind][str(c)].append({"round": r, **load, **row})
                say(f"    C={c:>2} round {r} {kind:>5}: {row['tok_s']:.1f} tok/s ({row['failed']} failed; "
                    f"load1 {load['load1']:.2f})")
    return {k: {c: {"runs": rs, "tok_s": sum(x["tok_s"] for x in rs) / len(rs)} for c, rs in per.items()}
            for k, per in runs.items()}


async def _load(target: str, prompts: list[list[str]]) -> list[Any]:
    async with channel(target) as ch:
        return await closed_loop(ch, prompts, 64)


def run(cfg: BenchConfig) -> dict[str, Any]:
    maker = PromptMaker(cfg.model, seed=3939)
    with contextlib.ExitStack() as stack:  # NOTE: all three up at once; each stops on the way out
        targets = {k: stack.enter_context(GrpcServer(
            f"U-{k}", cfg.model, "--ctx", str(CTX), "--kv-cache-type", k, "--prefix-cache-tokens", "0",
            threads=cfg.server_threads())).target for k in TYPES}
        for t in targets.values():
            asyncio.run(_load(t, [["warm up the server"]]))
        memory = {k: _memory(t) for k, t in targets.items()}
        for k, m in memory.items():
            say(f"    {k}: {m['bytes_per_token']:,} bytes/token, KV buffer {m['kv_buffer_bytes'] / 2**20:.1f} MiB "
                f"at ctx {CTX}; {m['sequences_in_budget']} sequences of {SEQ_TOKENS} in {BUDGET_MIB} MiB")
        drift = _drift(targets, cfg.quick)
        speed = _speed(targets, maker, QUICK_LEVELS if cfg.quick else LEVELS, 1 if cfg.quick else 2)
    return {"budget_mib": BUDGET_MIB, "seq_tokens": SEQ_TOKENS, "memory": memory, "speed": speed,
            "drift": drift, "targets": _targets(memory, speed, drift)}


def _targets(memory: dict[str, Any], speed: dict[str, Any], drift: dict[str, Any]) -> dict[str, Any]:
    seqs = ratio(memory["q8_0"]["sequences_in_budget"], memory["f16"]["sequences_in_budget"])
    c = "16" if "16" in speed["f16"] else max(speed["f16"], key=int)
    tok = ratio(speed["q8_0"][c]["tok_s"], speed["f16"][c]["tok_s"])
    return {"q8_0_sequences_x_f16": seqs, f"q8_0_tok_s_x_f16_at_{c}": tok,
            "q8_0_identical": drift["q8_0"]["identical"], "q8_0_outputs": drift["q8_0"]["outputs"]}


def render(results: dict[str, Any]) -> str:
    mem, speed, drift = results["memory"], results["speed"], results["drift"]
    levels = list(speed["f16"])
    rows = []
    for k in TYPES:
        d = drift.get(k)
        rows.append([k, f"{mem[k]['bytes_per_token']:,}", fmt(mem[k]["kv_buffer_bytes"] / 2**20, 1),
                     str(mem[k]["sequences_in_budget"]),
                     *[fmt(dig(speed, k, c, "tok_s")) for c in levels],
                     f"{d['identical']}/{d['outputs']}" if d else "(reference)",
                     fmt(d["max_abs_logprob_diff"], 4) if d else "-"])
    head = ["type", "bytes/token", f"KV MiB at {CTX}", f"seqs of {results['seq_tokens']} in "
            f"{results['budget_mib']} MiB", *[f"tok/s C={c}" for c in levels], "identical to f16",
            "max |dlogprob|"]
    t = results["targets"]
    tok_key = next(k for k in t if k.startswith("q8_0_tok_s"))
    lines = [table(head, rows), "",
             f"- q8_0 sequences vs f16: {fmt(t['q8_0_sequences_x_f16'], 2)}x (target >= 1.8x: "
             f"{verdict(t['q8_0_sequences_x_f16'], 1.8)})",
             f"- q8_0 tokens/s vs f16 ({tok_key.rsplit('_', 1)[-1]} streams): {fmt(t[tok_key], 3)}x "
             f"(target >= 0.95x: {verdict(t[tok_key], 0.95)})",
             f"- q8_0 greedy outputs identical to f16: {t['q8_0_identical']}/{t['q8_0_outputs']} (target >= 6/8)"]
    return "\n".join(lines)
