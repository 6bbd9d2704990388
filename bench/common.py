"""Shared helpers of the benchmark harness: paths, machine info, statistics, result files."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
_results_dir = RESULTS
DEFAULT_MODEL = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
PYTHON = sys.executable


def results_dir() -> Path:
    """Where result files go: bench/results, or bench/results/quick in quick mode."""
    return _results_dir


def set_results_dir(path: Path) -> None:
    global _results_dir
    _results_dir = path


def logs_dir() -> Path:
    """Server logs (stderr of every subprocess): <results>/logs."""
    return _results_dir / "logs"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_rev() -> str:
    try:
        cmd = ["git", "rev-parse", "--short", "HEAD"]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _llama_cpp_version() -> str:
    try:
        import llama_cpp

        return str(llama_cpp.__version__)
    except Exception:  # pragma: no cover - reported, never fatal
        return "unknown"


def machine_info(model: str | Path, quick: bool) -> dict[str, Any]:
    """What the figures were measured on; recorded in every result file."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "loadavg_at_start": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "llama_cpp_python": _llama_cpp_version(),
        "model": Path(model).name,
        "git_rev": _git_rev(),
        "quick": quick,
    }


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile of ``values`` (None when empty)."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def latency_summary(values_ms: list[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values_ms),
        "p50_ms": pct(values_ms, 50),
        "p99_ms": pct(values_ms, 99),
        "mean_ms": float(np.mean(values_ms)) if values_ms else None,
    }


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or not den:
        return None
    return num / den


def write_result(name: str, data: dict[str, Any]) -> Path:
    """Write ``<results>/<name>.json`` (atomically) and return its path."""
    results_dir().mkdir(parents=True, exist_ok=True)
    path = results_dir() / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")
    tmp.replace(path)
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def say(msg: str) -> None:
    """Progress output of the harness (flushed at once)."""
    print(msg, flush=True)


def fmt(value: float | int | None, digits: int = 1, suffix: str = "") -> str:
    """A number for a table cell; '-' for missing."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value}{suffix}"
    return f"{value:.{digits}f}{suffix}"


@dataclass(frozen=True)
class BenchConfig:
    """What every scenario gets: the model, quick mode and the compute threads of servers."""

    model: Path
    quick: bool
    threads: int | None = None  # None: the server's default (all cores)

    def server_threads(self) -> int:
        return self.threads or os.cpu_count() or 2
