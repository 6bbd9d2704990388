"""Statistics of the benchmark figures: percentiles, ratios, fairness and binomial intervals."""

from __future__ import annotations

import math

import numpy as np


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


def jain(xs: list[float]) -> float | None:
    """Jain's fairness index (1 = equal shares; 1/n = one takes everything)."""
    total, squares = sum(xs), sum(x * x for x in xs)
    return total * total / (len(xs) * squares) if squares else None


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of ``k`` successes in ``n`` trials (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def clopper_pearson(k: int, n: int) -> tuple[float, float] | None:
    """Exact 95% interval of ``k`` in ``n``; None without SciPy."""
    try:
        from scipy.stats import beta
    except ImportError:
        return None
    lo = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return (lo, hi)
