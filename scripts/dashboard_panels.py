"""The panels of the Grafana dashboard (``scripts/grafana_dashboard.py`` lays them out).

``ROWS`` lists (row title, panels); each panel has a title, a description
(shown as the panel's info tooltip and in docs/operations.md), its PromQL
queries with legends, and a unit. Queries filter on the dashboard's
``instance`` variable and use Grafana's ``$__rate_interval``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEL = '{instance=~"$instance"}'
RATE = "$__rate_interval"
DS = {"type": "prometheus", "uid": "${datasource}"}


def sel(**labels: str) -> str:
    """The instance selector plus ``labels`` (exact matches)."""
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return '{instance=~"$instance"' + extra + "}"


def quantiles(hist: str, by: str = "inference_priority") -> list[tuple[str, str]]:
    """p50/p95/p99 of a GenAI histogram (seconds) per ``by``."""
    return [
        (
            f"histogram_quantile({q}, sum by (le, {by}) (rate({hist}_bucket{SEL}[{RATE}])))",
            f"p{round(q * 100)} {{{{{by}}}}}",
        )
        for q in (0.5, 0.95, 0.99)
    ]


@dataclass
class Panel:
    """One panel: title, what it shows (the panel description), queries (expr, legend) and its unit."""

    title: str
    description: str
    targets: list[tuple[str, str]]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 8
    stack: bool = False
    options: dict[str, Any] = field(default_factory=dict)


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Overview",
        [
            Panel(
                "Up",
                "1 when Prometheus scraped the server's metrics endpoint, 0 when the scrape failed.",
                [(f"up{SEL}", "{{instance}}")],
                kind="stat",
                width=4,
            ),
            Panel(
                "Uptime",
                "Seconds since the server process started (a drop is a restart).",
                [(f"inference_uptime_seconds{SEL}", "{{instance}}")],
                unit="s",
                kind="stat",
                width=4,
            ),
            Panel(
                "Generated tokens/s",
                "Tokens generated per second over the rate interval, all tiers.",
                [(f"sum(rate(inference_generated_tokens_total{SEL}[{RATE}]))", "tok/s")],
                unit="none",
                kind="stat",
                width=4,
            ),
            Panel(
                "Running",
                "Sequences in the running batch now.",
                [(f"sum(inference_requests_running{SEL})", "running")],
                kind="stat",
                width=4,
            ),
            Panel(
                "Waiting",
                "Requests waiting in the queues now.",
                [(f"sum(inference_requests_waiting{SEL})", "waiting")],
                kind="stat",
                width=4,
            ),
            Panel(
                "KV blocks free",
                "Share of the KV pool that is free (not used by running sequences, not cached).",
                [
                    (
                        f"sum(inference_kv_blocks{sel(inference_kv_state='free')}) / sum(inference_kv_blocks{SEL})",
                        "free",
                    )
                ],
                unit="percentunit",
                kind="stat",
                width=4,
            ),
        ],
    ),
    (
        "Requests",
        [
            Panel(
                "Request rate by tier and outcome",
                "Requests ended per second, by priority tier and outcome (completed, cancelled, failed), and requests accepted.",
                [
                    (
                        f"sum by (inference_priority, inference_outcome) (rate(inference_requests_finished_total{SEL}[{RATE}]))",
                        "{{inference_priority}} {{inference_outcome}}",
                    ),
                    (
                        f"sum by (inference_priority) (rate(inference_requests_accepted_total{SEL}[{RATE}]))",
                        "{{inference_priority}} accepted",
                    ),
                ],
                unit="reqps",
            ),
            Panel(
                "Errors by status and tier",
                "Requests that ended with an error per second, by gRPC status (error_type) and tier; queue-full refusals are RESOURCE_EXHAUSTED.",
                [
                    (
                        f'sum by (error_type, inference_priority) (rate(gen_ai_server_request_duration_seconds_count{{instance=~"$instance",error_type!=""}}[{RATE}]))',
                        "{{error_type}} {{inference_priority}}",
                    )
                ],
                unit="reqps",
            ),
            Panel(
                "Queue rejections",
                "Requests refused because a tier's queue was full (RESOURCE_EXHAUSTED), per second.",
                [
                    (
                        f"sum by (inference_priority) (rate(inference_requests_rejected_total{SEL}[{RATE}]))",
                        "{{inference_priority}}",
                    )
                ],
                unit="reqps",
            ),
        ],
    ),
    (
        "Latency",
        [
            Panel(
                "Time to first token",
                "TTFT quantiles per tier from the GenAI histogram (arrival to the first token).",
                quantiles("gen_ai_server_time_to_first_token_seconds"),
                unit="s",
            ),
            Panel(
                "Time per output token",
                "TPOT quantiles per tier (time per token after the first: the decode step time as requests see it).",
                quantiles("gen_ai_server_time_per_output_token_seconds"),
                unit="s",
            ),
            Panel(
                "End-to-end latency",
                "Request duration quantiles per tier (arrival to the last token).",
                quantiles("gen_ai_server_request_duration_seconds"),
                unit="s",
            ),
            Panel(
                "Server-side p99 (last 2048 requests)",
                "p99 over the server's own window of recent requests, per tier: queue time, TTFT, TPOT, e2e.",
                [
                    (
                        f"inference_latency_milliseconds{sel(inference_statistic='p99')}",
                        "{{inference_priority}} {{inference_latency}}",
                    )
                ],
                unit="ms",
                width=12,
            ),
            Panel(
                "Queue time",
                "Mean and p99 time waiting before the first engine step, per tier (server window).",
                [
                    (
                        'inference_latency_milliseconds{instance=~"$instance",inference_latency="queue_time",inference_statistic=~"mean|p99"}',
                        "{{inference_priority}} {{inference_statistic}}",
                    )
                ],
                unit="ms",
                width=12,
            ),
        ],
    ),
    (
        "Engine",
        [
            Panel(
                "Tokens/s",
                "Generated tokens/s, prompt tokens accepted/s and prompt tokens actually computed by prefill/s (the rest came from the prefix cache).",
                [
                    (f"sum(rate(inference_generated_tokens_total{SEL}[{RATE}]))", "generated"),
                    (f"sum(rate(inference_prompt_tokens_total{SEL}[{RATE}]))", "prompt"),
                    (f"sum(rate(inference_prefill_tokens_total{SEL}[{RATE}]))", "prefill computed"),
                ],
                unit="none",
            ),
            Panel(
                "Running and waiting",
                "Sequences running and requests waiting, per tier.",
                [
                    (f"inference_requests_running{SEL}", "running {{inference_priority}}"),
                    (f"inference_requests_waiting{SEL}", "waiting {{inference_priority}}"),
                ],
                stack=True,
            ),
            Panel(
                "Batch size distribution",
                "Engine steps per second by sequences per decode step, and the mean batch size since start.",
                [
                    (
                        f"sum by (inference_batch_size) (rate(inference_engine_steps_total{SEL}[{RATE}]))",
                        "{{inference_batch_size}} seqs",
                    ),
                    (f"inference_batch_size_mean{SEL}", "mean since start"),
                ],
                unit="none",
                stack=True,
            ),
        ],
    ),
    (
        "KV cache",
        [
            Panel(
                "KV blocks",
                "KV pool blocks by state: used by running sequences, cached for prefix reuse, free.",
                [(f"sum by (inference_kv_state) (inference_kv_blocks{SEL})", "{{inference_kv_state}}")],
                stack=True,
                width=6,
            ),
            Panel(
                "Prefix hit rate",
                "Share of prompt tokens served from the prefix cache: over the rate interval, and since start.",
                [
                    (
                        f"sum(rate(inference_kv_prefix_hit_tokens_total{SEL}[{RATE}])) / sum(rate(inference_prompt_tokens_total{SEL}[{RATE}]))",
                        "recent",
                    ),
                    (f"inference_kv_prefix_hit_rate{SEL}", "since start"),
                ],
                unit="percentunit",
                width=6,
            ),
            Panel(
                "Preemptions by reason",
                "Preemptions per second by reason: priority (an interactive request took the place of a batch one) or kv_memory (the KV pool ran out); preempted requests are recomputed later. And cached KV blocks evicted per second.",
                [
                    (
                        f"sum by (inference_preemption_reason) (rate(inference_preemptions_by_reason_total{SEL}[{RATE}]))",
                        "{{inference_preemption_reason}}",
                    ),
                    (f"sum(rate(inference_kv_evictions_total{SEL}[{RATE}]))", "evicted blocks"),
                ],
                unit="none",
                width=6,
            ),
            Panel(
                "Preemptions by tier",
                "Preemptions per second by the tier of the preempted request.",
                [
                    (
                        f"sum by (inference_priority) (rate(inference_preemptions_total{SEL}[{RATE}]))",
                        "{{inference_priority}}",
                    ),
                ],
                unit="none",
                width=6,
            ),
        ],
    ),
    (
        "Structured output",
        [
            Panel(
                "Grammar mask time",
                "Time to compute the token mask per constrained token, p50 and p99 over the server's window.",
                [(f"inference_grammar_mask_time_microseconds{SEL}", "{{inference_statistic}}")],
                unit="µs",
                width=6,
            ),
            Panel(
                "Grammar compile time",
                "Time to compile a JSON schema or grammar (cache misses), mean, p50 and p99 over the server's window.",
                [(f"inference_grammar_compile_time_milliseconds{SEL}", "{{inference_statistic}}")],
                unit="ms",
                width=6,
            ),
            Panel(
                "Grammar compiles",
                "Grammars compiled per second and compilations served from the cache.",
                [
                    (f"sum(rate(inference_grammar_compiles_total{SEL}[{RATE}]))", "compiled"),
                    (f"sum(rate(inference_grammar_cache_hits_total{SEL}[{RATE}]))", "cache hits"),
                ],
                unit="none",
                width=6,
            ),
            Panel(
                "Constrained tokens",
                "Constrained tokens per second, and the ones the grammar forced (fast-forwarded without sampling).",
                [
                    (f"sum(rate(inference_grammar_constrained_tokens_total{SEL}[{RATE}]))", "constrained"),
                    (f"sum(rate(inference_grammar_forced_tokens_total{SEL}[{RATE}]))", "forced"),
                ],
                unit="none",
                width=6,
            ),
        ],
    ),
    (
        "Tenants",
        [
            Panel(
                "Requests per tenant",
                "Requests accepted per second, per tenant.",
                [
                    (
                        f"sum by (inference_tenant) (rate(inference_tenant_requests_total{SEL}[{RATE}]))",
                        "{{inference_tenant}}",
                    )
                ],
                unit="reqps",
                width=6,
            ),
            Panel(
                "Quota rejections per tenant",
                "Requests refused by a tenant quota per second.",
                [
                    (
                        f"sum by (inference_tenant) (rate(inference_tenant_rejected_total{SEL}[{RATE}]))",
                        "{{inference_tenant}}",
                    )
                ],
                unit="reqps",
                width=6,
            ),
            Panel(
                "Tokens per tenant",
                "Generated and prompt tokens per second, per tenant (finished requests).",
                [
                    (
                        f"sum by (inference_tenant) (rate(inference_tenant_generated_tokens_total{SEL}[{RATE}]))",
                        "generated {{inference_tenant}}",
                    ),
                    (
                        f"sum by (inference_tenant) (rate(inference_tenant_prompt_tokens_total{SEL}[{RATE}]))",
                        "prompt {{inference_tenant}}",
                    ),
                ],
                unit="none",
                width=6,
            ),
            Panel(
                "In flight per tenant",
                "Requests in flight now, per tenant.",
                [(f"inference_tenant_in_flight{SEL}", "{{inference_tenant}}")],
                width=6,
            ),
        ],
    ),
]
