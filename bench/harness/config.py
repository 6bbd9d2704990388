"""Paths, the results folder and the configuration every scenario gets."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
_results_dir = RESULTS
DEFAULT_MODEL = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
PYTHON = sys.executable

# Set (to anything) in the environment: scenarios S and T run their benchmark-model half only, not the
# 1.1B shape's (recorded as skipped), e.g. when a quiet machine is only available for ~1 hour.
SKIP_1B = "BENCH_SKIP_1B"


def results_dir() -> Path:
    """Where result files go: bench/results, or bench/results/quick in quick mode."""
    return _results_dir


def set_results_dir(path: Path) -> None:
    global _results_dir
    _results_dir = path


def logs_dir() -> Path:
    """Server logs (stderr of every subprocess): <results>/logs."""
    return _results_dir / "logs"


def say(msg: str) -> None:
    """Progress output of the harness (flushed at once)."""
    print(msg, flush=True)


@dataclass(frozen=True)
class BenchConfig:
    """What every scenario gets: the model, quick mode and the compute threads of servers."""

    model: Path
    quick: bool
    threads: int | None = None  # None: the server's default (all cores)

    def server_threads(self) -> int:
        return self.threads or os.cpu_count() or 2
