"""Readable forms of a GetMetricsResponse: a plain dict and a text table."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from inference.v1 import inference_pb2 as pb

_TIER_NAMES: dict[int, str] = {pb.PRIORITY_INTERACTIVE: "interactive", pb.PRIORITY_BATCH: "batch"}
_LATENCIES = (("queue", "queue_time"), ("ttft", "ttft"), ("tpot", "tpot"), ("e2e", "e2e"))


def metrics_to_dict(resp: pb.GetMetricsResponse) -> dict[str, Any]:
    """All fields (defaults included) under their proto names; enums as names, int64 as ints."""
    return json_format.MessageToDict(
        resp,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
        unquote_int64_if_possible=True,
    )


def tier_name(priority: int) -> str:
    """Name of a Priority: "interactive", "batch" or "unspecified"."""
    return _TIER_NAMES.get(priority, "unspecified")


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def _summary_lines(m: pb.GetMetricsResponse) -> list[tuple[str, str]]:
    kv = m.kv
    by_reason = ", ".join(f"{k} {v}" for k, v in sorted(m.preemptions_by_reason.items()))
    g = m.grammar
    return [
        ("model", m.model or "-"),
        ("uptime", f"{m.uptime_s:.1f} s"),
        ("requests", f"{m.requests_total} total, {m.running} running, {m.waiting} waiting"),
        (
            "tokens",
            f"{m.prompt_tokens_total} prompt, {m.prefill_tokens_total} prefilled, "
            f"{m.generated_tokens_total} generated",
        ),
        ("engine steps", f"{m.engine_steps_total}, mean batch size {m.mean_batch_size:.2f}"),
        ("throughput", f"{m.throughput_tok_s:.1f} tok/s (last {m.throughput_window_s:g} s)"),
        ("preemptions", f"{m.preemptions_total}" + (f" ({by_reason})" if by_reason else "")),
        ("rejections", f"{m.rejections_total}"),
        (
            "kv blocks",
            f"{kv.blocks_used} used, {kv.blocks_cached} cached, {kv.blocks_free} free of "
            f"{kv.blocks_total} ({kv.block_size} tok, {_mib(kv.bytes_per_block)} per block; "
            f"buffer {_mib(kv.kv_buffer_bytes)})",
        ),
        (
            "prefix cache",
            f"hit rate {kv.prefix_hit_rate:.1%} ({kv.prefix_hit_tokens}/{kv.prompt_tokens} tokens), "
            f"{kv.evictions} evictions, {kv.holder_seq_ids} holders",
        ),
        (
            "grammar",
            f"{g.compiles} compiles, {g.cache_hits} cache hits, {g.constrained_tokens} constrained "
            f"tokens ({g.forced_tokens} forced), mask p50/p99 {g.mask_us_p50:.0f}/{g.mask_us_p99:.0f} us",
        ),
    ]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        first = row[0].ljust(widths[0])
        rest = (cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return [fmt(header), *(fmt(r) for r in rows)]


def _tier_rows(m: pb.GetMetricsResponse) -> list[str]:
    header = ["tier", "requests", "completed", "cancelled", "failed", "rejected", "running", "waiting"]
    header.append("preempted")
    rows = [
        [
            tier_name(t.priority),
            *map(str, (t.requests_total, t.requests_completed, t.requests_cancelled, t.requests_failed)),
            *map(str, (t.requests_rejected, t.running, t.waiting, t.preemptions)),
        ]
        for t in m.tiers
    ]
    return _table(header, rows)


def _latency_rows(m: pb.GetMetricsResponse) -> list[str]:
    header = ["latency (ms)", "count", "mean", "p50", "p95", "p99"]
    rows = []
    for t in m.tiers:
        for label, field in _LATENCIES:
            s: pb.LatencySummary = getattr(t, field)
            figures = (s.mean_ms, s.p50_ms, s.p95_ms, s.p99_ms)
            rows.append([f"{tier_name(t.priority)} {label}", str(s.count), *(f"{x:.1f}" for x in figures)])
    return _table(header, rows)


def format_metrics(m: pb.GetMetricsResponse) -> str:
    """A multi-line, human-readable table of the key figures of a metrics snapshot."""
    lines = [f"{k:<14}{v}" for k, v in _summary_lines(m)]
    if m.batch_sizes:
        hist = " ".join(f"{b.sequences}:{b.steps}" for b in sorted(m.batch_sizes, key=lambda b: b.sequences))
        lines.append(f"{'batch sizes':<14}{hist}  (sequences:steps)")
    if m.tiers:
        lines += ["", *_tier_rows(m), "", *_latency_rows(m)]
    return "\n".join(lines)
