"""Every exported metric reads a field of a typed view that exists, and every view field feeds a metric.

The views (``service.observability.views``) are what the engine, scheduler, KV
manager and tenancy publish for observability. These tests build the metrics
(GetMetrics, the vLLM-named Prometheus series, the OpenTelemetry instruments)
from fake producers of those views, so they run without the model:

* renaming any field of any view makes reading the metrics raise (never a
  silently missing or zero series): each field is renamed in turn;
* with every view figure set, every GetMetrics field, every OTel instrument and
  every vLLM series has a value.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from types import FunctionType
from typing import Any

import pytest
from google.protobuf.message import Message
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from service.observability.metrics_view import metrics_response
from service.observability.model_server import HISTOGRAMS, ModelServerCollector
from service.observability.otel_metrics import COUNTERS, GAUGES, observe_engine
from service.observability.sources import EngineView
from service.observability.step_clock import StepTimes
from service.observability.views import (
    EngineSnapshot,
    GrammarFigures,
    Histogram,
    Histograms,
    KVSnapshot,
    Latency,
    MetricsSnapshot,
    ModelFigures,
    SchedulerLoad,
    TenantFigures,
    TierFigures,
    Totals,
)
from tests.support.metric_views import (
    FakeGrammar,
    FakeMetrics,
    FakeResponseCache,
    FakeTenancy,
    busy_engine,
)

VIEWS = (
    EngineSnapshot,
    GrammarFigures,
    Histogram,
    Histograms,
    KVSnapshot,
    Latency,
    MetricsSnapshot,
    ModelFigures,
    SchedulerLoad,
    StepTimes,
    TenantFigures,
    TierFigures,
    Totals,
)
VLLM_SERIES = {
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:prompt_tokens",  # counters: the family name, without "_total"
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "vllm:request_success",
    *(name for name, _doc, _pick in HISTOGRAMS),
}


def read_every_metric(engine: EngineView, tenancy: FakeTenancy) -> None:
    """Build GetMetrics and scrape the vLLM collector (both raise what a view read raised)."""
    response = FakeResponseCache().metrics()
    metrics_response(engine, FakeGrammar(), tenancy, response)
    list(ModelServerCollector(engine, "m").collect())


# -- a renamed field fails loudly -----------------------------------------------------------------
@dataclasses.dataclass
class Renamed:
    """An ``EngineView`` serving views whose classes had a field renamed."""

    metrics: FakeMetrics
    snapshot: Any

    def view(self) -> Any:
        return self.snapshot


def _renamed_class(view: type, old: str) -> type:
    """``view`` with field ``old`` renamed (its methods and properties kept, reading the new layout)."""
    hints = typing.get_type_hints(view)
    fields = [(f"renamed_{f.name}" if f.name == old else f.name, hints[f.name]) for f in dataclasses.fields(view)]
    methods = {
        k: v for k, v in vars(view).items() if isinstance(v, property | FunctionType) and not k.startswith("__")
    }
    return dataclasses.make_dataclass(view.__name__, fields, namespace=methods, frozen=True)


def _rename(obj: Any, view: type, variant: type) -> Any:
    """``obj`` with every ``view`` instance in it (at any depth) rebuilt as ``variant``."""
    if isinstance(obj, dict):
        return {k: _rename(v, view, variant) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rename(v, view, variant) for v in obj]
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return obj
    values = [_rename(getattr(obj, f.name), view, variant) for f in dataclasses.fields(obj)]
    return variant(*values) if type(obj) is view else type(obj)(*values)


def _cases() -> Iterator[Any]:
    for view in VIEWS:
        for f in dataclasses.fields(view):
            yield pytest.param(view, f.name, id=f"{view.__name__}.{f.name}")


@pytest.mark.parametrize(("view", "name"), list(_cases()))
def test_renaming_a_view_field_breaks_the_metrics_loudly(view: type, name: str) -> None:
    """A field nobody reads, or a reader left behind by a rename, fails this test."""
    busy, tenancy = busy_engine(), FakeTenancy()
    read_every_metric(busy, tenancy)  # the views as they are read fine
    variant = _renamed_class(view, name)
    figures, totals = busy.metrics.figures(), busy.metrics.cumulative()
    metrics = FakeMetrics(_rename(figures, view, variant), _rename(totals, view, variant))
    renamed = Renamed(metrics, _rename(busy.view(), view, variant))
    with pytest.raises(AttributeError, match=name):
        read_every_metric(renamed, FakeTenancy(_rename(tenancy.rows, view, variant)))


# -- every exported figure has a source -------------------------------------------------------------
def _unset(message: Message, path: str = "") -> Iterator[str]:
    """Dotted paths of the fields of ``message`` (recursively) left at their default."""
    present = {f.name: v for f, v in message.ListFields()}
    for f in message.DESCRIPTOR.fields:
        where = f"{path}{f.name}"
        if f.name not in present:
            yield where
        elif f.message_type is not None and not f.message_type.GetOptions().map_entry:
            items = present[f.name] if f.is_repeated else [present[f.name]]
            for i, item in enumerate(items):
                yield from _unset(item, f"{where}[{i}]." if f.is_repeated else f"{where}.")


def test_every_get_metrics_field_is_filled_from_a_view() -> None:
    engine, tenancy = busy_engine(), FakeTenancy()
    response = metrics_response(engine, FakeGrammar(), tenancy, FakeResponseCache().metrics())
    assert list(_unset(response)) == []
    view = engine.view()
    assert response.kv.blocks_used == view.kv.blocks_used
    assert response.kv.holder_seq_ids == view.kv.holder_lanes
    assert response.kv.bytes_per_block == view.model.kv_bytes_per_token * view.kv.block_size
    assert response.running == sum(view.scheduler.running.values())
    tiers = view.scheduler.running  # every tier, in order
    assert [t.preemptions for t in response.tiers] == [view.scheduler.preemptions_of(p) for p in tiers]
    assert dict(response.preemptions_by_reason) == view.scheduler.preemptions_by_reason()
    assert dict(response.step_phases.seconds_total) == view.steps.seconds
    assert [t.tenant for t in response.tenants] == [r.tenant for r in tenancy.rows]


def test_every_otel_instrument_observes_a_non_zero_figure() -> None:
    response = metrics_response(busy_engine(), FakeGrammar(), FakeTenancy(), FakeResponseCache().metrics())
    for name, _unit, _description, rows in [*COUNTERS, *GAUGES]:
        observed = rows(response)
        assert observed, name
        assert all(value for value, _labels in observed), (name, observed)


def test_every_otel_instrument_is_registered_and_collected() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    observe_engine(provider.get_meter("test"), busy_engine(), FakeTenancy(), FakeResponseCache())
    data = reader.get_metrics_data()
    assert data is not None
    collected = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    expected = {name for name, *_ in [*COUNTERS, *GAUGES]}
    assert set(collected) == expected
    assert all(collected[n].data.data_points for n in expected)
    provider.shutdown()


def test_every_vllm_series_is_served() -> None:
    families = {f.name: f for f in ModelServerCollector(busy_engine(), "m").collect()}
    assert set(families) == VLLM_SERIES
    assert all(family.samples for family in families.values())
