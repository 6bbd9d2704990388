"""The publisher's counters as Prometheus series, on the registry ``/metrics`` serves.

* ``inference_kv_events_published_total``: event batches sent on the PUB socket (one per engine
  step that changed the prefix index, plus the first and last ``AllBlocksCleared``);
* ``inference_kv_events_dropped_total``: batches the engine could not queue because the publisher
  thread was that far behind (each is followed by a resynchronisation, ``service.kv.events``);
* ``inference_kv_events_replays_total``: replay requests answered;
* ``inference_kv_events_queued``: batches waiting for the publisher thread.

A subscriber too slow for the PUB socket's high-water mark loses messages inside ZMQ, which no
counter here sees: it sees them itself, as a gap in the sequence numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class PublisherFigures(Protocol):
    """What the collector reads of ``KVEventPublisher`` (plain ints, read from the scraping thread)."""

    published: int
    dropped: int
    replays: int

    @property
    def queued(self) -> int: ...


class KVEventsCollector(Collector):
    """The publisher's series (see the module docstring)."""

    def __init__(self, publisher: PublisherFigures) -> None:
        self.publisher = publisher

    def collect(self) -> Iterator[Metric]:
        p = self.publisher
        yield CounterMetricFamily(
            "inference_kv_events_published", "KV-event batches sent on the PUB socket", value=p.published
        )
        yield CounterMetricFamily(
            "inference_kv_events_dropped", "KV-event batches dropped because the publisher queue was full",
            value=p.dropped,
        )
        yield CounterMetricFamily("inference_kv_events_replays", "KV-event replay requests answered", value=p.replays)
        yield GaugeMetricFamily("inference_kv_events_queued", "KV-event batches waiting to be sent", value=p.queued)
