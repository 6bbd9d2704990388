"""Builds the GetMetrics proto from the typed views of the engine, tenancy and caches.

Every figure comes from a view dataclass (``service.observability.views``) or a
Protocol of ``service.observability.sources``: a renamed field upstream is a
type error here, not a silently missing number.
"""

from __future__ import annotations

from inference.v1 import inference_pb2 as pb

from service.observability.engine_metrics import THROUGHPUT_WINDOW_S
from service.observability.sources import EngineView, GrammarCacheView, TenantView
from service.observability.views import (
    EngineSnapshot,
    GrammarFigures,
    KVSnapshot,
    Latency,
    MetricsSnapshot,
    SchedulerLoad,
    TierFigures,
)
from service.request.sequence import Priority

TIER_PROTO = {Priority.INTERACTIVE: pb.PRIORITY_INTERACTIVE, Priority.BATCH: pb.PRIORITY_BATCH}


def _latency(d: Latency) -> pb.LatencySummary:
    return pb.LatencySummary(count=d.count, mean_ms=d.mean_ms, p50_ms=d.p50_ms, p95_ms=d.p95_ms, p99_ms=d.p99_ms)


def tenant_metrics(tenancy: TenantView | None) -> list[pb.TenantMetrics]:
    """Per-tenant figures (``Tenancy.view()``); names come from the tenants file only."""
    if tenancy is None:
        return []
    return [
        pb.TenantMetrics(
            tenant=r.tenant,
            weight=r.weight,
            requests_total=r.requests,
            requests_rejected=r.rejected,
            requests_finished=r.finished,
            in_flight=r.in_flight,
            queued=r.queued,
            prompt_tokens=r.prompt_tokens,
            generated_tokens=r.generated_tokens,
            window_tokens=r.window_tokens,
            service=r.service,
        )
        for r in tenancy.view()
    ]


def _tier(prio: Priority, t: TierFigures, load: SchedulerLoad) -> pb.TierMetrics:
    return pb.TierMetrics(
        priority=TIER_PROTO[prio],
        requests_total=t.requests,
        requests_completed=t.completed,
        requests_cancelled=t.cancelled,
        requests_failed=t.failed,
        requests_rejected=t.rejected,
        waiting=load.waiting[prio],
        running=load.running[prio],
        preemptions=load.preemptions_of(prio),
        queue_time=_latency(t.queue),
        ttft=_latency(t.ttft),
        tpot=_latency(t.tpot),
        e2e=_latency(t.e2e),
    )


def _kv(kv: KVSnapshot, view: EngineSnapshot) -> pb.KvMetrics:
    return pb.KvMetrics(
        blocks_total=kv.blocks_total,
        blocks_used=kv.blocks_used,
        blocks_cached=kv.blocks_cached,
        blocks_free=kv.blocks_free,
        block_size=kv.block_size,
        bytes_per_block=view.model.kv_bytes_per_token * kv.block_size,
        kv_buffer_bytes=view.model.kv_buffer_bytes,
        prefix_hit_tokens=kv.prefix_hit_tokens,
        prompt_tokens=kv.prompt_tokens,
        prefix_hit_rate=kv.hit_rate,
        evictions=kv.evictions,
        holder_seq_ids=kv.holder_lanes,
        host_hit_tokens=kv.host_hit_tokens,
        host_prefixes=kv.host_prefixes,
        host_bytes=view.model.host_bytes,
        cache_type=view.model.kv_cache_type,
    )


def _grammar(g: GrammarFigures, cache: GrammarCacheView | None) -> pb.GrammarMetrics:
    out = pb.GrammarMetrics(
        compiles=g.compiles,
        cache_hits=g.cache_hits,
        compile_time=_latency(g.compile_ms),
        mask_us_p50=g.mask_us_p50,
        mask_us_p99=g.mask_us_p99,
        constrained_tokens=g.constrained_tokens,
        forced_tokens=g.forced_tokens,
        documents_natural=g.documents_natural,
        documents_closed=g.documents_closed,
        documents_cut_off=g.documents_cut_off,
    )
    if cache is not None:
        stats = cache.cache_stats()
        out.cache_entries, out.cache_bytes, out.cache_evictions = stats["entries"], stats["bytes"], stats["evictions"]
    return out


def metrics_response(
    engine: EngineView,
    grammar: GrammarCacheView | None = None,
    tenancy: TenantView | None = None,
    response_cache: pb.ResponseCacheMetrics | None = None,
) -> pb.GetMetricsResponse:
    """A consistent-enough snapshot: counters from the metrics lock, gauges read as they are."""
    snap: MetricsSnapshot = engine.metrics.figures()
    view = engine.view()
    load = view.scheduler
    return pb.GetMetricsResponse(
        uptime_s=snap.uptime_s,
        requests_total=sum(t.requests for t in snap.tiers.values()),
        prompt_tokens_total=snap.prompt_tokens,
        generated_tokens_total=snap.generated_tokens,
        prefill_tokens_total=snap.prefill_tokens,
        shared_prefill_choices=snap.shared_prefill_choices,
        engine_steps_total=snap.steps,
        batch_sizes=[pb.BatchSizeBucket(sequences=k, steps=v) for k, v in snap.batch_sizes.items()],
        mean_batch_size=snap.mean_batch_size,
        running=load.num_running,
        waiting=load.num_waiting,
        tiers=[_tier(prio, t, load) for prio, t in snap.tiers.items()],
        kv=_kv(view.kv, view),
        preemptions_total=load.num_preemptions,
        preemptions_by_reason=load.preemptions_by_reason(),
        rejections_total=sum(t.rejected for t in snap.tiers.values()),
        throughput_tok_s=snap.throughput_tok_s,
        throughput_window_s=THROUGHPUT_WINDOW_S,
        grammar=_grammar(snap.grammar, grammar),
        model=view.model.model,
        tenants=tenant_metrics(tenancy),
        response_cache=response_cache,
        step_phases=pb.StepPhases(steps=view.steps.steps, seconds_total=view.steps.seconds),
    )
