"""Scenario E at 32 batch streams, repeated, with and without the batch-row cap (issue #18 part 2).

``python -m bench.studies.e_tail [--runs 3] [--caps 0,8]``: one server per cap value
(``--batch-rows-with-interactive``; 0 = no cap), all started first; then each
run measures, server after server, scenario E's three phases (interactive alone
on the idle server, 32 batch streams alone, both together) with E's load and
code (``bench/scenarios/e_priority.py``). Writes ``bench/results/interactive_tail.json``.
Targets: interactive TTFT p99 <= 250 ms and <= 2x idle in every run; total
tokens (batch + interactive) within 10% of batch-only.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
from typing import Any

from bench.harness.config import DEFAULT_MODEL, say
from bench.harness.procs import GrpcServer
from bench.harness.prompts import PromptMaker
from bench.harness.results import machine_info, write_result
from bench.harness.stats import ratio
from bench.scenarios.e_priority import CTX, FULL, one_run

N = 32


def _phases(target: str, maker: PromptMaker) -> dict[str, Any]:
    load = replace(FULL, batch_streams=(N,))
    idle = asyncio.run(one_run(target, 0, True, load, maker, load.idle_window_s))
    alone = asyncio.run(one_run(target, N, False, load, maker, load.window_s))
    loaded = asyncio.run(one_run(target, N, True, load, maker, load.window_s))
    p99, idle_p99 = loaded["interactive_ttft"]["p99_ms"], idle["interactive_ttft"]["p99_ms"]
    return {
        "idle_p99_ms": idle_p99,
        "loaded_p99_ms": p99,
        "loaded_p50_ms": loaded["interactive_ttft"]["p50_ms"],
        "p99_vs_idle": ratio(p99, idle_p99),
        "batch_only_tok_s": alone["batch_tok_s"],
        "loaded_batch_tok_s": loaded["batch_tok_s"],
        "loaded_interactive_tok_s": loaded["interactive_tok_s"],
        "loaded_total_tok_s": loaded["total_tok_s"],
        "total_vs_batch_only": ratio(loaded["total_tok_s"], alone["batch_tok_s"]),
        "interactive_failed": loaded["interactive_failed"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--caps", default="0,8")
    args = ap.parse_args(argv)
    caps = [int(c) for c in args.caps.split(",")]
    flags = ["--scheduling", "priority", "--ctx", str(CTX), "--max-running", str(N)]
    servers = {
        c: GrpcServer(f"E32-cap{c}", DEFAULT_MODEL, *flags, "--batch-rows-with-interactive", str(c))
        for c in caps
    }
    runs: dict[str, list[dict[str, Any]]] = {str(c): [] for c in caps}
    doc: dict[str, Any] = {"machine": machine_info(DEFAULT_MODEL, False), "batch_streams": N, "runs": runs}
    try:
        for srv in servers.values():
            srv.start()
        for r in range(args.runs):
            for c, srv in servers.items():
                row = _phases(srv.target, PromptMaker(DEFAULT_MODEL, seed=555 + r))
                runs[str(c)].append(row)
                say(
                    f"run {r} cap {c:>2}: p99 {row['loaded_p99_ms']:.0f} ms ({row['p99_vs_idle']:.2f}x idle "
                    f"{row['idle_p99_ms']:.0f}), total {row['loaded_total_tok_s']:.1f} tok/s = "
                    f"{row['total_vs_batch_only']:.3f} x batch-only {row['batch_only_tok_s']:.1f}; "
                    f"batch {row['loaded_batch_tok_s']:.1f}"
                )
                write_result("interactive_tail", doc)
    finally:
        for srv in servers.values():
            srv.stop()


if __name__ == "__main__":
    main()
