"""Scenario I — scale-out routing: round_robin vs prefix_affinity over 3 replicas.

A routing experiment, not a throughput one: 3 server processes with 1 llama.cpp
thread each share this machine's 2 cores. The load is scenario D's: 32
distinct ~500-token system prompts used round-robin by 8 closed-loop clients
(threads sharing one ``InferenceClient``), a fill pass over all 32, then two
measured passes. Each replica's prefix cache holds about half the working set
(``--prefix-cache-tokens 8192`` of 32 x 500 = 16,000 tokens): the fleet as a
whole could hold it, one replica cannot.

* ``round_robin``: gRPC's policy; every replica sees every system prompt.
* ``prefix_affinity``: the bounded-load consistent-hash ring keyed by the
  system prompt (epsilon 0.25), each prompt's home the less crowded of its two
  ring choices (``placement.HomeTable``), so each prompt has a home replica
  unless that one is over (1 + epsilon) x the mean in-flight.
* ``prefix_affinity_ring_only``: the same without the home table (each
  prompt's home is its first ring choice), the routing of the previous runs.

Reported per mode: aggregate prefix hit rate (sum of the replicas' GetMetrics
kv counters over the measured passes), client TTFT p50/p99, and the in-flight
balance: each replica's running + waiting requests sampled every 0.2 s, the
max over replicas of their time-averaged in-flight divided by the mean.
Fresh replicas (cold caches) for each run; the modes alternate and repeat
(``BENCH_SCALE_REPEATS``, default 2) and each mode's row pools its runs.

Sensitivity runs (not part of ``make bench``): ``BENCH_SCALE_CACHE_TOKENS`` sets the
per-replica cache, ``BENCH_SCALE_MODES`` (comma-separated labels) picks the modes.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import ExitStack
from typing import Any

from inference_client import Delta, InferenceClient

from bench.harness.config import BenchConfig, say
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.stats import latency_summary, ratio
from bench.harness.tables import Row, dig, fmt, table

CLIENTS = 8
REPLICAS = 3
# (label, balancing, epsilon): the ring's bound at two settings, side by side
MODES = (
    ("round_robin", "round_robin", 0.25),
    ("prefix_affinity", "prefix_affinity", 0.25),
    ("prefix_affinity_ring_only", "prefix_affinity", 0.25),
)
MAX_TOKENS = 16
SAMPLE_S = 0.2
CACHE_TOKENS = int(os.environ.get("BENCH_SCALE_CACHE_TOKENS", "8192"))
# round_robin's hit rate moves by 13 points between runs (arrival order), so each mode runs this often
REPEATS = int(os.environ.get("BENCH_SCALE_REPEATS", "2"))


def _requests(systems: list[str], maker: PromptMaker, rounds: int) -> list[list[str]]:
    """Request k uses system prompt k % len(systems); client i takes every CLIENTS-th request."""
    reqs = [systems[k % len(systems)] + "\nUser: " + maker.words(12) for k in range(len(systems) * rounds)]
    return [reqs[i::CLIENTS] for i in range(CLIENTS)]


def _ttft_ms(client: InferenceClient, prompt: str) -> float | None:
    t0 = time.perf_counter()
    first = None
    for event in client.generate(prompt, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True):
        if first is None and isinstance(event, Delta) and event.token_ids:
            first = (time.perf_counter() - t0) * 1000.0
    return first


def _closed_loop(client: InferenceClient, work: list[list[str]]) -> tuple[list[float], list[str]]:
    ttfts: list[float] = []
    errors: list[str] = []

    def run(mine: list[str]) -> None:
        for prompt in mine:
            try:
                t = _ttft_ms(client, prompt)
                if t is not None:
                    ttfts.append(t)
            except Exception as exc:  # counted and reported
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(w,)) for w in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ttfts, errors


class _InFlightSampler:
    """Polls every replica's running + waiting count until stopped."""

    def __init__(self, monitors: list[InferenceClient]) -> None:
        self.monitors = monitors
        self.samples: list[list[int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            snap = [m.metrics(timeout=5) for m in self.monitors]
            self.samples.append([int(s.running + s.waiting) for s in snap])

    def __enter__(self) -> _InFlightSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def _balance(samples: list[list[int]]) -> dict[str, Any]:
    """Time-averaged in-flight per replica over ``samples`` (one list per poll) and max / mean."""
    if not samples:
        return {"samples": 0}
    n = len(samples)
    means = [sum(s[r] for s in samples) / n for r in range(REPLICAS)]
    mean = sum(means) / len(means)
    return {
        "samples": n,
        "mean_in_flight_per_replica": [round(m, 2) for m in means],
        "max_over_mean": ratio(max(means), mean),
    }


def _kv(monitors: list[InferenceClient]) -> list[tuple[int, int, int]]:
    out = []
    for m in monitors:
        snap = m.metrics(timeout=10)
        out.append((int(snap.kv.prefix_hit_tokens), int(snap.kv.prompt_tokens), int(snap.requests_total)))
    return out


def _run_mode(
    cfg: BenchConfig, label: str, mode: str, epsilon: float, fill: list[list[str]], measured: list[list[str]]
) -> dict:
    flags = ["--ctx", "12288", "--prefix-cache-tokens", str(CACHE_TOKENS), "--max-running", "8"]
    with ExitStack() as stack:
        servers = [
            stack.enter_context(GrpcServer(f"I-{label}-{i}", cfg.model, *flags, threads=1))
            for i in range(REPLICAS)
        ]
        monitors = [stack.enter_context(InferenceClient(s.target)) for s in servers]
        target = "ipv4:" + ",".join(s.target for s in servers)
        client = stack.enter_context(
            InferenceClient(target, timeout=600, balancing=mode, affinity_epsilon=epsilon)
        )
        if client.pool is not None:
            client.pool.balance_keys = not label.endswith("ring_only")
        _closed_loop(client, fill)
        k0 = _kv(monitors)
        t0 = time.perf_counter()
        with _InFlightSampler(monitors) as sampler:
            ttfts, errors = _closed_loop(client, measured)
        wall = time.perf_counter() - t0
        k1 = _kv(monitors)
    return {
        "ttfts_ms": ttfts,
        "errors": errors,
        "wall_s": wall,
        "hits": [a[0] - b[0] for a, b in zip(k1, k0, strict=True)],
        "prompts": [a[1] - b[1] for a, b in zip(k1, k0, strict=True)],
        "requests": [a[2] - b[2] for a, b in zip(k1, k0, strict=True)],
        "in_flight_samples": sampler.samples,
    }


def _pooled(mode: str, epsilon: float, runs: list[dict]) -> dict:
    """One row over every repetition: hit rates from summed counters, TTFTs and in-flight samples pooled."""
    hits = [sum(r["hits"][i] for r in runs) for i in range(REPLICAS)]
    prompts = [sum(r["prompts"][i] for r in runs) for i in range(REPLICAS)]
    errors = [e for r in runs for e in r["errors"]]
    return {
        "balancing": mode,
        "epsilon": epsilon if mode == "prefix_affinity" else None,
        "repeats": len(runs),
        "requests": sum(sum(r["requests"]) for r in runs),
        "failed": len(errors),
        "errors": sorted(set(errors))[:5],
        "wall_s": round(sum(r["wall_s"] for r in runs), 1),
        "requests_per_replica": [sum(r["requests"][i] for r in runs) for i in range(REPLICAS)],
        "prefix_hit_rate": sum(hits) / sum(prompts) if sum(prompts) else None,
        "prefix_hit_rate_per_run": [
            sum(r["hits"]) / sum(r["prompts"]) if sum(r["prompts"]) else None for r in runs
        ],
        "prefix_hit_rate_per_replica": [h / p if p else None for h, p in zip(hits, prompts, strict=True)],
        "ttft": latency_summary([t for r in runs for t in r["ttfts_ms"]]),
        "in_flight": _balance([s for r in runs for s in r["in_flight_samples"]]),
    }


def run(cfg: BenchConfig) -> dict[str, Any]:
    maker = PromptMaker(cfg.model, seed=4242)
    n_sys, length, rounds = (12, 150, 1) if cfg.quick else (32, 500, 2)
    systems = [maker.text(length) for _ in range(n_sys)]
    fill, measured = _requests(systems, maker, 1), _requests(systems, maker, rounds)
    out: dict[str, Any] = {
        "replicas": REPLICAS,
        "threads_per_replica": 1,
        "system_prompts": n_sys,
        "system_prompt_tokens": length,
        "clients": CLIENTS,
        "measured_requests": n_sys * rounds,
        "repeats": REPEATS,
        "max_tokens": MAX_TOKENS,
        "prefix_cache_tokens_per_replica": CACHE_TOKENS,
    }
    chosen = os.environ.get("BENCH_SCALE_MODES", "").split(",")
    modes = [m for m in MODES if m[0] in chosen] if chosen != [""] else list(MODES)
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in modes}
    for rep in range(REPEATS):  # NOTE: modes alternate, so a noisy minute hurts every mode alike
        for label, mode, epsilon in modes:
            runs[label].append(_run_mode(cfg, label, mode, epsilon, fill, measured))
            r = runs[label][-1]
            say(f"  {label} run {rep + 1}: hit rate {100 * sum(r['hits']) / max(1, sum(r['prompts'])):.1f}%")
    for label, mode, epsilon in modes:
        row = out[label] = _pooled(mode, epsilon, runs[label])
        say(
            f"  {label}: hit rate {(row['prefix_hit_rate'] or 0) * 100:.1f}%, TTFT p50 "
            f"{row['ttft']['p50_ms'] or 0:.0f} ms p99 {row['ttft']['p99_ms'] or 0:.0f} ms, in-flight max/mean "
            f"{row['in_flight'].get('max_over_mean') or 0:.2f}, per replica {row['requests_per_replica']}, "
            f"{row['failed']} failed"
        )
    rr = out["round_robin"]
    for label, mode, _ in modes:
        if mode == "prefix_affinity":
            out[label]["targets"] = _targets(rr, out[label])
    return out


def _targets(rr: dict[str, Any], pa: dict[str, Any]) -> dict[str, Any]:
    """Hit rate >= 2x round_robin's; time-averaged in-flight max/mean <= 1.5."""
    hit_ratio = ratio(pa["prefix_hit_rate"], rr["prefix_hit_rate"])
    balance = pa["in_flight"].get("max_over_mean")
    return {
        "hit_rate_ratio": hit_ratio,
        "hit_rate_met": (hit_ratio or 0) >= 2.0
        or (rr["prefix_hit_rate"] == 0 and (pa["prefix_hit_rate"] or 0) > 0),
        "in_flight_max_over_mean": balance,
        "balance_met": balance is not None and balance <= 1.5,
    }


# -- summary.md ------------------------------------------------------------------------------------
HEAD = ["routing", "prefix hit rate", "vs round_robin", "TTFT p50 ms", "TTFT p99 ms"]
HEAD += ["in-flight max/mean", "requests per replica", "failed"]


def _row(label: str, m: dict[str, Any]) -> Row:
    t = m.get("targets", {})
    return [
        label,
        f"{fmt(100 * (m['prefix_hit_rate'] or 0), 1)}%",
        fmt(t.get("hit_rate_ratio"), 2, "x") if t else "-",
        fmt(dig(m, "ttft", "p50_ms"), 0),
        fmt(dig(m, "ttft", "p99_ms"), 0),
        fmt(dig(m, "in_flight", "max_over_mean"), 2),
        " / ".join(str(n) for n in m["requests_per_replica"]),
        str(m["failed"]),
    ]


def _target_line(label: str, t: dict[str, Any]) -> str:
    return (
        f"- {label}: hit rate {fmt(t['hit_rate_ratio'], 2)}x round_robin's (target >= 2x: "
        f"{'met' if t['hit_rate_met'] else 'NOT met'}); in-flight max/mean "
        f"{fmt(t['in_flight_max_over_mean'], 2)} (target <= 1.5: {'met' if t['balance_met'] else 'NOT met'})"
    )


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario I."""
    labels = [k for k in r if isinstance(r[k], dict) and "balancing" in r[k]]
    out = [
        f"{r['replicas']} replicas x 1 thread on this machine (a routing experiment, not a throughput one): "
        f"{r['system_prompts']} system prompts x {r['system_prompt_tokens']} tokens round-robin from "
        f"{r['clients']} clients, {r['measured_requests']} measured requests, prefix cache "
        f"{r['prefix_cache_tokens_per_replica']} tokens per replica.",
        "",
        table(HEAD, [_row(label, r[label]) for label in labels]),
        "",
    ]
    out += [_target_line(label, r[label]["targets"]) for label in labels if r[label].get("targets")]
    return "\n".join(out)
