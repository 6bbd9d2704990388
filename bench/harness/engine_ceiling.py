"""The raw engine ceiling: the batched greedy decode loop with no server around it.

Run as a subprocess (``python -m bench.harness.engine_ceiling --model M --batches 1,4 --prompts-json F``)
so the model's memory goes away with it; prints one JSON object on stdout.

For each batch size B: prefill B prompts on lanes 0..B-1 (one decode per
prompt), then time ``steps`` decode steps of the whole batch, one
``llama_decode`` per step with one token per lane, argmax per row — the same
``ModelRunner.decode`` the engine calls, minus scheduling, sampling options,
KV accounting and gRPC.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from service.model.runner import ModelRunner


def measure(runner: ModelRunner, prompts: list[list[int]], steps: int) -> dict[str, Any]:
    """Prefill ``prompts`` (one lane each), then time ``steps`` batched greedy decode steps."""
    runner.clear_kv()
    b = len(prompts)
    last = np.zeros(b, dtype=np.int32)
    pos = np.zeros(b, dtype=np.int32)
    t0 = time.perf_counter()
    for lane, ids in enumerate(prompts):
        n = len(ids)
        want = np.r_[np.zeros(n - 1, dtype=np.int8), 1]
        logits = runner.decode(np.asarray(ids), np.arange(n), np.full(n, lane), want)
        last[lane], pos[lane] = int(np.argmax(logits[0])), n
    prefill_s = time.perf_counter() - t0
    lanes = np.arange(b, dtype=np.int32)
    want = np.ones(b, dtype=np.int8)
    t0 = time.perf_counter()
    for _ in range(steps):
        logits = runner.decode(last, pos, lanes, want)
        last = np.argmax(logits, axis=1).astype(np.int32)
        pos += 1
    decode_s = time.perf_counter() - t0
    runner.clear_kv()
    return {
        "batch": b,
        "steps": steps,
        "tokens": b * steps,
        "prefill_tokens": sum(map(len, prompts)),
        "prefill_s": round(prefill_s, 4),
        "decode_s": round(decode_s, 4),
        "tok_s": b * steps / decode_s,
        # Same work as a server request: its prompt's prefill plus the decode steps.
        "tok_s_with_prefill": b * steps / (prefill_s + decode_s),
        "step_ms": decode_s / steps * 1000.0,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batches", default="1,4,8,16,32")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts-json", required=True, help="file with a JSON list of prompt strings")
    ap.add_argument("--repeat", type=int, default=1, help="runs per batch size; the best is kept")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    texts: list[str] = json.loads(Path(args.prompts_json).read_text())
    biggest = max(batches)
    if len(texts) < biggest:
        sys.exit(f"need {biggest} prompts, got {len(texts)}")
    runner = ModelRunner(args.model, n_ctx=8192, step_tokens=512, n_lanes=biggest + 1, n_threads=args.threads)
    ids = [runner.vocab.tokenize(t) for t in texts]
    need = max(map(len, ids[:biggest])) + args.steps
    if biggest * need > runner.n_ctx:
        sys.exit(f"pool too small: {biggest} x {need} tokens > {runner.n_ctx}")
    measure(runner, ids[:1], 4)  # warm-up
    out = []
    for b in batches:
        runs = [measure(runner, ids[:b], args.steps) for _ in range(args.repeat)]
        out.append(max(runs, key=lambda r: r["tok_s"]))
        print(f"  raw B={b}: {out[-1]['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
    runner.close()
    print(json.dumps({"threads": args.threads, "results": out}))


if __name__ == "__main__":
    main()
