"""Scenario R's measurement from the command line, some parts only if asked (issue #36's benchmark).

``flock /tmp/bench.lock .venv/bin/python -m bench.studies.tool_calls [--per-kind 5] [--per-kind-1b 2]
[--grammar-rounds 6] [--parts grammar,default,default-own,1.1b] [--out bench/results/tool_calls.json]``

Method: ``bench/scenarios/r_tool_calls.py`` and docs/benchmarks.md (R). The file is written in the
layout ``bench.run`` writes scenario R in, so ``bench/results/summary.md`` picks it up; a run of
some parts only adds them to the last whole run's file (its machine and load under
``results.later_runs``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.harness.config import ROOT
from bench.harness.results import machine_info
from bench.scenarios.r_tool_calls import DEFAULT_MODEL, PARTS, THREADS, TITLE, measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-kind", type=int, default=5, help="conversations of each kind, default model")
    ap.add_argument("--per-kind-1b", type=int, default=2, help="conversations of each kind on the 1.1B shape")
    ap.add_argument("--grammar-rounds", type=int, default=6)
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ", ".join(PARTS))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tool_calls.json")
    args = ap.parse_args()
    parts = tuple(p for p in PARTS if p in args.parts.split(","))
    t0 = time.monotonic()
    machine = machine_info(DEFAULT_MODEL, False) | {"threads": THREADS}
    results = measure(args.per_kind, args.per_kind_1b, args.grammar_rounds, parts=parts)
    if parts != PARTS and args.out.is_file():  # NOTE: a partial run adds its parts to the last whole run's file
        doc = json.loads(args.out.read_text())
        doc["results"]["models"].update(results.pop("models"))
        doc["results"].setdefault("later_runs", []).append(results | {"machine": machine,
                                                                      "elapsed_s": round(time.monotonic() - t0, 1)})
    else:  # NOTE: as bench.run writes scenario R, so bench/results/summary.md picks it up
        doc = {"scenario": "R", "name": "tool_calls", "title": TITLE, "machine": machine, "results": results,
               "status": "ok", "elapsed_s": round(time.monotonic() - t0, 1)}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out} after {time.monotonic() - t0:.0f} s", flush=True)

if __name__ == "__main__":
    main()
