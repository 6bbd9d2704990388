"""HTTP vs gRPC on one server, paired rounds: does the OpenAI front end cost throughput?

``python -m bench.studies.http_vs_grpc [--rounds 4] [--levels 1,8,16,32] [--out FILE]``

Scenario P's load (C closed-loop clients, unique 30-60-token prompts, 64 greedy
tokens by ``ignore_eos``, streamed; ``p_http.PER_CLIENT`` requests per client and
arm run) on one server (``--max-running 32 --ctx 8192``) through its two front
ends: ``/v1/completions`` over SSE and ``Generate`` over gRPC. Within a level
the two arms run back to back in alternating order, each round on fresh
prompts, with the 1-minute load average recorded before each arm. The result
per level is the median over rounds of the per-round HTTP/gRPC tok/s ratio
(scenario P pools the rounds, which lets one disturbed arm run swing it).
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
from bench.harness.grpc_load import summarize
from bench.harness.procs import GrpcServer, free_port
from bench.harness.prompts import PromptMaker
from bench.scenarios.p_http import CTX, PER_CLIENT, _arm

MAX_TOKENS = 64


def level(srv: GrpcServer, http_port: int, model: Path, c: int, rounds: int) -> dict[str, Any]:
    maker = PromptMaker(model, seed=3000 + c)
    name = model.name.removesuffix(".gguf")
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        for arm in ("http", "grpc") if r % 2 == 0 else ("grpc", "http"):
            prompts = [maker.unique(PER_CLIENT[c], 30, 60) for _ in range(c)]
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            results = asyncio.run(_arm(arm, srv, f"http://127.0.0.1:{http_port}", "", prompts, MAX_TOKENS, name))
            row = summarize(results, time.perf_counter() - t0)
            runs.append({"round": r, "arm": arm, "load1": round(load, 2), "tok_s": row["tok_s"],
                         "ttft_p50_ms": row["ttft"]["p50_ms"], "failed": row["failed"]})
            print(json.dumps({"c": c, **runs[-1]}), flush=True)
    by = {(x["round"], x["arm"]): x["tok_s"] for x in runs}
    ratios = [by[r, "http"] / by[r, "grpc"] for r in range(rounds) if by[r, "grpc"]]
    return {"runs": runs, "http_over_grpc": [round(x, 3) for x in ratios],
            "median": round(statistics.median(ratios), 3) if ratios else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--levels", default="1,8,16,32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "extra" / "http_vs_grpc.json")
    args = ap.parse_args()
    http_port = free_port()
    flags = ["--http-port", str(http_port), "--max-running", "32", "--ctx", str(CTX)]
    out: dict[str, Any] = {"study": "http_vs_grpc", "model": args.model.name, "rounds": args.rounds, "levels": {}}
    with GrpcServer("http-vs-grpc", args.model, *flags, threads=args.threads) as srv:
        asyncio.run(_arm("grpc", srv, "", "", [["warm up"]], 4, ""))
        for c in (int(x) for x in args.levels.split(",")):
            out["levels"][str(c)] = level(srv, http_port, args.model, c, args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({c: v["median"] for c, v in out["levels"].items()}))


if __name__ == "__main__":
    main()
