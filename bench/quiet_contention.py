"""Scenario L's quiet cells only: adaptive vs fixed threads, 4 alternating rounds, no busy processes.

``python bench/quiet_contention.py`` (under ``flock /tmp/bench.lock``) writes
``bench/results/extra/contention_quiet.json``. Separate from scenario L so a quiet
window never follows a window with busy processes.
"""
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, ".")
from bench.common import BenchConfig
from bench.prompts import PromptMaker
from bench.s_contention import _start, _switches, window_tok_s

cfg = BenchConfig(model=Path("models/gemma-3-270m-q4_k_m.gguf"), quick=False)
servers = {arm: _start(cfg, arm) for arm in ("adaptive", "fixed")}
try:
    maker = PromptMaker(cfg.model, seed=4321)
    prompts = {c: [maker.unique(8, 30, 60) for _ in range(c)] for c in (4, 16)}
    time.sleep(5)
    res = {}
    for rep in range(4):
        order = ["adaptive", "fixed"] if rep % 2 == 0 else ["fixed", "adaptive"]
        for c in (4, 16):
            for arm in order:
                before = _switches(servers[arm])
                row = asyncio.run(window_tok_s(servers[arm].target, prompts[c], 12.0))
                res.setdefault(f"C{c}", {}).setdefault(arm, []).append(row["tok_s"])
                print(rep, c, arm, round(row["tok_s"], 1), "switches", _switches(servers[arm]) - before, flush=True)
    out = {k: {a: sum(v) / len(v) for a, v in d.items()} for k, d in res.items()}
    for k, d in out.items():
        print(k, d, "ratio", round(d["adaptive"] / d["fixed"], 3))
    Path("bench/results/extra").mkdir(exist_ok=True)
    Path("bench/results/extra/contention_quiet.json").write_text(json.dumps({"runs": res, "means": out}, indent=1))
finally:
    for s in servers.values():
        s.stop()
