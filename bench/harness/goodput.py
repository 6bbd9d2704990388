"""Scenario S's pure parts: the request mix written for guidellm, per-rate latency figures read back
from guidellm's JSON, and goodput (the highest Poisson rate meeting the SLO).

The mix (seeded): short chat turns (no system prompt), long-prompt summarisation (1,000-1,500 prompt
tokens, within the 1.1B shape's 2,048-token context) and short questions under one of a few shared
~300-token system prompts; each row carries its own output length (``output_tokens_count``, which
guidellm sends as ``max_completion_tokens`` with ``ignore_eos``).

The SLO (issue #39): TTFT p99 <= 2 s and inter-token latency p99 <= 200 ms. guidellm's own
percentiles count completed requests only; at overload the requests still waiting when the rate's
time is up are cancelled and would drop out, which flatters TTFT p99 exactly where it matters. So the
percentiles here also count, as TTFT violations (infinite), every errored request and every cancelled
one that had waited longer than the TTFT bound without a first token (censored data: its TTFT is
known to exceed the bound). Cancelled requests that had waited less are left out (unknown).
A secondary figure applies the TTFT bound to the completed short requests only (not summarisation).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from typing import Any

TTFT_P99_MS = 2000.0
ITL_P99_MS = 200.0
KINDS = (("chat", 0.5), ("summarise", 0.2), ("shared_system", 0.3))
N_SYSTEM_PROMPTS = 4
SYSTEM_TOKENS = 300
LENGTHS = {  # prompt tokens (lo, hi) and output tokens (lo, hi) per kind
    "chat": ((20, 80), (32, 128)),
    "summarise": ((1000, 1500), (64, 128)),
    "shared_system": ((20, 60), (32, 96)),
}
QUICK_LENGTHS = {  # --quick: the same kinds, shorter, so that a loaded machine still completes some in 20 s
    "chat": ((20, 60), (8, 24)),
    "summarise": ((300, 400), (16, 32)),
    "shared_system": ((20, 40), (8, 24)),
}
LONG_PROMPT_TOKENS = 900  # a completed request with at least this many prompt tokens (usage) is a summarisation
SUMMARISE = "Summarise the following text in a few sentences.\n\n"


def system_prompts(text: Callable[[int], str]) -> list[str]:
    """The few shared system prompts (``text(n)``: n tokens of text)."""
    return [f"You are assistant number {i}. " + text(SYSTEM_TOKENS) for i in range(N_SYSTEM_PROMPTS)]


def mix_rows(text: Callable[[int], str], n: int, seed: int, systems: list[str],
             lengths: dict[str, tuple[tuple[int, int], tuple[int, int]]] = LENGTHS) -> list[dict[str, Any]]:
    """``n`` rows for guidellm's json_file data: ``system`` (may be empty), ``prompt``, ``output_tokens_count``,
    plus ``kind`` (ignored by guidellm's column mapper; kept for the mix's own record)."""
    rng = random.Random(seed)
    names = [k for k, _ in KINDS]
    weights = [w for _, w in KINDS]
    rows = []
    for _ in range(n):
        kind = rng.choices(names, weights)[0]
        (plo, phi), (olo, ohi) = lengths[kind]
        body = text(rng.randint(plo, phi))
        rows.append({
            "kind": kind,
            "system": rng.choice(systems) if kind == "shared_system" else "",
            "prompt": SUMMARISE + body if kind == "summarise" else body,
            "output_tokens_count": rng.randint(olo, ohi),
        })
    return rows


def nearest_rank(values: list[float], q: float) -> float | None:
    """The q-th percentile by nearest rank (robust to ``inf`` values); None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) else x


def request_samples(bench: dict[str, Any]) -> dict[str, Any]:
    """TTFT and ITL samples (ms) of one guidellm benchmark (one rate), censoring-aware (module docstring)."""
    reqs = bench["requests"]
    ttft: list[float] = []
    itl: list[float] = []
    short: list[float] = []  # completed requests other than summarisation (the secondary, per-class figure)
    for r in reqs.get("successful") or []:
        ttft.append(float(r["time_to_first_token_ms"]))
        if (r.get("prompt_tokens") or 0) < LONG_PROMPT_TOKENS:
            short.append(float(r["time_to_first_token_ms"]))
        if r.get("inter_token_latency_ms") is not None and (r.get("output_tokens") or 0) > 1:
            itl.append(float(r["inter_token_latency_ms"]))
    ttft += [math.inf] * len(reqs.get("errored") or [])
    censored = 0
    for r in reqs.get("incomplete") or []:
        t = r["info"]["timings"]
        start = t.get("request_start")  # None: never sent (its arrival was due after the end)
        if start is None:
            continue
        if t.get("first_token_iteration") is not None:
            ttft.append((t["first_token_iteration"] - start) * 1000)
        elif ((t.get("resolve_end") or start) - start) * 1000 > TTFT_P99_MS:
            ttft.append(math.inf)
            censored += 1
    sm = bench["scheduler_metrics"]
    return {
        "ttft_ms": ttft, "itl_ms": itl, "ttft_short_ms": short, "late_cancelled": censored,
        "completed": len(reqs.get("successful") or []), "errored": len(reqs.get("errored") or []),
        "incomplete": len(reqs.get("incomplete") or []),
        "measured_s": float(sm["measure_end_time"]) - float(sm["measure_start_time"]),
    }


def arrivals_broken(bench: dict[str, Any]) -> bool:
    """guidellm 0.8.1's Poisson schedule raced: arrival targets far before the run's start (the worker read
    the arrival offset before the main process set it, so every request went out at once)."""
    start = float(bench["scheduler_metrics"]["start_time"])
    return any(r["info"]["timings"]["targeted_start"] < start - 60
               for g in bench["requests"].values() if g for r in g)


def rate_summary(samples: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Pooled figures of one rate over its runs (rounds): percentiles, completed req/s, SLO met or not."""
    runs = list(samples)
    ttft = [x for s in runs for x in s["ttft_ms"]]
    itl = [x for s in runs for x in s["itl_ms"]]
    wall = sum(s["measured_s"] for s in runs)
    done = sum(s["completed"] for s in runs)
    out: dict[str, Any] = {
        "ttft_p50_ms": _finite(nearest_rank(ttft, 50)), "ttft_p99_ms": _finite(nearest_rank(ttft, 99)),
        "itl_p50_ms": _finite(nearest_rank(itl, 50)), "itl_p99_ms": _finite(nearest_rank(itl, 99)),
        "completed_rps": done / wall if wall > 0 else None, "completed": done,
        "errored": sum(s["errored"] for s in runs), "incomplete": sum(s["incomplete"] for s in runs),
        "late_cancelled": sum(s["late_cancelled"] for s in runs), "n_ttft": len(ttft), "n_itl": len(itl),
    }
    out["slo_met"] = meets_slo(nearest_rank(ttft, 99), nearest_rank(itl, 99))
    # NOTE: secondary: TTFT p99 of the completed short requests (chat, shared system prompt) only, for
    # models where no rate can prefill the 1,000-1,500-token prompts within the TTFT bound.
    short = [x for s in runs for x in s.get("ttft_short_ms", [])]
    out["ttft_p99_short_ms"] = nearest_rank(short, 99)
    out["slo_met_short"] = meets_slo(out["ttft_p99_short_ms"], nearest_rank(itl, 99))
    return out


def meets_slo(ttft_p99_ms: float | None, itl_p99_ms: float | None) -> bool:
    """TTFT p99 <= 2 s and ITL p99 <= 200 ms (no sample: not met)."""
    if ttft_p99_ms is None or itl_p99_ms is None:
        return False
    return ttft_p99_ms <= TTFT_P99_MS and itl_p99_ms <= ITL_P99_MS


def goodput(per_rate: dict[float, bool]) -> float | None:
    """The highest offered rate meeting the SLO with every lower rate of the sweep meeting it too
    (NOTE: a lucky pass above a failing rate is noise, not capacity); None when the lowest rate fails."""
    best = None
    for rate in sorted(per_rate):
        if not per_rate[rate]:
            break
        best = rate
    return best
