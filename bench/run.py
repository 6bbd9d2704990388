"""``python -m bench.run [--quick] [--only A,B,...] [--model PATH] [--threads N]``: the benchmark suite.

Scenarios (each starts its own server subprocesses and stops them):

  A throughput        continuous batcher vs --max-running 1 vs raw engine vs llama_cpp.server
  B kv_memory         shared KV pool vs the naive 8 x 4096 reservation
  C prefix_reuse      cold vs warm TTFT of a ~1,100-token shared prefix
  D many_prefixes     32 system prompts round-robin: prefix hit rate vs --no-prefix-cache
  E priority          interactive TTFT and batch throughput under mixed load, priority vs fcfs
  F structured_output GenerateJSON vs unconstrained generation of the same length
  G tracing           tracing overhead (bench/bench_tracing.py, when present)
  H fairness          two tenants 16:2 streams, fair share on vs off; TLS and auth cost
  I scale             3 replicas (1 thread each): round_robin vs prefix_affinity routing
  L contention        4/16 streams beside 0-2 busy processes: adaptive vs fixed threads (vs OMP passive)
  K response_cache    exact cache on a 50%-repeat Zipf workload vs none; semantic hit / false-hit rates
  J batch_jobs        BatchService: job vs batch streams throughput, interactive TTFT beside a job, kill -9 chaos
  M api               logprobs + top_logprobs 5 vs none at 16 streams; n=8 choices vs 8 requests
  N speculative       1 stream: extraction / edit / story with speculation on vs off; 16 streams

Results: ``bench/results/<name>.json`` per scenario, ``bench/results/summary.md`` and its
charts in ``bench/results/plots/`` (``bench/plots.py``);
server logs in ``bench/results/logs/``. ``--quick`` runs tiny loads (seconds per
scenario, for checking the harness) into ``bench/results/quick/`` instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import report
from bench.common import (
    DEFAULT_MODEL,
    RESULTS,
    BenchConfig,
    machine_info,
    results_dir,
    say,
    set_results_dir,
    write_result,
)


class Skipped(Exception):
    """The scenario cannot run here (the reason is recorded, the suite goes on)."""


@dataclass(frozen=True)
class Scenario:
    key: str
    name: str
    title: str
    run: Callable[[BenchConfig], dict[str, Any]]
    full_estimate_s: int  # expected duration of the full (non-quick) run on a quiet 2-core machine


def _throughput(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_throughput

    return s_throughput.run(cfg)


def _memory(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_memory

    return s_memory.run(cfg)


def _cold_warm(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_prefix

    return s_prefix.run_cold_warm(cfg)


def _many_prefixes(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_prefix

    return s_prefix.run_many_prefixes(cfg)


def _priority(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_priority

    return s_priority.run(cfg)


def _structured(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_structured

    out = s_structured.run(cfg)
    if "skipped" in out:
        raise Skipped(out["skipped"])
    return out


def _fairness(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_fairness

    return s_fairness.run(cfg)


def _tracing(cfg: BenchConfig) -> dict[str, Any]:
    try:
        mod = importlib.import_module("bench.bench_tracing")
    except ModuleNotFoundError as exc:
        if exc.name != "bench.bench_tracing":
            raise
        raise Skipped("bench/bench_tracing.py is not there yet") from exc
    out: dict[str, Any] = {}
    saved = os.environ.get("INFERENCE_THREADS")
    if cfg.threads:  # its servers take --threads from the environment (service/config.py)
        os.environ["INFERENCE_THREADS"] = str(cfg.threads)
    try:
        mod.run(str(cfg.model), out, quick=cfg.quick)
    finally:
        if saved is None:
            os.environ.pop("INFERENCE_THREADS", None)
        else:
            os.environ["INFERENCE_THREADS"] = saved
    return out


def _speculative(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_speculative

    return s_speculative.run(cfg)


def _api(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_api

    return s_api.run(cfg)


def _batch_jobs(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_batch

    return s_batch.run(cfg)


def _response_cache(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_cache

    return s_cache.run(cfg)


def _contention(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_contention

    return s_contention.run(cfg)


def _scale(cfg: BenchConfig) -> dict[str, Any]:
    from bench import s_scale

    return s_scale.run(cfg)


SCENARIOS = [
    Scenario(
        "A",
        "throughput",
        "Throughput: continuous batching vs sequential vs raw engine vs llama_cpp.server",
        _throughput,
        420,
    ),
    Scenario("B", "kv_memory", "KV memory: shared block pool vs naive per-request reservation", _memory, 90),
    Scenario("C", "prefix_reuse", "Prefix reuse: cold vs warm TTFT", _cold_warm, 60),
    Scenario("D", "many_prefixes", "Many prefixes: 32 system prompts round-robin", _many_prefixes, 120),
    Scenario(
        "E", "priority", "Mixed priority load: interactive latency and batch throughput", _priority, 270
    ),
    Scenario("F", "structured_output", "Structured output overhead", _structured, 90),
    Scenario("G", "tracing", "Tracing overhead", _tracing, 180),
    Scenario("H", "fairness", "Fair share between tenants; cost of TLS and token auth", _fairness, 600),
    Scenario("I", "scale", "Scale-out routing: 3 replicas, round_robin vs prefix_affinity", _scale, 540),
    Scenario("L", "contention", "Noisy neighbours: adaptive vs fixed threads beside busy processes", _contention, 600),
    Scenario("K", "response_cache", "Response cache: exact replay and semantic reuse", _response_cache, 420),
    Scenario("J", "batch_jobs", "Batch jobs: throughput, interactive latency beside a job, kill -9 chaos",
             _batch_jobs, 900),
    Scenario("M", "api", "Logprobs cost; n choices vs n separate requests", _api, 240),
    Scenario("N", "speculative", "One caller alone: prompt-lookup speculative decoding on vs off", _speculative, 420),
]


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


def write_summary() -> Path:
    files = sorted(
        p
        for p in results_dir().glob("*.json")
        if json.loads(p.read_text()).get("scenario") in {s.key for s in SCENARIOS}
    )
    path = results_dir() / "summary.md"
    charts = [(title, str(png.relative_to(results_dir()))) for title, png in render_charts()]
    path.write_text(report.render_summary(files, charts))
    return path


def render_charts() -> list[tuple[str, Path]]:
    """PNG charts of the results (bench/plots.py); none, said loudly, without matplotlib."""
    try:
        from bench import plots
    except ModuleNotFoundError as exc:
        if exc.name != "matplotlib":
            raise
        say("CHARTS SKIPPED: matplotlib is not installed (run `make bench-env`)")
        return []
    charts = plots.render_all(results_dir())
    say(f"charts: {', '.join(str(p) for _, p in charts) or 'none (no results)'}")
    return charts


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
    unknown = keys - {s.key for s in SCENARIOS}
    if unknown:
        sys.exit(f"unknown scenario(s): {', '.join(sorted(unknown))}; choose from A-G")
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
