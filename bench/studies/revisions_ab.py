"""Two revisions of the server under scenario A's load, side by side: did a change move throughput?

``python -m bench.studies.revisions_ab --before DIR [--after DIR] [--reps 3] [--out FILE]``

``DIR`` is a checkout of another revision (``git worktree add /tmp/before <rev>``, then
``make stubs VENV=<this checkout>/.venv`` in it so its gRPC stubs exist); ``--after`` defaults to
this checkout. Both servers start at once with scenario A's batcher flags and stay up; for each
repetition and concurrency (scenario A's ``FULL_LOADS``: 1-32 closed-loop clients, 30-60-token
prompts, 64 greedy tokens) the two arms run back to back in alternating order on the same fresh
prompts, with the 1-minute load average recorded before each. The summary is the after/before
tok/s ratio per repetition and its median: on a shared machine only such paired ratios mean
anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.harness.config import DEFAULT_MODEL, ROOT
from bench.harness.grpc_load import channel, closed_loop, summarize
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.scenarios.a_throughput import FULL_LOADS

MAX_TOKENS = 64


async def _measure(target: str, prompts: list[list[str]]) -> dict[str, Any]:
    async with channel(target) as ch:
        t0 = time.perf_counter()
        results = await closed_loop(ch, prompts, MAX_TOKENS)
        return summarize(results, time.perf_counter() - t0)


def _paired(servers: dict[str, GrpcServer], model: Path, reps: int, loads: dict[int, int]) -> list[dict[str, Any]]:
    rows = []
    for rep in range(reps):
        maker = PromptMaker(model, seed=1000 + rep)
        for i, (c, n) in enumerate(loads.items()):
            prompts = [maker.unique(n, 30, 60) for _ in range(c)]
            order = ("before", "after") if (rep + i) % 2 == 0 else ("after", "before")
            for arm in order:
                load = os.getloadavg()[0]
                row = asyncio.run(_measure(servers[arm].target, prompts))
                rows.append({"rep": rep, "c": c, "arm": arm, "load1": round(load, 2),
                             "tok_s": round(row["tok_s"], 1), "ttft_p50_ms": round(row["ttft"]["p50_ms"])})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per concurrency: the after/before tok/s ratio of each repetition and the median ratio."""
    out: dict[int, dict[str, Any]] = {}
    for c in sorted({r["c"] for r in rows}):
        by = {(r["rep"], r["arm"]): r["tok_s"] for r in rows if r["c"] == c}
        ratios = [by[rep, "after"] / by[rep, "before"] for rep in sorted({k[0] for k in by})]
        out[c] = {"after_over_before": [round(x, 3) for x in ratios], "median": round(statistics.median(ratios), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, default=ROOT)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--loads", type=int, nargs="+", default=sorted(FULL_LOADS),
                    help="the concurrencies to run (default: all of scenario A's)")
    args = ap.parse_args()
    loads = {c: FULL_LOADS[c] for c in args.loads}
    sources = {"before": args.before.resolve(), "after": args.after.resolve()}
    servers = {arm: GrpcServer(f"revisions-{arm}", args.model, "--max-running", "32", source=src)
               for arm, src in sources.items()}
    try:
        for s in servers.values():
            s.start()
        rows = _paired(servers, args.model, args.reps, loads)
    finally:
        for s in servers.values():
            s.stop()
    result = {"sources": {k: str(v) for k, v in sources.items()}, "rows": rows, "summary": summary(rows)}
    print(json.dumps(result["summary"], indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
