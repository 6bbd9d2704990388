"""What precise prefix routing's render call costs a pod (issue #38 item 3, docs/scale-out.md).

``python -m bench.studies.render_cost [--rounds 4] [--requests 30] [--threads 2]``

With llm-d's precise scorer, the router renders every request to token ids through a pod's
``/v1/chat/completions/render`` before it picks a pod (deploy/kustomize/components/
inference-gateway-precise). This measures that call on one server of the model the deploy overlays
run (SmolLM2-135M), against the cheapest real request it precedes: the same chat with its ~500-token
system prompt already in the prefix cache, ``max_tokens`` 1. Arms alternate within each round,
``--requests`` sequential calls each, with the 1-minute load average recorded before each arm;
per arm: latency p50/p90 (client side) and the server process's CPU time per call
(``/proc/<pid>/stat``). Writes ``bench/results/extra/render_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx2

from bench.harness.config import ROOT
from bench.harness.procs import GrpcServer, free_port

MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEM = (
    "You are the support assistant of a parcel company. Answer questions about tracking numbers, "
    "delivery windows, customs declarations, damaged goods, refunds and address changes. Quote the "
    "policy section you rely on, never invent a tracking status, and ask for the parcel number first. "
) * 8
ARMS = {"render": "/v1/chat/completions/render", "cached_request": "/v1/chat/completions"}


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all threads), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def body(i: int) -> dict[str, Any]:
    return {
        "model": MODEL.name.removesuffix(".gguf"),  # the router's token-producer sends it too
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Where is parcel {i}?"}],
        "max_tokens": 1,
        "temperature": 0,
    }


def arm(client: httpx2.Client, pid: int, path: str, requests: int) -> dict[str, Any]:
    load = os.getloadavg()[0]
    latencies = []
    cpu0 = cpu_seconds(pid)
    for i in range(requests):
        t0 = time.perf_counter()
        resp = client.post(path, json=body(i))
        latencies.append(time.perf_counter() - t0)
        assert resp.status_code == 200, resp.text
    cpu = cpu_seconds(pid) - cpu0
    q = statistics.quantiles(latencies, n=10)
    return {"load1": round(load, 2), "p50_ms": round(statistics.median(latencies) * 1e3, 2),
            "p90_ms": round(q[8] * 1e3, 2), "cpu_ms_per_call": round(cpu / requests * 1e3, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "extra" / "render_cost.json")
    args = ap.parse_args()
    http_port = free_port()
    out: dict[str, Any] = {"study": "render_cost", "model": MODEL.name, "runs": []}
    flags = ["--http-port", str(http_port), "--prefix-cache-tokens", "8192"]  # as components/prod
    with GrpcServer("render-cost", MODEL, *flags, threads=args.threads) as srv, \
            httpx2.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=600) as client:
        render = client.post(ARMS["render"], json=body(0)).json()
        out["prompt_tokens"] = len(render["token_ids"])
        client.post(ARMS["cached_request"], json=body(0))  # the system prompt into the prefix cache
        for r in range(args.rounds):
            for name in ARMS if r % 2 == 0 else reversed(ARMS):
                out["runs"].append({"round": r, "arm": name, **arm(client, srv.pid, ARMS[name], args.requests)})
                print(json.dumps(out["runs"][-1]), flush=True)
    for name in ARMS:
        rows = [x for x in out["runs"] if x["arm"] == name]
        out[name] = {k: statistics.median(x[k] for x in rows) for k in ("p50_ms", "cpu_ms_per_call")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"prompt_tokens": out["prompt_tokens"], **{n: out[n] for n in ARMS}}))


if __name__ == "__main__":
    main()
