"""Does one huge chat request stall everyone else? Health latency during a 20,000-message chat, two revisions.

``python -m bench.studies.loop_stall --before DIR [--after DIR] [--rounds 2] [--attacks 3] [--out FILE]``

``DIR`` is a checkout of another revision (as for ``bench.studies.revisions_ab``). Both servers run at
once (default model, HTTP API on); for each round and arm, in alternating order, a client polls
``GET /health`` every ``POLL_S`` for ``BASELINE_S`` (idle), then sends ``--attacks`` chat requests of
``--messages`` short messages one after another over HTTP while the polling goes on. Reported per
arm: the health latencies (p50, p99, max) idle and under attack, the attack requests' own status
and time, and the 1-minute load average before each arm. Health is answered by the same event loop
that prepares requests, so its latency is what every other client of the process waits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness.config import ROOT
from bench.harness.procs import GrpcServer, free_port

MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
POLL_S = 0.02
BASELINE_S = 3.0


def _chat(n: int) -> dict[str, Any]:
    roles = ("user", "assistant")
    return {"model": MODEL.stem, "max_tokens": 4,
            "messages": [{"role": roles[i % 2], "content": f"message number {i}"} for i in range(n)]}


class Poller:
    """Polls /health from a thread of its own; ``latencies_ms`` in order."""

    def __init__(self, base: str) -> None:
        self.base, self.latencies_ms, self._stop = base, [], threading.Event()
        self.errors = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=600) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = c.get(f"{self.base}/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies_ms.append((time.perf_counter() - t0) * 1e3)
                self.errors += not ok
                self._stop.wait(POLL_S)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _stats(ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {"n": len(ms), "p50_ms": round(q[49], 1), "p99_ms": round(q[98], 1), "max_ms": round(max(ms), 1)}


def _arm(base: str, messages: int, attacks: int) -> dict[str, Any]:
    load1 = os.getloadavg()[0]
    with Poller(base) as idle:
        time.sleep(BASELINE_S)
    body = _chat(messages)
    requests = []
    with Poller(base) as attacked, httpx.Client(timeout=1200) as c:
        for _ in range(attacks):
            t0 = time.perf_counter()
            r = c.post(f"{base}/v1/chat/completions", json=body)
            requests.append({"status": r.status_code, "s": round(time.perf_counter() - t0, 2)})
        time.sleep(0.5)
    return {"load1": round(load1, 2), "idle": _stats(idle.latencies_ms), "attack": _stats(attacked.latencies_ms),
            "health_errors": idle.errors + attacked.errors, "attack_requests": requests}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, default=ROOT)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--attacks", type=int, default=3)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    sources = {"before": args.before.resolve(), "after": args.after.resolve()}
    ports = {arm: free_port() for arm in sources}
    servers = {arm: GrpcServer(f"stall-{arm}", MODEL, "--http-port", str(ports[arm]), source=src)
               for arm, src in sources.items()}
    rows = []
    try:
        for s in servers.values():
            s.start()
        for rnd in range(args.rounds):
            for arm in ("before", "after") if rnd % 2 == 0 else ("after", "before"):
                row = {"round": rnd, "arm": arm, **_arm(f"http://127.0.0.1:{ports[arm]}", args.messages, args.attacks)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for s in servers.values():
            s.stop()
    result = {"sources": {k: str(v) for k, v in sources.items()}, "messages": args.messages, "rows": rows}
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
