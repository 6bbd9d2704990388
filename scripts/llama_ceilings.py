"""Measure llama.cpp's decode ceilings with llama-batched-bench, the reference for issue #28.

Usage: python scripts/llama_ceilings.py [--out bench/results/extra/ceilings_llama_batched_bench.json]
(needs ``make llama-tools``, ``make bench-model`` and ``make bench-model-1b``)

Why: "x% of the ceiling" needs a ceiling measured on the same machine with the same llama.cpp:
llama-batched-bench (built from the llama.cpp that the pinned llama-cpp-python vendors) decodes
``npl`` sequences of ``ntg`` tokens after an ``npp``-token prompt each, at a fixed thread count;
its ``speed_tg`` is decode-only tokens/s over all rows. The runs hold the machine-wide benchmark
lock (/tmp/bench.lock, flock(2) as ``flock /tmp/bench.lock ...`` takes it); each waits (up to
--quiet-timeout) for other processes to leave the cores idle and records the load average and
the cores in use just before it starts, and the cores other processes used while it ran (the
machine's busy time minus llama-batched-bench's own CPU time): the lock only keeps other
benchmarks out, and 2 threads on 2 cores lose most of their speed to any neighbour.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import resource
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


def cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (all cores, from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    busy = sum(fields) - fields[3] - fields[4]  # minus idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def busy_cores(seconds: float = 5.0) -> float:
    """Cores in use by everything on the machine over the next `seconds`."""
    before = cpu_seconds()
    time.sleep(seconds)
    return round((cpu_seconds() - before) / seconds, 2)


def wait_for_quiet(threshold: float, timeout: float) -> float:
    """Wait (holding the lock) until other work uses under `threshold` cores; return the last sample."""
    deadline = time.time() + timeout
    busy = busy_cores()
    while busy >= threshold and time.time() < deadline:
        print(f"waiting for a quiet machine: {busy} cores busy")
        busy = busy_cores()
    return busy


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
    busy = wait_for_quiet(args.quiet_below, args.quiet_timeout)
    load = loadavg()
    start, machine0, ours0 = time.time(), cpu_seconds(), children_cpu_seconds()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    wall = time.time() - start
    others = (cpu_seconds() - machine0 - (children_cpu_seconds() - ours0)) / wall
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {
        "command": shlex.join(cmd),
        "loadavg_before": load,
        "busy_cores_before": busy,
        "wall_s": round(wall, 1),
        "other_cores_during": round(others, 2),
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
    parser.add_argument("--quiet-below", type=float, default=0.3,
                        help="wait until other processes use fewer cores than this (5 s sample)")
    parser.add_argument("--quiet-timeout", type=float, default=600, help="seconds to wait for that, then run anyway")
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
            r = result["models"][name]
            print(name, r["decode_tok_s_by_rows"], "load", r["loadavg_before"], "busy", r["busy_cores_before"],
                  "others during", r["other_cores_during"])
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
