"""Scenario S — goodput measured by the field's own load tool (guidellm) vs llama.cpp's ``llama-server``.

guidellm 0.8.1 (``make goodput-env``: its own venv ``.venv-guidellm``, pinned) drives streamed
``/v1/chat/completions`` with Poisson arrivals at a sweep of rates, against this server (``--http-port``,
``--max-running 32 --ctx 8192``: scenario P's flags) and ``llama-server --jinja`` (``-np 32`` slots on one
unified KV cache of the same 8,192 tokens, the same threads), on the benchmark model and on the 1.1B
shape (``make bench-model-1b``). Both servers get the same request bodies: guidellm's, from one seeded
jsonl per (round, rate) — short chat turns, long-prompt summarisation (1,000-1,500 prompt tokens) and
short questions under a few shared ~300-token system prompts, each with its own output length (sent as
``max_completion_tokens`` with ``ignore_eos``); see ``bench/harness/goodput.py``.

Each rate runs a fixed time (60 s, longer at low rates for >= 20 expected arrivals; ``--quick``: 20 s,
Gemma only, 2 low rates, a shorter mix); the two servers alternate
at every rate (the order flips each rate and each round), the load average is recorded before each
arm, 2 rounds. Per rate and server: TTFT p50/p99, inter-token latency p50/p99 (guidellm's per-request
ITL), completed requests/s, pooled over the rounds. SLO: TTFT p99 <= 2 s and ITL p99 <= 200 ms, with
errored requests and requests cancelled after waiting > 2 s for a first token counted as TTFT
violations. Goodput: the highest rate of the sweep meeting the SLO (every lower rate meeting it too).
Target: goodput >= 2x llama-server's on both models. guidellm's reports: ``<results>/goodput/``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness.config import ROOT, SKIP_1B, BenchConfig, results_dir, say
from bench.harness.goodput import (
    ITL_P99_MS,
    LENGTHS,
    QUICK_LENGTHS,
    TTFT_P99_MS,
    arrivals_broken,
    goodput,
    mix_rows,
    rate_summary,
    request_samples,
    system_prompts,
)
from bench.harness.guidellm_tool import guidellm_binary, own_figures, run_rate
from bench.harness.procs import GrpcServer, LlamaServer, cpu_seconds, free_port, llama_server_binary
from bench.harness.prompts import PromptMaker
from bench.harness.results import load_now
from bench.harness.stats import ratio
from bench.harness.tables import fmt, table, verdict

TITLE = "Goodput by guidellm (Poisson rates, chat/summarise/shared-system mix) vs llama.cpp's llama-server"
MODEL_1B = ROOT / "models" / "tinyllama-shape-1.1b-q4_k_m.gguf"
# NOTE: bracketing both servers' capacity on a 2-core machine: the mix averages ~380 prompt and ~80 output
# tokens a request and Gemma prefills ~500 tok/s here (llama-server's log, a quiet probe), so it saturates
# near 1 req/s; the 1.1B shape is several times slower. A rate runs at least SECONDS and long enough for
# MIN_ARRIVALS expected arrivals (0.1 req/s: 200 s), so that each p99 has some samples.
RATES = {"gemma": (0.2, 0.35, 0.5, 0.75, 1.0, 1.5), "1.1b": (0.1, 0.15, 0.25, 0.35, 0.5)}
QUICK_RATES = (0.25, 0.5)
SECONDS, QUICK_SECONDS, MIN_ARRIVALS = 60.0, 20.0, 20
CTX, SLOTS = 8192, 32
ARMS = ("ours", "llama_server")
# NOTE: guidellm cancels the streams still open when a rate's time is up; a server may finish its current
# step (a long prompt's batch) first. The next arm starts once the last one's server is idle
# (< IDLE_CORES of CPU over IDLE_WINDOW_S), at most DRAIN_MAX_S later.
IDLE_CORES, IDLE_WINDOW_S, DRAIN_MAX_S = 0.15, 1.0, 60.0
TARGET = 2.0
ATTEMPTS = 3  # NOTE: guidellm 0.8.1's Poisson schedule sometimes races at start (see arrivals_broken): rerun


def _data(maker: PromptMaker, systems: list[str], rate: float, seconds: float, seed: int, tmp: Path,
          quick: bool) -> Path:
    """One seeded jsonl for a (round, rate), shared by both arms; more rows than Poisson arrivals need."""
    lengths = QUICK_LENGTHS if quick else LENGTHS
    rows = mix_rows(maker.text, math.ceil(rate * seconds * 1.5) + 20, seed, systems, lengths)
    path = tmp / f"mix-{seed}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _wait_idle(pid: int) -> float:
    """Wait until process ``pid`` uses < IDLE_CORES of CPU; returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < DRAIN_MAX_S:
        c0 = cpu_seconds(pid)
        time.sleep(IDLE_WINDOW_S)
        if cpu_seconds(pid) - c0 < IDLE_CORES * IDLE_WINDOW_S:
            break
    return time.monotonic() - t0


def _warm(url: str, name: str) -> None:
    from bench.harness import sse_load  # NOTE: httpx is a bench-env dependency

    asyncio.run(sse_load.closed_loop(url, name, [["warm up the server"]], 4))


def _arm(name: str, arm: str, url: str, pid: int, data: Path, rate: float, seconds: float, r: int) -> dict[str, Any]:
    load = load_now()
    attempts = 0
    while True:
        attempts += 1
        bench = run_rate(f"{name}-{arm}-r{r}-rate{rate:g}", url, data, rate, seconds, seed=1000 + r)
        if not (broken := arrivals_broken(bench)) or attempts == ATTEMPTS:
            break
        say(f"    {name} rate {rate:g} {arm}: guidellm's Poisson schedule raced (all requests at once); again")
        _wait_idle(pid)
        load = load_now()
    s = request_samples(bench)
    row = {"round": r, "seconds": seconds, **load, "attempts": attempts, "arrivals_broken": broken,
           **{k: v for k, v in s.items() if not k.endswith("_ms")},
           "guidellm": own_figures(bench), "_samples": s}
    say(f"    {name} rate {rate:g} round {r} {arm:>12}: {s['completed']} done, {s['errored']} errored, "
        f"{s['incomplete']} cancelled at the end ({s['late_cancelled']} after > 2 s); guidellm TTFT p99 "
        f"{row['guidellm']['ttft_ms']['p99']:.0f} ms, ITL p99 {row['guidellm']['itl_ms']['p99']:.0f} ms "
        f"(load1 {load['load1']:.2f})")
    return row


def _model(cfg: BenchConfig, name: str, model: Path, rates: tuple[float, ...], quick_s: float | None,
           rounds: int) -> dict[str, Any]:
    """Both servers on ``model``, every rate for ``rounds`` (``quick_s``: that many seconds a rate)."""
    maker = PromptMaker(model, seed=3939)
    systems = system_prompts(maker.text)
    port = free_port()
    flags = ["--http-port", str(port), "--max-running", str(SLOTS), "--ctx", str(CTX)]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {a: {f"{x:g}": [] for x in rates} for a in ARMS}
    with GrpcServer(f"S-ours-{name}", model, *flags, threads=cfg.threads) as ours, \
            LlamaServer(f"S-llama-server-{name}", llama_server_binary(), model, parallel=SLOTS, ctx=CTX,
                        threads=cfg.server_threads(), extra=["--jinja"]) as peer, \
            tempfile.TemporaryDirectory(prefix="goodput-mix-") as tmp:
        urls = {"ours": f"http://127.0.0.1:{port}", "llama_server": peer.base_url}
        pids = {"ours": ours.pid, "llama_server": peer.pid}
        _warm(urls["ours"], model.name.removesuffix(".gguf"))
        _warm(urls["llama_server"], "peer")
        for r in range(rounds):
            for i, rate in enumerate(rates):
                seconds = quick_s if quick_s else max(SECONDS, MIN_ARRIVALS / rate)
                data = _data(maker, systems, rate, seconds, 100 * r + i, Path(tmp), cfg.quick)
                for arm in ARMS if (r + i) % 2 == 0 else tuple(reversed(ARMS)):
                    runs[arm][f"{rate:g}"].append(_arm(name, arm, urls[arm], pids[arm], data, rate, seconds, r))
                    runs[arm][f"{rate:g}"][-1]["drain_s"] = round(_wait_idle(pids[arm]), 1)
    return _summarise(runs)


def _summarise(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"per_rate": {}, "goodput_rps": {}, "goodput_short_rps": {}, "runs": {}}
    for arm, by_rate in runs.items():
        out["per_rate"][arm] = {k: rate_summary(x["_samples"] for x in v) for k, v in by_rate.items()}
        out["goodput_rps"][arm] = goodput({float(k): v["slo_met"] for k, v in out["per_rate"][arm].items()})
        out["goodput_short_rps"][arm] = goodput({float(k): v["slo_met_short"]
                                                 for k, v in out["per_rate"][arm].items()})
        out["runs"][arm] = {k: [{a: b for a, b in x.items() if a != "_samples"} for x in v]
                            for k, v in by_rate.items()}
    out["max_completed_rps"] = {a: max((v["completed_rps"] or 0.0) for v in out["per_rate"][a].values())
                                for a in ARMS}
    g = out["goodput_rps"]
    out["goodput_ratio"] = ratio(g["ours"], g["llama_server"])
    out["goodput_short_ratio"] = ratio(out["goodput_short_rps"]["ours"], out["goodput_short_rps"]["llama_server"])
    return out


def run(cfg: BenchConfig) -> dict[str, Any]:
    guidellm_binary()  # skip early when the load tool is not installed
    llama_server_binary()  # ... or the peer is not built
    quick_s, rounds = (QUICK_SECONDS, 1) if cfg.quick else (None, 2)
    for stale in (results_dir() / "goodput").glob("*.json.gz"):  # this run's reports replace the last run's
        stale.unlink()
    doc: dict[str, Any] = {"slo": {"ttft_p99_ms": TTFT_P99_MS, "itl_p99_ms": ITL_P99_MS},
                           "seconds_per_rate": quick_s or f">= {SECONDS:g}, >= {MIN_ARRIVALS} arrivals",
                           "rounds": rounds, "ctx": CTX, "slots": SLOTS, "tool": "guidellm 0.8.1", "models": {}}
    main = Path(cfg.model).resolve()
    # NOTE: ``--model`` the 1.1B shape runs that half alone (tagged and rated as the 1.1B), as scenario T does
    first = "1.1b" if main == MODEL_1B.resolve() else "gemma"
    models = [(first, main)] + ([] if cfg.quick or first == "1.1b" else [("1.1b", MODEL_1B)])
    for name, model in models:
        if name == "1.1b" and os.environ.get(SKIP_1B):
            doc["models"][name] = {"skipped": f"not run: {SKIP_1B} was set"}
            continue
        if not model.is_file():
            doc["models"][name] = {"skipped": f"{model} missing: run `make bench-model-1b`"}
            continue
        rates = QUICK_RATES if cfg.quick else RATES[name]
        say(f"  {name} ({model.name}): rates {', '.join(f'{x:g}' for x in rates)} req/s, "
            f"{doc['seconds_per_rate']} s each, {rounds} round(s), arms alternating")
        doc["models"][name] = {"model": model.name, "rates": list(rates),
                               **_model(cfg, name, model, rates, quick_s, rounds)}
        m = doc["models"][name]
        say(f"  {name} goodput: ours {m['goodput_rps']['ours']}, llama-server {m['goodput_rps']['llama_server']} "
            f"req/s (ratio {fmt(m['goodput_ratio'], 2)}, target >= {TARGET:g})")
    return doc


def _cells(p: dict[str, Any]) -> list[str]:
    return [f"{fmt(p['ttft_p50_ms'], 0)} / {fmt(p['ttft_p99_ms'], 0)}",
            f"{fmt(p['itl_p50_ms'], 0)} / {fmt(p['itl_p99_ms'], 0)}", fmt(p["completed_rps"], 2),
            f"{p['errored']} / {p['late_cancelled']}", fmt(p.get("ttft_p99_short_ms"), 0),
            "met" if p["slo_met"] else "not met"]


def render(r: dict[str, Any]) -> str:
    """The summary.md section of scenario S."""
    head = ["model", "rate req/s", "server", "TTFT p50 / p99 ms", "ITL p50 / p99 ms", "completed req/s",
            "errored / cancelled > 2 s", "short TTFT p99 ms", "SLO"]
    rows: list[list[Any]] = []
    lines = []
    for name, m in r["models"].items():
        if "skipped" in m:
            lines.append(f"- {name}: skipped ({m['skipped']})")
            continue
        for rate in m["per_rate"]["ours"]:
            for arm, label in (("ours", "this server"), ("llama_server", "llama-server")):
                rows.append([name, rate, label, *_cells(m["per_rate"][arm][rate])])
        g = m["goodput_rps"]
        lines.append(f"- {name}: goodput {fmt(g['ours'], 2)} req/s (this server) vs {fmt(g['llama_server'], 2)} "
                     f"(llama-server): {fmt(m['goodput_ratio'], 2)}x {verdict(m['goodput_ratio'], TARGET)}; "
                     f"most completed req/s {fmt(m['max_completed_rps']['ours'], 2)} vs "
                     f"{fmt(m['max_completed_rps']['llama_server'], 2)}; short requests only (TTFT p99 of chat "
                     f"and shared-system requests): {fmt(m['goodput_short_rps']['ours'], 2)} vs "
                     f"{fmt(m['goodput_short_rps']['llama_server'], 2)} req/s")
    note = (f"guidellm 0.8.1, streamed chat completions, Poisson arrivals, {r['seconds_per_rate']} s per rate, "
            f"{r['rounds']} alternating round(s); SLO TTFT p99 <= {r['slo']['ttft_p99_ms'] / 1000:g} s and ITL p99 "
            f"<= {r['slo']['itl_p99_ms']:g} ms (errored and > 2 s-cancelled requests count as TTFT misses); "
            f"goodput = the highest rate meeting it (all lower rates too); target >= {TARGET:g}x llama-server.")
    return note + "\n\n" + "\n".join(lines) + "\n\n" + table(head, rows)
