"""Measure llama.cpp's decode ceilings with llama-batched-bench, the reference for issue #28.

Usage: python scripts/llama_ceilings.py [--out bench/results/extra/ceilings_llama_batched_bench.json]
(needs ``make llama-tools``, ``make bench-model`` and ``make bench-model-1b``)

Why: "x% of the ceiling" needs a ceiling measured on the same machine with the same llama.cpp:
llama-batched-bench (built from the llama.cpp that the pinned llama-cpp-python vendors) decodes
``npl`` sequences of ``ntg`` tokens after an ``npp``-token prompt each, at a fixed thread count;
its ``speed_tg`` is decode-only tokens/s over all rows. Each run holds the machine-wide benchmark
lock (/tmp/bench.lock, flock(2) as ``flock /tmp/bench.lock ...`` takes it) and records the load
average just before it starts.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import platform
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Paths relative to the repository root (commands run there and are recorded as run).
TOOL = ".llama-tools/bin/llama-batched-bench"
MODELS = {
    "gemma-3-270m-q4_k_m": "models/gemma-3-270m-q4_k_m.gguf",
    "tinyllama-shape-1.1b-q4_k_m": "models/tinyllama-shape-1.1b-q4_k_m.gguf",
}
LOCK = Path("/tmp/bench.lock")


@contextlib.contextmanager
def bench_lock() -> Iterator[None]:
    with LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def git_rev() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip()


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run(model: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        TOOL, "-m", model, "-c", str(args.ctx), "-t", str(args.threads),
        "-tb", str(args.threads), "-npp", args.npp, "-ntg", args.ntg, "-npl", args.npl,
        "--output-format", "jsonl",
    ]
    load = loadavg()
    start = time.time()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {
        "command": shlex.join(cmd),
        "loadavg_before": load,
        "wall_s": round(time.time() - start, 1),
        "decode_tok_s_by_rows": {str(r["pl"]): round(r["speed_tg"], 2) for r in rows},
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/extra/ceilings_llama_batched_bench.json"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=4096, help="KV cells over all rows (32 x (32 + 64) fit)")
    parser.add_argument("--npp", default="32")
    parser.add_argument("--ntg", default="64")
    parser.add_argument("--npl", default="1,4,16,32")
    args = parser.parse_args()

    stamp = (ROOT / ".llama-tools" / "stamp").read_text().split(" cmake:")[0]
    result: dict[str, Any] = {
        "what": "llama-batched-bench decode-only ceilings (speed_tg, tokens/s over all rows)",
        "git_rev": git_rev(),
        "llama_tools": stamp,
        "cpu": cpu_model(),
        "threads": args.threads,
        "lock": str(LOCK),
        "models": {},
    }
    with bench_lock():
        for name, path in MODELS.items():
            result["models"][name] = run(path, args)
            print(name, result["models"][name]["decode_tok_s_by_rows"], "load before", result["models"][name]["loadavg_before"])
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
