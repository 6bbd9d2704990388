"""Engine metrics: counters, per-tier latency windows, batch-size histogram, throughput.

The engine thread records; RPC handlers read ``snapshot()``. One lock guards
both sides; recording is O(1) per event.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from service.request.sequence import FinishReason, Priority, Sequence

WINDOW = 2048  # latency observations kept per tier and metric
THROUGHPUT_WINDOW_S = 10.0
COMPLETED = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.CLOSED)
DOCUMENT_ENDS = {FinishReason.STOP: "natural", FinishReason.CLOSED: "closed", FinishReason.LENGTH: "cut_off"}
# Upper bounds (seconds) of the cumulative latency histograms (served as vllm:* on /metrics).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                  10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                 240.0, 480.0, 960.0, 1920.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


def _is_json(seq: Sequence) -> bool:
    """The sequence writes a JSON document (json_schema output)."""
    return getattr(seq.grammar, "kind", None) == "json_schema"


def summarize(values: list[float]) -> dict[str, float]:
    """count, mean and p50/p95/p99 of ``values`` (all zero when empty)."""
    if not values:
        return {"count": 0, "mean_ms": 0.0, "p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0}
    arr = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {"count": len(arr), "mean_ms": float(arr.mean()), "p50_ms": p50, "p95_ms": p95, "p99_ms": p99}


@dataclass
class Cumulative:
    """A Prometheus-style histogram: per-bucket counts (non-cumulative here), sum and count, since start."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # the last bucket is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def snapshot(self) -> tuple[tuple[float, ...], list[int], float]:
        """(bounds, counts per bucket with +Inf last, sum)."""
        return self.bounds, list(self.counts), self.total


@dataclass
class TierStats:
    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0
    latencies: dict[str, deque[float]] = field(
        default_factory=lambda: {k: deque(maxlen=WINDOW) for k in ("queue", "ttft", "tpot", "e2e")}
    )


class EngineMetrics:
    """Thread-safe accumulator of everything GetMetrics reports."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.tiers = {p: TierStats() for p in Priority}
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.prefill_tokens = 0
        self.shared_prefill_choices = 0  # choices admitted onto another choice's computed prompt
        self.steps = 0
        self.batch_sizes: Counter[int] = Counter()
        self._recent: deque[tuple[float, int]] = deque()
        self.grammar_compiles = 0
        self.grammar_cache_hits = 0
        self.compile_ms: deque[float] = deque(maxlen=WINDOW)
        self.mask_us: deque[float] = deque(maxlen=WINDOW * 8)
        self.constrained_tokens = 0
        self.forced_tokens = 0
        # JSON documents (json_schema output) by how they ended: STOP, CLOSED, LENGTH
        self.documents: Counter[str] = Counter()
        self.histograms = {
            "ttft": Cumulative(TTFT_BUCKETS_S),
            "e2e": Cumulative(E2E_BUCKETS_S),
            "queue": Cumulative(E2E_BUCKETS_S),
            "tpot": Cumulative(TPOT_BUCKETS_S),
        }
        self.finished_by_reason: Counter[str] = Counter()

    def on_accept(self, seq: Sequence) -> None:
        with self._lock:
            self.tiers[seq.priority].requests += 1
            self.prompt_tokens += seq.num_prompt_tokens

    def on_generated(self, tokens: int) -> None:
        """Tokens produced outside the one-per-sampled-row count of ``on_step`` (speculation)."""
        now = time.monotonic()
        with self._lock:
            self.generated_tokens += tokens
            self._recent.append((now, tokens))

    def on_shared_prefill(self) -> None:
        with self._lock:
            self.shared_prefill_choices += 1

    def on_reject(self, priority: Priority) -> None:
        with self._lock:
            self.tiers[priority].rejected += 1

    def on_step(self, num_seqs: int, prefill_tokens: int, generated: int) -> None:
        now = time.monotonic()
        with self._lock:
            self.steps += 1
            self.batch_sizes[num_seqs] += 1
            self.prefill_tokens += prefill_tokens
            self.generated_tokens += generated
            self._recent.append((now, generated))
            while self._recent and now - self._recent[0][0] > THROUGHPUT_WINDOW_S:
                self._recent.popleft()

    def on_finish(self, seq: Sequence) -> None:
        tier = self.tiers[seq.priority]
        with self._lock:
            if _is_json(seq) and (kind := DOCUMENT_ENDS.get(seq.finish_reason)) is not None:  # type: ignore[arg-type]
                self.documents[kind] += 1
            if seq.finish_reason in COMPLETED:
                tier.completed += 1
            elif seq.finish_reason is FinishReason.CANCELLED:
                tier.cancelled += 1
            else:
                tier.failed += 1
            self.finished_by_reason[seq.finish_reason.value if seq.finish_reason else "error"] += 1
            lat, hist = tier.latencies, self.histograms
            end = seq.finish_time or time.monotonic()
            if seq.first_scheduled is not None:
                lat["queue"].append((seq.first_scheduled - seq.arrival) * 1e3)
                hist["queue"].observe(seq.first_scheduled - seq.arrival)
            if seq.first_token_time is not None:
                lat["ttft"].append((seq.first_token_time - seq.arrival) * 1e3)
                hist["ttft"].observe(seq.first_token_time - seq.arrival)
                if seq.num_generated > 1:
                    lat["tpot"].append((end - seq.first_token_time) * 1e3 / (seq.num_generated - 1))
                    hist["tpot"].observe((end - seq.first_token_time) / (seq.num_generated - 1))
            if seq.finish_reason in COMPLETED:
                lat["e2e"].append((end - seq.arrival) * 1e3)
                hist["e2e"].observe(end - seq.arrival)

    def on_grammar_compile(self, ms: float, cache_hit: bool) -> None:
        with self._lock:
            if cache_hit:
                self.grammar_cache_hits += 1
            else:
                self.grammar_compiles += 1
                self.compile_ms.append(ms)

    def on_mask(self, us_per_row: float, rows: int, forced: int) -> None:
        with self._lock:
            if rows:
                self.mask_us.append(us_per_row)
            self.constrained_tokens += rows + forced
            self.forced_tokens += forced

    def throughput(self) -> float:
        with self._lock:
            if not self._recent:
                return 0.0
            span = max(time.monotonic() - self._recent[0][0], 1e-3)
            return sum(n for _, n in self._recent) / min(span, THROUGHPUT_WINDOW_S)

    def cumulative(self) -> dict:
        """Counters and histograms since start, without the windowed percentiles (cheap: for scrapes)."""
        with self._lock:
            return {
                "prompt_tokens": self.prompt_tokens,
                "generated_tokens": self.generated_tokens,
                "requests": sum(t.requests for t in self.tiers.values()),
                "histograms": {k: h.snapshot() for k, h in self.histograms.items()},
                "finished_by_reason": dict(self.finished_by_reason),
            }

    def snapshot(self) -> dict:
        """A consistent copy of the figures (latency windows summarised)."""
        tput = self.throughput()
        with self._lock:
            tiers = {
                p: {
                    "requests": t.requests,
                    "completed": t.completed,
                    "cancelled": t.cancelled,
                    "failed": t.failed,
                    "rejected": t.rejected,
                    **{k: summarize(list(v)) for k, v in t.latencies.items()},
                }
                for p, t in self.tiers.items()
            }
            steps = self.steps
            mean_batch = sum(k * v for k, v in self.batch_sizes.items()) / steps if steps else 0.0
            return {
                "uptime_s": time.monotonic() - self.started,
                "tiers": tiers,
                "prompt_tokens": self.prompt_tokens,
                "generated_tokens": self.generated_tokens,
                "prefill_tokens": self.prefill_tokens,
                "shared_prefill_choices": self.shared_prefill_choices,
                "steps": steps,
                "batch_sizes": dict(sorted(self.batch_sizes.items())),
                "mean_batch_size": mean_batch,
                "throughput_tok_s": tput,
                "histograms": {k: h.snapshot() for k, h in self.histograms.items()},
                "finished_by_reason": dict(self.finished_by_reason),
                "grammar": self._grammar(),
            }

    def _grammar(self) -> dict:
        """The grammar figures (the caller holds the lock)."""
        mask = np.asarray(self.mask_us) if self.mask_us else np.zeros(1)
        return {
            "compiles": self.grammar_compiles,
            "cache_hits": self.grammar_cache_hits,
            "compile_ms": summarize(list(self.compile_ms)),
            "mask_us_p50": float(np.percentile(mask, 50)),
            "mask_us_p99": float(np.percentile(mask, 99)),
            "constrained_tokens": self.constrained_tokens,
            "forced_tokens": self.forced_tokens,
            **{f"documents_{k}": self.documents[k] for k in DOCUMENT_ENDS.values()},
        }
