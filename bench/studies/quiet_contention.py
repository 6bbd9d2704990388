"""Scenario L's quiet cells only: adaptive vs fixed threads, 4 alternating rounds, no busy processes.

``python -m bench.studies.quiet_contention`` (under ``flock /tmp/bench.lock``) writes
``bench/results/extra/contention_quiet.json``. Separate from scenario L so a quiet
window never follows a window with busy processes.

Each window also records the CPU used outside this benchmark (the machine's busy
time minus both servers' and this process's): on a shared machine a test run
elsewhere can stall a window. Rounds in which any window saw more than
``OUTSIDE_MAX_CORES`` are reported but left out of the "quiet" means (a rule
fixed before looking at the ratios).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from bench.harness.config import DEFAULT_MODEL, RESULTS, BenchConfig
from bench.harness.procs import GrpcServer, cpu_seconds
from bench.harness.prompts import PromptMaker
from bench.harness.results import git_rev
from bench.scenarios.l_contention import start_arm, switches, window_tok_s

OUTSIDE_MAX_CORES = 0.2
ROUNDS = int(os.environ.get("BENCH_QUIET_ROUNDS", "4"))
HZ = os.sysconf("SC_CLK_TCK")
STREAMS = (4, 16)
WINDOW_S = 12.0


def _busy_s() -> float:
    vals = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(vals) - vals[3] - vals[4]) / HZ  # all but idle and iowait


def _ours_s(pids: list[int]) -> float:
    t = os.times()
    return t.user + t.system + sum(cpu_seconds(p) for p in pids)


class Rounds:
    """tok/s per stream count and arm, and the outside CPU (cores) of every window per round."""

    def __init__(self) -> None:
        self.res: dict[str, dict[str, list[float]]] = {}
        self.outside_by_round: dict[int, list[float]] = {}

    def window(self, servers: dict[str, GrpcServer], arm: str, prompts: list[list[str]], rep: int) -> None:
        """One measured window on ``arm``'s server, with the CPU used outside this benchmark."""
        srv = servers[arm]
        before = switches(srv)
        pids = [s.pid for s in servers.values()]
        t0, b0, o0 = time.monotonic(), _busy_s(), _ours_s(pids)
        row = asyncio.run(window_tok_s(srv.target, prompts, WINDOW_S))
        outside = max(0.0, (_busy_s() - b0) - (_ours_s(pids) - o0)) / (time.monotonic() - t0)
        c = len(prompts)
        self.res.setdefault(f"C{c}", {}).setdefault(arm, []).append(row["tok_s"])
        self.outside_by_round.setdefault(rep, []).append(round(outside, 2))
        print(
            rep,
            c,
            arm,
            round(row["tok_s"], 1),
            "switches",
            switches(srv) - before,
            "outside cores",
            round(outside, 2),
            flush=True,
        )

    def quiet(self) -> list[int]:
        return [r for r, o in self.outside_by_round.items() if max(o) <= OUTSIDE_MAX_CORES]


def _means(rounds: Rounds) -> tuple[dict[str, Any], dict[str, Any]]:
    """Means over all rounds and over the quiet rounds only (printed with their ratios)."""
    quiet = rounds.quiet()
    out = {k: {a: sum(v) / len(v) for a, v in d.items()} for k, d in rounds.res.items()}
    out_quiet = (
        {k: {a: sum(v[r] for r in quiet) / len(quiet) for a, v in d.items()} for k, d in rounds.res.items()}
        if quiet
        else {}
    )
    for k, d in out.items():
        print(k, "all rounds", d, "ratio", round(d["adaptive"] / d["fixed"], 3))
    for k, d in out_quiet.items():
        print(k, f"quiet rounds {quiet}", d, "ratio", round(d["adaptive"] / d["fixed"], 3))
    return out, out_quiet


def _write(rounds: Rounds) -> None:
    out, out_quiet = _means(rounds)
    folder = RESULTS / "extra"
    folder.mkdir(exist_ok=True)
    doc = {
        "git_rev": git_rev(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": rounds.res,
        "means": out,
        "outside_cores_by_round": rounds.outside_by_round,
        "outside_max_cores": OUTSIDE_MAX_CORES,
        "quiet_rounds": rounds.quiet(),
        "means_quiet_rounds": out_quiet,
    }
    (folder / "contention_quiet.json").write_text(json.dumps(doc, indent=1))


def main() -> None:
    cfg = BenchConfig(model=DEFAULT_MODEL, quick=False)
    servers = {arm: start_arm(cfg, arm) for arm in ("adaptive", "fixed")}
    try:
        maker = PromptMaker(cfg.model, seed=4321)
        prompts = {c: [maker.unique(8, 30, 60) for _ in range(c)] for c in STREAMS}
        time.sleep(5)
        rounds = Rounds()
        for rep in range(ROUNDS):
            order = ["adaptive", "fixed"] if rep % 2 == 0 else ["fixed", "adaptive"]
            for c in STREAMS:
                for arm in order:
                    rounds.window(servers, arm, prompts[c], rep)
        _write(rounds)
    finally:
        for s in servers.values():
            s.stop()


if __name__ == "__main__":
    main()
