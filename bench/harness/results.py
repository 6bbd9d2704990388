"""Result files: what the figures were measured on, and the atomic write of ``<results>/<name>.json``."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.config import ROOT, results_dir


class Skipped(Exception):
    """The scenario cannot run here (the reason is recorded, the suite goes on)."""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_rev() -> str:
    """The short git revision of the checkout (``unknown`` outside git)."""
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


def load_now() -> dict[str, Any]:
    """The machine's load right now: ``uptime``'s line and the 1-minute load average (recorded before arm runs)."""
    text = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return {"uptime": text, "load1": os.getloadavg()[0]}


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
        "git_rev": git_rev(),
        "quick": quick,
    }


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
