"""The step-cost arithmetic behind scenario T: a decode step of N rows costs about ``a + b*N`` ms.

``fit`` finds ``a`` and ``b`` from (rows per step, ms per step) points measured
with the step clock (GetMetrics ``step_phases``); ``predict`` says what a batch
row cap K (``--batch-rows-with-interactive``) does to one interactive request
beside ``n`` closed-loop batch streams, arriving every ``interval_s``:

* its decode steps carry ``min(K, n) + 1`` rows, so each costs ``a + b*(min(K, n) + 1)``;
  its end-to-end time is its TTFT plus ``tokens - 1`` such steps;
* interactive work is present for a share ``f = min(1, e2e / interval)`` of the time;
  then the batch work makes ``min(K, n)`` tokens per capped step, otherwise ``n`` per
  ``a + b*n`` step.

Prefill, the isolated interactive prefill step and the HTTP layer's CPU are
left out: the model is for choosing K, the scenario measures the real figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inference.v1 import inference_pb2 as pb


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``ms = a + b * rows`` over (rows, ms) points (at least two distinct rows)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        raise ValueError("need points at two or more row counts")
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


@dataclass(frozen=True)
class Prediction:
    cap: int  # 0: no cap
    interactive_step_ms: float
    e2e_ms: float
    e2e_alone_ms: float
    busy_share: float  # of the time with interactive work present
    batch_tok_s_alone: float
    batch_tok_s_mixed: float

    @property
    def e2e_vs_alone(self) -> float:
        return self.e2e_ms / self.e2e_alone_ms

    @property
    def batch_vs_alone(self) -> float:
        return self.batch_tok_s_mixed / self.batch_tok_s_alone


def predict(a: float, b: float, *, n: int, cap: int, tokens: int, interval_s: float,
            ttft_ms: float = 0.0) -> Prediction:
    """What cap ``cap`` (0 = none) predicts beside ``n`` batch streams (see the module docstring)."""
    rows = min(cap, n) if cap > 0 else n
    step = a + b * (rows + 1)
    e2e = ttft_ms + (tokens - 1) * step
    alone = ttft_ms + (tokens - 1) * (a + b)
    share = min(1.0, e2e / (interval_s * 1000.0))
    full = n / (a + b * n) * 1000.0
    capped = rows / step * 1000.0
    return Prediction(cap, step, e2e, alone, share, full, (1.0 - share) * full + share * capped)


def caps_meeting(a: float, b: float, *, n: int, tokens: int, interval_s: float, ttft_ms: float = 0.0,
                 e2e_max: float = 3.0, batch_min: float = 0.75) -> list[int]:
    """The caps 1..n whose prediction meets e2e <= ``e2e_max`` x alone and batch >= ``batch_min`` x alone."""
    out = []
    for k in range(1, n + 1):
        p = predict(a, b, n=n, cap=k, tokens=tokens, interval_s=interval_s, ttft_ms=ttft_ms)
        if p.e2e_vs_alone <= e2e_max and p.batch_vs_alone >= batch_min:
            out.append(k)
    return out


def phases_delta(before: pb.GetMetricsResponse, after: pb.GetMetricsResponse) -> dict[str, Any]:
    """Per-step ms and share of each phase between two GetMetrics responses."""
    steps = after.step_phases.steps - before.step_phases.steps
    secs = {k: v - before.step_phases.seconds_total.get(k, 0.0) for k, v in after.step_phases.seconds_total.items()}
    total = sum(secs.values())
    return {
        "steps": steps,
        "ms_per_step": {k: round(1000 * v / steps, 3) for k, v in secs.items()} if steps else {},
        "share": {k: round(v / total, 4) for k, v in secs.items()} if total else {},
        "python_share": round(1 - secs.get("decode", 0.0) / total, 4) if total else None,
        "tokens_per_step": round((after.generated_tokens_total - before.generated_tokens_total) / steps, 2)
        if steps
        else None,
    }
