"""Short prompts before long prefills: scenario S's load against three arms in one run (issue #39 item 1).

``python -m bench.studies.prefill_order [--rates 0.35,0.5,0.75] [--rounds 1] [--model M]``

The arms: this server as it ships (``--long-prompt-tokens 512``: prompts with more than 512 tokens left
to compute go after shorter ones of their tier and get no first-token step of their own), this server in
arrival order (``--long-prompt-tokens 0``, what it did before) and ``llama-server --jinja``, each with
scenario S's flags, the same guidellm bodies (one seeded jsonl per rate and round) and Poisson arrivals;
the arms rotate at every rate and round, the load average is recorded before each. Per arm and rate: TTFT
p50/p99, the short requests' TTFT p99, ITL p50/p99, completed req/s, the SLO (scenario S's) with and
without the summarisation requests. Writes ``bench/results/extra/prefill_order.json``; guidellm's reports
go to ``bench/results/goodput/`` as ``O-<arm>-...``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.harness.config import DEFAULT_MODEL, ROOT, BenchConfig
from bench.harness.goodput import SUMMARISE, rate_summary, system_prompts
from bench.harness.procs import GrpcServer, LlamaServer, free_port, llama_server_binary
from bench.harness.prompts import PromptMaker
from bench.scenarios.s_goodput import CTX, MIN_ARRIVALS, SECONDS, SLOTS, _arm, _data, _wait_idle, _warm

ARMS = {"ours": "512", "ours_arrival_order": "0"}  # --long-prompt-tokens of this server's two arms
ALONE_TOKENS, ALONE_REPS = (1000, 1250, 1500), 1  # summarisation prompts timed alone on an idle server


def _alone(urls: dict[str, str], model: str, maker: PromptMaker) -> dict[str, list[dict[str, Any]]]:
    """TTFT of single summarisation prompts on each idle server (the floor under scenario S's TTFT p99)."""
    from bench.harness import sse_load  # NOTE: httpx is a bench-env dependency

    prompts = [SUMMARISE + maker.text(n) for n in ALONE_TOKENS for _ in range(ALONE_REPS)]
    out: dict[str, list[dict[str, Any]]] = {}
    for arm, url in urls.items():
        name = model if arm != "llama_server" else "peer"
        res = asyncio.run(sse_load.closed_loop(url, name, [prompts], 4))
        out[arm] = [{"prompt_tokens": r.prompt_tokens, "ttft_ms": r.ttft_ms, "load1": os.getloadavg()[0]}
                    for r in res]
    return out


def _servers(stack: ExitStack, model: Path, threads: int, server_threads: int) -> tuple[dict[str, str], dict[str, int]]:
    urls, pids = {}, {}
    for arm, limit in ARMS.items():
        port = free_port()
        flags = ["--http-port", str(port), "--max-running", str(SLOTS), "--ctx", str(CTX),
                 "--long-prompt-tokens", limit]
        srv = stack.enter_context(GrpcServer(f"O-{arm}", model, *flags, threads=threads))
        urls[arm], pids[arm] = f"http://127.0.0.1:{port}", srv.pid
    peer = stack.enter_context(LlamaServer("O-llama-server", llama_server_binary(), model, parallel=SLOTS,
                                           ctx=CTX, threads=server_threads, extra=["--jinja"]))
    urls["llama_server"], pids["llama_server"] = peer.base_url, peer.pid
    return urls, pids


def run(model: Path, rates: list[float], rounds: int) -> dict[str, Any]:
    cfg = BenchConfig(model, False)
    maker = PromptMaker(model, seed=3939)
    systems = system_prompts(maker.text)
    names = [*ARMS, "llama_server"]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {a: {f"{x:g}": [] for x in rates} for a in names}
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="prefill-order-") as tmp:
        urls, pids = _servers(stack, model, cfg.threads, cfg.server_threads())
        for arm in names:
            _warm(urls[arm], model.name.removesuffix(".gguf") if arm != "llama_server" else "peer")
        alone = _alone(urls, model.name.removesuffix(".gguf"), maker)
        for r in range(rounds):
            for i, rate in enumerate(rates):
                seconds = max(SECONDS, MIN_ARRIVALS / rate)
                data = _data(maker, systems, rate, seconds, 100 * r + i, Path(tmp), False)
                k = (r * len(rates) + i) % len(names)
                for arm in names[k:] + names[:k]:
                    row = _arm("O", arm, urls[arm], pids[arm], data, rate, seconds, r)
                    row["drain_s"] = round(_wait_idle(pids[arm]), 1)
                    runs[arm][f"{rate:g}"].append(row)
    per_rate = {a: {k: rate_summary(x["_samples"] for x in v) for k, v in by.items()} for a, by in runs.items()}
    kept = {a: {k: [{f: g for f, g in x.items() if f != "_samples"} for x in v] for k, v in by.items()}
            for a, by in runs.items()}
    return {"model": model.name, "rates": rates, "rounds": rounds, "arms": {**ARMS, "llama_server": "--jinja"},
            "alone": alone, "per_rate": per_rate, "runs": kept}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--rates", default="0.35,0.5,0.75")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "extra" / "prefill_order.json")
    a = ap.parse_args()
    doc = run(a.model, [float(x) for x in a.rates.split(",")], a.rounds)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    for arm, rows in doc["alone"].items():
        print(f"{arm:>20} alone: " + ", ".join(f"{r['prompt_tokens']} tokens {r['ttft_ms'] or -1:.0f} ms" for r in rows))
    for arm, by in doc["per_rate"].items():
        for rate, p in by.items():
            print(f"{arm:>20} {rate:>5}: TTFT p50/p99 {p['ttft_p50_ms']}/{p['ttft_p99_ms']} short p99 "
                  f"{p['ttft_p99_short_ms']} ITL p50/p99 {p['itl_p50_ms']}/{p['itl_p99_ms']} done "
                  f"{p['completed']} slo {p['slo_met']} short {p['slo_met_short']}")


if __name__ == "__main__":
    main()
