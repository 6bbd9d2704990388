"""Scenario L — contention: throughput next to busy processes, adaptive vs fixed threads.

Servers (all up at once; an idle one uses no CPU): ``adaptive`` (the default,
``--adaptive-threads``), ``fixed`` (``--no-adaptive-threads``, the previous
behaviour) and ``passive`` (fixed threads with ``OMP_WAIT_POLICY=PASSIVE``:
OpenMP threads sleep at barriers instead of spinning) and ``spin2k`` (fixed
threads, ``GOMP_SPINCOUNT=2000``: spin briefly, then sleep). For each load (4 and 16
closed-loop streams, 30-60 token prompts, 64 greedy tokens) and each neighbour
count (0, 1, 2 processes running ``while True: pass``, pinned with ``taskset``
to the server's cores, started and stopped here) every server gets the same
time window, one after another, in an order that rotates each repetition
(``BENCH_L_ARMS=adaptive,fixed`` runs a subset). The
figure is tokens received inside the window / window (requests still running at
its end are cancelled), so a server that gets slow cannot stretch the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from statistics import mean
from typing import Any

from bench.harness.config import PYTHON, BenchConfig, say
from bench.harness.grpc_load import Stream, channel
from bench.harness.procs import GrpcServer, environment
from bench.harness.prompts import PromptMaker
from bench.harness.stats import ratio
from bench.harness.tables import fmt

ARMS: dict[str, tuple[list[str], dict[str, str]]] = {
    "adaptive": (["--adaptive-threads"], {}),
    "fixed": (["--no-adaptive-threads"], {}),
    "passive": (["--no-adaptive-threads"], {"OMP_WAIT_POLICY": "PASSIVE"}),
    "spin2k": (["--no-adaptive-threads"], {"GOMP_SPINCOUNT": "2000"}),
}
FULL = {"streams": (4, 16), "busy": (0, 1, 2), "window_s": 12.0, "reps": 2}
QUICK = {"streams": (4,), "busy": (0, 1), "window_s": 3.0, "reps": 1}
MAX_TOKENS = 64


@contextlib.contextmanager
def busy_processes(n: int, cpus: set[int]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` spinning Python processes pinned to ``cpus``; killed on exit."""
    cmd = ["taskset", "-c", ",".join(map(str, sorted(cpus))), PYTHON, "-c", "while True: pass"]
    procs = [subprocess.Popen(cmd) for _ in range(n)]
    try:
        time.sleep(0.3 if n else 0)
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


async def window_tok_s(target: str, prompts: list[list[str]], window_s: float) -> dict[str, Any]:
    """Closed-loop clients for ``window_s``; tokens received inside the window / window."""
    got = [0]
    t0 = time.perf_counter()
    end = t0 + window_s

    def on_tokens(n: int, now: float) -> None:
        if now <= end:
            got[0] += n

    async with channel(target) as ch:
        streams = [Stream(ch, on_tokens=on_tokens) for _ in prompts]

        async def client(stream: Stream, mine: list[str]) -> int:
            done = 0
            while time.perf_counter() < end:
                res = await stream.request(mine[done % len(mine)], MAX_TOKENS)
                done += res.ok
            return done

        tasks = [asyncio.create_task(client(s, p)) for s, p in zip(streams, prompts, strict=True)]
        await asyncio.wait(tasks, timeout=window_s)
        for s in streams:
            s.abort()  # requests in flight end now (counted tokens stay counted)
        completed = sum(await asyncio.gather(*tasks))
    return {"tok_s": got[0] / window_s, "tokens": got[0], "completed": completed}


def switches(srv: GrpcServer) -> int:
    """Thread-count switches the server has logged so far (the adaptive controller's)."""
    try:
        return srv.log_path.read_text(errors="replace").count("compute threads now")
    except OSError:
        return 0


def start_arm(cfg: BenchConfig, arm: str) -> GrpcServer:
    """Start the server of ``arm`` (one of ``ARMS``: its flags and environment)."""
    flags, env = ARMS[arm]
    with environment(**env):
        srv = GrpcServer(f"L-{arm}", cfg.model, "--max-running", "32", *flags, threads=cfg.threads)
        srv.start()
    return srv


async def _measure(cfg: BenchConfig, servers: dict[str, GrpcServer], plan: dict[str, Any]) -> dict[str, Any]:
    maker = PromptMaker(cfg.model, seed=4321)
    prompts = {c: [maker.unique(8, 30, 60) for _ in range(c)] for c in plan["streams"]}
    cpus = os.sched_getaffinity(next(iter(servers.values())).pid)
    raw: dict[str, dict[str, list[float]]] = {}
    arms = list(servers)
    for rep in range(plan["reps"]):
        order = arms[rep % len(arms) :] + arms[: rep % len(arms)]
        for c in plan["streams"]:
            for busy in plan["busy"]:
                key = f"C{c}_busy{busy}"
                with busy_processes(busy, cpus):
                    for arm in order:
                        before = switches(servers[arm])
                        row = await window_tok_s(servers[arm].target, prompts[c], plan["window_s"])
                        raw.setdefault(key, {}).setdefault(arm, []).append(row["tok_s"])
                        say(
                            f"    rep {rep} {key:>11} {arm:>8}: {row['tok_s']:6.1f} tok/s"
                            f" (switches {switches(servers[arm]) - before})"
                        )
    return raw


def run(cfg: BenchConfig) -> dict[str, Any]:
    plan = QUICK if cfg.quick else FULL
    say(f"  {plan}; the machine may be shared: compare within a row")
    servers: dict[str, GrpcServer] = {}
    arms = [a for a in os.environ.get("BENCH_L_ARMS", ",".join(ARMS)).split(",") if a in ARMS]
    try:
        for arm in arms:
            servers[arm] = start_arm(cfg, arm)
        raw = asyncio.run(_measure(cfg, servers, plan))
        logged = {arm: switches(srv) for arm, srv in servers.items()}
    finally:
        for srv in servers.values():
            srv.stop()
    rows = {key: {arm: mean(v) for arm, v in arms.items()} for key, arms in raw.items()}
    ratios = {
        key: {
            "adaptive_vs_fixed": ratio(r.get("adaptive"), r.get("fixed")),
            "passive_vs_fixed": ratio(r.get("passive"), r.get("fixed")),
            "spin2k_vs_fixed": ratio(r.get("spin2k"), r.get("fixed")),
        }
        for key, r in rows.items()
    }
    for key, r in ratios.items():
        say("  " + key + ": " + ", ".join(f"{k.replace('_vs_', '/')} {v or 0:.2f}" for k, v in r.items()))
    return {
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.items()},
        "max_tokens": MAX_TOKENS,
        "tok_s_runs": raw,
        "tok_s_mean": rows,
        "ratios": ratios,
        "adaptive_switches_logged": logged["adaptive"],
        "targets": "one busy process: adaptive >= 1.8x fixed; quiet: adaptive within 3% of fixed",
    }


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario L."""
    lines = [
        "| load | adaptive tok/s | fixed tok/s | passive tok/s | spin2k tok/s | adaptive / fixed | passive / fixed "
        "| spin2k / fixed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, row in r["tok_s_mean"].items():
        q = r["ratios"][key]
        lines.append(
            f"| {key.replace('_', ', ')} | {fmt(row.get('adaptive'))} | {fmt(row.get('fixed'))} | "
            f"{fmt(row.get('passive'))} | {fmt(row.get('spin2k'))} | {fmt(q['adaptive_vs_fixed'], 2)} | "
            f"{fmt(q['passive_vs_fixed'], 2)} | {fmt(q.get('spin2k_vs_fixed'), 2)} |"
        )
    lines += [
        "",
        f"Mean of {r['plan']['reps']} interleaved {r['plan']['window_s']:.0f} s windows per cell; "
        f"adaptive server logged {r['adaptive_switches_logged']} thread switches. Targets: {r['targets']}.",
    ]
    return "\n".join(lines)
