"""Per-token cost of issue 30's structured-output work, paired rounds: is it within 3% of today?

``python -m bench.studies.json_finish_cost [--rounds 12] [--threads 2] [--out FILE]``

Scenario F's "finish" part measures the cost on fixed-shape requests (a story in a
JSON string, ``f_finish.COST_TOKENS`` tokens, ignore_eos, ``f_finish.CLIENTS`` at
once) with a mean over 6 rounds per arm, which a shared machine's noise swamps.
This study runs the same requests on one server for more rounds, arms in the order
A B C C B A ..., and records for each round the 1-minute load average before it,
the server's time per output token (``(total_ms - ttft_ms) / (tokens - 1)``,
median of the round's requests) and the server process's CPU seconds per output
token (``/proc/<pid>/stat``). Each arm's round is compared with the ``today``
round run next to it (the arms of one triple A B C saw the same moment of the
machine); the result is the median of those paired ratios, per measure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from inference.v1 import inference_pb2_grpc as pb_grpc

from bench.harness.config import ROOT
from bench.harness.procs import GrpcServer
from bench.scenarios.f_finish import ARMS, CLIENTS, MODEL, _cost_one

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def one_round(stub: pb_grpc.InferenceServiceStub, pid: int, arm: str, i: int) -> dict[str, Any]:
    """``CLIENTS`` requests of one arm at once: load before, time and CPU per output token."""
    load, cpu0 = os.getloadavg()[0], cpu_seconds(pid)
    with ThreadPoolExecutor(CLIENTS) as pool:
        runs = list(pool.map(_cost_one, [stub] * CLIENTS, [arm] * CLIENTS, [1000 * i + k for k in range(CLIENTS)]))
    cpu = cpu_seconds(pid) - cpu0
    ok = [r for r in runs if "tpot_ms" in r]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "round": i,
        "arm": arm,
        "loadavg_1m": load,
        "requests_ok": len(ok),
        "tokens": tokens,
        "tpot_ms_median": statistics.median(r["tpot_ms"] for r in ok) if ok else None,
        "cpu_ms_per_token": 1000 * cpu / tokens if tokens else None,
        "errors": [r["error"] for r in runs if "error" in r],
    }


def paired(rounds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Per arm: the median over triples of (arm's round / the same triple's ``today`` round)."""
    names = list(ARMS)
    out: dict[str, Any] = {}
    for arm in names[1:]:
        ratios = []
        for t in range(0, len(rounds), len(names)):
            triple = {r["arm"]: r[key] for r in rounds[t : t + len(names)]}
            if triple.get(arm) and triple.get("today"):
                ratios.append(triple[arm] / triple["today"])
        out[arm] = {
            "pairs": len(ratios),
            "median_ratio": statistics.median(ratios) if ratios else None,
            "ratios": [round(x, 4) for x in ratios],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=12, help="rounds per arm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "extra" / "json_finish_cost.json")
    args = ap.parse_args()
    names = list(ARMS)
    order = [names[i % 3] if (i // 3) % 2 == 0 else names[2 - i % 3] for i in range(3 * args.rounds)]
    t0 = time.time()
    with GrpcServer("json-finish-cost", MODEL, threads=args.threads) as srv, grpc.insecure_channel(srv.target) as ch:
        stub = pb_grpc.InferenceServiceStub(ch)
        one_round(stub, srv.pid, "today", 999)  # warm-up, not recorded
        rounds = []
        for i, arm in enumerate(order):
            rounds.append(one_round(stub, srv.pid, arm, i))
            r = rounds[-1]
            print(f"round {i:2d} {arm:13s} load {r['loadavg_1m']:.2f} tpot {r['tpot_ms_median']} cpu/token {r['cpu_ms_per_token']}")
    result = {
        "study": "json_finish_cost",
        "model": MODEL.name,
        "clients": CLIENTS,
        "threads": args.threads,
        "arms": {k: {kk: str(vv) for kk, vv in v.items()} for k, v in ARMS.items()},
        "elapsed_s": round(time.time() - t0, 1),
        "rounds": rounds,
        "tpot_vs_today": paired(rounds, "tpot_ms_median"),
        "cpu_per_token_vs_today": paired(rounds, "cpu_ms_per_token"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("tpot_vs_today", "cpu_per_token_vs_today")}, indent=1))


if __name__ == "__main__":
    main()
