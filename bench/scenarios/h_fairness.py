"""Scenario H — fair share between tenants, and the cost of TLS and token authentication.

Fairness: two tenants in the batch tier, equal weights; tenant A runs 16
closed-loop streams, tenant B 2 (128 greedy tokens each, ignore_eos). The
server runs ``--max-running 3``: work queues, so the scheduler's order decides
who is served (with room for all 18 there is nothing to share), and B's 2
streams ask for more than its fair half of the 3 slots, so B stays backlogged.
(With 4 slots B's fair half is exactly its 2 streams; each time one of its
requests ends, the slot goes to A before B's next request arrives, and B waits
for the next free slot: measured 42.5% for B.) Also
``--aging-s 3600`` (no interactive work here; see ``service/scheduler/fair_share.py``). Runs
with fair share on (the virtual token counter) and off (FCFS within the tier).
Both tenants have requests outstanding the whole window (closed loop), so the
window is one backlogged period: reported are each tenant's token share, Jain's
index over 5-second bins and over the window, B's client-side TTFT, and the
total throughput.

Cost: scenario A's shape at 16 streams (unique 30-60 token prompts, 64 tokens,
interactive) against a plaintext server without authentication, the same with
``--auth-tokens`` (token in metadata), and with TLS and the token; the three
alternate (``Load.cost_repeats`` rounds) and the medians are compared.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.harness.config import BenchConfig, say
from bench.harness.grpc_load import BATCH, INTERACTIVE, Stream
from bench.harness.procs import GrpcServer, cpu_seconds
from bench.harness.prompts import PromptMaker
from bench.harness.secure import Endpoint, TlsGrpcServer, tenants_file
from bench.harness.stats import jain, latency_summary, ratio
from bench.harness.tables import dig, fmt, table, verdict

TOKENS = {"tenant-a": "bench-token-a", "tenant-b": "bench-token-b"}
BIN_S = 5.0


@dataclass(frozen=True)
class Load:
    a_streams: int
    b_streams: int
    fair_tokens: int
    ramp_s: float
    window_s: float
    cost_streams: int
    cost_tokens: int
    cost_window_s: float
    cost_repeats: int


FULL = Load(16, 2, 128, 10.0, 60.0, 16, 64, 20.0, 5)
QUICK = Load(16, 2, 16, 2.0, 6.0, 16, 16, 4.0, 1)
MAX_RUNNING = 3


class Bins:
    """Tokens per tenant per ``BIN_S`` bin of [start, end] (perf_counter times)."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.n = max(1, int((end - start) // BIN_S))
        self.tokens: dict[str, list[int]] = {}

    def sink(self, tenant: str) -> Callable[[int, float], None]:
        row = self.tokens.setdefault(tenant, [0] * self.n)

        def add(n: int, at: float) -> None:
            k = int((at - self.start) // BIN_S)
            if self.start <= at < self.end and k < self.n:
                row[k] += n

        return add


def _f(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


@dataclass(frozen=True)
class Client:
    """One tenant's closed-loop streams: its token, prompts (one per stream), output length and tier."""

    tenant: str
    token: str | None
    prompts: list[str]
    tokens: int
    priority: int


async def _tenant(ep: Endpoint, c: Client, until: float, bins: Bins, ttft: list[float]) -> None:
    """One Generate stream per closed-loop client (a gRPC call takes one write at a time)."""
    errors: list[str] = []
    async with ep.channel(c.token) as ch:

        async def client(prompt: str) -> None:
            stream = Stream(ch, on_tokens=bins.sink(c.tenant))
            try:
                while time.perf_counter() < until:
                    try:
                        res = await stream.request(prompt, c.tokens, c.priority)
                    except (grpc.RpcError, asyncio.InvalidStateError):  # the stream ended
                        return
                    if not res.ok and time.perf_counter() < until:
                        errors.append(res.error)
                    first = res.start + (res.ttft_ms or 0.0) / 1000.0
                    if res.ok and res.ttft_ms is not None and bins.start <= first < bins.end:
                        ttft.append(res.ttft_ms)  # requests whose first token came in the window
            finally:
                stream.abort()

        tasks = [asyncio.create_task(client(p)) for p in c.prompts]
        await asyncio.sleep(max(0.0, until - time.perf_counter()))
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
    if errors:
        say(f"    {c.tenant}: {len(errors)} failed requests, e.g. {errors[0]}")


async def _fair_run(ep: Endpoint, load: Load, maker: PromptMaker) -> dict[str, Any]:
    start = time.perf_counter() + load.ramp_s
    bins = Bins(start, start + load.window_s)
    ttft: dict[str, list[float]] = {"tenant-a": [], "tenant-b": []}
    streams = {"tenant-a": load.a_streams, "tenant-b": load.b_streams}
    clients = [
        Client(t, TOKENS[t], maker.unique(n, 30, 60), load.fair_tokens, BATCH) for t, n in streams.items()
    ]
    await asyncio.gather(*(_tenant(ep, c, bins.end, bins, ttft[c.tenant]) for c in clients))
    a, b = bins.tokens["tenant-a"], bins.tokens["tenant-b"]
    total = sum(a) + sum(b)
    per_bin = [jain([x, y]) for x, y in zip(a, b, strict=True)]
    pairs = [jain([a[i] + a[i + 1], b[i] + b[i + 1]]) for i in range(0, len(a) - 1, 2)]
    return {
        "tokens": {"tenant-a": sum(a), "tenant-b": sum(b)},
        "b_share": sum(b) / total if total else None,
        "jain_window": jain([sum(a), sum(b)]),
        "jain_bins_mean": statistics.mean([j for j in per_bin if j is not None]) if per_bin else None,
        "jain_bins_min": min([j for j in per_bin if j is not None], default=None),
        "jain_10s_bins_mean": statistics.mean([j for j in pairs if j is not None]) if pairs else None,
        "bins": {"tenant-a": a, "tenant-b": b},
        "total_tok_s": total / load.window_s,
        "b_ttft": latency_summary(ttft["tenant-b"]),
        "a_ttft": latency_summary(ttft["tenant-a"]),
    }


def _fairness(cfg: BenchConfig, load: Load, folder: Path, maker: PromptMaker) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # NOTE: aging off (--aging-s 3600): A's backlog would wait longer than the default 30 s, be promoted
    # to the interactive tier and go before B's batch work (fair share orders within a tier).
    base = ["--auth-tokens", str(tenants_file(folder, TOKENS)), "--max-running", str(MAX_RUNNING)]
    base += ["--scheduling", "priority", "--aging-s", "3600"]
    for label, extra in (("on", []), ("off", ["--no-fair-share"])):
        with GrpcServer(f"H-fair-{label}", cfg.model, *base, *extra, threads=cfg.threads) as srv:
            row = asyncio.run(_fair_run(Endpoint(srv.target), load, maker))
        out[label] = row
        say(
            f"  fair share {label}: B share {_f(row['b_share'], '.1%')}, Jain {_f(row['jain_window'], '.3f')} "
            f"(bins mean {_f(row['jain_bins_mean'], '.3f')}), total {row['total_tok_s']:.1f} tok/s, "
            f"B TTFT p50 {_f(row['b_ttft']['p50_ms'], '.0f')} ms p99 {_f(row['b_ttft']['p99_ms'], '.0f')} ms"
        )
    return out


async def _cost_run(
    ep: Endpoint, token: str | None, load: Load, prompts: list[str], pid: int
) -> tuple[float, float]:
    """(tok/s in the window, server CPU ms per token in the window)."""
    start = time.perf_counter() + 3.0
    bins = Bins(start, start + load.cost_window_s)
    client = Client("tenant-a", token, prompts, load.cost_tokens, INTERACTIVE)
    cpu: list[float] = []

    async def sample() -> None:
        for at in (bins.start, bins.end):
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            cpu.append(cpu_seconds(pid))

    sampler = asyncio.create_task(sample())
    await _tenant(ep, client, bins.end, bins, [])
    await sampler
    tokens = sum(bins.tokens["tenant-a"])
    return tokens / load.cost_window_s, 1000.0 * (cpu[1] - cpu[0]) / max(tokens, 1)


def _cost(cfg: BenchConfig, load: Load, folder: Path, maker: PromptMaker) -> dict[str, Any]:
    from tests.support.certs import CA

    ca = CA("bench CA")
    cert, key = ca.issue("localhost", server=True).write(folder, "server")
    tenants = str(tenants_file(folder, TOKENS))
    configs: dict[str, tuple[list[str], bool, bool]] = {
        "plaintext": ([], False, False),
        "auth": (["--auth-tokens", tenants], False, True),
        "tls_auth": (["--auth-tokens", tenants, "--tls-cert", str(cert), "--tls-key", str(key)], True, True),
    }
    runs: dict[str, list[float]] = {k: [] for k in configs}
    cpu_runs: dict[str, list[float]] = {k: [] for k in configs}

    async def all_runs() -> None:
        # NOTE: one event loop for every run: grpc.aio's poller outlives a closed loop and complains.
        for rep in range(load.cost_repeats):
            for name, (flags, tls, auth) in configs.items():
                prompts = maker.unique(load.cost_streams, 30, 60)
                label = f"H-cost-{name}-{rep}"
                server = TlsGrpcServer(label, cfg.model, ca.pem, *flags, threads=cfg.threads) if tls else None
                with server or GrpcServer(label, cfg.model, *flags, threads=cfg.threads) as srv:
                    ep = Endpoint(srv.target, ca.pem if tls else None)
                    token = TOKENS["tenant-a"] if auth else None
                    tok_s, cpu_ms = await _cost_run(ep, token, load, prompts, srv.pid)
                runs[name].append(tok_s)
                cpu_runs[name].append(cpu_ms)
                say(f"  cost {name} #{rep}: {tok_s:.1f} tok/s, server CPU {cpu_ms:.2f} ms/token")

    asyncio.run(all_runs())
    return _cost_summary(runs, cpu_runs)


def _cost_summary(runs: dict[str, list[float]], cpu_runs: dict[str, list[float]]) -> dict[str, Any]:
    med = {k: statistics.median(v) for k, v in runs.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_runs.items()}
    return {
        "runs_tok_s": runs,
        "median_tok_s": med,
        "auth_vs_plaintext": ratio(med["auth"], med["plaintext"]),
        "tls_auth_vs_plaintext": ratio(med["tls_auth"], med["plaintext"]),
        # NOTE: CPU per token is far less sensitive to other load on the machine than tok/s.
        "runs_server_cpu_ms_per_token": cpu_runs,
        "median_server_cpu_ms_per_token": cpu,
        "cpu_auth_vs_plaintext": ratio(cpu["auth"], cpu["plaintext"]),
        "cpu_tls_auth_vs_plaintext": ratio(cpu["tls_auth"], cpu["plaintext"]),
    }


def run(cfg: BenchConfig) -> dict[str, Any]:
    load = QUICK if cfg.quick else FULL
    maker = PromptMaker(cfg.model, seed=4242)
    out: dict[str, Any] = {"load": load.__dict__, "max_running": MAX_RUNNING, "bin_s": BIN_S}
    with tempfile.TemporaryDirectory() as tmp:
        out["fairness"] = _fairness(cfg, load, Path(tmp), maker)
        out["cost"] = _cost(cfg, load, Path(tmp), maker)
    on, off = out["fairness"]["on"], out["fairness"]["off"]
    out["checks"] = {
        "b_share_on": on["b_share"],
        "b_share_target": 0.45,
        "b_share_ok": (on["b_share"] or 0) >= 0.45,
        "jain_on": on["jain_window"],
        "jain_ok": (on["jain_window"] or 0) >= 0.95,
        "total_on_vs_off": ratio(on["total_tok_s"], off["total_tok_s"]),
        "total_ok": abs((ratio(on["total_tok_s"], off["total_tok_s"]) or 0) - 1) <= 0.05,
        "tls_auth_cost": 1 - (out["cost"]["tls_auth_vs_plaintext"] or 0),
        "auth_cost": 1 - (out["cost"]["auth_vs_plaintext"] or 0),
        "cost_target": 0.02,
    }
    return out


# -- summary.md ------------------------------------------------------------------------------------
HEAD = [
    "run",
    "B share",
    "Jain (window)",
    "Jain (5 s bins)",
    "Jain (10 s bins)",
    "tok/s",
    "B TTFT p50 ms",
    "B TTFT p99 ms",
]


def _row(label: str, f: dict[str, Any]) -> list[str]:
    return [
        f"fair share {label}",
        f"{fmt(100 * f['b_share'], 1)}%" if f["b_share"] is not None else "-",
        fmt(f["jain_window"], 3),
        fmt(f["jain_bins_mean"], 3),
        fmt(f.get("jain_10s_bins_mean"), 3),
        fmt(f["total_tok_s"], 1),
        fmt(dig(f, "b_ttft", "p50_ms"), 0),
        fmt(dig(f, "b_ttft", "p99_ms"), 0),
    ]


def _cost_lines(r: dict[str, Any]) -> list[str]:
    load, c, cost = r["load"], r["checks"], r["cost"]
    med = cost["median_tok_s"]
    out = [
        f"- TLS/auth cost (scenario A shape, {load['cost_streams']} streams, medians of "
        f"{load['cost_repeats']} alternating runs): plaintext {fmt(med['plaintext'], 1)} tok/s, "
        f"auth {fmt(med['auth'], 1)} ({fmt(100 * c['auth_cost'], 1)}% cost), TLS + auth "
        f"{fmt(med['tls_auth'], 1)} ({fmt(100 * c['tls_auth_cost'], 1)}% cost); target <= 2%; runs "
        f"{json.dumps(cost['runs_tok_s'])}",
    ]
    if "median_server_cpu_ms_per_token" in cost:
        cpu = cost["median_server_cpu_ms_per_token"]
        out.append(
            f"- server CPU per token (medians): plaintext {fmt(cpu['plaintext'], 2)} ms, auth "
            f"{fmt(cpu['auth'], 2)} ms ({fmt(100 * ((cost['cpu_auth_vs_plaintext'] or 1) - 1), 1)}%), TLS + auth "
            f"{fmt(cpu['tls_auth'], 2)} ms ({fmt(100 * ((cost['cpu_tls_auth_vs_plaintext'] or 1) - 1), 1)}%)"
        )
    return out


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario H."""
    load, c = r["load"], r["checks"]
    out = [
        f"Batch tier, equal weights: tenant A {load['a_streams']} closed-loop streams, tenant B "
        f"{load['b_streams']}, {load['fair_tokens']} tokens each, --max-running {r['max_running']}, "
        f"{load['window_s']:.0f} s window (both backlogged throughout); Jain's index over the window and "
        "the mean over 5 s and 10 s bins (a bin holds only ~2 requests' tokens per tenant).",
        "",
        table(HEAD, [_row(label, r["fairness"][label]) for label in ("on", "off")]),
        "",
        f"- B share >= 45%: {verdict(c['b_share_on'], 0.45)}; Jain >= 0.95: {verdict(c['jain_on'], 0.95)}; "
        f"total on/off {fmt(c['total_on_vs_off'], 3)} (within 5%: {'met' if c['total_ok'] else 'NOT met'})",
    ]
    return "\n".join(out + _cost_lines(r))
