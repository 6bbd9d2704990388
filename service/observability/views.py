"""Typed read-only views: what observability reads of the subsystems above it.

``service.observability`` sits below the engine, the scheduler, the KV manager
and the tenancy, so it cannot import them. Each of them instead *produces* one
of these frozen snapshots (the record is defined here, filled in up there):

======================  ====================================  ==========================================
view                    produced by                           read by
======================  ====================================  ==========================================
``MetricsSnapshot``     ``EngineMetrics.figures()``           ``metrics_view`` (GetMetrics), OTel
``Totals``              ``EngineMetrics.cumulative()``        ``model_server`` (vLLM series)
``SchedulerLoad``       ``Scheduler.view()``                  ``metrics_view``, ``model_server``
``KVSnapshot``          ``KVBlockManager.view()``             ``metrics_view``, ``model_server``
``ModelFigures``        ``Engine.view()`` (from its runner)   ``metrics_view``
``EngineSnapshot``      ``Engine.view()`` (the four above)    ``metrics_view``, ``model_server``
``TenantFigures``       ``Tenancy.view()``                    ``metrics_view`` (per-tenant rows)
======================  ====================================  ==========================================

A renamed field is a type error (mypy) and an AttributeError in the model-free
tests (``tests/unit/observability``), never a silently missing series.

NOTE: the containers inside (``dict``) are fresh copies owned by the snapshot;
"frozen" means nobody reassigns a field, and readers never mutate them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from service.observability.step_clock import StepTimes
from service.request.sequence import Priority


@dataclass(frozen=True)
class Latency:
    """count, mean and percentiles (milliseconds) of one latency window; all zero when empty."""

    count: int = 0
    mean_ms: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0


@dataclass(frozen=True)
class Histogram:
    """A Prometheus-style histogram since start: bucket upper bounds, per-bucket counts (+Inf last), sum."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float


@dataclass(frozen=True)
class Histograms:
    """The four request-latency histograms (seconds), served as ``vllm:*`` series."""

    ttft: Histogram
    e2e: Histogram
    queue: Histogram
    tpot: Histogram


@dataclass(frozen=True)
class TierFigures:
    """One priority tier's request counters and latency windows."""

    requests: int
    completed: int
    cancelled: int
    failed: int
    rejected: int
    queue: Latency
    ttft: Latency
    tpot: Latency
    e2e: Latency


@dataclass(frozen=True)
class GrammarFigures:
    """Constrained-decoding figures: compiles, mask cost, forced tokens, JSON documents by ending."""

    compiles: int
    cache_hits: int
    compile_ms: Latency
    mask_us_p50: float
    mask_us_p99: float
    constrained_tokens: int
    forced_tokens: int
    documents_natural: int
    documents_closed: int
    documents_cut_off: int


@dataclass(frozen=True)
class Totals:
    """Counters and histograms since start (cheap: no percentiles; read at every scrape)."""

    prompt_tokens: int
    generated_tokens: int
    histograms: Histograms
    finished_by_reason: dict[str, int]  # FinishReason value (or "error") -> requests


@dataclass(frozen=True)
class MetricsSnapshot:
    """What GetMetrics reports of ``EngineMetrics``, latency windows summarised (histograms: ``Totals``)."""

    uptime_s: float
    tiers: dict[Priority, TierFigures]  # every tier, in Priority order
    prompt_tokens: int
    generated_tokens: int
    prefill_tokens: int
    shared_prefill_choices: int
    steps: int
    batch_sizes: dict[int, int]  # sequences per decode -> steps, sorted
    mean_batch_size: float
    throughput_tok_s: float
    grammar: GrammarFigures

    def as_dict(self) -> dict[str, object]:
        """The same figures as nested plain dicts (tiers keyed by ``Priority``)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SchedulerLoad:
    """What the scheduler holds now, per tier, and the preemptions it made since start."""

    running: dict[Priority, int]  # sequences in the running batch (every tier present)
    waiting: dict[Priority, int]  # requests queued (every tier present)
    preemptions: dict[tuple[Priority, str], int]  # (tier, reason) -> preemptions

    @property
    def num_running(self) -> int:
        return sum(self.running.values())

    @property
    def num_waiting(self) -> int:
        return sum(self.waiting.values())

    @property
    def num_preemptions(self) -> int:
        return sum(self.preemptions.values())

    def preemptions_of(self, tier: Priority) -> int:
        """Preemptions of ``tier``'s sequences, any reason."""
        return sum(n for (p, _reason), n in self.preemptions.items() if p is tier)

    def preemptions_by_reason(self) -> dict[str, int]:
        """Preemptions by reason (``priority``, ``kv_memory``), any tier; reasons seen so far only."""
        out: dict[str, int] = {}
        for (_tier, reason), n in self.preemptions.items():
            out[reason] = out.get(reason, 0) + n
        return out


@dataclass(frozen=True)
class KVSnapshot:
    """The KV block pool (block states, lanes, host tier) and its prefix-cache counters since start."""

    blocks_total: int
    blocks_used: int  # referenced by running sequences
    blocks_cached: int  # registered prefix blocks nobody references (evictable)
    blocks_free: int
    block_size: int  # tokens per block
    holder_lanes: int  # llama sequence ids holding cached prefixes
    host_prefixes: int  # chains held in host memory (0 without a host tier)
    prefix_hit_tokens: int
    prompt_tokens: int
    host_hit_tokens: int
    evictions: int

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache over prompt tokens seen (0 before any)."""
        return self.prefix_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def usage(self) -> float:
        """Fraction 0-1 of the pool's blocks referenced by running sequences."""
        return min(1.0, self.blocks_used / self.blocks_total) if self.blocks_total else 0.0


@dataclass(frozen=True)
class ModelFigures:
    """The loaded model: its file name, its KV cache's data type and the memory that cache takes."""

    model: str  # the GGUF file name
    kv_cache_type: str  # "f16", "q8_0" or "q4_0" (--kv-cache-type)
    kv_bytes_per_token: int  # in that type
    kv_buffer_bytes: int  # llama.cpp's KV buffer
    host_bytes: int  # host memory held by spilled prefix chains


@dataclass(frozen=True)
class EngineSnapshot:
    """One read of the engine's gauges (``Engine.view()``): cheap, taken on the reading thread."""

    scheduler: SchedulerLoad
    kv: KVSnapshot
    model: ModelFigures
    steps: StepTimes  # where engine steps' time went (GetMetrics step_phases)


@dataclass(frozen=True)
class TenantFigures:
    """One tenant's counters (``Tenancy.view()``); names come from the tenants file only."""

    tenant: str
    weight: float
    requests: int
    rejected: int
    finished: int
    in_flight: int
    queued: int
    prompt_tokens: int
    generated_tokens: int
    window_tokens: int
    service: float  # fair-share virtual token counter


__all__ = [
    "EngineSnapshot",
    "GrammarFigures",
    "Histogram",
    "Histograms",
    "KVSnapshot",
    "Latency",
    "MetricsSnapshot",
    "ModelFigures",
    "SchedulerLoad",
    "TenantFigures",
    "TierFigures",
    "Totals",
]
