"""Scenario T — mixed load against llama.cpp's ``llama-server``: 32 batch streams plus an interactive client.

Over HTTP for both servers (``/v1/completions``, streamed, greedy, ``ignore_eos``):
32 closed-loop batch streams (unique 30-60-token prompts, 128 tokens each,
``x-priority: batch``) and an interactive client (a unique 20-30-token prompt,
32 tokens, ``x-priority: interactive``) sending one request every 2 s during a
60 s window after a 10 s ramp; llama-server has no tiers and ignores the header.
Per server and round, three phases: the interactive requests alone (one after
another on the idle server), the batch streams alone (same ramp and window), both
together. Batch tok/s counts batch tokens received inside the window; the batch
streams keep going until the last interactive answer is in.

Arms: this server at default flags, this server with ``--batch-rows-with-interactive
CAP`` (scenario T's cap, see docs/benchmarks.md), and ``llama-server`` (``make
llama-tools``; scenario P's flags: ``-np 34 -kvu -c 8192``, the same threads);
ours ``--max-running 34 --ctx 8192``. All three up for a model's whole run;
arms alternate (order reversed every round), 2 rounds, the load (``uptime``)
recorded before every phase. Our arms also record the step clock (GetMetrics
``step_phases``) of each phase: ms per step by phase and tokens per step, from
which ``a + b*N`` is fitted and the cap arithmetic (``bench/harness/step_cost.py``)
is evaluated. Models: ``--model`` (the benchmark model, Gemma 3 270M) and the
1.1B shape (``make bench-model-1b``; reported, the targets are stated for Gemma).

Targets (Gemma, beside 32 batch streams): interactive TTFT p99 <= 500 ms;
interactive end-to-end p99 <= 3x the same request's p50 alone; batch tok/s
>= 0.75x its rate alone and >= 0.95x llama-server's under the same load.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from bench.harness.config import DEFAULT_MODEL, ROOT, SKIP_1B, BenchConfig, say
from bench.harness.procs import GrpcServer, LlamaServer, llama_server_binary
from bench.harness.prompts import PromptMaker
from bench.scenarios import t_report
from bench.scenarios.t_report import Load, Target, phase_row

MODEL_1B = ROOT / "models" / "tinyllama-shape-1.1b-q4_k_m.gguf"
FULL = Load(batch_streams=32, batch_tokens=128, interactive_tokens=32, interval_s=2.0, ramp_s=10.0,
            window_s=60.0, alone_requests=10, rounds=2)
QUICK = Load(batch_streams=8, batch_tokens=32, interactive_tokens=16, interval_s=2.0, ramp_s=3.0,
             window_s=8.0, alone_requests=3, rounds=1)
CTX = 8192
SLOTS = 34  # 32 batch streams + up to 2 interactive requests at once (llama-server -np, our --max-running)
CAP = 8  # NOTE: the cap arm's --batch-rows-with-interactive (chosen from the arithmetic, docs/benchmarks.md)
QUICK_CAP = 4  # below the quick load's 8 batch streams, so the quick run exercises the cap
ARMS = ("ours", "ours_cap", "llama_server")
PHASES = ("alone", "batch", "mixed")


async def _mixed(t: Target, load: Load, maker: PromptMaker, with_interactive: bool) -> dict[str, Any]:
    from bench.harness.mixed_load import WindowMeter
    from bench.harness.sse_mixed import batch_streams, interactive_timer

    prompts = [maker.unique(12, 30, 60) for _ in range(load.batch_streams)]  # NOTE: ~6 per stream in a full window
    inter_prompts = maker.unique(64, 20, 30)
    start = time.perf_counter() + load.ramp_s
    meter = WindowMeter(start, start + load.window_s)
    done = asyncio.Event()
    batch = asyncio.create_task(batch_streams(t.url, t.model, prompts, load.batch_tokens, meter, done))
    inter = []
    if with_interactive:
        inter = await interactive_timer(t.url, t.model, inter_prompts, load.interactive_tokens,
                                        load.interval_s, start, start + load.window_s)
    done.set()
    completed = await batch
    return {"batch_tokens_in_window": meter.tokens, "batch_tok_s": meter.tokens / load.window_s,
            "batch_requests_completed": completed, "interactive": inter}


async def _phase(t: Target, phase: str, load: Load, maker: PromptMaker) -> dict[str, Any]:
    from bench.harness.sse_mixed import interactive_alone

    await t.wait_idle()
    m0 = await t.metrics()
    t0 = time.perf_counter()
    if phase == "alone":
        out: dict[str, Any] = {"interactive": await interactive_alone(
            t.url, t.model, maker.unique(load.alone_requests, 20, 30), load.interactive_tokens)}
    else:
        out = await _mixed(t, load, maker, with_interactive=phase == "mixed")
    out["wall_s"] = time.perf_counter() - t0
    await t.wait_idle()
    return phase_row(out, m0, await t.metrics())


def _cap(cfg: BenchConfig) -> int:
    return QUICK_CAP if cfg.quick else CAP


def _servers(cfg: BenchConfig, model: Path, tag: str) -> tuple[list[Any], dict[str, Target]]:
    """The three servers (not started yet; their ports are chosen) and each arm's Target."""
    from bench.harness.procs import free_port
    from bench.harness.sse_mixed import wait_idle_ours, wait_idle_peer

    def ours(label: str, *extra: str) -> tuple[GrpcServer, Target]:
        port = free_port()
        s = GrpcServer(label, model, "--http-port", str(port), "--max-running", str(SLOTS), "--ctx", str(CTX),
                       *extra, threads=cfg.threads)
        return s, Target(f"http://127.0.0.1:{port}", model.stem, lambda: wait_idle_ours(s.target), s.target)

    peer = LlamaServer(f"T-llama-server-{tag}", llama_server_binary(), model, parallel=SLOTS, ctx=CTX,
                       threads=cfg.server_threads())
    mine, mine_t = ours(f"T-ours-{tag}")
    cap, cap_t = ours(f"T-ours-cap{_cap(cfg)}-{tag}", "--batch-rows-with-interactive", str(_cap(cfg)))
    peer_t = Target(peer.base_url, "peer", lambda: wait_idle_peer(peer.base_url), None)
    return [mine, cap, peer], {"ours": mine_t, "ours_cap": cap_t, "llama_server": peer_t}


def run_model(cfg: BenchConfig, model: Path, tag: str, load: Load) -> dict[str, Any]:
    """All arms, phases and rounds on one model; servers up for the whole run."""
    from bench.harness.results import load_now
    from bench.harness.sse_mixed import interactive_alone

    maker = PromptMaker(model, seed=3939)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
    servers, targets = _servers(cfg, model, tag)
    with contextlib.ExitStack() as stack:
        for s in servers:
            stack.enter_context(s)
        for t in targets.values():  # warm-up, unmeasured
            asyncio.run(interactive_alone(t.url, t.model, ["warm up the server"], 4))
        for r in range(load.rounds):
            for arm in ARMS if r % 2 == 0 else tuple(reversed(ARMS)):
                for phase in PHASES:
                    before = load_now()
                    row = asyncio.run(_phase(targets[arm], phase, load, maker))
                    runs[arm].append({"round": r, "phase": phase, **before, **row})
                    say(f"    {tag} round {r} {arm:>12} {phase:>5}: {t_report.line(row)} (load1 {before['load1']:.2f})")
    return t_report.model_result(runs, load, _cap(cfg))


def _models(cfg: BenchConfig) -> list[tuple[str, Path]]:
    """``--model`` (tagged ``gemma`` when it is the benchmark model) and, unless quick, the 1.1B shape."""
    main = Path(cfg.model).resolve()
    tag = "gemma" if main == DEFAULT_MODEL.resolve() else "1.1b" if main == MODEL_1B.resolve() else main.stem
    extra = [] if cfg.quick or main == MODEL_1B.resolve() else [("1.1b", MODEL_1B)]
    return [(tag, main), *extra]


def run(cfg: BenchConfig) -> dict[str, Any]:
    llama_server_binary()  # skip early when the peer is not built
    load = QUICK if cfg.quick else FULL
    out: dict[str, Any] = {"load": load.__dict__, "ctx": CTX, "slots": SLOTS, "cap": _cap(cfg), "models": {}}
    models = _models(cfg)
    for tag, model in models:
        if tag == "1.1b" and model != Path(cfg.model).resolve() and os.environ.get(SKIP_1B):
            out["models"][tag] = {"skipped": f"not run: {SKIP_1B} was set"}
            continue
        if not model.is_file():
            out["models"][tag] = {"skipped": f"{model} missing: run `make bench-model-1b`"}
            continue
        say(f"  {tag} ({model.name}): arms {', '.join(ARMS)} alternating, {load.rounds} rounds")
        out["models"][tag] = run_model(cfg, model, tag, load)
        for k, v in out["models"][tag]["checks"].items():
            say(f"  {tag} {k}: {v}")
    return out


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario T."""
    return t_report.render(r)
