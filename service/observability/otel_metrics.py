"""OpenTelemetry metrics: the GetMetrics figures as observable instruments, plus GenAI histograms.

``observe_engine`` registers observable counters and gauges whose callbacks
read one GetMetrics snapshot (``service.observability.metrics_view.metrics_response``), so
the OTel/Prometheus figures are exactly the ones GetMetrics reports. One
snapshot is taken per collection (cached for ``SNAPSHOT_TTL_S``), on the
collecting thread (Prometheus scrape or periodic exporter), never on the
engine thread.

``RequestHistograms`` records the GenAI semantic-convention server histograms
(``gen_ai.server.request.duration``, ``gen_ai.server.time_to_first_token``,
``gen_ai.server.time_per_output_token``) once per finished request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping

from inference.v1 import inference_pb2 as pb
from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation
from opentelemetry.util.types import AttributeValue

from service.observability.metrics_view import metrics_response
from service.observability.sources import EngineView, ResponseCacheView, TenantView
from service.request.events import Done, Error
from service.request.sequence import Sequence
from service.threads.adaptive import AdaptiveThreads, observe_threads

SNAPSHOT_TTL_S = 0.5
TIER = {pb.PRIORITY_INTERACTIVE: "interactive", pb.PRIORITY_BATCH: "batch"}
PRIO = "inference.priority"
Labels = dict[str, str | int]
Rows = list[tuple[float, Labels]]
Callback = Callable[[CallbackOptions], Iterable[Observation]]
Metrics = pb.GetMetricsResponse
Figure = Callable[[Metrics], float]  # one field of the GetMetrics response, read by attribute


class _Snapshot:
    """One GetMetrics proto shared by all callbacks of a collection."""

    def __init__(
        self, engine: EngineView, tenancy: TenantView | None = None, response_cache: ResponseCacheView | None = None
    ) -> None:
        self.engine = engine
        self.tenancy = tenancy
        self.response_cache = response_cache
        self._lock = threading.Lock()
        self._at = -1.0
        self._value: Metrics | None = None

    def get(self) -> Metrics:
        with self._lock:
            now = time.monotonic()
            if self._value is None or now - self._at > SNAPSHOT_TTL_S:
                self._value, self._at = self._read(), now
            return self._value

    def _read(self) -> Metrics:
        cache = self.response_cache.metrics() if self.response_cache is not None else None
        for _ in range(3):  # the engine thread may resize a dict we iterate; just read again
            try:
                return metrics_response(self.engine, None, self.tenancy, cache)
            except RuntimeError:
                continue
        return metrics_response(self.engine, None, self.tenancy, cache)


def _per_tier(figure: Callable[[pb.TierMetrics], float]) -> Callable[[Metrics], Rows]:
    return lambda m: [(figure(t), {PRIO: TIER[t.priority]}) for t in m.tiers]


def _per_tenant(figure: Callable[[pb.TenantMetrics], float]) -> Callable[[Metrics], Rows]:
    # NOTE: bounded cardinality: tenant names come from the tenants file only.
    return lambda m: [(figure(t), {"inference.tenant": t.tenant}) for t in m.tenants]


def _finished(m: Metrics) -> Rows:
    out: Rows = []
    for t in m.tiers:
        outcomes = (
            ("completed", t.requests_completed),
            ("cancelled", t.requests_cancelled),
            ("failed", t.requests_failed),
        )
        for outcome, n in outcomes:
            out.append((n, {PRIO: TIER[t.priority], "inference.outcome": outcome}))
    return out


def _statistics(summary: pb.LatencySummary) -> tuple[tuple[str, float], ...]:
    """(statistic label, value) of a latency summary, in the order the series were always observed."""
    return (("mean", summary.mean_ms), ("p50", summary.p50_ms), ("p95", summary.p95_ms), ("p99", summary.p99_ms))


def _latency(m: Metrics) -> Rows:
    out: Rows = []
    for t in m.tiers:
        kinds = (("queue_time", t.queue_time), ("ttft", t.ttft), ("tpot", t.tpot), ("e2e", t.e2e))
        for kind, summary in kinds:
            for stat, value in _statistics(summary):
                attrs: Labels = {PRIO: TIER[t.priority], "inference.latency": kind, "inference.statistic": stat}
                out.append((value, attrs))
    return out


def _preemption_reasons(m: Metrics) -> Rows:
    # NOTE: both known reasons are always observed (0 until one happens), so the series exist from start.
    reasons = {"priority": 0, "kv_memory": 0} | dict(m.preemptions_by_reason)
    return [(n, {"inference.preemption.reason": r}) for r, n in sorted(reasons.items())]


def _compile_time(m: Metrics) -> Rows:
    stats = dict(_statistics(m.grammar.compile_time))
    return [(stats[s], {"inference.statistic": s}) for s in ("mean", "p50", "p99")]


def _field(figure: Figure) -> Callable[[Metrics], Rows]:
    """One unlabelled observation: ``figure`` of the GetMetrics response."""
    return lambda m: [(figure(m), {})]


def _by(key: str, figures: Mapping[str, Figure]) -> Callable[[Metrics], Rows]:
    """One observation per ``figures`` entry, labelled ``{key: name}``."""
    return lambda m: [(figure(m), {key: name}) for name, figure in figures.items()]


def _response_cache_outcomes(m: Metrics) -> Rows:
    c = m.response_cache
    outcomes = {
        "exact_hit": c.hits - c.semantic_hits,
        "semantic_hit": c.semantic_hits,
        "miss": c.misses,
        "coalesced": c.coalesced,
    }
    return [(n, {"inference.response_cache.outcome": k}) for k, n in outcomes.items()]


Instrument = tuple[str, str, str, Callable[[Metrics], Rows]]

COUNTERS: list[Instrument] = [
    ("inference.requests.accepted", "{request}", "requests accepted", _per_tier(lambda t: t.requests_total)),
    ("inference.requests.finished", "{request}", "requests ended after acceptance, by outcome", _finished),
    (
        "inference.requests.rejected",
        "{request}",
        "requests refused (queue full)",
        _per_tier(lambda t: t.requests_rejected),
    ),
    ("inference.preemptions", "{preemption}", "preemptions", _per_tier(lambda t: t.preemptions)),
    (
        "inference.preemptions.by_reason",
        "{preemption}",
        "preemptions by reason (priority, kv_memory)",
        _preemption_reasons,
    ),
    ("inference.tenant.requests", "{request}", "requests accepted per tenant", _per_tenant(lambda t: t.requests_total)),
    (
        "inference.tenant.rejected",
        "{request}",
        "requests refused by a tenant quota",
        _per_tenant(lambda t: t.requests_rejected),
    ),
    (
        "inference.tenant.generated_tokens",
        "{token}",
        "tokens generated per tenant (finished requests)",
        _per_tenant(lambda t: t.generated_tokens),
    ),
    (
        "inference.tenant.prompt_tokens",
        "{token}",
        "prompt tokens per tenant (finished requests)",
        _per_tenant(lambda t: t.prompt_tokens),
    ),
    (
        "inference.prompt_tokens",
        "{token}",
        "prompt tokens of accepted requests",
        _field(lambda m: m.prompt_tokens_total),
    ),
    ("inference.generated_tokens", "{token}", "tokens generated", _field(lambda m: m.generated_tokens_total)),
    (
        "inference.prefill_tokens",
        "{token}",
        "prompt tokens computed by prefill",
        _field(lambda m: m.prefill_tokens_total),
    ),
    (
        "inference.engine.steps",
        "{step}",
        "engine steps by sequences per decode",
        lambda m: [(b.steps, {"inference.batch_size": b.sequences}) for b in m.batch_sizes],
    ),
    (
        "inference.kv.prefix_hit_tokens",
        "{token}",
        "prompt tokens served from the prefix cache",
        _field(lambda m: m.kv.prefix_hit_tokens),
    ),
    ("inference.kv.evictions", "{block}", "cached KV blocks evicted", _field(lambda m: m.kv.evictions)),
    ("inference.grammar.compiles", "{grammar}", "grammars compiled", _field(lambda m: m.grammar.compiles)),
    (
        "inference.response_cache.requests",
        "{request}",
        "cacheable requests by response-cache outcome (exact_hit, semantic_hit, miss; coalesced: waited for an "
        "identical running request, its answer then counted as exact_hit)",
        _response_cache_outcomes,
    ),
    (
        "inference.response_cache.entries_changed",
        "{entry}",
        "response-cache entries stored, evicted (byte bound) and expired (TTL)",
        _by(
            "inference.response_cache.change",
            {
                "stores": lambda m: m.response_cache.stores,
                "evictions": lambda m: m.response_cache.evictions,
                "expirations": lambda m: m.response_cache.expirations,
            },
        ),
    ),
    ("inference.grammar.cache_hits", "{grammar}", "grammar cache hits", _field(lambda m: m.grammar.cache_hits)),
    (
        "inference.grammar.constrained_tokens",
        "{token}",
        "constrained tokens produced",
        _field(lambda m: m.grammar.constrained_tokens),
    ),
    (
        "inference.grammar.forced_tokens",
        "{token}",
        "constrained tokens forced by the grammar",
        _field(lambda m: m.grammar.forced_tokens),
    ),
    (
        "inference.grammar.documents",
        "{document}",
        "JSON documents by how they ended (natural, closed: budget-aware completion, cut_off: max_tokens)",
        _by(
            "inference.document.end",
            {
                "natural": lambda m: m.grammar.documents_natural,
                "closed": lambda m: m.grammar.documents_closed,
                "cut_off": lambda m: m.grammar.documents_cut_off,
            },
        ),
    ),
]

GAUGES: list[Instrument] = [
    ("inference.requests.waiting", "{request}", "requests waiting now", _per_tier(lambda t: t.waiting)),
    ("inference.requests.running", "{request}", "requests running now", _per_tier(lambda t: t.running)),
    ("inference.tenant.in_flight", "{request}", "requests in flight per tenant", _per_tenant(lambda t: t.in_flight)),
    ("inference.tenant.service", "{token}", "fair-share virtual token counter", _per_tenant(lambda t: t.service)),
    ("inference.latency", "ms", "latency over the recent window (queue_time, ttft, tpot, e2e)", _latency),
    (
        "inference.throughput",
        "{token}/s",
        "generated tokens per second, last 10 s",
        _field(lambda m: m.throughput_tok_s),
    ),
    ("inference.batch_size.mean", "{sequence}", "mean sequences per decode step", _field(lambda m: m.mean_batch_size)),
    (
        "inference.kv.blocks",
        "{block}",
        "KV blocks by state",
        _by(
            "inference.kv.state",
            {
                "used": lambda m: m.kv.blocks_used,
                "cached": lambda m: m.kv.blocks_cached,
                "free": lambda m: m.kv.blocks_free,
            },
        ),
    ),
    ("inference.kv.prefix_hit_rate", "1", "prefix-cache hit rate", _field(lambda m: m.kv.prefix_hit_rate)),
    (
        "inference.kv.holder_lanes",
        "{lane}",
        "llama sequence ids holding cached prefixes",
        _field(lambda m: m.kv.holder_seq_ids),
    ),
    (
        "inference.grammar.mask_time",
        "us",
        "mask time per constrained token",
        _by(
            "inference.statistic",
            {"p50": lambda m: m.grammar.mask_us_p50, "p99": lambda m: m.grammar.mask_us_p99},
        ),
    ),
    ("inference.grammar.compile_time", "ms", "grammar compile time, recent window", _compile_time),
    ("inference.uptime", "s", "seconds since the server started", _field(lambda m: m.uptime_s)),
    ("inference.response_cache.entries", "{entry}", "response-cache entries held", _field(lambda m: m.response_cache.entries)),
    ("inference.response_cache.bytes", "By", "response-cache bytes held", _field(lambda m: m.response_cache.bytes)),
]


def observe_engine(
    meter: Meter,
    engine: EngineView,
    tenancy: TenantView | None = None,
    response_cache: ResponseCacheView | None = None,
    threads: AdaptiveThreads | None = None,
) -> None:
    """Register every COUNTERS/GAUGES instrument, reading ``engine``'s (``tenancy``'s, ``response_cache``'s)
    GetMetrics figures; with ``threads``, the adaptive thread count's instruments too."""
    snapshot = _Snapshot(engine, tenancy, response_cache)

    def callback(rows: Callable[[Metrics], Rows]) -> Callback:
        return lambda _options: [Observation(v, a) for v, a in rows(snapshot.get())]

    for name, unit, description, rows in COUNTERS:
        meter.create_observable_counter(name, [callback(rows)], unit=unit, description=description)
    for name, unit, description, rows in GAUGES:
        meter.create_observable_gauge(name, [callback(rows)], unit=unit, description=description)
    if threads is not None:
        observe_threads(meter, threads)


class RequestHistograms:
    """GenAI server histograms, recorded on the event loop when a request ends."""

    def __init__(self, meter: Meter, model: str) -> None:
        def histogram(name: str, description: str, buckets: list[float]) -> Histogram:
            return meter.create_histogram(
                name, unit="s", description=description, explicit_bucket_boundaries_advisory=buckets
            )

        # Bucket boundaries: the ones the GenAI semantic conventions recommend.
        self.duration = histogram(
            "gen_ai.server.request.duration",
            "time from arrival to the last token",
            [0.01 * 2**i for i in range(14)],
        )
        self.ttft = histogram(
            "gen_ai.server.time_to_first_token",
            "time from arrival to the first token",
            [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0],
        )
        self.tpot = histogram(
            "gen_ai.server.time_per_output_token",
            "time per output token after the first",
            [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5],
        )
        self.model = model

    def record(self, seq: Sequence, event: Done | Error) -> None:
        """Durations in seconds; TTFT/TPOT only for requests that produced those tokens."""
        attrs: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "text_completion",
            "gen_ai.provider.name": "llama.cpp",
            "gen_ai.request.model": self.model,
            PRIO: seq.priority.name.lower(),
        }
        if isinstance(event, Error):
            attrs["error.type"] = event.status
        end = seq.finish_time or time.monotonic()
        self.duration.record(end - seq.arrival, attrs)
        if seq.first_token_time is None:
            return
        self.ttft.record(seq.first_token_time - seq.arrival, attrs)
        if seq.num_generated > 1:
            self.tpot.record((end - seq.first_token_time) / (seq.num_generated - 1), attrs)
