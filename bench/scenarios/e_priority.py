"""Scenario E — mixed priority load: interactive latency under batch load, batch throughput kept.

N closed-loop batch streams (PRIORITY_BATCH, 256 tokens each, ignore_eos)
run for a ramp plus a measured window; interactive requests (64 tokens)
arrive every 500 ms (open loop) during the window. Batch throughput counts the
batch tokens received inside the window; at its end the batch streams are
cancelled. Runs: interactive alone on an idle server, batch alone, and both
together with ``--scheduling priority`` and with ``--scheduling fcfs``.
Every run also keeps the raw client-side TTFT samples of both tiers (the
CDF chart of ``bench/report/plots.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import grpc

from bench.harness.config import BenchConfig, say
from bench.harness.grpc_load import BATCH, ReqResult, Stream, channel, get_metrics
from bench.harness.mixed_load import WindowMeter, interactive
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.stats import latency_summary, ratio
from bench.harness.tables import Row, fmt, table, verdict


@dataclass(frozen=True)
class Load:
    batch_streams: tuple[int, ...]
    batch_tokens: int
    interactive_tokens: int
    interval_s: float
    ramp_s: float
    window_s: float
    idle_window_s: float


FULL = Load((16, 32), 256, 64, 0.5, 5.0, 30.0, 15.0)
QUICK = Load((4,), 32, 16, 0.5, 2.0, 6.0, 4.0)
CTX = 16384  # room for 32 x (prompt + 256) tokens: KV pressure is not what this scenario measures


class TtftLog:
    """Client-side TTFT (ms) of every batch request of a run (ramp and window), as first tokens arrive.

    Requests that got no token before the batch streams were cancelled at the
    window's end are ``unfinished`` (the CDF chart counts them, so its curve
    stops below 1 when batch requests starve).
    """

    def __init__(self) -> None:
        self.sent = 0
        self.samples_ms: list[float] = []

    def sending(self) -> None:
        self.sent += 1

    def first(self, start: float, at: float) -> None:
        self.samples_ms.append(round((at - start) * 1000.0, 1))


async def _batch_client(
    ch: grpc.aio.Channel, prompts: list[str], load: Load, meter: WindowMeter, ttft: TtftLog
) -> int:
    stream = Stream(ch, on_tokens=meter.add, on_first=ttft.first)
    done = 0

    async def loop() -> None:
        nonlocal done
        i = 0
        while True:
            ttft.sending()
            res = await stream.request(prompts[i % len(prompts)], load.batch_tokens, BATCH)
            done += res.ok
            i += 1

    task = asyncio.create_task(loop())
    await asyncio.sleep(max(0.0, meter.end - time.perf_counter()))
    task.cancel()
    stream.abort()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return done


async def _wait_idle(ch: grpc.aio.Channel, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        m = await get_metrics(ch)
        if m.running == 0 and m.waiting == 0:
            return
        await asyncio.sleep(0.1)


async def one_run(
    target: str, n_batch: int, with_interactive: bool, load: Load, maker: PromptMaker, window_s: float
) -> dict[str, Any]:
    """One measurement on an idle server: ``n_batch`` closed-loop batch streams over a ramp and a
    ``window_s`` window, with (``with_interactive``) interactive requests on a timer in the window."""
    async with channel(target) as ch:
        await _wait_idle(ch)
        m0 = await get_metrics(ch)
        batch_prompts = [maker.unique(8, 30, 60) for _ in range(n_batch)]
        inter_prompts = maker.unique(64, 30, 60)
        start = time.perf_counter() + (load.ramp_s if n_batch else 0.5)
        meter = WindowMeter(start, start + window_s)
        inter_meter = WindowMeter(start, start + window_s)
        batch_ttft = TtftLog()
        batch = [asyncio.create_task(_batch_client(ch, p, load, meter, batch_ttft)) for p in batch_prompts]
        inter: list[ReqResult] = []
        if with_interactive:
            inter = await interactive(
                ch, inter_prompts, load.interactive_tokens, load.interval_s, inter_meter
            )
        completed = sum(await asyncio.gather(*batch))
        await _wait_idle(ch)
        m1 = await get_metrics(ch)
    return _row(
        n_batch=n_batch,
        window_s=window_s,
        meter=meter,
        inter_meter=inter_meter,
        inter=inter,
        batch_ttft=batch_ttft,
        completed=completed,
        m0=m0,
        m1=m1,
    )


def _row(
    *,
    n_batch: int,
    window_s: float,
    meter: WindowMeter,
    inter_meter: WindowMeter,
    inter: list[ReqResult],
    batch_ttft: TtftLog,
    completed: int,
    m0: Any,
    m1: Any,
) -> dict[str, Any]:
    """The result of ``one_run`` (``m0``/``m1``: GetMetrics before and after)."""
    ok = [r for r in inter if r.ok]
    return {
        "batch_streams": n_batch,
        "window_s": window_s,
        "batch_tokens_in_window": meter.tokens,
        "batch_tok_s": meter.tokens / window_s if n_batch else None,
        "batch_requests_completed": completed,
        "interactive_tok_s": inter_meter.tokens / window_s,
        "total_tok_s": (meter.tokens + inter_meter.tokens) / window_s,
        "interactive_requests": len(inter),
        "interactive_failed": len(inter) - len(ok),
        "interactive_ttft": latency_summary([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        "interactive_server_ttft": latency_summary([r.server_ttft_ms for r in ok]),
        # raw samples for the TTFT CDF chart (bench/report/charts.py)
        "interactive_ttft_samples_ms": [round(r.ttft_ms, 1) for r in ok if r.ttft_ms is not None],
        "batch_ttft": latency_summary(batch_ttft.samples_ms),
        "batch_ttft_samples_ms": sorted(batch_ttft.samples_ms),
        "batch_ttft_unfinished": batch_ttft.sent - len(batch_ttft.samples_ms),
        "preemptions": dict(m1.preemptions_by_reason),
        "preemptions_delta": m1.preemptions_total - m0.preemptions_total,
    }


def _show(label: str, row: dict[str, Any]) -> None:
    t = row["interactive_ttft"]
    parts = [f"  {label}:"]
    if row["interactive_requests"]:
        parts.append(
            f"interactive TTFT p50 {t['p50_ms']:.0f} ms p99 {t['p99_ms']:.0f} ms "
            f"(n={t['n']}, {row['interactive_failed']} failed);"
        )
    if row["batch_tok_s"] is not None:
        parts.append(f"batch {row['batch_tok_s']:.1f} tok/s;")
    parts.append(f"preemptions {row['preemptions_delta']}")
    say(" ".join(parts))


def _server_runs(cfg: BenchConfig, policy: str, load: Load, maker: PromptMaker) -> dict[str, Any]:
    out: dict[str, Any] = {}
    flags = ["--scheduling", policy, "--ctx", str(CTX), "--max-running", "32"]
    with GrpcServer(f"E-{policy}", cfg.model, *flags, threads=cfg.threads) as srv:
        plan: list[tuple[str, int, bool, float]] = []
        if policy == "priority":
            plan.append(("idle", 0, True, load.idle_window_s))
        for n in load.batch_streams:
            if policy == "priority":
                plan.append((f"batch_only_{n}", n, False, load.window_s))
            plan.append((f"loaded_{n}", n, True, load.window_s))
        for label, n, inter, window in plan:
            out[label] = asyncio.run(one_run(srv.target, n, inter, load, maker, window))
            _show(f"{policy} {label}", out[label])
    return out


def _check(out: dict[str, Any], n: int, idle_p99: float | None) -> dict[str, Any]:
    """The targets at ``n`` batch streams: interactive p99 vs idle, batch throughput lost."""
    pri, fcfs = out["priority"][f"loaded_{n}"], out["fcfs"][f"loaded_{n}"]
    alone = out["priority"][f"batch_only_{n}"]["batch_tok_s"]
    p99 = pri["interactive_ttft"]["p99_ms"]
    return {
        "interactive_p99_loaded_ms": p99,
        "interactive_p99_idle_ms": idle_p99,
        "p99_vs_idle": ratio(p99, idle_p99),
        "fcfs_interactive_p99_ms": fcfs["interactive_ttft"]["p99_ms"],
        "batch_tok_s_alone": alone,
        "batch_tok_s_priority": pri["batch_tok_s"],
        "batch_tok_s_fcfs": fcfs["batch_tok_s"],
        "batch_loss_pct_priority": _loss(pri["batch_tok_s"], alone),
        "batch_loss_pct_fcfs": _loss(fcfs["batch_tok_s"], alone),
        "total_tok_s_priority": pri["total_tok_s"],
        "total_tok_s_fcfs": fcfs["total_tok_s"],
        "total_loss_pct_priority": _loss(pri["total_tok_s"], alone),
    }


def run(cfg: BenchConfig) -> dict[str, Any]:
    load = QUICK if cfg.quick else FULL
    maker = PromptMaker(cfg.model, seed=555)
    out: dict[str, Any] = {"load": load.__dict__, "ctx": CTX}
    out["priority"] = _server_runs(cfg, "priority", load, maker)
    out["fcfs"] = _server_runs(cfg, "fcfs", load, maker)
    idle_p99 = out["priority"]["idle"]["interactive_ttft"]["p99_ms"]
    checks: dict[str, Any] = {}
    for n in load.batch_streams:
        c = checks[str(n)] = _check(out, n, idle_p99)
        say(
            f"  N={n}: interactive p99 {c['interactive_p99_loaded_ms']:.0f} ms = {c['p99_vs_idle'] or 0:.2f}x "
            f"idle; batch loss {c['batch_loss_pct_priority'] or 0:.1f}% (priority), "
            f"{c['batch_loss_pct_fcfs'] or 0:.1f}% (fcfs)"
        )
    out["checks"] = checks
    return out


def _loss(loaded: float | None, alone: float | None) -> float | None:
    r = ratio(loaded, alone)
    return None if r is None else (1.0 - r) * 100.0


# -- summary.md ------------------------------------------------------------------------------------
HEAD = [
    "scheduling",
    "run",
    "batch streams",
    "interactive TTFT p50 ms",
    "p99 ms",
    "n",
    "batch tok/s",
    "interactive tok/s",
    "all tok/s",
    "preemptions",
]


def _table_row(policy: str, label: str, x: dict[str, Any]) -> Row:
    t = x["interactive_ttft"]
    return [
        policy,
        label.replace("_", " "),
        str(x["batch_streams"]),
        fmt(t["p50_ms"], 0),
        fmt(t["p99_ms"], 0),
        str(t["n"]),
        fmt(x["batch_tok_s"]),
        fmt(x.get("interactive_tok_s")),
        fmt(x.get("total_tok_s")),
        str(x["preemptions_delta"]),
    ]


def _check_line(n: str, c: dict[str, Any]) -> str:
    p99, ratio_idle, loss = c["interactive_p99_loaded_ms"], c["p99_vs_idle"], c["batch_loss_pct_priority"]
    return (
        f"- N={n}, priority: interactive p99 **{fmt(p99, 0)} ms** = {fmt(ratio_idle, 2)}x idle "
        f"(targets <= 2x: {verdict(ratio_idle, 2, False)}; <= 300 ms: {verdict(p99, 300, False)}); "
        f"batch throughput loss **{fmt(loss)}%** vs batch-only "
        f"(target <= 10%: {verdict(loss, 10, False)}); "
        f"all tokens (batch + interactive) {fmt(c.get('total_loss_pct_priority'))}% below batch-only; "
        f"fcfs: p99 {fmt(c['fcfs_interactive_p99_ms'], 0)} ms, batch loss {fmt(c['batch_loss_pct_fcfs'])}%"
    )


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario E."""
    rows = [
        _table_row(policy, label, x)
        for policy in ("priority", "fcfs")
        for label, x in r.get(policy, {}).items()
    ]
    load = r["load"]
    out = [
        f"Batch streams: closed loop, {load['batch_tokens']} tokens each (PRIORITY_BATCH); interactive: "
        f"{load['interactive_tokens']} tokens every {load['interval_s'] * 1000:.0f} ms (open loop) over a "
        f"{load['window_s']:.0f} s window after a {load['ramp_s']:.0f} s ramp; batch tok/s counts tokens "
        "received inside the window.",
        "",
        table(HEAD, rows),
        "",
    ]
    out += [_check_line(n, c) for n, c in r.get("checks", {}).items()]
    return "\n".join(out)
