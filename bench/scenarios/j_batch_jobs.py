"""Scenario J — batch jobs (BatchService): throughput, interactive latency beside a job, kill -9 chaos.

1. Throughput: one job of N items (prompts 30-300 tokens, 32 output tokens,
   ignore_eos) vs the same items sent as closed-loop batch-tier Generate
   streams at several concurrencies; the job runs with --batch-max-running at
   the best stream concurrency. Ratio = job items/s / best streams items/s.
2. Interactive TTFT (2 requests/s x 64 tokens, open loop) while a job runs,
   vs while closed-loop batch streams (as many as the job's running cap) run.
3. Chaos: a job of M small items; the server is killed with SIGKILL at
   random points (after random numbers of finished items) and restarted on the
   same database each time. Reports lost items, duplicated results and items
   executed more than once (vs the running cap per kill).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.v1 import batch_pb2 as bpb

from bench.harness.batch_jobs import FINAL, all_results, get, item, submit, wait
from bench.harness.config import BenchConfig, say
from bench.harness.grpc_load import BATCH, ReqResult, channel, closed_loop
from bench.harness.mixed_load import WindowMeter, interactive
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.stats import latency_summary, ratio
from bench.harness.tables import fmt, table, verdict


@dataclass(frozen=True)
class Plan:
    items: int  # throughput job size (the issue asks 2,000; see run())
    out_tokens: int
    stream_concurrency: tuple[int, ...]
    window_s: float  # interactive measurement window
    chaos_items: int
    chaos_tokens: int
    kills: int
    rounds: int = 1  # alternating streams/job rounds per concurrency (medians are reported)


FULL = Plan(300, 32, (8, 16), 30.0, 500, 8, 10)
QUICK = Plan(24, 8, (4,), 6.0, 24, 4, 2)
MAX_RUNNING = 32
CTX = 16384
# NOTE: fixed compute threads: the adaptive controller (--adaptive-threads) reacts to other load on a
# shared machine and can sit at 1 thread through one run and not the other (seen: the whole job at 1
# thread, the streams flipping 1 <-> 2), which would measure the controller, not the job.
FIXED = ("--no-adaptive-threads",)
# the interactive requests beside the job or the streams: 64 tokens every 0.5 s after a 3 s ramp
INTERACTIVE_TOKENS, INTERVAL_S, RAMP_S = 64, 0.5, 3.0


def _flags(cap: int | None = None, db: Path | None = None) -> list[str]:
    out = ["--ctx", str(CTX), "--max-running", str(MAX_RUNNING), *FIXED]
    if db is not None:
        out += ["--batch-db", str(db)]
    if cap is not None:
        out += ["--batch-max-running", str(cap)]
    return out


async def _streams(target: str, prompts: list[str], n: int, tokens: int) -> dict[str, Any]:
    groups = [prompts[i::n] for i in range(n)]
    async with channel(target) as ch:
        t0 = time.perf_counter()
        res = await closed_loop(ch, groups, tokens, BATCH)
        wall = time.perf_counter() - t0
    ok = [r for r in res if r.ok]
    return {
        "streams": n,
        "items": len(res),
        "completed": len(ok),
        "wall_s": round(wall, 2),
        "items_per_s": len(ok) / wall,
        "tok_s": sum(r.tokens for r in ok) / wall,
    }


def _job(target: str, prompts: list[str], tokens: int, key: str) -> dict[str, Any]:
    items = [item(f"t{i:05d}", p, tokens) for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    batch_id = submit(target, items, key)
    upload_s = time.perf_counter() - t0
    job = wait(target, batch_id)
    wall = time.perf_counter() - t0
    return {
        "items": len(items),
        "completed": job.counts.completed,
        "wall_s": round(wall, 2),
        "upload_s": round(upload_s, 2),
        "items_per_s": job.counts.completed / wall,
        "tok_s": job.usage.completion_tokens / wall,
    }


def _throughput(cfg: BenchConfig, prompts: list[str], plan: Plan, tmp: Path) -> dict[str, Any]:
    """Per concurrency n, on one server with --batch-max-running n: the items as n closed-loop
    batch streams, then as one job (same process, so both see the same warm state); with
    ``plan.rounds`` > 1 the two alternate and the medians are compared (the machine is shared)."""
    out: dict[str, Any] = {}
    for n in plan.stream_concurrency:
        rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []
        with GrpcServer(
            f"J-throughput-{n}", cfg.model, *_flags(n, tmp / f"t{n}.db"), threads=cfg.threads
        ) as srv:
            for k in range(plan.rounds):
                streams = asyncio.run(_streams(srv.target, prompts, n, plan.out_tokens))
                rounds.append((streams, _job(srv.target, prompts, plan.out_tokens, f"throughput-{n}-{k}")))
        streams = {
            "items_per_s": statistics.median(r[0]["items_per_s"] for r in rounds),
            "rounds": [r[0] for r in rounds],
        }
        job = {
            "items_per_s": statistics.median(r[1]["items_per_s"] for r in rounds),
            "rounds": [r[1] for r in rounds],
            "upload_s": max(r[1]["upload_s"] for r in rounds),
        }
        out[str(n)] = {
            "streams": streams,
            "job": job,
            "job_vs_streams": ratio(job["items_per_s"], streams["items_per_s"]),
        }
        say(
            f"  x{n}: streams {streams['items_per_s']:.2f} items/s, job {job['items_per_s']:.2f} items/s "
            f"= {out[str(n)]['job_vs_streams'] or 0:.3f}x"
        )
    return out


def _interactive_beside(
    cfg: BenchConfig, maker: PromptMaker, plan: Plan, cap: int, db: Path, with_job: bool
) -> dict[str, Any]:
    """Interactive TTFT during a job (``with_job``) or during ``cap`` closed-loop batch streams."""
    flags = _flags(cap, db)
    background = maker.unique(max(4 * cap, int(plan.window_s * 12)), 30, 300)  # outlasts the window
    inter_prompts = maker.unique(64, 30, 60)
    label = "job" if with_job else "streams"
    with GrpcServer(f"J-interactive-{label}", cfg.model, *flags, threads=cfg.threads) as srv:
        if with_job:
            items = [item(f"b{i:05d}", p, plan.out_tokens) for i, p in enumerate(background)]
            batch_id = submit(srv.target, items, "beside-interactive")

        async def go() -> list[ReqResult]:
            async with channel(srv.target) as ch:
                start = time.perf_counter() + RAMP_S
                meter = WindowMeter(start, start + plan.window_s)
                bg = None
                if not with_job:
                    groups = [background[i::cap] for i in range(cap)]
                    bg = asyncio.create_task(closed_loop(ch, groups, plan.out_tokens, BATCH, until=meter.end))
                res = await interactive(ch, inter_prompts, INTERACTIVE_TOKENS, INTERVAL_S, meter)
                if bg is not None:
                    await bg
                return res

        res = asyncio.run(go())
        progress = get(srv.target, batch_id).counts.completed if with_job else None
    ok = [r for r in res if r.ok]
    return {
        "background": label,
        "interactive_requests": len(res),
        "failed": len(res) - len(ok),
        "ttft": latency_summary([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        "job_items_completed_in_run": progress,
    }


def _chaos(cfg: BenchConfig, maker: PromptMaker, plan: Plan, cap: int, db: Path) -> dict[str, Any]:
    """Kill -9 the server after random numbers of finished items, restart it on the same database."""
    rng = random.Random(1414)
    items = [
        item(f"c{i:05d}", p, plan.chaos_tokens) for i, p in enumerate(maker.unique(plan.chaos_items, 30, 60))
    ]
    points = sorted(rng.sample(range(1, plan.chaos_items), plan.kills))
    flags = _flags(cap, db)
    kills: list[dict[str, Any]] = []
    srv = GrpcServer("J-chaos-0", cfg.model, *flags, threads=cfg.threads)
    srv.start()
    try:
        batch_id = submit(srv.target, items, "chaos")
        for k, point in enumerate(points, 1):
            b = wait(srv.target, batch_id, lambda b, p=point: b.counts.completed >= p or b.state in FINAL)
            assert srv.proc is not None
            srv.proc.kill()  # SIGKILL at a random point
            srv.proc.wait(10)
            srv.stop()
            kills.append(
                {
                    "after_completed": point,
                    "seen_completed": b.counts.completed,
                    "seen_running": b.counts.running,
                }
            )
            srv = GrpcServer(f"J-chaos-{k}", cfg.model, *flags, threads=cfg.threads)
            srv.start()
        job = wait(srv.target, batch_id)
        results = all_results(srv.target, batch_id)
    finally:
        srv.stop()
    ids = [r.custom_id for r in results]
    expected = {i.custom_id for i in items}
    reruns = sum(max(0, r.attempts - 1) for r in results)
    return {
        "items": len(items),
        "kills": kills,
        "state": bpb.BatchState.Name(job.state),
        "lost_items": len(expected - set(ids)),
        "duplicated_results": len(ids) - len(set(ids)),
        "items_executed_more_than_once": sum(1 for r in results if r.attempts > 1),
        "extra_executions": reruns,
        "running_cap": cap,
        "bound_extra_executions": cap * len(points),
        "failed_items": sum(1 for r in results if r.HasField("error")),
    }


def run(cfg: BenchConfig) -> dict[str, Any]:
    plan = QUICK if cfg.quick else FULL
    maker = PromptMaker(cfg.model, seed=1400)
    prompts = maker.unique(plan.items, 30, 300)
    out: dict[str, Any] = {"plan": plan.__dict__, "max_running": MAX_RUNNING, "ctx": CTX}
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        out["throughput"] = _throughput(cfg, prompts, plan, Path(tmp))
        best_n = max(out["throughput"], key=lambda n: out["throughput"][n]["streams"]["items_per_s"])
        cap, job_vs = int(best_n), out["throughput"][best_n]["job_vs_streams"]
        say(f"  best stream concurrency {cap}: job = {job_vs or 0:.3f}x streams")
        beside = {
            label: _interactive_beside(cfg, maker, plan, cap, Path(tmp) / f"{label}.db", label == "job")
            for label in ("streams", "job")
        }
        out["interactive"] = beside
        p99_job, p99_streams = beside["job"]["ttft"]["p99_ms"], beside["streams"]["ttft"]["p99_ms"]
        say(f"  interactive TTFT p99: {p99_job} ms beside the job, {p99_streams} ms beside {cap} streams")
        out["chaos"] = _chaos(cfg, maker, plan, cap, Path(tmp) / "chaos.db")
        c = out["chaos"]
        say(
            f"  chaos: {len(c['kills'])} kills, lost {c['lost_items']}, duplicated {c['duplicated_results']}, "
            f"re-executed {c['items_executed_more_than_once']} (bound {c['bound_extra_executions']})"
        )
    out["checks"] = {
        "job_vs_best_streams": job_vs,
        "target_job_vs_streams": 0.95,
        "interactive_p99_job_ms": p99_job,
        "interactive_p99_streams_ms": p99_streams,
        "interactive_p99_ratio": ratio(p99_job, p99_streams),
        "target_p99_ratio": 1.2,
        "chaos_lost": out["chaos"]["lost_items"],
        "chaos_duplicated": out["chaos"]["duplicated_results"],
        "chaos_extra_executions": out["chaos"]["extra_executions"],
        "chaos_bound": out["chaos"]["bound_extra_executions"],
    }
    return out


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario J."""
    p, c = r["plan"], r["checks"]
    rows = []
    for n, t in r["throughput"].items():
        rows.append(
            [
                f"x{n}",
                fmt(t["streams"]["items_per_s"], 2),
                fmt(t["job"]["items_per_s"], 2),
                fmt(t["job_vs_streams"], 3),
                fmt(t["job"]["upload_s"], 1),
            ]
        )
    out = [
        f"{p['items']} items (prompts 30-300 tokens, {p['out_tokens']} output tokens, ignore_eos) as closed-loop "
        "batch-tier streams and as one job on the same server (--batch-max-running = the stream count).",
        "",
        table(["concurrency", "streams items/s", "job items/s", "job / streams", "job upload s"], rows),
        "",
        f"- Job vs the best stream concurrency: **{fmt(c['job_vs_best_streams'], 3)}x** (target >= 0.95: "
        f"{verdict(c['job_vs_best_streams'], 0.95)})",
        f"- Interactive TTFT p99 (2/s x 64 tokens): {fmt(c['interactive_p99_job_ms'], 0)} ms beside the job vs "
        f"{fmt(c['interactive_p99_streams_ms'], 0)} ms beside the same number of batch streams = "
        f"**{fmt(c['interactive_p99_ratio'], 2)}x** (target <= 1.2: "
        f"{verdict(c['interactive_p99_ratio'], 1.2, higher_is_better=False)})",
    ]
    ch = r["chaos"]
    out.append(
        f"- Chaos: {len(ch['kills'])} x kill -9 during a {ch['items']}-item job ({p['chaos_tokens']} tokens each), "
        f"restarted on the same database: lost **{ch['lost_items']}**, duplicated results "
        f"**{ch['duplicated_results']}**, items executed more than once {ch['items_executed_more_than_once']} "
        f"({ch['extra_executions']} extra runs; bound: running cap {ch['running_cap']} x kills = "
        f"{ch['bound_extra_executions']}); final state {ch['state']}"
    )
    return "\n".join(out)
