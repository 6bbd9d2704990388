"""What observability reads, as Protocols the layers above satisfy (no back-pointers, nothing untyped).

Each Protocol names only methods that return a typed view (``service.observability.views``)
or a proto; the objects behind them live in higher layers and are passed in by
``service.server`` (or by the gRPC servicer, for GetMetrics):

* ``EngineView``: ``service.continuous_batcher.Engine`` (its ``metrics``, a ``MetricsSource``, and ``view()``);
* ``TenantView``: ``service.security.tenancy.Tenancy``;
* ``GrammarCacheView``: ``service.api.grammar_service.GrammarService``;
* ``ResponseCacheView``: ``service.api.cache_front.CacheFront``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from inference.v1 import inference_pb2 as pb

from service.observability.views import EngineSnapshot, MetricsSnapshot, TenantFigures, Totals


class MetricsSource(Protocol):
    """Counters and latency windows (``service.observability.engine_metrics.EngineMetrics``; thread-safe)."""

    def figures(self) -> MetricsSnapshot:
        """Every figure GetMetrics reports, latency windows summarised (costly: percentiles)."""
        ...

    def cumulative(self) -> Totals:
        """Counters and histograms since start (cheap: read at every scrape)."""
        ...


class EngineView(Protocol):
    """The engine as metrics see it: its counters, and one read of its gauges."""

    @property
    def metrics(self) -> MetricsSource: ...

    def view(self) -> EngineSnapshot:
        """Scheduler, KV pool, model memory and step phases, read now (any thread, never blocks the engine)."""
        ...


class TenantView(Protocol):
    """Per-tenant counters for GetMetrics and the ``inference.tenant.*`` instruments."""

    def view(self) -> Sequence[TenantFigures]:
        """One row per tenant of the tenants file (or ``anonymous``), sorted by name."""
        ...


class GrammarCacheView(Protocol):
    """The grammar compile cache's size figures."""

    def cache_stats(self) -> Mapping[str, int]:
        """``entries``, ``bytes`` and ``evictions``.

        NOTE: a mapping, not a view dataclass: the cache lives in ``service.grammar`` (above this
        package), whose ``CompileCache.stats`` this change does not touch; ``metrics_view`` reads
        the three keys in one place and a test pins them.
        """
        ...


class ResponseCacheView(Protocol):
    """The response cache's figures, already as the GetMetrics message (None: no cache)."""

    def metrics(self) -> pb.ResponseCacheMetrics | None: ...


__all__ = ["EngineView", "GrammarCacheView", "MetricsSource", "ResponseCacheView", "TenantView"]
