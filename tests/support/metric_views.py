"""Fake producers of the observability views (``service.observability.views``), for model-free tests.

``filled(cls)`` builds a view whose every number is distinct and non-zero, so a
metric that drops or mixes up a field shows; ``FakeEngine``, ``FakeTenancy``,
``FakeGrammar`` and ``FakeResponseCache`` serve views through the Protocols of
``service.observability.sources``; ``busy_engine()`` has every figure set.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from dataclasses import dataclass, field
from typing import Any

from inference.v1 import inference_pb2 as pb

from service.observability.engine_metrics import E2E_BUCKETS_S, TPOT_BUCKETS_S, TTFT_BUCKETS_S, EngineMetrics
from service.observability.sources import MetricsSource
from service.observability.step_clock import PHASES, StepTimes
from service.observability.views import (
    EngineSnapshot,
    Histogram,
    Histograms,
    KVSnapshot,
    MetricsSnapshot,
    ModelFigures,
    SchedulerLoad,
    TenantFigures,
    TierFigures,
    Totals,
)
from service.request.sequence import Priority

_numbers = itertools.count(3)


def number() -> int:
    """A fresh positive integer (distinct within a test run)."""
    return next(_numbers)


def filled(cls: type[Any], **given: Any) -> Any:
    """An instance of the view dataclass ``cls``: ``given`` fields as given, every other a distinct
    non-zero number (or name), nested views filled the same way."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if f.name in given:
            values[f.name] = given[f.name]
        elif kind is int:
            values[f.name] = number()
        elif kind is float:
            values[f.name] = float(number())
        elif kind is str:
            values[f.name] = f"name-{number()}"
        elif dataclasses.is_dataclass(kind):
            values[f.name] = filled(typing.cast(type, kind))
        else:
            raise TypeError(f"filled({cls.__name__}): give {f.name} ({kind})")
    return cls(**values)


def histogram(bounds: tuple[float, ...]) -> Histogram:
    return Histogram(bounds, tuple(number() for _ in range(len(bounds) + 1)), float(number()))


def busy_figures() -> MetricsSnapshot:
    """``EngineMetrics.figures()`` after traffic in both tiers."""
    return filled(
        MetricsSnapshot,
        tiers={p: filled(TierFigures) for p in Priority},
        batch_sizes={1: number(), 4: number()},
    )


def busy_totals() -> Totals:
    """``EngineMetrics.cumulative()`` after traffic that ended every way."""
    return filled(
        Totals,
        histograms=Histograms(
            histogram(TTFT_BUCKETS_S), histogram(E2E_BUCKETS_S), histogram(E2E_BUCKETS_S), histogram(TPOT_BUCKETS_S)
        ),
        finished_by_reason={"stop": number(), "closed": number(), "length": number(), "cancelled": number()},
    )


@dataclass
class FakeMetrics:
    """A ``MetricsSource`` over fixed snapshots."""

    snapshot: MetricsSnapshot = field(default_factory=busy_figures)
    totals: Totals = field(default_factory=busy_totals)

    def figures(self) -> MetricsSnapshot:
        return self.snapshot

    def cumulative(self) -> Totals:
        return self.totals


def kv_snapshot(blocks_used: int = 0, blocks_total: int = 64, block_size: int = 16) -> KVSnapshot:
    free = blocks_total - blocks_used
    return KVSnapshot(blocks_total, blocks_used, 0, free, block_size, 0, 0, 0, 0, 0, 0)


def scheduler_load(running: int = 0, waiting: int = 0) -> SchedulerLoad:
    """``running``/``waiting`` requests, all interactive; no preemptions."""

    def tiers(n: int) -> dict[Priority, int]:
        return {Priority.INTERACTIVE: n, Priority.BATCH: 0}

    return SchedulerLoad(tiers(running), tiers(waiting), {})


@dataclass
class FakeEngine:
    """An ``EngineView``: a real ``EngineMetrics`` unless given, and gauges as given."""

    load: SchedulerLoad = field(default_factory=scheduler_load)
    kv: KVSnapshot = field(default_factory=kv_snapshot)
    metrics: MetricsSource = field(default_factory=EngineMetrics)
    model: ModelFigures = field(default_factory=lambda: ModelFigures("tiny.gguf", "f16", 64, 1 << 20, 0))
    steps: StepTimes = field(default_factory=lambda: StepTimes(0, dict.fromkeys(PHASES, 0.0)))

    def view(self) -> EngineSnapshot:
        return EngineSnapshot(self.load, self.kv, self.model, self.steps)


def busy_engine() -> FakeEngine:
    """Every figure non-zero and distinct: both tiers ran, waited and were preempted, for both reasons."""
    load = SchedulerLoad(
        running={p: number() for p in Priority},
        waiting={p: number() for p in Priority},
        preemptions={(Priority.INTERACTIVE, "priority"): number(), (Priority.BATCH, "kv_memory"): number()},
    )
    steps = StepTimes(number(), {p: float(number()) for p in PHASES})
    return FakeEngine(load, filled(KVSnapshot), FakeMetrics(), filled(ModelFigures), steps)


@dataclass
class FakeTenancy:
    """A ``TenantView`` over fixed rows."""

    rows: list[TenantFigures] = field(default_factory=lambda: [filled(TenantFigures), filled(TenantFigures)])

    def view(self) -> list[TenantFigures]:
        return self.rows


@dataclass
class FakeGrammar:
    """A ``GrammarCacheView``."""

    stats: dict[str, int] = field(default_factory=lambda: {"entries": number(), "bytes": number(), "evictions": number()})

    def cache_stats(self) -> dict[str, int]:
        return self.stats


def response_cache_metrics() -> pb.ResponseCacheMetrics:
    """Every response-cache figure set (more hits than semantic hits: exact hits are non-zero too)."""
    return pb.ResponseCacheMetrics(
        hits=1000, semantic_hits=7, misses=number(), stores=number(), evictions=number(), expirations=number(),
        coalesced=number(), entries=number(), bytes=number(), capacity_bytes=number(),
    )


@dataclass
class FakeResponseCache:
    """A ``ResponseCacheView``."""

    figures: pb.ResponseCacheMetrics = field(default_factory=response_cache_metrics)

    def metrics(self) -> pb.ResponseCacheMetrics:
        return self.figures
