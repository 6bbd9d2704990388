"""Where an engine step's time goes, at several concurrencies and on several models.

``python -m bench.studies.step_phases [--model M ...] [--streams 1,16,32] [--threads 2] [--fixed-threads] [--flag=--no-speculative]``

For each model one server runs (``--max-running 32``; adaptive threads unless
``--fixed-threads``); for each concurrency C, C closed-loop clients send scenario
A's requests (30-60-token prompts, 64 greedy tokens, ``A_PER_CLIENT`` each), and
GetMetrics before and after gives the steps, the generated tokens and the seconds
of each step phase (``GetMetrics.step_phases``: plan, batch, decode inside
llama.cpp, sample, update, emit). The result: ms per step and share of each
phase, tokens per step, tok/s, the 1-minute load average before the cell, and the
compute-thread count the server logged as chosen (a governor switch shows here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

from bench.harness.config import DEFAULT_MODEL, ROOT
from bench.harness.grpc_load import metered_closed_loop, summarize
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.step_cost import phases_delta

MAX_TOKENS = 64
PER_CLIENT = {1: 8, 4: 4, 8: 3, 16: 2, 32: 2}
SWITCH = re.compile(r"compute threads now (\d+) \((up|down)")


async def cell(target: str, model: Path, c: int) -> dict[str, Any]:
    prompts = [PromptMaker(model, seed=500 + c).unique(PER_CLIENT.get(c, 2), 30, 60) for _ in range(c)]
    m = await metered_closed_loop(target, prompts, MAX_TOKENS)
    row = summarize(m.results, m.wall_s)
    return {"tok_s": round(row["tok_s"] or 0.0, 1), "failed": row["failed"], **phases_delta(m.before, m.after)}


def run_model(model: Path, streams: list[int], threads: int, fixed: bool, extra: list[str]) -> list[dict[str, Any]]:
    flags = ["--max-running", "32"] + (["--no-adaptive-threads"] if fixed else []) + extra
    rows = []
    with GrpcServer(f"step-phases-{model.stem}", model, *flags, threads=threads) as srv:
        asyncio.run(cell(srv.target, model, 1))  # warm-up
        for c in streams:
            load = os.getloadavg()[0]
            mark = srv.log_path.stat().st_size
            row = {"model": model.name, "flags": extra, "streams": c, "loadavg_1m": round(load, 2),
                   **asyncio.run(cell(srv.target, model, c))}
            with srv.log_path.open("rb") as f:
                f.seek(mark)
                row["thread_switches"] = SWITCH.findall(f.read().decode(errors="replace"))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, action="append", default=None)
    ap.add_argument("--streams", default="1,16,32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fixed-threads", action="store_true")
    ap.add_argument("--flag", action="append", default=[], help="an extra server flag (repeatable)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "extra" / "step_phases.json")
    args = ap.parse_args()
    streams = [int(x) for x in args.streams.split(",")]
    rows = [r for m in args.model or [DEFAULT_MODEL] for r in run_model(m, streams, args.threads, args.fixed_threads, args.flag)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"study": "step_phases", "threads": args.threads, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
