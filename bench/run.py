"""``python -m bench.run [--quick] [--only A,B,...] [--model PATH] [--threads N]``: the benchmark suite.

Scenarios (each starts its own server subprocesses and stops them):

  A throughput        continuous batcher vs --max-running 1 vs raw engine vs llama_cpp.server
  B kv_memory         shared KV pool vs the naive 8 x 4096 reservation
  C prefix_reuse      cold vs warm TTFT of a ~1,100-token shared prefix
  D many_prefixes     32 system prompts round-robin: prefix hit rate vs --no-prefix-cache
  E priority          interactive TTFT and batch throughput under mixed load, priority vs fcfs
  F structured_output GenerateJSON vs unconstrained generation of the same length; 120 dev schemas:
                      valid / closed early / cut off, today vs repetition control vs + json_finish
  G tracing           tracing overhead: OTLP trace export on vs off
  H fairness          two tenants 16:2 streams, fair share on vs off; TLS and auth cost
  I scale             3 replicas (1 thread each): round_robin vs prefix_affinity routing
  L contention        4/16 streams beside 0-2 busy processes: adaptive vs fixed threads (vs OMP passive)
  K response_cache    exact cache on a 50%-repeat Zipf workload vs none; semantic hit / false-hit rates
  J batch_jobs        BatchService: job vs batch streams throughput, interactive TTFT beside a job, kill -9 chaos
  M api               logprobs + top_logprobs 5 vs none at 16 streams; n=8 choices vs 8 requests
  N speculative       1 stream: extraction / edit / story with speculation on vs off; 16 streams
  O replicas          one 300-item job: 3 replicas on one PostgreSQL store vs 1 vs 3 SQLite replicas; kill -9
  P http              OpenAI HTTP API vs gRPC vs llama.cpp's llama-server, 1-32 streams (make llama-tools)
  Q prefix_defaults   default flags, 32 system prompts x 8 clients: req/s vs llama-server; a request
                      sharing no prefix, after that load vs on a fresh server (make llama-tools)
  R tool_calls        tool calling (tool_choice auto) vs llama-server --jinja, default model and the 1.1B
                      shape with a tool-capable template; the auto grammar's cost per token (make llama-tools)
  S goodput           guidellm (the field's load tool) with Poisson arrivals at a sweep of rates, chat /
                      summarisation / shared-system mix: TTFT and ITL p50/p99, req/s, goodput at TTFT p99 <= 2 s
                      and ITL p99 <= 200 ms vs llama-server, both models (make goodput-env llama-tools)
  T mixed_peer        32 batch streams + an interactive request every 2 s over HTTP vs llama-server, Gemma and
                      the 1.1B shape: interactive TTFT / end-to-end p99, batch tok/s (make llama-tools)
  U kv_cache_types    --kv-cache-type f16 vs q8_0 vs q4_0: bytes per token, sequences of 2,048 in 1 GiB,
                      tokens/s at 1/16/32 streams, greedy drift against f16

Each scenario is a module of ``bench/scenarios/`` (its ``run`` and its ``render``), listed in
``bench/scenarios/catalog.py``.

Results: ``bench/results/<name>.json`` per scenario, ``bench/results/summary.md`` and its
charts in ``bench/results/plots/`` (``bench/report/``);
server logs in ``bench/results/logs/``. ``--quick`` runs tiny loads (seconds per
scenario, for checking the harness) into ``bench/results/quick/`` instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench.harness.config import DEFAULT_MODEL, RESULTS, BenchConfig, say, set_results_dir
from bench.harness.results import Skipped, machine_info, write_result
from bench.report.summary import write_summary
from bench.scenarios.catalog import BY_KEY, SCENARIOS, Scenario


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def run_one(sc: Scenario, cfg: BenchConfig) -> dict[str, Any]:
    say(f"\n== {sc.key}. {sc.title}" + (" [quick]" if cfg.quick else ""))
    doc: dict[str, Any] = {
        "scenario": sc.key,
        "name": sc.name,
        "title": sc.title,
        "machine": machine_info(cfg.model, cfg.quick) | {"threads": cfg.server_threads()},
    }
    t0, cpu0 = time.monotonic(), _own_cpu_s()
    try:
        doc["results"] = sc.run(cfg)
        doc["status"] = "ok"
    except Skipped as exc:
        doc.update(status="skipped", skipped=str(exc))
        say(f"  skipped: {exc}")
    except Exception as exc:
        doc.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        say(f"  FAILED: {type(exc).__name__}: {exc}")
    doc["elapsed_s"] = round(time.monotonic() - t0, 1)
    # CPU the bench process itself used (load generation, prompt making): it shares the cores
    doc["bench_client_cpu_s"] = round(_own_cpu_s() - cpu0, 1)
    path = write_result(sc.name, doc)
    say(f"  -> {path} ({doc['elapsed_s']:.0f} s)")
    return doc


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="tiny loads (seconds) to check the harness")
    ap.add_argument("--only", default="", help="comma-separated scenario letters, e.g. A,C")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="GGUF model (default: %(default)s)")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="llama.cpp threads of every server and the raw engine (default: all cores)",
    )
    ap.add_argument(
        "--summary-only",
        action="store_true",
        help="only rebuild summary.md and the charts from the JSON files",
    )
    ap.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="where results go (default: bench/results, quick: .../quick)",
    )
    return ap.parse_args(argv)


def select(only: str) -> list[Scenario]:
    if not only:
        return SCENARIOS
    keys = {k.strip().upper() for k in only.split(",") if k.strip()}
    unknown = keys - set(BY_KEY)
    if unknown:
        sys.exit(
            f"unknown scenario(s): {', '.join(sorted(unknown))}; choose from {', '.join(sorted(BY_KEY))}"
        )
    return [s for s in SCENARIOS if s.key in keys]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.results_dir is not None:
        set_results_dir(args.results_dir.resolve())
    elif args.quick:
        set_results_dir(RESULTS / "quick")
    if args.summary_only:
        say(f"wrote {write_summary()}")
        return 0
    if not args.model.is_file():
        sys.exit(f"model {args.model} not found: run `make bench-model`")
    cfg = BenchConfig(model=args.model.resolve(), quick=args.quick, threads=args.threads)
    chosen = select(args.only)
    if not args.quick:
        est = sum(s.full_estimate_s for s in chosen)
        say(f"running {', '.join(s.key for s in chosen)}: about {est // 60} min on a quiet 2-core machine")
    t0 = time.monotonic()
    docs = [run_one(sc, cfg) for sc in chosen]
    summary = write_summary()
    say(f"\n{summary.read_text()}")
    say(f"wrote {summary} after {(time.monotonic() - t0) / 60:.1f} min")
    return 1 if any(d["status"] == "error" for d in docs) else 0


if __name__ == "__main__":
    sys.exit(main())
