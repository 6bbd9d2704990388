"""Engine metrics: counters, per-tier latency windows, batch-size histogram, throughput.

The engine thread records; readers take ``figures()`` (everything, latency windows
summarised: GetMetrics) or ``cumulative()`` (counters and histograms only: scrapes),
both typed views (``service.observability.views``). One lock guards both sides;
recording is O(1) per event.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from service.observability.views import (
    GrammarFigures,
    Histogram,
    Histograms,
    Latency,
    MetricsSnapshot,
    TierFigures,
    Totals,
)
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
    return seq.grammar is not None and seq.grammar.kind == "json_schema"


def summarize(values: list[float]) -> Latency:
    """count, mean and p50/p95/p99 of ``values`` (all zero when empty)."""
    if not values:
        return Latency()
    arr = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return Latency(len(arr), float(arr.mean()), float(p50), float(p95), float(p99))


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

    def snapshot(self) -> Histogram:
        """(bounds, counts per bucket with +Inf last, sum)."""
        return Histogram(self.bounds, tuple(self.counts), self.total)


@dataclass
class LatencyHistograms:
    """The four request-latency histograms, recorded in seconds."""

    ttft: Cumulative = field(default_factory=lambda: Cumulative(TTFT_BUCKETS_S))
    e2e: Cumulative = field(default_factory=lambda: Cumulative(E2E_BUCKETS_S))
    queue: Cumulative = field(default_factory=lambda: Cumulative(E2E_BUCKETS_S))
    tpot: Cumulative = field(default_factory=lambda: Cumulative(TPOT_BUCKETS_S))

    def snapshot(self) -> Histograms:
        return Histograms(self.ttft.snapshot(), self.e2e.snapshot(), self.queue.snapshot(), self.tpot.snapshot())


def _window() -> deque[float]:
    return deque(maxlen=WINDOW)


@dataclass
class TierStats:
    """One tier's counters and latency windows (milliseconds), as recorded."""

    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0
    queue: deque[float] = field(default_factory=_window)
    ttft: deque[float] = field(default_factory=_window)
    tpot: deque[float] = field(default_factory=_window)
    e2e: deque[float] = field(default_factory=_window)

    def figures(self) -> TierFigures:
        """A copy, latency windows summarised (the caller holds the metrics lock)."""
        return TierFigures(
            requests=self.requests,
            completed=self.completed,
            cancelled=self.cancelled,
            failed=self.failed,
            rejected=self.rejected,
            queue=summarize(list(self.queue)),
            ttft=summarize(list(self.ttft)),
            tpot=summarize(list(self.tpot)),
            e2e=summarize(list(self.e2e)),
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
        self.histograms = LatencyHistograms()
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
        reason = seq.finish_reason
        with self._lock:
            if reason is not None and _is_json(seq) and (kind := DOCUMENT_ENDS.get(reason)) is not None:
                self.documents[kind] += 1
            if reason in COMPLETED:
                tier.completed += 1
            elif reason is FinishReason.CANCELLED:
                tier.cancelled += 1
            else:
                tier.failed += 1
            self.finished_by_reason[reason.value if reason else "error"] += 1
            self._latencies(seq, tier)

    def _latencies(self, seq: Sequence, tier: TierStats) -> None:
        """Record ``seq``'s queue, TTFT, TPOT and e2e times (the caller holds the lock)."""
        hist = self.histograms
        end = seq.finish_time or time.monotonic()
        if seq.first_scheduled is not None:
            tier.queue.append((seq.first_scheduled - seq.arrival) * 1e3)
            hist.queue.observe(seq.first_scheduled - seq.arrival)
        if seq.first_token_time is not None:
            tier.ttft.append((seq.first_token_time - seq.arrival) * 1e3)
            hist.ttft.observe(seq.first_token_time - seq.arrival)
            if seq.num_generated > 1:
                tier.tpot.append((end - seq.first_token_time) * 1e3 / (seq.num_generated - 1))
                hist.tpot.observe((end - seq.first_token_time) / (seq.num_generated - 1))
        if seq.finish_reason in COMPLETED:
            tier.e2e.append((end - seq.arrival) * 1e3)
            hist.e2e.observe(end - seq.arrival)

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

    def cumulative(self) -> Totals:
        """Counters and histograms since start, without the windowed percentiles (cheap: for scrapes)."""
        with self._lock:
            return Totals(
                prompt_tokens=self.prompt_tokens,
                generated_tokens=self.generated_tokens,
                histograms=self.histograms.snapshot(),
                finished_by_reason=dict(self.finished_by_reason),
            )

    def figures(self) -> MetricsSnapshot:
        """A consistent copy of every figure (latency windows summarised): what GetMetrics reports."""
        tput = self.throughput()
        with self._lock:
            steps = self.steps
            mean_batch = sum(k * v for k, v in self.batch_sizes.items()) / steps if steps else 0.0
            return MetricsSnapshot(
                uptime_s=time.monotonic() - self.started,
                tiers={p: t.figures() for p, t in self.tiers.items()},
                prompt_tokens=self.prompt_tokens,
                generated_tokens=self.generated_tokens,
                prefill_tokens=self.prefill_tokens,
                shared_prefill_choices=self.shared_prefill_choices,
                steps=steps,
                batch_sizes=dict(sorted(self.batch_sizes.items())),
                mean_batch_size=mean_batch,
                throughput_tok_s=tput,
                grammar=self._grammar(),
            )

    def snapshot(self) -> dict[str, object]:
        """``figures()`` as nested plain dicts (``snapshot()["tiers"][Priority.BATCH]["rejected"]``).

        NOTE: kept for tests and ad-hoc reads; code reads the typed ``figures()``.
        """
        return self.figures().as_dict()

    def _grammar(self) -> GrammarFigures:
        """The grammar figures (the caller holds the lock)."""
        mask = np.asarray(self.mask_us) if self.mask_us else np.zeros(1)
        return GrammarFigures(
            compiles=self.grammar_compiles,
            cache_hits=self.grammar_cache_hits,
            compile_ms=summarize(list(self.compile_ms)),
            mask_us_p50=float(np.percentile(mask, 50)),
            mask_us_p99=float(np.percentile(mask, 99)),
            constrained_tokens=self.constrained_tokens,
            forced_tokens=self.forced_tokens,
            documents_natural=self.documents["natural"],
            documents_closed=self.documents["closed"],
            documents_cut_off=self.documents["cut_off"],
        )
