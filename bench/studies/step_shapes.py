"""Steps per generated token: two revisions of the server under scenario A's load (issue #39 item 4).

``python -m bench.studies.step_shapes --before DIR [--after DIR] [--model M] [--streams 4,16,32] [--reps 2]``

A weight-bound model (the 1.1B shape) pays one pass over its weights per engine step, so a revision
that plans fewer steps for the same tokens is faster whatever the machine's load. Both servers
start at once (``DIR`` is a checkout of the other revision with its stubs made, as for
``revisions_ab``); for each repetition and concurrency the two arms run back to back in alternating
order on the same fresh prompts (30-60 tokens, 64 greedy tokens, ``ignore_eos``), and ``GetMetrics``
before and after gives the steps, the steps without decode rows (``GetMetrics.batch_sizes`` is per
sequence count; the isolated ones are counted from ``step_phases``) and the ms per step. Output: per
arm and C, tok/s, steps per generated token, ms per step, the load average before the arm; and the
after/before tok/s ratio of each pair. Writes ``bench/results/extra/step_shapes.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from bench.harness.config import DEFAULT_MODEL, ROOT
from bench.harness.grpc_load import metered_closed_loop, summarize
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker

MAX_TOKENS = 64
PER_CLIENT = {1: 6, 4: 4, 8: 3, 16: 2, 32: 2}


async def _measure(target: str, prompts: list[list[str]]) -> dict[str, Any]:
    m = await metered_closed_loop(target, prompts, MAX_TOKENS)
    before, after, wall = m.before, m.after, m.wall_s
    row = summarize(m.results, wall)
    steps = after.step_phases.steps - before.step_phases.steps
    hist = {b.sequences: b.steps for b in before.batch_sizes}
    single = sum(b.steps - hist.get(b.sequences, 0) for b in after.batch_sizes if b.sequences == 1)
    return {"tok_s": row["tok_s"], "tokens": row["tokens"], "failed": row["failed"], "steps": steps,
            "steps_per_token": steps / row["tokens"] if row["tokens"] else None,
            "one_sequence_steps": single, "ms_per_step": wall * 1000.0 / steps if steps else None,
            "ttft_p50_ms": row["ttft"]["p50_ms"], "ttft_p99_ms": row["ttft"]["p99_ms"]}


def _paired(targets: dict[str, str], model: Path, streams: list[int], reps: int) -> list[dict[str, Any]]:
    maker = PromptMaker(model, seed=3940)
    out = []
    for rep in range(reps):
        for c in streams:
            prompts = [maker.unique(PER_CLIENT[c], 30, 60) for _ in range(c)]
            order = ("before", "after") if (rep + c) % 2 == 0 else ("after", "before")
            cell: dict[str, Any] = {"rep": rep, "streams": c}
            for arm in order:
                cell[f"load1_{arm}"] = os.getloadavg()[0]
                cell[arm] = asyncio.run(_measure(targets[arm], prompts))
            cell["ratio"] = cell["after"]["tok_s"] / cell["before"]["tok_s"]
            print(json.dumps(cell), flush=True)
            out.append(cell)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, default=ROOT)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--streams", default="4,16,32")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/extra/step_shapes.json")
    args = ap.parse_args()
    sources = {"before": args.before.resolve(), "after": args.after.resolve()}
    with contextlib.ExitStack() as stack:  # NOTE: both up at once; each stops on the way out
        targets = {arm: stack.enter_context(GrpcServer(f"step-shapes-{arm}", args.model, "--max-running", "32",
                                                       source=src)).target for arm, src in sources.items()}
        for t in targets.values():
            asyncio.run(_measure(t, [["warm up"]]))
        cells = _paired(targets, args.model, [int(x) for x in args.streams.split(",")], args.reps)
    doc = {"model": args.model.name, "sources": {k: str(v) for k, v in sources.items()}, "cells": cells}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
