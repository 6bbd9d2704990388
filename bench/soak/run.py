"""``python -m bench.soak [--minutes 10] [--workers 6] [--threads 2]``: the soak benchmark (``make soak``).

Starts one server process (``python -m service``, the default model) and drives
the mixed load of ``bench/soak/load.py`` for ``--minutes``: concurrent Generate
streams with prompts of 4 to ~1,000 tokens, GenerateJSON with several schemas,
cancel messages, abrupt stream closes, short deadlines. Every ``--interval-s``
(10 s) it samples the server's ``RssAnon`` (/proc/PID/status) and a few
GetMetrics gauges. It reports the least-squares slope of RssAnon after the first
minute (MiB/min), the requests by outcome and every unexpected error with its
message, then checks that the server is idle afterwards (no running or waiting
request, no KV block in use). Target: slope < 1 MiB/min, zero unexpected errors;
the exit status is 1 when it is missed. Results: ``bench/results/soak.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tqdm import tqdm

from bench.harness.config import ROOT, say, set_results_dir
from bench.harness.grpc_load import channel, get_metrics
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.results import machine_info, write_result
from bench.soak import report
from bench.soak.load import REQUEST_TIMEOUT_S, Tally, Worker, Workload

DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_SLOPE_MIB_PER_MIN = 1.0
WARMUP_S = 60.0  # the slope ignores the first minute (allocator, caches and pools filling)


def rss_anon_kib(pid: int) -> int | None:
    """``RssAnon`` of ``pid`` in KiB (None when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def slope_mib_per_min(samples: list[dict[str, Any]], after_s: float) -> float | None:
    """Least-squares slope of RssAnon (MiB per minute) over the samples taken at or after ``after_s``."""
    pts = [
        (s["t_s"] / 60.0, s["rss_anon_kib"] / 1024.0)
        for s in samples
        if s["t_s"] >= after_s and s.get("rss_anon_kib") is not None
    ]
    if len(pts) < 3:
        return None
    t, mib = np.array(pts).T
    return float(np.polyfit(t, mib, 1)[0])


def make_workload(model: Path, seed: int) -> Workload:
    """64 prompts of 4 .. ~1,000 tokens (log-uniform, three near 1,000) and 16 JSON prompts."""
    maker = PromptMaker(model, seed=seed)
    rng = maker.rng
    lengths = [1000, 950, 900] + [int(math.exp(rng.uniform(math.log(4), math.log(1000)))) for _ in range(61)]
    subjects = ["a person", "a colour and a score", "a list of items", "a family tree"]
    json_prompts = [
        f"Reply with JSON only: describe {rng.choice(subjects)}. Notes: {maker.words(rng.randint(4, 60))}\n"
        for _ in range(16)
    ]
    return Workload(prompts=[maker.text(n) for n in lengths], json_prompts=json_prompts, seed=seed)


async def _sample(srv: GrpcServer, ch: grpc.aio.Channel, tally: Tally, t_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {
        "t_s": round(t_s, 1),
        "rss_anon_kib": rss_anon_kib(srv.pid),
        "requests": tally.total,
    }
    try:
        m = await get_metrics(ch)
    except grpc.RpcError as exc:
        row["metrics_error"] = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        return row
    row.update(
        running=m.running, waiting=m.waiting, blocks_used=m.kv.blocks_used, blocks_cached=m.kv.blocks_cached
    )
    return row


async def _monitor(
    srv: GrpcServer,
    ch: grpc.aio.Channel,
    tally: Tally,
    stop: asyncio.Event,
    interval_s: float,
    bar: tqdm[Any],
) -> list[dict[str, Any]]:
    """Sample every ``interval_s`` until ``stop`` (or the server exits); tick the progress bar each second.

    NOTE: sampling goes on while the requests in flight at the end time finish, so the tail is measured too.
    """
    samples: list[dict[str, Any]] = []
    next_sample = tally.t0
    while not stop.is_set() and srv.proc is not None and srv.proc.poll() is None:
        now = time.monotonic()
        if now >= next_sample:
            samples.append(await _sample(srv, ch, tally, now - tally.t0))
            next_sample += interval_s
        rss = samples[-1]["rss_anon_kib"] or 0
        bar.n = min(bar.total, int(now - tally.t0))
        bar.set_postfix(req=tally.total, unexpected=tally.unexpected_total, rss_anon=f"{rss / 1024:.1f}MiB")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    return samples


async def _settle(srv: GrpcServer, ch: grpc.aio.Channel, wait_s: float = 30.0) -> dict[str, Any]:
    """After the load: wait for the server to go idle; its gauges, health and liveness."""
    out: dict[str, Any] = {"server_alive": srv.proc is not None and srv.proc.poll() is None}
    if not out["server_alive"]:
        out["server_exit_code"] = srv.proc.returncode if srv.proc is not None else None
        return out
    deadline = time.monotonic() + wait_s
    while True:
        m = await get_metrics(ch)
        idle = m.running == 0 and m.waiting == 0 and m.kv.blocks_used == 0
        if idle or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.5)
    health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    out.update(
        idle=idle,
        running=m.running,
        waiting=m.waiting,
        blocks_used=m.kv.blocks_used,
        blocks_cached=m.kv.blocks_cached,
        health=health_pb2.HealthCheckResponse.ServingStatus.Name(health.status),
        requests_total=m.requests_total,
        rejections_total=m.rejections_total,
        preemptions_total=m.preemptions_total,
        prompt_tokens_total=m.prompt_tokens_total,
        generated_tokens_total=m.generated_tokens_total,
        grammar_compiles=m.grammar.compiles,
        grammar_cache_hits=m.grammar.cache_hits,
    )
    return out


async def drive(srv: GrpcServer, work: Workload, args: argparse.Namespace) -> dict[str, Any]:
    """Run the load for ``args.minutes`` with the sampler beside it; everything measured."""
    tally = Tally()
    until = tally.t0 + args.minutes * 60.0
    async with channel(srv.target) as ch:
        tty = sys.stderr.isatty()
        with tqdm(total=int(args.minutes * 60), unit="s", desc="soak", mininterval=1 if tty else 30) as bar:
            stop = asyncio.Event()
            monitor = asyncio.create_task(_monitor(srv, ch, tally, stop, args.interval_s, bar))
            workers = [Worker(ch, work, tally, i) for i in range(args.workers)]
            await asyncio.gather(*(w.run(until) for w in workers))
            stop.set()
            samples = await monitor
        load_s = time.monotonic() - tally.t0
        after = await _settle(srv, ch)
        if after["server_alive"]:
            samples.append(await _sample(srv, ch, tally, time.monotonic() - tally.t0))
    return {"tally": tally, "samples": samples, "load_s": load_s, "after_load": after}


def _git_dirty() -> bool:
    """Whether service/ differs from HEAD at the start (the server runs the working tree)."""
    cmd = ["git", "status", "--porcelain", "--untracked-files=no", "--", "service"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    return bool(out.stdout.strip())


def build_doc(
    args: argparse.Namespace, machine: dict[str, Any], run: dict[str, Any], cpu_s: float
) -> dict[str, Any]:
    """The soak.json document; ``machine`` was taken before the server started."""
    tally: Tally = run["tally"]
    samples = run["samples"]
    slope = slope_mib_per_min(samples, WARMUP_S)
    rss = [s["rss_anon_kib"] / 1024.0 for s in samples if s.get("rss_anon_kib") is not None]
    by_action: dict[str, dict[str, int]] = {}
    for (action, outcome), n in sorted(tally.counts.items()):
        by_action.setdefault(action, {})[outcome] = n
    after = run["after_load"]
    met = {
        "slope": slope is not None and slope < TARGET_SLOPE_MIB_PER_MIN,
        "no_unexpected_errors": tally.unexpected_total == 0,
        "idle_after_load": bool(after.get("idle")),
    }
    return {
        "name": "soak",
        "title": "Soak: RssAnon slope and errors under mixed load",
        "machine": machine | {"loadavg_at_end": [round(x, 2) for x in os.getloadavg()]},
        "config": {
            "minutes": args.minutes,
            "workers": args.workers,
            "interval_s": args.interval_s,
            "seed": args.seed,
        },
        "load_s": round(run["load_s"], 1),
        "bench_client_cpu_s": round(cpu_s, 1),
        "rss_anon": {
            "slope_mib_per_min_after_1min": slope,
            "slope_mib_per_min_all": slope_mib_per_min(samples, 0.0),
            "first_mib": rss[0] if rss else None,
            "last_mib": rss[-1] if rss else None,
            "max_mib": max(rss, default=None),
            "target_mib_per_min": TARGET_SLOPE_MIB_PER_MIN,
        },
        "requests": {"total": tally.total, "by_action": by_action},
        "unexpected_errors": {"count": tally.unexpected_total, "kept": tally.unexpected},
        "slow": {
            "limit_s": REQUEST_TIMEOUT_S,
            "count": sum(1 for x in tally.slow if x["action"] != "late_answer"),
            "events": tally.slow,
        },
        "after_load": after,
        "target_met": met | {"all": all(met.values())},
        "samples": samples,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--minutes", type=float, default=10.0, help="load duration (default: %(default)s)")
    ap.add_argument(
        "--workers", type=int, default=6, help="concurrent closed-loop clients (default: %(default)s)"
    )
    ap.add_argument("--threads", type=int, default=2, help="server llama.cpp threads (default: %(default)s)")
    ap.add_argument(
        "--interval-s", type=float, default=10.0, help="RssAnon sampling period (default: %(default)s)"
    )
    ap.add_argument("--seed", type=int, default=1, help="seed of prompts and of each worker's choices")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="GGUF model (default: %(default)s)")
    ap.add_argument(
        "--results-dir", type=Path, default=None, help="where soak.json goes (default: bench/results)"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.results_dir is not None:
        set_results_dir(args.results_dir.resolve())
    if not args.model.is_file():
        sys.exit(f"model {args.model} not found: run `make setup`")
    work = make_workload(args.model, args.seed)
    say(
        f"soak: {args.minutes:g} min, {args.workers} workers, server --threads {args.threads}, {args.model.name}"
    )
    machine = machine_info(args.model, quick=args.minutes < 10)
    machine.update(threads=args.threads, git_dirty_service=_git_dirty())
    cpu0 = sum(os.times()[:2])
    with GrpcServer("soak", args.model, threads=args.threads) as srv:
        run = asyncio.run(drive(srv, work, args))
    doc = build_doc(args, machine, run, sum(os.times()[:2]) - cpu0)
    path = write_result("soak", doc)
    say(report.render(doc))
    say(f"wrote {path} (server log: {srv.log_path})")
    return 0 if doc["target_met"]["all"] else 1


if __name__ == "__main__":
    sys.exit(main())
