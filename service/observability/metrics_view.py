"""Builds the GetMetrics proto from the engine's metrics, scheduler and KV manager."""

from __future__ import annotations

from typing import Any

from inference.v1 import inference_pb2 as pb

from service.request.sequence import Priority

TIER_PROTO = {Priority.INTERACTIVE: pb.PRIORITY_INTERACTIVE, Priority.BATCH: pb.PRIORITY_BATCH}


def _latency(d: dict[str, float]) -> pb.LatencySummary:
    return pb.LatencySummary(
        count=int(d["count"]),
        mean_ms=d["mean_ms"],
        p50_ms=d["p50_ms"],
        p95_ms=d["p95_ms"],
        p99_ms=d["p99_ms"],
    )


def tenant_metrics(tenancy: Any) -> list[pb.TenantMetrics]:
    """Per-tenant figures (``service.security.tenancy.Tenancy.rows``); names come from the tenants file only."""
    if tenancy is None:
        return []
    return [
        pb.TenantMetrics(
            tenant=r["tenant"],
            weight=r["weight"],
            requests_total=r["requests"],
            requests_rejected=r["rejected"],
            requests_finished=r["finished"],
            in_flight=r["in_flight"],
            queued=r["queued"],
            prompt_tokens=r["prompt_tokens"],
            generated_tokens=r["generated_tokens"],
            window_tokens=r["window_tokens"],
            service=r["service"],
        )
        for r in tenancy.rows()
    ]


def _grammar_cache(grammar: Any) -> dict[str, int]:
    if grammar is None:
        return {}
    stats = grammar.cache_stats()
    return {"cache_entries": stats["entries"], "cache_bytes": stats["bytes"], "cache_evictions": stats["evictions"]}


def metrics_response(
    engine: Any, grammar: Any = None, tenancy: Any = None, response_cache: pb.ResponseCacheMetrics | None = None
) -> pb.GetMetricsResponse:
    """A consistent-enough snapshot: counters from the metrics lock, gauges read as they are."""
    snap = engine.metrics.snapshot()
    sched, kv = engine.scheduler, engine.kv
    running = list(sched.running)
    waiting = list(sched.waiting)
    preempt = dict(sched.preemptions)
    tiers = []
    for prio, t in snap["tiers"].items():
        tiers.append(
            pb.TierMetrics(
                priority=TIER_PROTO[prio],
                requests_total=t["requests"],
                requests_completed=t["completed"],
                requests_cancelled=t["cancelled"],
                requests_failed=t["failed"],
                requests_rejected=t["rejected"],
                waiting=sum(1 for s in waiting if s.priority is prio),
                running=sum(1 for s in running if s.priority is prio),
                preemptions=sum(n for (p, _r), n in preempt.items() if p is prio),
                queue_time=_latency(t["queue"]),
                ttft=_latency(t["ttft"]),
                tpot=_latency(t["tpot"]),
                e2e=_latency(t["e2e"]),
            )
        )
    by_reason: dict[str, int] = {}
    for (_p, reason), n in preempt.items():
        by_reason[reason] = by_reason.get(reason, 0) + n
    stats = kv.stats
    g = snap["grammar"]
    return pb.GetMetricsResponse(
        uptime_s=snap["uptime_s"],
        requests_total=sum(t["requests"] for t in snap["tiers"].values()),
        prompt_tokens_total=snap["prompt_tokens"],
        generated_tokens_total=snap["generated_tokens"],
        prefill_tokens_total=snap["prefill_tokens"],
        shared_prefill_choices=snap["shared_prefill_choices"],
        engine_steps_total=snap["steps"],
        batch_sizes=[pb.BatchSizeBucket(sequences=k, steps=v) for k, v in snap["batch_sizes"].items()],
        mean_batch_size=snap["mean_batch_size"],
        running=len(running),
        waiting=len(waiting),
        tiers=tiers,
        kv=pb.KvMetrics(
            blocks_total=kv.num_blocks,
            blocks_used=kv.num_used,
            blocks_cached=kv.num_cached,
            blocks_free=kv.num_free,
            block_size=kv.block_size,
            bytes_per_block=engine.runner.kv_bytes_per_token * kv.block_size,
            kv_buffer_bytes=engine.runner.kv_buffer_bytes,
            prefix_hit_tokens=stats.hit_tokens,
            prompt_tokens=stats.prompt_tokens,
            prefix_hit_rate=stats.hit_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0,
            evictions=stats.evictions,
            holder_seq_ids=kv.num_holder_lanes,
            host_hit_tokens=stats.host_hit_tokens,
            host_prefixes=len(kv.host) if kv.host is not None else 0,
            host_bytes=engine.runner.spilled_bytes,
        ),
        preemptions_total=sum(preempt.values()),
        preemptions_by_reason=by_reason,
        rejections_total=sum(t["rejected"] for t in snap["tiers"].values()),
        throughput_tok_s=snap["throughput_tok_s"],
        throughput_window_s=10.0,
        grammar=pb.GrammarMetrics(
            compiles=g["compiles"],
            cache_hits=g["cache_hits"],
            compile_time=_latency(g["compile_ms"]),
            mask_us_p50=g["mask_us_p50"],
            mask_us_p99=g["mask_us_p99"],
            constrained_tokens=g["constrained_tokens"],
            forced_tokens=g["forced_tokens"],
            documents_natural=g["documents_natural"],
            documents_closed=g["documents_closed"],
            documents_cut_off=g["documents_cut_off"],
            **_grammar_cache(grammar),
        ),
        model=engine.runner.model_path.name,
        tenants=tenant_metrics(tenancy),
        response_cache=response_cache,
        step_phases=_step_phases(engine),
    )


def _step_phases(engine: Any) -> pb.StepPhases:
    times = engine.clock.snapshot()
    return pb.StepPhases(steps=times.steps, seconds_total=times.seconds)
