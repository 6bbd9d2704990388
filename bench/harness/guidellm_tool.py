"""guidellm (the load tool of scenario S) as a subprocess: one run = one Poisson rate against one server.

guidellm 0.8.1 lives in its own venv ``.venv-guidellm`` (``make goodput-env``, pinned by
``bench/requirements-goodput.txt``), never in the project's ``.venv``. Each run gets a scenario file
(guidellm's ``--config``: the full spec, kept in the result) and writes guidellm's JSON report, which is
kept gzipped (``<results>/goodput/*.json.gz``: the reports hold every request's timings, ~9 KB each).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.config import ROOT, results_dir
from bench.harness.goodput import ITL_P99_MS, TTFT_P99_MS
from bench.harness.results import Skipped

VENV = ROOT / ".venv-guidellm"
TIMEOUT_PAD_S = 180  # guidellm's start (imports torch), data loading and the drain after the duration


def guidellm_binary() -> Path:
    """``.venv-guidellm/bin/guidellm`` (``$GUIDELLM`` overrides); ``Skipped`` when it is not installed."""
    path = Path(os.environ.get("GUIDELLM", VENV / "bin" / "guidellm"))
    if not path.is_file():
        raise Skipped(f"{path} missing: run `make goodput-env` (guidellm in .venv-guidellm)")
    return path


def spec(target: str, data: Path, rate: float, seconds: float, out: Path, seed: int) -> dict[str, Any]:
    """guidellm's scenario: streamed chat completions, Poisson arrivals at ``rate``, for ``seconds``."""
    return {"spec": {
        "backend": {"kind": "openai_http", "target": target, "request_format": "/v1/chat/completions",
                    "timeout": 600},
        "profile": {"kind": "poisson", "rate": [rate]},
        "data": [{"kind": "json_file", "path": str(data)}],
        "constraints": [{"kind": "max_duration", "seconds": seconds}],
        "outputs": [{"kind": "json", "path": str(out)}],
        "seed": {"kind": "static", "value": seed},
        # NOTE: sample_size 0 drops prompts and outputs from the report, not the per-request timings;
        # guidellm's own SLO (TPOT, not ITL) is recorded beside ours for reference.
        "metrics": {"kind": "generative", "sample_size": 0,
                    "slo": {"ttft_ms": TTFT_P99_MS, "tpot_ms": ITL_P99_MS}},
    }}


def run_rate(label: str, target: str, data: Path, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    """Run guidellm once; returns its (only) benchmark, and keeps the report as ``goodput/<label>.json.gz``."""
    binary = guidellm_binary()
    keep = results_dir() / "goodput" / f"{label}.json.gz"
    keep.parent.mkdir(parents=True, exist_ok=True)
    log = results_dir() / "logs" / f"S-guidellm-{label}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="guidellm-") as tmp:
        out = Path(tmp) / "report.json"
        cfg = Path(tmp) / "scenario.json"
        cfg.write_text(json.dumps(spec(target, data, rate, seconds, out, seed)))
        # NOTE: no model hub (tokens are counted by the servers' usage); one worker process: the
        # default (10 spawned processes, each importing torch) would take the servers' cores.
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   GUIDELLM__MAX_WORKER_PROCESSES="1")
        with log.open("wb") as f:
            subprocess.run([str(binary), "run", "--config", str(cfg), "--disable-console-interactive"],
                           stdout=f, stderr=subprocess.STDOUT, env=env, check=True,
                           timeout=seconds + TIMEOUT_PAD_S, cwd=tmp)
        with out.open("rb") as src, gzip.open(keep, "wb") as dst:
            shutil.copyfileobj(src, dst)
        report = json.loads(out.read_text())
    benches = report["benchmarks"]
    assert len(benches) == 1, f"one rate per guidellm run, got {len(benches)}"
    return dict(benches[0])


def own_figures(bench: dict[str, Any]) -> dict[str, Any]:
    """guidellm's own percentiles (completed requests only), its req/s and its SLO attainment."""
    m = bench["metrics"]

    def pcts(name: str) -> dict[str, float]:
        p = m[name]["successful"]["percentiles"]
        return {"p50": p["p50"], "p99": p["p99"]}

    return {"ttft_ms": pcts("time_to_first_token_ms"), "itl_ms": pcts("inter_token_latency_ms"),
            "tpot_ms": pcts("time_per_output_token_ms"),
            "requests_per_second_mean": m["requests_per_second"]["successful"]["mean"],
            "slo_attainment": m.get("slo_attainment"),
            "requests_made": bench["scheduler_metrics"]["requests_made"]}
