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
from collections.abc import Callable, Iterable
from typing import Any

from inference.v1 import inference_pb2 as pb
from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation

from service.observability.metrics_view import metrics_response
from service.request.events import Error
from service.request.sequence import Sequence

SNAPSHOT_TTL_S = 0.5
TIER = {pb.PRIORITY_INTERACTIVE: "interactive", pb.PRIORITY_BATCH: "batch"}
PRIO = "inference.priority"
Rows = list[tuple[float, dict[str, Any]]]
Callback = Callable[[CallbackOptions], Iterable[Observation]]


class _Snapshot:
    """One GetMetrics proto shared by all callbacks of a collection."""

    def __init__(self, engine: Any, tenancy: Any = None, response_cache: Any = None) -> None:
        self.engine = engine
        self.tenancy = tenancy
        self.response_cache = response_cache
        self._lock = threading.Lock()
        self._at = -1.0
        self._value: pb.GetMetricsResponse | None = None

    def get(self) -> pb.GetMetricsResponse:
        with self._lock:
            now = time.monotonic()
            if self._value is None or now - self._at > SNAPSHOT_TTL_S:
                self._value, self._at = self._read(), now
            return self._value

    def _read(self) -> pb.GetMetricsResponse:
        cache = self.response_cache.metrics() if self.response_cache is not None else None
        for _ in range(3):  # the engine thread may resize a dict we iterate; just read again
            try:
                return metrics_response(self.engine, None, self.tenancy, cache)
            except RuntimeError:
                continue
        return metrics_response(self.engine, None, self.tenancy, cache)


def _per_tier(field: str) -> Callable[[pb.GetMetricsResponse], Rows]:
    return lambda m: [(getattr(t, field), {PRIO: TIER[t.priority]}) for t in m.tiers]


def _per_tenant(field: str) -> Callable[[pb.GetMetricsResponse], Rows]:
    # NOTE: bounded cardinality: tenant names come from the tenants file only.
    return lambda m: [(getattr(t, field), {"inference.tenant": t.tenant}) for t in m.tenants]


def _finished(m: pb.GetMetricsResponse) -> Rows:
    out: Rows = []
    for t in m.tiers:
        for outcome in ("completed", "cancelled", "failed"):
            attrs = {PRIO: TIER[t.priority], "inference.outcome": outcome}
            out.append((getattr(t, f"requests_{outcome}"), attrs))
    return out


def _latency(m: pb.GetMetricsResponse) -> Rows:
    out: Rows = []
    for t in m.tiers:
        for kind in ("queue_time", "ttft", "tpot", "e2e"):
            summary = getattr(t, kind)
            for stat in ("mean", "p50", "p95", "p99"):
                attrs = {PRIO: TIER[t.priority], "inference.latency": kind, "inference.statistic": stat}
                out.append((getattr(summary, f"{stat}_ms"), attrs))
    return out


def _preemption_reasons(m: pb.GetMetricsResponse) -> Rows:
    # NOTE: both known reasons are always observed (0 until one happens), so the series exist from start.
    reasons = {"priority": 0, "kv_memory": 0} | dict(m.preemptions_by_reason)
    return [(n, {"inference.preemption.reason": r}) for r, n in sorted(reasons.items())]


def _compile_time(m: pb.GetMetricsResponse) -> Rows:
    t = m.grammar.compile_time
    return [(getattr(t, f"{s}_ms"), {"inference.statistic": s}) for s in ("mean", "p50", "p99")]


def _field(path: str) -> Callable[[pb.GetMetricsResponse], Rows]:
    """One unlabelled observation: the figure at dotted ``path`` of the GetMetrics response."""

    def rows(m: pb.GetMetricsResponse) -> Rows:
        value: Any = m
        for part in path.split("."):
            value = getattr(value, part)
        return [(value, {})]

    return rows


def _by(key: str, paths: dict[str, str]) -> Callable[[pb.GetMetricsResponse], Rows]:
    """One observation per ``paths`` entry, labelled ``{key: name}``."""
    return lambda m: [(_field(path)(m)[0][0], {key: name}) for name, path in paths.items()]


def _response_cache_outcomes(m: pb.GetMetricsResponse) -> Rows:
    c = m.response_cache
    outcomes = {
        "exact_hit": c.hits - c.semantic_hits,
        "semantic_hit": c.semantic_hits,
        "miss": c.misses,
        "coalesced": c.coalesced,
    }
    return [(n, {"inference.response_cache.outcome": k}) for k, n in outcomes.items()]


Instrument = tuple[str, str, str, Callable[[pb.GetMetricsResponse], Rows]]

COUNTERS: list[Instrument] = [
    ("inference.requests.accepted", "{request}", "requests accepted", _per_tier("requests_total")),
    ("inference.requests.finished", "{request}", "requests ended after acceptance, by outcome", _finished),
    (
        "inference.requests.rejected",
        "{request}",
        "requests refused (queue full)",
        _per_tier("requests_rejected"),
    ),
    ("inference.preemptions", "{preemption}", "preemptions", _per_tier("preemptions")),
    (
        "inference.preemptions.by_reason",
        "{preemption}",
        "preemptions by reason (priority, kv_memory)",
        _preemption_reasons,
    ),
    ("inference.tenant.requests", "{request}", "requests accepted per tenant", _per_tenant("requests_total")),
    (
        "inference.tenant.rejected",
        "{request}",
        "requests refused by a tenant quota",
        _per_tenant("requests_rejected"),
    ),
    (
        "inference.tenant.generated_tokens",
        "{token}",
        "tokens generated per tenant (finished requests)",
        _per_tenant("generated_tokens"),
    ),
    (
        "inference.tenant.prompt_tokens",
        "{token}",
        "prompt tokens per tenant (finished requests)",
        _per_tenant("prompt_tokens"),
    ),
    (
        "inference.prompt_tokens",
        "{token}",
        "prompt tokens of accepted requests",
        _field("prompt_tokens_total"),
    ),
    ("inference.generated_tokens", "{token}", "tokens generated", _field("generated_tokens_total")),
    (
        "inference.prefill_tokens",
        "{token}",
        "prompt tokens computed by prefill",
        _field("prefill_tokens_total"),
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
        _field("kv.prefix_hit_tokens"),
    ),
    ("inference.kv.evictions", "{block}", "cached KV blocks evicted", _field("kv.evictions")),
    ("inference.grammar.compiles", "{grammar}", "grammars compiled", _field("grammar.compiles")),
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
            {k: f"response_cache.{k}" for k in ("stores", "evictions", "expirations")},
        ),
    ),
    ("inference.grammar.cache_hits", "{grammar}", "grammar cache hits", _field("grammar.cache_hits")),
    (
        "inference.grammar.constrained_tokens",
        "{token}",
        "constrained tokens produced",
        _field("grammar.constrained_tokens"),
    ),
    (
        "inference.grammar.forced_tokens",
        "{token}",
        "constrained tokens forced by the grammar",
        _field("grammar.forced_tokens"),
    ),
    (
        "inference.grammar.documents",
        "{document}",
        "JSON documents by how they ended (natural, closed: budget-aware completion, cut_off: max_tokens)",
        _by(
            "inference.document.end",
            {k: f"grammar.documents_{k}" for k in ("natural", "closed", "cut_off")},
        ),
    ),
]

GAUGES: list[Instrument] = [
    ("inference.requests.waiting", "{request}", "requests waiting now", _per_tier("waiting")),
    ("inference.requests.running", "{request}", "requests running now", _per_tier("running")),
    ("inference.tenant.in_flight", "{request}", "requests in flight per tenant", _per_tenant("in_flight")),
    ("inference.tenant.service", "{token}", "fair-share virtual token counter", _per_tenant("service")),
    ("inference.latency", "ms", "latency over the recent window (queue_time, ttft, tpot, e2e)", _latency),
    (
        "inference.throughput",
        "{token}/s",
        "generated tokens per second, last 10 s",
        _field("throughput_tok_s"),
    ),
    ("inference.batch_size.mean", "{sequence}", "mean sequences per decode step", _field("mean_batch_size")),
    (
        "inference.kv.blocks",
        "{block}",
        "KV blocks by state",
        _by("inference.kv.state", {f: f"kv.blocks_{f}" for f in ("used", "cached", "free")}),
    ),
    ("inference.kv.prefix_hit_rate", "1", "prefix-cache hit rate", _field("kv.prefix_hit_rate")),
    (
        "inference.kv.holder_lanes",
        "{lane}",
        "llama sequence ids holding cached prefixes",
        _field("kv.holder_seq_ids"),
    ),
    (
        "inference.grammar.mask_time",
        "us",
        "mask time per constrained token",
        _by("inference.statistic", {"p50": "grammar.mask_us_p50", "p99": "grammar.mask_us_p99"}),
    ),
    ("inference.grammar.compile_time", "ms", "grammar compile time, recent window", _compile_time),
    ("inference.uptime", "s", "seconds since the server started", _field("uptime_s")),
    ("inference.response_cache.entries", "{entry}", "response-cache entries held", _field("response_cache.entries")),
    ("inference.response_cache.bytes", "By", "response-cache bytes held", _field("response_cache.bytes")),
]


def observe_engine(meter: Meter, engine: Any, tenancy: Any = None, response_cache: Any = None) -> None:
    """Register every COUNTERS/GAUGES instrument, reading ``engine``'s (``tenancy``'s, ``response_cache``'s)
    GetMetrics figures."""
    snapshot = _Snapshot(engine, tenancy, response_cache)

    def callback(rows: Callable[[pb.GetMetricsResponse], Rows]) -> Callback:
        return lambda _options: [Observation(v, a) for v, a in rows(snapshot.get())]

    for name, unit, description, rows in COUNTERS:
        meter.create_observable_counter(name, [callback(rows)], unit=unit, description=description)
    for name, unit, description, rows in GAUGES:
        meter.create_observable_gauge(name, [callback(rows)], unit=unit, description=description)
    if getattr(engine, "thread_control", None) is not None:
        from service.threads.adaptive import observe_threads

        observe_threads(meter, engine.thread_control)


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

    def record(self, seq: Sequence, event: Any) -> None:
        """Durations in seconds; TTFT/TPOT only for requests that produced those tokens."""
        attrs: dict[str, Any] = {
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
