"""Does any attack stall the others? Health and a neighbour's TTFT during each hostile input (issue #35).

``python -m bench.studies.hostile [--source DIR] [--attack-s 10] [--only NAME ...] [--rounds 1]
[--final-settle-s 0] [--out FILE]``

One server (the default model, HTTP API on, the response cache off; ``--source``: another
checkout's code, as for ``bench.studies.revisions_ab``). For each attack of
``bench.studies.hostile_attacks.catalogue``, in turn:

1. baseline (``BASE_S``): ``GET /health`` polled every 20 ms on a keep-alive connection, and a
   neighbour sending short streaming chats one after another (its time to first token);
2. the attack runs for ``--attack-s`` (or until its own requests end, up to ``MAX_ATTACK_S``)
   with the same polling and the same neighbour;
3. the attack stops and releases what it holds; the server's descriptors and RSS are read after
   they settle (up to ``SETTLE_S``).

``--rounds``: the catalogue that many times on the same server (a leak grows RSS every round; the
allocator's high-water mark does not); ``--final-settle-s``: RSS read again that long after the
last attack (``rss_settle``). The last entry, ``grpc_readers_control``, is not an attack: the
16 streams of ``grpc_stall``, read to their end, so the stall's cost can be told from the load's.

Reported per attack: health p50/p99/max (baseline, during), the neighbour's TTFT p50/p99
(baseline, during) and their ratio, the attack's statuses, 5xx anywhere, descriptors and RSS
before/after, and the cores the server and this process used in each window (``cores_base``,
``cores_attack``: ``[server, study]``; the attacker runs in this process, on the same 2 cores, so its
share is the study's increase over the baseline). Targets (the issue's): health max <= 250 ms and p99 < 100 ms, the neighbour's TTFT
p99 within 2x of baseline, no 5xx, descriptors and memory back to baseline.
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

import httpx2

from bench.harness.config import ROOT
from bench.harness.procs import GrpcServer, free_port
from bench.studies.hostile_attacks import MODEL, Attack, Sockets, catalogue, wait_until

MODEL_PATH = ROOT / "models" / f"{MODEL}.gguf"
POLL_S = 0.02
BASE_S = 5.0
MAX_ATTACK_S = 120.0
SETTLE_S = 30.0


class Probe:
    """Health polling and a neighbour's streaming chats, each in a thread, until ``stop``."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.health_ms: list[float] = []
        self.ttft_ms: list[float] = []
        self.statuses: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._health, self._neighbour)]

    def _health(self) -> None:
        with httpx2.Client(timeout=600) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    self.statuses.append(str(c.get(f"{self.base}/health").status_code))
                except httpx2.HTTPError as exc:
                    self.statuses.append(type(exc).__name__)
                self.health_ms.append((time.perf_counter() - t0) * 1e3)
                self._stop.wait(POLL_S)

    def _neighbour(self) -> None:
        i = 0
        with httpx2.Client(timeout=600) as c:
            while not self._stop.is_set():
                i += 1
                body = {"model": MODEL, "max_tokens": 8, "stream": True, "temperature": 0,
                        "messages": [{"role": "user", "content": f"Neighbour question {i}: name a colour."}]}
                t0 = time.perf_counter()
                try:
                    with c.stream("POST", f"{self.base}/v1/chat/completions", json=body) as r:
                        self.statuses.append(str(r.status_code))
                        first = True
                        for line in r.iter_lines():
                            if first and line.startswith("data: ") and '"content"' in line:
                                self.ttft_ms.append((time.perf_counter() - t0) * 1e3)
                                first = False
                except httpx2.HTTPError as exc:
                    self.statuses.append(type(exc).__name__)

    def __enter__(self) -> Probe:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=600)


def _q(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0}
    q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {"n": len(ms), "p50_ms": round(q[49], 1), "p99_ms": round(q[98], 1), "max_ms": round(max(ms), 1)}


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return round(kb / 1024, 1)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Cores:
    """Cores used over a window by the server and by this process (the probes; during an attack, the attacker
    too: so the attacker's share is the difference from the baseline's), as ``[server, study]``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.t0, self.server0, self.study0 = time.monotonic(), _cpu_s(pid), time.process_time()

    def read(self) -> list[float]:
        wall = time.monotonic() - self.t0
        return [round((_cpu_s(self.pid) - self.server0) / wall, 2), round((time.process_time() - self.study0) / wall, 2)]


def _run_one(server: GrpcServer, http: str, attack: Attack, attack_s: float) -> dict[str, Any]:
    pid, load1 = server.pid, os.getloadavg()[0]
    fds0, rss0 = _fds(pid), _rss_mb(pid)
    with Probe(http) as base:
        cores = Cores(pid)
        time.sleep(BASE_S)
        cores_base = cores.read()
    with Probe(http) as during:
        t0, cores = time.monotonic(), Cores(pid)
        attack.start()
        time.sleep(attack_s)
        wait_until(attack.done, max(0.0, MAX_ATTACK_S - (time.monotonic() - t0)))
        closed = attack.closed_by_server() if isinstance(attack, Sockets) else None
        cores_attack = cores.read()
        attack.stop()
    wait_until(lambda: _fds(pid) <= fds0 + 2, SETTLE_S)
    statuses = {s: attack.statuses.count(s) for s in sorted(set(attack.statuses))}
    probes = base.statuses + during.statuses
    ttft_base, ttft_attack = _q(base.ttft_ms), _q(during.ttft_ms)
    b, a = ttft_base.get("p99_ms"), ttft_attack.get("p99_ms")
    row: dict[str, Any] = {
        "attack": attack.name, "load1": round(load1, 2),
        "health_base": _q(base.health_ms), "health_attack": _q(during.health_ms),
        "ttft_base": ttft_base, "ttft_attack": ttft_attack, "ttft_p99_ratio": round(a / b, 2) if a and b else None,
        "attack_statuses": statuses, "probe_errors": sorted({s for s in probes if s != "200"}),
        "status_5xx": sum(n for s, n in statuses.items() if s.startswith("5")) + sum(s.startswith("5") for s in probes),
        "fds": [fds0, _fds(pid)], "rss_mb": [rss0, _rss_mb(pid)],
        "cores_base": cores_base, "cores_attack": cores_attack,  # [server, study process]
    }
    if isinstance(attack, Sockets):
        row["sockets"] = {"opened": len(attack.socks), "refused": attack.refused, "closed_by_server": closed}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=ROOT)
    ap.add_argument("--attack-s", type=float, default=10.0)
    ap.add_argument("--only", nargs="*", default=None, help="attack names to run (default: all)")
    ap.add_argument("--rounds", type=int, default=1, help="run the catalogue this many times")
    ap.add_argument("--final-settle-s", type=float, default=0.0, help="read RSS again this long after the end")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    port = free_port()
    http = f"http://127.0.0.1:{port}"
    server = GrpcServer("hostile", MODEL_PATH, "--http-port", str(port), source=args.source.resolve())
    rows: list[dict[str, Any]] = []
    settle: dict[str, Any] = {}
    try:
        server.start()
        for round_ in range(1, args.rounds + 1):
            for make in catalogue(http, server.target):
                attack = make()
                if args.only and attack.name not in args.only:
                    continue
                rows.append({"round": round_, **_run_one(server, http, attack, args.attack_s)})
                print(json.dumps(rows[-1]), flush=True)
        if args.final_settle_s > 0:
            settle = {"after_s": args.final_settle_s, "rss_mb_before": _rss_mb(server.pid)}
            time.sleep(args.final_settle_s)
            settle.update(rss_mb_after=_rss_mb(server.pid), fds=_fds(server.pid), load1=round(os.getloadavg()[0], 2))
            print(json.dumps({"rss_settle": settle}), flush=True)
    finally:
        server.stop()
    if args.out is not None:
        out = {"source": str(args.source.resolve()), "rows": rows, "rss_settle": settle}
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
